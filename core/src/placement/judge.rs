//! The sharing rules judged on [`GpuSummary`]s: whether a GPU can take a demand beside what it
//! runs ([`judge_shared`]), the policies' order of the GPUs that can and their collocation score,
//! and [`quick_score`], the allocation-free node score for callers that keep summaries up to date.
//! [`super::place_on_node`] calls the same rules and turns a failed one into its reason.

use super::pack;
use super::summary::{Fit, GpuSummary};
use crate::Millis;
use crate::config::PlacementConfig;
use crate::model::{Demand, Policy, Reservation};

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
    if cfg.telemetry_memory_test && s.usable_mib < need_test.saturating_add(margin) {
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
    if demand.policy == Policy::Pack && !pack::fits_beside(s, demand, cfg) {
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
        Policy::Pack => pack::order(fits, demand, cfg),
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
        Policy::Pack => pack::score(chosen, demand, cfg),
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
