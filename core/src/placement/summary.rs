//! What placement reads of one GPU, taken once: its telemetry and the ledger's records on it under
//! one [`PlacementConfig`] — a [`GpuSummary`]. Every sharing rule, the policies' order and the
//! collocation score are judged on summaries (see `judge.rs`), by [`super::place_on_node`]
//! and by [`super::quick_score`], the allocation-free answer for callers that keep summaries up to
//! date (the extender refreshes a node's summaries on
//! every change of the node or of the ledger records on its GPUs, and judges thousands of nodes per
//! new demand from them).

use crate::Millis;
use crate::config::PlacementConfig;
use crate::gate::{gate_rule_passes, stale_deadline};
use crate::ledger::Ledger;
use crate::model::Gpu;

/// One GPU as placement sees it under one config (the one it was built with).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct GpuSummary {
    /// Memory usable for a new pod: telemetry free minus the reserve minus in-flight reservations.
    pub usable_mib: u64,
    /// Reservations of the pods on it.
    pub reserved_mib: u64,
    /// Total memory.
    pub total_mib: u64,
    /// The warm-up lock holds while `now` is below this (the latest end of a running warm-up of
    /// a pod not yet visible in telemetry); 0: no lock.
    pub lock_until: Millis,
    /// From this time on the telemetry is stale; `Millis::MAX`: never.
    pub stale_from: Millis,
    /// SM activity risk score.
    pub sm_activity: Option<f64>,
    /// Sum of the expected SM activity booked with the pods on it ([`Ledger::expected_sm_activity`]).
    pub booked_sm_activity: f64,
    /// The expected SM activity booked with each pod on it; filled only when
    /// `pack` judges busy GPUs by their predicted throughput
    /// ([`PlacementConfig::pack_gain`]), empty otherwise.
    pub booked_activities: Vec<f64>,
    /// GPU index.
    pub index: u32,
    /// Compute processes in telemetry.
    pub processes: u32,
    /// Pods placed on it.
    pub pods: u32,
    /// Replicas advertised; `u32::MAX`: no limit.
    pub max_pods: u32,
    /// Healthy.
    pub healthy: bool,
    /// Whether a pod holds it exclusively.
    pub exclusive_held: bool,
    /// Whether the utilization gate's rule passes it (staleness aside: see `stale_from`).
    pub gate_open: bool,
}

impl GpuSummary {
    /// The summary of `gpu` with the records of `ledger`, under `cfg`.
    pub fn of(gpu: &Gpu, ledger: &Ledger, cfg: &PlacementConfig) -> Self {
        let uuid = &gpu.uuid;
        let records = ledger.on_gpu(uuid);
        GpuSummary {
            usable_mib: super::usable_mib(gpu, ledger, cfg),
            reserved_mib: ledger.reserved_mib(uuid),
            total_mib: gpu.memory_total_mib,
            lock_until: records
                .iter()
                .filter(|r| !r.visible)
                .map(|r| r.assigned_at.saturating_add(cfg.warmup_ms))
                .max()
                .unwrap_or(0),
            stale_from: stale_deadline(gpu, cfg).unwrap_or(Millis::MAX),
            sm_activity: gpu.sm_activity,
            booked_sm_activity: ledger.expected_sm_activity(uuid),
            booked_activities: if cfg.pack_gain.is_some() {
                records
                    .iter()
                    .map(|r| r.expected_sm_activity.clamp(0.0, 1.0))
                    .collect()
            } else {
                Vec::new()
            },
            index: gpu.index,
            processes: gpu.processes,
            pods: u32::try_from(ledger.pods_on(uuid)).unwrap_or(u32::MAX),
            max_pods: gpu.max_pods.unwrap_or(u32::MAX),
            healthy: gpu.healthy,
            exclusive_held: records.iter().any(|r| r.exclusive),
            gate_open: gate_rule_passes(gpu, cfg).is_ok(),
        }
    }

    /// Idle: healthy, no pod placed, no compute process. Exclusive-first takes idle GPUs.
    pub fn is_idle(&self) -> bool {
        idle(self.healthy, self.processes, self.pods as usize)
    }
}

/// The exclusive-first rule's idle GPU: healthy, no compute process, no pod placed.
pub(super) fn idle(healthy: bool, processes: u32, pods: usize) -> bool {
    healthy && processes == 0 && pods == 0
}

/// The summaries of `gpus` in the order placement visits them: by index.
pub fn summarize(gpus: &[Gpu], ledger: &Ledger, cfg: &PlacementConfig) -> Vec<GpuSummary> {
    let mut out: Vec<GpuSummary> = gpus
        .iter()
        .map(|g| GpuSummary::of(g, ledger, cfg))
        .collect();
    out.sort_by_key(|s| s.index);
    out
}

/// A GPU that passes every sharing rule, with what the policies order and score by.
#[derive(Debug, Clone, Copy)]
pub(super) struct Fit<'a> {
    /// Position in the summaries (index order).
    pub(super) at: usize,
    pub(super) gpu: &'a GpuSummary,
    pub(super) need_mib: u64,
}

/// When an answer of [`super::place_on_node`] can change by time alone.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct VerdictExpiry {
    /// The earliest warm-up lock running now lifts.
    pub lock_lifts_at: Option<Millis>,
    /// The earliest fresh telemetry turns stale.
    pub stale_at: Option<Millis>,
}

impl VerdictExpiry {
    /// The earlier of the two.
    pub fn earliest(&self) -> Option<Millis> {
        match (self.lock_lifts_at, self.stale_at) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }
}

/// The expiry of any answer judged from `gpus` at `now`: until then the answer holds while the
/// node, the ledger records on its GPUs and the demand stay the same.
pub fn expiry_of(gpus: &[GpuSummary], now: Millis) -> VerdictExpiry {
    VerdictExpiry {
        lock_lifts_at: gpus.iter().map(|s| s.lock_until).filter(|&t| t > now).min(),
        stale_at: gpus
            .iter()
            .map(|s| s.stale_from)
            .filter(|&t| t > now && t < Millis::MAX)
            .min(),
    }
}
