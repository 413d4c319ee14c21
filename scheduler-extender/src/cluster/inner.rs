//! What is behind the cluster state's lock: one entry per node (GPUs, telemetry, generation,
//! GPU summaries), the ledger, and which node publishes each GPU.

use std::collections::{HashMap, HashSet};

use carma_core::placement::GpuSummary;
use carma_core::{
    Demand, Ledger, Millis, Node, NodePlacement, NodeRejection, PlacementConfig, PlacementRecord,
};

/// One node as placement sees it.
#[derive(Debug, Clone)]
pub(crate) struct NodeEntry {
    /// The GPUs, from the node's `GpuNode` (empty when none was published).
    pub(crate) node: Node,
    /// Whether a `GpuNode` exists for it.
    pub(super) has_gpu_node: bool,
    /// Whether the Kubernetes `Node` exists.
    pub(super) has_node: bool,
    /// UIDs of pods whose memory the `GpuNode` shows (`observedMiB` set).
    pub(super) observed: HashSet<String>,
    /// `status.updatedAt` of the latest publication, to tell a new publication from a re-list.
    pub(super) published: Option<String>,
    /// Where round robin starts on this node.
    pub(crate) rr_cursor: usize,
    /// Index of the node in per-node tables (reused after the node leaves).
    pub(crate) slot: usize,
    /// Changes whenever the node's verdicts may change; unique across nodes.
    pub(crate) generation: u64,
    /// The ledger as placement reads it, per GPU in index order; refreshed with the generation.
    pub(crate) summary: Vec<GpuSummary>,
}

/// The summaries of `gpus` (`carma_core::placement::summarize`) under `cfg`; none without one.
pub(super) fn summarize(
    gpus: &[carma_core::Gpu],
    ledger: &Ledger,
    cfg: Option<&PlacementConfig>,
) -> Vec<GpuSummary> {
    cfg.map(|cfg| carma_core::placement::summarize(gpus, ledger, cfg))
        .unwrap_or_default()
}

impl NodeEntry {
    pub(crate) fn usable(&self) -> bool {
        self.has_node && self.has_gpu_node
    }
}

/// Everything behind the lock.
#[derive(Debug, Default)]
pub struct Inner {
    /// By node name; looked up once per candidate on every filter, hence the fast hasher.
    pub(super) nodes: HashMap<String, NodeEntry, foldhash::fast::RandomState>,
    pub(super) ledger: Ledger,
    /// Nodes publishing each GPU UUID (one, unless GpuNodes disagree).
    pub(super) gpu_owner: HashMap<String, Vec<String>>,
    next_generation: u64,
    free_slots: Vec<usize>,
    slots: usize,
    /// The thresholds the summaries' gate and staleness figures are computed with.
    pub(super) summary_config: Option<PlacementConfig>,
}

impl Inner {
    /// The entry of `name`, created (with a slot) when missing.
    pub(super) fn entry(&mut self, name: &str) -> &mut NodeEntry {
        match self.nodes.entry(name.to_string()) {
            std::collections::hash_map::Entry::Occupied(o) => o.into_mut(),
            std::collections::hash_map::Entry::Vacant(v) => {
                let slot = self.free_slots.pop().unwrap_or_else(|| {
                    self.slots += 1;
                    self.slots - 1
                });
                self.next_generation += 1;
                v.insert(NodeEntry {
                    node: Node {
                        name: name.to_string(),
                        gpus: Vec::new(),
                    },
                    has_gpu_node: false,
                    has_node: false,
                    observed: HashSet::new(),
                    published: None,
                    rr_cursor: 0,
                    slot,
                    generation: self.next_generation,
                    summary: Vec::new(),
                })
            }
        }
    }

    /// The node's verdicts may have changed (called after the change): a new generation and
    /// summary.
    pub(super) fn bump(&mut self, name: &str) {
        if let Some(e) = self.nodes.get_mut(name) {
            self.next_generation += 1;
            e.generation = self.next_generation;
            e.summary = summarize(&e.node.gpus, &self.ledger, self.summary_config.as_ref());
        }
    }

    /// `name` no longer publishes GPU `uuid`.
    pub(super) fn disown(&mut self, uuid: &str, name: &str) {
        if let Some(owners) = self.gpu_owner.get_mut(uuid) {
            owners.retain(|n| n != name);
            if owners.is_empty() {
                self.gpu_owner.remove(uuid);
            }
        }
    }

    /// A record changed (called after the ledger changed): every node holding one of its GPUs,
    /// and its node.
    pub(super) fn touch(&mut self, record: &PlacementRecord) {
        let mut names: Vec<String> = record
            .gpus
            .iter()
            .filter_map(|g| self.gpu_owner.get(g))
            .flatten()
            .cloned()
            .collect();
        names.push(record.node.clone());
        for n in names {
            self.bump(&n);
        }
    }

    pub(super) fn drop_if_empty(&mut self, name: &str) {
        if self
            .nodes
            .get(name)
            .is_some_and(|e| !e.has_node && !e.has_gpu_node)
            && let Some(e) = self.nodes.remove(name)
        {
            self.free_slots.push(e.slot);
        }
    }

    /// Whether every node's summary is what the ledger says now (tests).
    #[cfg(test)]
    pub(crate) fn summaries_are_fresh(&self) -> bool {
        self.nodes.values().all(|e| {
            e.summary == summarize(&e.node.gpus, &self.ledger, self.summary_config.as_ref())
        })
    }

    /// The thresholds the summaries were computed with.
    pub(crate) fn summary_config(&self) -> Option<&PlacementConfig> {
        self.summary_config.as_ref()
    }

    /// Number of per-node slots handed out so far.
    pub(crate) fn slot_count(&self) -> usize {
        self.slots
    }

    /// The entry of node `name`.
    pub(crate) fn node_entry(&self, name: &str) -> Option<&NodeEntry> {
        self.nodes.get(name)
    }

    /// Where `demand` would go on node `name` at `now`.
    pub fn place(
        &self,
        name: &str,
        demand: &Demand,
        cfg: &PlacementConfig,
        now: Millis,
    ) -> Result<NodePlacement, NodeRejection> {
        match self.nodes.get(name) {
            Some(e) if e.usable() => self.place_entry(e, demand, cfg, now),
            _ => Err(NodeRejection::NoGpus {
                node: name.to_string(),
            }),
        }
    }

    pub(crate) fn place_entry(
        &self,
        e: &NodeEntry,
        demand: &Demand,
        cfg: &PlacementConfig,
        now: Millis,
    ) -> Result<NodePlacement, NodeRejection> {
        carma_core::place_on_node(&e.node, &self.ledger, demand, cfg, now, e.rr_cursor)
    }

    /// The ledger.
    pub fn ledger(&self) -> &Ledger {
        &self.ledger
    }

    /// Book `placement` for pod `uid` at `now`, checked by the ledger against
    /// each GPU's total memory and warm-up lock; round robin moves past the GPUs.
    pub(crate) fn book(
        &mut self,
        uid: &str,
        placement: &NodePlacement,
        cfg: &PlacementConfig,
        now: Millis,
    ) -> Result<(), carma_core::LedgerError> {
        let Some(entry) = self.nodes.get_mut(&placement.node) else {
            return Err(carma_core::LedgerError::NoGpu(uid.to_string()));
        };
        let record = placement.record(uid, now);
        let gpus = &entry.node.gpus;
        self.ledger.assume(
            record.clone(),
            |uuid| {
                gpus.iter()
                    .find(|g| g.uuid == uuid)
                    .filter(|_| placement.capacity_checked)
                    .map(|g| g.memory_total_mib)
            },
            cfg.warmup_ms,
            now,
        )?;
        if let Some(next) = placement.next_rr_cursor() {
            entry.rr_cursor = next;
        }
        self.touch(&record);
        Ok(())
    }

    /// Release a pod's booking (its writes failed, or it ended).
    pub(crate) fn unbook(&mut self, uid: &str) -> bool {
        match self.ledger.release(uid) {
            Some(r) => {
                self.touch(&r);
                true
            }
            None => false,
        }
    }
}
