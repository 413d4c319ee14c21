//! The extender's view of the cluster: GPU nodes with their telemetry, and the
//! ledger of pods placed on GPUs.
//!
//! Both sources feed this one state through the same functions: the kube
//! watchers ([`crate::kube_backend`]) and a static snapshot
//! ([`crate::snapshot`]). Filter and prioritize read it under a read lock and
//! never call the API server; bind books under the write lock.
//!
//! Every change that can alter a node's placement verdict (its telemetry, its
//! existence, a ledger record on one of its GPUs, its round-robin cursor) gives
//! the node a new *generation*; [`crate::verdict`] reuses a verdict only while
//! the node's generation is unchanged. The same change refreshes the node's
//! `GpuSummary`s (`carma_core::placement`) — what placement reads of the ledger for each of its GPUs — so
//! that judging a node for a new demand needs no ledger lookup.

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicBool, Ordering};

use carma_api::{Assignment, GpuNode, PodRequest};
use carma_core::placement::GpuSummary;
use carma_core::{
    Demand, Ledger, Millis, Node, NodePlacement, NodeRejection, PlacementConfig, PlacementRecord,
};
use k8s_openapi::api::core::v1::Pod;
use parking_lot::{RwLock, RwLockReadGuard, RwLockWriteGuard};

use crate::decision::pod_key;

/// Which object kind a source has finished listing.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// Kubernetes `Node`s.
    Nodes,
    /// carma `GpuNode`s.
    GpuNodes,
    /// `Pod`s.
    Pods,
    /// carma `MemoryHistory` records (not part of readiness).
    MemoryHistories,
}

/// One node as placement sees it.
#[derive(Debug, Clone)]
pub(crate) struct NodeEntry {
    /// The GPUs, from the node's `GpuNode` (empty when none was published).
    pub(crate) node: Node,
    /// Whether a `GpuNode` exists for it.
    has_gpu_node: bool,
    /// Whether the Kubernetes `Node` exists.
    has_node: bool,
    /// UIDs of pods whose memory the `GpuNode` shows (`observedMiB` set).
    observed: HashSet<String>,
    /// `status.updatedAt` of the latest publication, to tell a new publication from a re-list.
    published: Option<String>,
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
fn summarize(
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
    nodes: HashMap<String, NodeEntry, foldhash::fast::RandomState>,
    ledger: Ledger,
    /// Nodes publishing each GPU UUID (one, unless GpuNodes disagree).
    gpu_owner: HashMap<String, Vec<String>>,
    next_generation: u64,
    free_slots: Vec<usize>,
    slots: usize,
    /// The thresholds the summaries' gate and staleness figures are computed with.
    summary_config: Option<PlacementConfig>,
}

/// The shared cluster state.
#[derive(Debug, Default)]
pub struct ClusterState {
    inner: RwLock<Inner>,
    nodes_synced: AtomicBool,
    gpu_nodes_synced: AtomicBool,
    pods_synced: AtomicBool,
    handoff: crate::handoff::Handoff,
}

/// Wall-clock milliseconds since the Unix epoch (assignment times are wall clock).
pub fn now_ms() -> Millis {
    u64::try_from(chrono::Utc::now().timestamp_millis()).unwrap_or(0)
}

impl ClusterState {
    /// An empty, not yet synced state.
    pub fn new() -> Self {
        Self::default()
    }

    /// A source has listed every object of `kind` once.
    pub fn mark_synced(&self, kind: Kind) {
        let flag = match kind {
            Kind::Nodes => &self.nodes_synced,
            Kind::GpuNodes => &self.gpu_nodes_synced,
            Kind::Pods => &self.pods_synced,
            Kind::MemoryHistories => {
                tracing::debug!(?kind, "records listed");
                return;
            }
        };
        if !flag.swap(true, Ordering::SeqCst) {
            tracing::info!(?kind, "cache synced");
        }
    }

    /// Whether every cache has synced: only then may the extender answer.
    pub fn is_ready(&self) -> bool {
        self.nodes_synced.load(Ordering::SeqCst)
            && self.gpu_nodes_synced.load(Ordering::SeqCst)
            && self.pods_synced.load(Ordering::SeqCst)
    }

    /// The per-node admission handoff that bind uses (fed by [`Self::apply_pod`]).
    pub fn handoff(&self) -> &crate::handoff::Handoff {
        &self.handoff
    }

    /// Read access for filter and prioritize.
    pub fn read(&self) -> View<'_> {
        View {
            inner: self.inner.read(),
        }
    }

    /// Write access for bind.
    pub(crate) fn write(&self) -> RwLockWriteGuard<'_, Inner> {
        self.inner.write()
    }

    /// The placement thresholds filter and prioritize judge with, so that each node's summary can
    /// carry the utilization gate (judged once per change of the node rather than once per node and
    /// demand). Without them, or with others, nodes are judged by `carma_core` alone.
    pub fn use_placement_config(&self, cfg: &PlacementConfig) {
        let mut inner = self.inner.write();
        if inner.summary_config.as_ref() == Some(cfg) {
            return;
        }
        inner.summary_config = Some(cfg.clone());
        let Inner {
            nodes,
            ledger,
            summary_config,
            ..
        } = &mut *inner;
        for e in nodes.values_mut() {
            e.summary = summarize(&e.node.gpus, ledger, summary_config.as_ref());
        }
    }

    /// A Kubernetes `Node` exists.
    pub fn apply_node(&self, name: &str) {
        let mut inner = self.inner.write();
        let e = inner.entry(name);
        if !e.has_node {
            e.has_node = true;
            inner.bump(name);
        }
    }

    /// A Kubernetes `Node` is gone.
    pub fn delete_node(&self, name: &str) {
        let mut inner = self.inner.write();
        if let Some(e) = inner.nodes.get_mut(name) {
            e.has_node = false;
            inner.bump(name);
        }
        inner.drop_if_empty(name);
    }

    /// Keep only the `Node`s named in `names` (after a re-list).
    pub fn retain_nodes(&self, names: &HashSet<String>) {
        let gone: Vec<String> = {
            let inner = self.inner.read();
            inner
                .nodes
                .iter()
                .filter(|(n, e)| e.has_node && !names.contains(*n))
                .map(|(n, _)| n.clone())
                .collect()
        };
        for n in gone {
            self.delete_node(&n);
        }
    }

    /// A `GpuNode` was published or updated: new telemetry, and the pods whose
    /// memory now shows leave the in-flight set. Its telemetry ages from now.
    pub fn apply_gpu_node(&self, gpu_node: &GpuNode) {
        self.apply_gpu_node_observed(gpu_node, Some(now_ms()));
    }

    /// As [`Self::apply_gpu_node`], with the local time the publication was observed, or `None`
    /// for telemetry that never ages (a static snapshot).
    ///
    /// Staleness is judged on this clock, never on the `updatedAt` the device plugin wrote with
    /// its own: a publication is fresh when it is first seen (a new `updatedAt`), as the node
    /// lifecycle controller judges kubelet heartbeats, so clock skew between nodes cannot make a
    /// live node stale or a dead one fresh.
    pub fn apply_gpu_node_observed(&self, gpu_node: &GpuNode, observed_at: Option<Millis>) {
        let mut core = gpu_node.to_core();
        let published = gpu_node.status.as_ref().and_then(|s| s.updated_at.clone());
        let observed: HashSet<String> = gpu_node
            .status
            .iter()
            .flat_map(|s| &s.gpus)
            .flat_map(|g| &g.pods)
            .filter(|p| p.observed_mib.is_some() && !p.uid.is_empty())
            .map(|p| p.uid.clone())
            .collect();
        let mut inner = self.inner.write();
        for uid in &observed {
            let newly = inner.ledger.get(uid).is_some_and(|r| !r.visible);
            if newly
                && inner.ledger.confirm(uid)
                && let Some(r) = inner.ledger.get(uid).cloned()
            {
                inner.touch(&r);
            }
        }
        let name = core.name.clone();
        let old: Vec<String> = inner
            .nodes
            .get(&name)
            .map(|e| e.node.gpus.iter().map(|g| g.uuid.clone()).collect())
            .unwrap_or_default();
        for uuid in old {
            inner.disown(&uuid, &name);
        }
        for g in &core.gpus {
            let owners = inner.gpu_owner.entry(g.uuid.clone()).or_default();
            if !owners.contains(&name) {
                owners.push(name.clone());
            }
        }
        let e = inner.entry(&name);
        // A re-list delivers the same publication again: it keeps its first observation time.
        let telemetry_at = match e.node.gpus.first() {
            Some(g) if e.published.is_some() && e.published == published => g.telemetry_at,
            _ => observed_at,
        };
        for g in &mut core.gpus {
            g.telemetry_at = telemetry_at;
        }
        // Power, energy and the publication time change every publication without changing
        // what placement reads; the observation time does (staleness), so a new publication
        // counts as a change.
        let changed = !e.has_gpu_node || e.node != core || e.observed != observed;
        e.node = core;
        e.has_gpu_node = true;
        e.observed = observed;
        e.published = published;
        if changed {
            inner.bump(&name);
        }
    }

    /// A `GpuNode` is gone: the node has no carma GPUs any more.
    pub fn delete_gpu_node(&self, name: &str) {
        let mut inner = self.inner.write();
        let Some(e) = inner.nodes.get_mut(name) else {
            return;
        };
        e.has_gpu_node = false;
        let gpus = std::mem::take(&mut e.node.gpus);
        e.observed.clear();
        for g in gpus {
            inner.disown(&g.uuid, name);
        }
        inner.bump(name);
        inner.drop_if_empty(name);
    }

    /// Keep only the `GpuNode`s named in `names` (after a re-list).
    pub fn retain_gpu_nodes(&self, names: &HashSet<String>) {
        let gone: Vec<String> = {
            let inner = self.inner.read();
            inner
                .nodes
                .iter()
                .filter(|(n, e)| e.has_gpu_node && !names.contains(*n))
                .map(|(n, _)| n.clone())
                .collect()
        };
        for n in gone {
            self.delete_gpu_node(&n);
        }
    }

    /// A pod was seen. A pod bound to a node with carma's assignment annotations
    /// holds its GPUs (this is how the ledger is rebuilt after a restart); a
    /// pod that has terminated frees them. Returns whether the ledger changed.
    pub fn apply_pod(&self, pod: &Pod) -> bool {
        let Some(uid) = pod.metadata.uid.as_deref() else {
            return false;
        };
        let phase = pod.status.as_ref().and_then(|s| s.phase.as_deref());
        let allocated = pod
            .metadata
            .annotations
            .as_ref()
            .and_then(|a| a.get(carma_api::names::ANNOTATION_ALLOCATED))
            .is_some_and(|v| v.trim() == "true");
        if allocated || matches!(phase, Some("Running" | "Succeeded" | "Failed")) {
            self.handoff.admitted(uid);
        }
        if matches!(phase, Some("Succeeded" | "Failed")) {
            return self.release_pod(uid);
        }
        let Some(node) = pod.spec.as_ref().and_then(|s| s.node_name.as_deref()) else {
            // Not bound yet: a bind in progress books it itself.
            return false;
        };
        let empty = Default::default();
        let annotations = pod.metadata.annotations.as_ref().unwrap_or(&empty);
        let assignment = match Assignment::from_annotations(annotations) {
            Ok(Some(a)) => a,
            Ok(None) => return false,
            Err(e) => {
                tracing::warn!(pod = %pod_key(pod), error = %e, "ignoring a pod with a broken carma assignment");
                return false;
            }
        };
        if self.inner.read().ledger.get(uid).is_some() {
            return false;
        }
        if let Some(assigned) = annotations.get(carma_api::names::ANNOTATION_ASSIGNED_NODE)
            && assigned != node
        {
            tracing::warn!(
                pod = %pod_key(pod),
                assigned_node = %assigned,
                node,
                "pod is bound to another node than carma assigned; booking its GPUs on the bound node"
            );
        }
        // As bind booked it: from the pod's own annotations (1 when unknown). Parsed before the
        // write lock is taken.
        let expected_sm_activity = carma_core::placement::pack::booked(
            PodRequest::from_annotations(annotations)
                .ok()
                .as_ref()
                .and_then(crate::decision::expected_sm_activity),
        );
        let mut inner = self.inner.write();
        if inner.ledger.get(uid).is_some() {
            return false;
        }
        let visible = inner
            .nodes
            .get(node)
            .is_some_and(|e| e.observed.contains(uid));
        let record = PlacementRecord {
            pod: uid.to_string(),
            node: node.to_string(),
            gpus: assignment.gpus,
            reserved_mib: assignment.estimate.mib,
            exclusive: assignment.exclusive,
            assigned_at: u64::try_from(assignment.assigned_at.timestamp_millis()).unwrap_or(0),
            visible,
            expected_sm_activity,
        };
        tracing::debug!(pod = %pod_key(pod), node, visible, "pod holds GPUs");
        inner.ledger.insert_unchecked(record.clone());
        inner.touch(&record);
        true
    }

    /// A pod is gone (deleted or terminated): its GPUs are free of it.
    pub fn release_pod(&self, uid: &str) -> bool {
        self.handoff.admitted(uid);
        if self.inner.read().ledger.get(uid).is_none() {
            return false;
        }
        self.inner.write().unbook(uid)
    }

    /// Release every placement whose pod is not in `uids` and for which
    /// `keep(uid)` is false (after a re-list of pods).
    pub fn retain_pods(&self, uids: &HashSet<String>, keep: impl Fn(&str) -> bool) {
        let mut inner = self.inner.write();
        let gone: Vec<String> = inner
            .ledger
            .records()
            .filter(|r| !uids.contains(&r.pod) && !keep(&r.pod))
            .map(|r| r.pod.clone())
            .collect();
        for uid in gone {
            inner.unbook(&uid);
        }
    }

    /// Number of placements not yet visible in telemetry.
    pub fn in_flight(&self) -> usize {
        self.inner.read().ledger.in_flight_count()
    }

    /// A copy of the ledger (tests and diagnostics).
    pub fn ledger_snapshot(&self) -> Ledger {
        self.inner.read().ledger.clone()
    }
}

impl Inner {
    /// The entry of `name`, created (with a slot) when missing.
    fn entry(&mut self, name: &str) -> &mut NodeEntry {
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
    fn bump(&mut self, name: &str) {
        if let Some(e) = self.nodes.get_mut(name) {
            self.next_generation += 1;
            e.generation = self.next_generation;
            e.summary = summarize(&e.node.gpus, &self.ledger, self.summary_config.as_ref());
        }
    }

    /// `name` no longer publishes GPU `uuid`.
    fn disown(&mut self, uuid: &str, name: &str) {
        if let Some(owners) = self.gpu_owner.get_mut(uuid) {
            owners.retain(|n| n != name);
            if owners.is_empty() {
                self.gpu_owner.remove(uuid);
            }
        }
    }

    /// A record changed (called after the ledger changed): every node holding one of its GPUs,
    /// and its node.
    fn touch(&mut self, record: &PlacementRecord) {
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

    fn drop_if_empty(&mut self, name: &str) {
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

    /// The node's GPUs, when carma may use them.
    pub fn node(&self, name: &str) -> Option<&Node> {
        self.nodes.get(name).filter(|e| e.usable()).map(|e| &e.node)
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

/// A read guard over the cluster state.
#[derive(Debug)]
pub struct View<'a> {
    inner: RwLockReadGuard<'a, Inner>,
}

impl std::ops::Deref for View<'_> {
    type Target = Inner;
    fn deref(&self) -> &Inner {
        &self.inner
    }
}
