//! The extender's view of the cluster: GPU nodes with their telemetry, and the
//! ledger of pods placed on GPUs.
//!
//! Both sources feed this one state through the same functions: the kube
//! watchers ([`crate::kube_backend`]) and a static snapshot
//! ([`crate::snapshot`]). Filter and prioritize read it under a read lock and
//! never call the API server; bind books under the write lock.

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicBool, Ordering};

use carma_api::{Assignment, GpuNode};
use carma_core::{Demand, Ledger, Millis, Node, NodePlacement, NodeRejection, PlacementConfig};
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
}

/// One node as placement sees it.
#[derive(Debug, Clone)]
struct NodeEntry {
    /// The GPUs, from the node's `GpuNode` (empty when none was published).
    node: Node,
    /// Whether a `GpuNode` exists for it.
    has_gpu_node: bool,
    /// Whether the Kubernetes `Node` exists.
    has_node: bool,
    /// UIDs of pods whose memory the `GpuNode` shows (`observedMiB` set).
    observed: HashSet<String>,
    /// Where round robin starts on this node.
    rr_cursor: usize,
}

impl NodeEntry {
    fn new(name: &str) -> Self {
        Self {
            node: Node {
                name: name.to_string(),
                gpus: Vec::new(),
            },
            has_gpu_node: false,
            has_node: false,
            observed: HashSet::new(),
            rr_cursor: 0,
        }
    }

    fn usable(&self) -> bool {
        self.has_node && self.has_gpu_node
    }
}

/// Everything behind the lock.
#[derive(Debug, Default)]
pub struct Inner {
    nodes: HashMap<String, NodeEntry>,
    ledger: Ledger,
}

/// The shared cluster state.
#[derive(Debug, Default)]
pub struct ClusterState {
    inner: RwLock<Inner>,
    nodes_synced: AtomicBool,
    gpu_nodes_synced: AtomicBool,
    pods_synced: AtomicBool,
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

    /// A Kubernetes `Node` exists.
    pub fn apply_node(&self, name: &str) {
        let mut inner = self.inner.write();
        inner
            .nodes
            .entry(name.to_string())
            .or_insert_with(|| NodeEntry::new(name))
            .has_node = true;
    }

    /// A Kubernetes `Node` is gone.
    pub fn delete_node(&self, name: &str) {
        let mut inner = self.inner.write();
        if let Some(e) = inner.nodes.get_mut(name) {
            e.has_node = false;
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
    /// memory now shows leave the in-flight set.
    pub fn apply_gpu_node(&self, gpu_node: &GpuNode) {
        let core = gpu_node.to_core();
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
            inner.ledger.confirm(uid);
        }
        let name = core.name.clone();
        let entry = inner
            .nodes
            .entry(name.clone())
            .or_insert_with(|| NodeEntry::new(&name));
        entry.node = core;
        entry.has_gpu_node = true;
        entry.observed = observed;
    }

    /// A `GpuNode` is gone: the node has no carma GPUs any more.
    pub fn delete_gpu_node(&self, name: &str) {
        let mut inner = self.inner.write();
        if let Some(e) = inner.nodes.get_mut(name) {
            e.has_gpu_node = false;
            e.node.gpus.clear();
            e.observed.clear();
        }
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
        let mut inner = self.inner.write();
        if inner.ledger.get(uid).is_some() {
            return false;
        }
        let visible = inner
            .nodes
            .get(node)
            .is_some_and(|e| e.observed.contains(uid));
        let record = carma_core::PlacementRecord {
            pod: uid.to_string(),
            node: node.to_string(),
            gpus: assignment.gpus,
            reserved_mib: assignment.estimate.mib,
            exclusive: assignment.exclusive,
            assigned_at: u64::try_from(assignment.assigned_at.timestamp_millis()).unwrap_or(0),
            visible,
        };
        tracing::debug!(pod = %pod_key(pod), node, visible, "pod holds GPUs");
        inner.ledger.insert_unchecked(record);
        true
    }

    /// A pod is gone (deleted or terminated): its GPUs are free of it.
    pub fn release_pod(&self, uid: &str) -> bool {
        if self.inner.read().ledger.get(uid).is_none() {
            return false;
        }
        self.inner.write().ledger.release(uid).is_some()
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
            inner.ledger.release(&uid);
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
    fn drop_if_empty(&mut self, name: &str) {
        if self
            .nodes
            .get(name)
            .is_some_and(|e| !e.has_node && !e.has_gpu_node)
        {
            self.nodes.remove(name);
        }
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
            Some(e) if e.usable() => {
                carma_core::place_on_node(&e.node, &self.ledger, demand, cfg, now, e.rr_cursor)
            }
            _ => Err(NodeRejection::NoGpus {
                node: name.to_string(),
            }),
        }
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
        let record = carma_core::PlacementRecord {
            pod: uid.to_string(),
            node: placement.node.clone(),
            gpus: placement.gpus.clone(),
            reserved_mib: placement.reserved_mib,
            exclusive: placement.exclusive,
            assigned_at: now,
            visible: false,
        };
        let gpus = &entry.node.gpus;
        self.ledger.assume(
            record,
            |uuid| {
                gpus.iter()
                    .find(|g| g.uuid == uuid)
                    .map(|g| g.memory_total_mib)
            },
            cfg.warmup_ms,
            now,
        )?;
        if let Some(last) = placement.indices.iter().max() {
            entry.rr_cursor = *last as usize + 1;
        }
        Ok(())
    }

    /// Undo a booking whose writes failed.
    pub(crate) fn unbook(&mut self, uid: &str) {
        self.ledger.release(uid);
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
