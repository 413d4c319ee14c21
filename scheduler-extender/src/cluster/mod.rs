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
//! the node a new *generation*; [`crate::node_verdicts`] reuses a verdict only while
//! the node's generation is unchanged. The same change refreshes the node's
//! `GpuSummary`s (`carma_core::placement`) — what placement reads of the ledger for each of its GPUs — so
//! that judging a node for a new demand needs no ledger lookup.
//!
//! * `feed` — what the watchers and a snapshot deliver: Nodes, `GpuNode`s, pods.
//! * `inner` — what is behind the lock: node entries, generations, summaries, the ledger; where a
//!   demand would go and the booking of a placement.

mod feed;
mod inner;

use std::sync::atomic::{AtomicBool, Ordering};

use carma_core::{Ledger, Millis, PlacementConfig};
use parking_lot::{RwLock, RwLockReadGuard, RwLockWriteGuard};

pub(crate) use feed::admission_seen;
pub use inner::Inner;
pub(crate) use inner::NodeEntry;
use inner::summarize;

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

    /// Number of placements not yet visible in telemetry.
    pub fn in_flight(&self) -> usize {
        self.inner.read().ledger.in_flight_count()
    }

    /// A copy of the ledger (tests and diagnostics).
    pub fn ledger_snapshot(&self) -> Ledger {
        self.inner.read().ledger.clone()
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
