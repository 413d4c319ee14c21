//! What placement reads of one GPU, taken once: its telemetry and the ledger's records on it under
//! one [`PlacementConfig`] — a [`GpuSummary`]. Every sharing rule, the policies' order and the
//! collocation score are judged on summaries, by [`super::place_on_node`] (which builds them as it
//! goes and turns a failed rule into its reason) and by [`quick_score`], the allocation-free
//! answer for callers that keep summaries up to date (the extender refreshes a node's summaries on
//! every change of the node or of the ledger records on its GPUs, and judges thousands of nodes per
//! new demand from them).

use crate::Millis;
use crate::config::PlacementConfig;
use crate::gate::{gate_rule_passes, stale_deadline};
use crate::ledger::Ledger;
use crate::model::{Demand, Gpu, Policy, Reservation};

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

/// The first sharing rule a GPU fails, in the order they are checked.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum SharedFailure {
    /// The reservation fills the GPU.
    NeedsWhole,
    Unhealthy,
    ExclusivelyHeld,
    /// As many pods as replicas.
    ReplicasTaken,
    WarmUpLock,
    InsufficientMemory,
    OverReserved,
    /// Stale telemetry or the gate's rule.
    Gate,
    /// `pack`: the pod's expected activity does not fit under the cap beside the GPU's load.
    ActivityCap,
}

/// A GPU that passes every sharing rule, with what the policies order and score by.
#[derive(Debug, Clone, Copy)]
pub(super) struct Fit<'a> {
    /// Position in the summaries (index order).
    pub(super) at: usize,
    pub(super) gpu: &'a GpuSummary,
    pub(super) need_mib: u64,
}

/// Every rule for sharing the GPU `s` (at position `at`) with `demand`, in CARMA's order:
/// whole-GPU reservations, health, exclusive holders, replicas (kubelet admits one pod per
/// replica, whatever the policy), the warm-up lock; then, for the policies that check them, the
/// memory test (with margin when the reservation is an estimate), reservations within total memory
/// (when honoured) and the utilization gate on fresh telemetry.
pub(super) fn judge_shared<'a>(
    at: usize,
    s: &'a GpuSummary,
    demand: &Demand,
    cfg: &PlacementConfig,
    now: Millis,
) -> Result<Fit<'a>, SharedFailure> {
    if matches!(demand.reservation, Reservation::Mib(m) if m >= s.total_mib) {
        return Err(SharedFailure::NeedsWhole);
    }
    if !s.healthy {
        return Err(SharedFailure::Unhealthy);
    }
    if s.exclusive_held {
        return Err(SharedFailure::ExclusivelyHeld);
    }
    if s.pods >= s.max_pods {
        return Err(SharedFailure::ReplicasTaken);
    }
    if now < s.lock_until {
        return Err(SharedFailure::WarmUpLock);
    }
    let need_mib = demand
        .reservation
        .booked_mib(s.total_mib, cfg.min_free_without_estimate_mib);
    let fit = Fit {
        at,
        gpu: s,
        need_mib,
    };
    if !demand.policy.checks_memory_and_gate() {
        return Ok(fit);
    }
    let (need_test, margin) = memory_test(demand, need_mib, cfg);
    if s.usable_mib < need_test.saturating_add(margin) {
        return Err(SharedFailure::InsufficientMemory);
    }
    if cfg.honor_reservations && s.reserved_mib.saturating_add(need_mib) > s.total_mib {
        return Err(SharedFailure::OverReserved);
    }
    // The gate judges sharing a busy GPU. An idle GPU is `pack`'s idle tier, taken as
    // exclusive-first takes idle GPUs: whatever its telemetry says.
    let idle_for_pack = demand.policy == Policy::Pack && s.is_idle();
    if !idle_for_pack && (now >= s.stale_from || !s.gate_open) {
        return Err(SharedFailure::Gate);
    }
    if demand.policy == Policy::Pack && !super::pack::fits_beside(s, demand, cfg) {
        return Err(SharedFailure::ActivityCap);
    }
    Ok(fit)
}

/// What the memory test compares usable memory with: an estimate with the margin, a default
/// booking without.
pub(super) fn memory_test(demand: &Demand, need_mib: u64, cfg: &PlacementConfig) -> (u64, u64) {
    match demand.reservation {
        Reservation::Mib(m) => (m, cfg.memory_margin_mib),
        Reservation::Unknown | Reservation::WholeGpu => (need_mib, 0),
    }
}

/// Stable sort of candidates by the policy's key (ties keep index order).
pub(super) fn order(
    fits: &mut [Fit<'_>],
    demand: &Demand,
    cfg: &PlacementConfig,
    rr_cursor: usize,
    gpu_count: usize,
) {
    match demand.policy {
        Policy::Pack => super::pack::order(fits, demand, cfg),
        Policy::Ff | Policy::Exclusive => {}
        Policy::Bf => fits.sort_by_key(|f| f.gpu.usable_mib),
        Policy::Magm => fits.sort_by_key(|f| std::cmp::Reverse(f.gpu.usable_mib)),
        Policy::Lug => fits.sort_by(|a, b| {
            let x = a.gpu.sm_activity.unwrap_or(0.0);
            let y = b.gpu.sm_activity.unwrap_or(0.0);
            x.total_cmp(&y)
        }),
        Policy::Rr => {
            let n = gpu_count.max(1);
            let start = rr_cursor % n;
            fits.sort_by_key(|f| (f.gpu.index as usize + n - start) % n);
        }
    }
}

/// The policy's preference for the chosen GPUs, mapped to 0..9 (`pack`: 0..10, see
/// [`super::pack`]).
pub(super) fn collocation_score(chosen: &[Fit<'_>], demand: &Demand, cfg: &PlacementConfig) -> u8 {
    let scale = |x: f64| (x.clamp(0.0, 1.0) * 9.0).round() as u8;
    let left_fraction = |f: &Fit<'_>| {
        let after = f.gpu.usable_mib.saturating_sub(f.need_mib) as f64;
        after / f.gpu.total_mib.max(1) as f64
    };
    match demand.policy {
        Policy::Pack => super::pack::score(chosen, demand, cfg),
        Policy::Exclusive => 0,
        Policy::Ff => {
            let first = chosen.iter().map(|f| f.gpu.index).min().unwrap_or(0);
            9u8.saturating_sub(first.min(9) as u8)
        }
        Policy::Bf => {
            let tightest = chosen.iter().map(left_fraction).fold(1.0, f64::min);
            scale(1.0 - tightest)
        }
        Policy::Magm => {
            let least = chosen.iter().map(left_fraction).fold(1.0, f64::min);
            scale(least)
        }
        Policy::Lug => {
            let busiest = chosen
                .iter()
                .map(|f| f.gpu.sm_activity.unwrap_or(1.0))
                .fold(0.0, f64::max);
            scale(1.0 - busiest)
        }
        Policy::Rr => {
            let most = chosen.iter().map(|f| f.gpu.pods).max().unwrap_or(0);
            9u8.saturating_sub(most.min(9) as u8)
        }
    }
}

/// GPUs per node judged without a heap allocation by [`quick_score`].
const INLINE_GPUS: usize = 16;

/// [`super::place_on_node`]'s score for a node whose GPUs are `gpus` (its summaries under `cfg`,
/// in index order, every GPU of the node), when the node can take `demand`; `None` when it cannot
/// (`place_on_node` then gives the reason). Allocates nothing for nodes of up to 16 GPUs.
pub fn quick_score(
    gpus: &[GpuSummary],
    demand: &Demand,
    cfg: &PlacementConfig,
    now: Millis,
    rr_cursor: usize,
) -> Option<u8> {
    let wanted = demand.gpus.max(1) as usize;
    if gpus.len() < wanted {
        return None;
    }
    let idle = gpus.iter().filter(|s| s.is_idle()).count();
    let mut heap = Vec::new();
    let mut inline = [Fit {
        at: 0,
        gpu: gpus.first()?,
        need_mib: 0,
    }; INLINE_GPUS];
    let (heap, inline) = (&mut heap, &mut inline);
    let share = move || {
        // Moved out whole: the fits borrow the buffers past this call.
        let (heap, inline) = (heap, inline);
        let judged = gpus
            .iter()
            .enumerate()
            .filter_map(|(at, s)| judge_shared(at, s, demand, cfg, now).ok());
        let fits: &mut [Fit<'_>] = if gpus.len() <= INLINE_GPUS {
            let mut n = 0;
            for fit in judged {
                inline[n] = fit;
                n += 1;
            }
            &mut inline[..n]
        } else {
            heap.extend(judged);
            heap
        };
        (fits.len(), fits)
    };
    let totals = gpus.iter().map(|s| s.total_mib);
    match super::exclusive_first(demand, wanted, idle, totals, share) {
        super::Route::Idle(score) => Some(score),
        super::Route::Share(fits) => {
            order(fits, demand, cfg, rr_cursor, gpus.len());
            Some(collocation_score(&fits[..wanted], demand, cfg))
        }
        super::Route::NotIdle | super::Route::RecoveryFirst | super::Route::TooFewFits(_) => None,
    }
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
