//! `pack`, carma's own policy (not one of CARMA's): complementary packing.
//!
//! CARMA's policies give every pod idle GPUs first and order shared GPUs by one figure (index,
//! memory or SM activity); the gate then reads telemetry that shows a new pod's activity only after
//! its warm-up and sample window, so two busy jobs can land on one GPU and slow each other down
//! until both end. `pack` uses what carma also knows: each pod's *expected* SM activity (from its
//! model class or the `carma.io/sm-activity` annotation) and the activity booked with the pods
//! already on a GPU. A GPU's load is the larger of its measured SM activity risk score and the sum
//! booked there (telemetry raises it when a pod keeps the GPU busier than expected; it never falls
//! below the booked sum). Beyond every other sharing rule, a busy GPU takes the pod only while load
//! plus the pod's expected activity stays within the crowding limit
//! ([`PlacementConfig::pack_crowding_limit`], 1.3 by default: the expected activities are coarse
//! priors, so the limit sits a little past full activity); otherwise the pod waits — crowded GPUs
//! stay crowded until their jobs end, as nothing migrates — until it has
//! waited [`PlacementConfig::pack_aging_ms`], after which it may crowd any busy GPU. The
//! candidates, in order:
//!
//! 1. **complementary** busy GPUs — load plus the pod within the gate's cap; the tightest fit first
//!    (highest combined activity, then least usable memory), so that other GPUs stay idle;
//! 2. **idle** GPUs, in index order — kept for pods that cannot share (and taken whole by pods
//!    that must not share, exactly as exclusive-first);
//! 3. **crowded** busy GPUs — past the cap; the least loaded first.
//!
//! A pod of unknown activity counts as filling its GPU: it takes idle GPUs, or crowds once aged.
//! Node scores rank the tiers across nodes: complementary 7..10 (tighter is higher), idle 6,
//! crowded 0..5 (less crowded is higher).
//!
//! Two options, off by default (docs/policy-under-time-slicing.md evaluates them):
//! [`PlacementConfig::pack_idle_first`] puts the idle tier first (idle 10, complementary 6..9);
//! [`PlacementConfig::pack_gain`] replaces the activity sums by the throughput a configured slowdown
//! model predicts the placement adds (`gain.rs`): complementary where it predicts free sharing,
//! crowded (highest gain first, scored 0..5 by gain) only where the gain reaches the least gain.

use super::summary::{Fit, GpuSummary};
use crate::config::PlacementConfig;
use crate::model::{Demand, Policy, Reservation};

/// Score of a node that gives a `pack` pod idle GPUs.
pub const IDLE_SCORE: u8 = 6;

/// Expected activity of a demand whose activity is unknown: it fills a GPU.
const UNKNOWN_ACTIVITY: f64 = 1.0;

/// Slack for comparing sums of activities (thousandths are booked).
const EPSILON: f64 = 1e-9;

/// The demand's expected SM activity in thousandths, as `pack` reads it (0..1000; `None`:
/// unknown). Two demands with the same key are placed alike, so verdict caches key on it.
pub fn activity_key(demand: &Demand) -> Option<u16> {
    thousandths(demand.expected_sm_activity)
}

/// An expected activity in thousandths of the GPU (clamped to 0..1); `None` when unknown.
fn thousandths(expected: Option<f64>) -> Option<u16> {
    expected
        .filter(|a| a.is_finite())
        .map(|a| (a.clamp(0.0, 1.0) * 1000.0).round() as u16)
}

/// The expected SM activity `demand` books on each of its GPUs (to the thousandth).
pub fn booked_activity(demand: &Demand) -> f64 {
    booked(demand.expected_sm_activity)
}

/// What a pod of expected activity `expected` books (1 when unknown): also the figure a record
/// rebuilt from a running pod's annotations carries.
pub fn booked(expected: Option<f64>) -> f64 {
    thousandths(expected).map_or(UNKNOWN_ACTIVITY, |k| f64::from(k) / 1000.0)
}

/// Whether `demand` is placed by packing on a node whose GPUs have `totals_mib` memory; otherwise
/// (not `pack`, a pod that must not share or may take idle GPUs only, or a reservation that fills
/// a GPU) exclusive-first applies as for every policy.
pub(super) fn packs(demand: &Demand, mut totals_mib: impl Iterator<Item = u64>) -> bool {
    demand.policy == Policy::Pack
        && !demand.wants_exclusive()
        && !demand.idle_only
        && !totals_mib.any(|t| matches!(demand.reservation, Reservation::Mib(m) if m >= t))
}

/// The GPU's SM activity load: the larger of its measured risk score and the activity booked
/// with its pods.
pub(super) fn load(s: &GpuSummary) -> f64 {
    s.sm_activity.unwrap_or(0.0).max(s.booked_sm_activity)
}

/// The GPU's load with the pod on it.
fn combined(s: &GpuSummary, demand: &Demand) -> f64 {
    load(s) + booked_activity(demand)
}

/// Whether `demand` may join the GPU `s`: it is idle, or the pod's expected activity fits beside
/// its load under the cap — or, with [`PlacementConfig::pack_gain`], the placement adds at least
/// the least gain of throughput.
pub(super) fn fits_beside(s: &GpuSummary, demand: &Demand, cfg: &PlacementConfig) -> bool {
    s.is_idle()
        || aged(demand, cfg)
        || match (gain(s, demand, cfg), cfg.pack_gain) {
            (Some(g), Some(rule)) => g >= rule.min_gain - EPSILON,
            _ => combined(s, demand) <= crowding_limit(cfg) + EPSILON,
        }
}

/// The most combined SM activity `pack` lets a busy GPU reach for a pod that has not aged.
pub(super) fn crowding_limit(cfg: &PlacementConfig) -> f64 {
    cfg.sm_activity_cap.max(cfg.pack_crowding_limit)
}

/// Whether the pod has waited long enough to crowd any busy GPU that passes the other rules.
pub fn aged(demand: &Demand, cfg: &PlacementConfig) -> bool {
    demand.waited_ms >= cfg.pack_aging_ms
}

/// Measured SM activity beyond the booked sum by more than this counts as one more task (a process
/// or a pod busier than its prior) when the gain is predicted.
const UNBOOKED_MIN: f64 = 0.05;

/// The throughput the placement of `demand` on `s` adds under the configured slowdown model
/// ([`PlacementConfig::pack_gain`]): 1 on an idle GPU; `None` when no model is configured.
fn gain(s: &GpuSummary, demand: &Demand, cfg: &PlacementConfig) -> Option<f64> {
    let rule = cfg.pack_gain?;
    if s.is_idle() {
        return Some(1.0);
    }
    let mut before = s.booked_activities.clone();
    let booked: f64 = before.iter().sum();
    if let Some(measured) = s.sm_activity.filter(|m| *m > booked + UNBOOKED_MIN) {
        before.push(measured - booked);
    }
    Some(rule.model.gain(&before, booked_activity(demand)))
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Tier {
    Complementary,
    Idle,
    Crowded,
}

/// A tier's place in the order: complementary, idle, crowded; idle first with
/// [`PlacementConfig::pack_idle_first`].
fn rank(t: Tier, cfg: &PlacementConfig) -> u8 {
    match (t, cfg.pack_idle_first) {
        (Tier::Idle, true) => 0,
        (Tier::Complementary, true) => 1,
        (Tier::Complementary, false) => 0,
        (Tier::Idle, false) => 1,
        (Tier::Crowded, _) => 2,
    }
}

fn tier(s: &GpuSummary, demand: &Demand, cfg: &PlacementConfig) -> Tier {
    tier_given(s, demand, cfg, gain(s, demand, cfg))
}

/// [`tier`] with the placement's gain already predicted (`None` without a model).
fn tier_given(s: &GpuSummary, demand: &Demand, cfg: &PlacementConfig, gain: Option<f64>) -> Tier {
    if s.is_idle() {
        Tier::Idle
    } else if let Some(g) = gain {
        // Complementary: sharing the model predicts to cost nothing.
        if g >= 1.0 - crate::pack_gain::FREE {
            Tier::Complementary
        } else {
            Tier::Crowded
        }
    } else if combined(s, demand) <= cfg.sm_activity_cap + EPSILON {
        Tier::Complementary
    } else {
        Tier::Crowded
    }
}

/// Sort candidates (every one [`fits_beside`] its GPU) into the tiers, each in its own order
/// (stable: ties keep index order). Each candidate's tier, load and gain are worked out once,
/// not at every comparison (the gain runs the slowdown model).
pub(super) fn order(fits: &mut [Fit<'_>], demand: &Demand, cfg: &PlacementConfig) {
    let mut keyed: Vec<(Tier, f64, Option<f64>, Fit<'_>)> = fits
        .iter()
        .map(|f| {
            let g = gain(f.gpu, demand, cfg);
            (
                tier_given(f.gpu, demand, cfg, g),
                combined(f.gpu, demand),
                g,
                *f,
            )
        })
        .collect();
    keyed.sort_by(|(ta, ca, ga, a), (tb, cb, gb, b)| {
        rank(*ta, cfg).cmp(&rank(*tb, cfg)).then_with(|| match ta {
            Tier::Complementary => cb
                .total_cmp(ca)
                .then(a.gpu.usable_mib.cmp(&b.gpu.usable_mib)),
            Tier::Idle => std::cmp::Ordering::Equal,
            Tier::Crowded => match (ga, gb) {
                // The highest gain first.
                (Some(ga), Some(gb)) => gb.total_cmp(ga),
                _ => ca.total_cmp(cb),
            },
        })
    });
    for (slot, (_, _, _, f)) in fits.iter_mut().zip(keyed) {
        *slot = f;
    }
}

/// The node score of the chosen GPUs: their worst tier, refined within it. Idle first
/// ([`PlacementConfig::pack_idle_first`]) scores idle 10 and complementary 6..9.
pub(super) fn score(chosen: &[Fit<'_>], demand: &Demand, cfg: &PlacementConfig) -> u8 {
    let worst = chosen
        .iter()
        .map(|f| tier(f.gpu, demand, cfg))
        .max_by_key(|t| rank(*t, cfg))
        .unwrap_or(Tier::Idle);
    let cap = cfg.sm_activity_cap.max(EPSILON);
    let (idle, complementary_base) = if cfg.pack_idle_first {
        (10, 6)
    } else {
        (IDLE_SCORE, 7)
    };
    match worst {
        Tier::Complementary => {
            let tightest = chosen
                .iter()
                .map(|f| combined(f.gpu, demand))
                .fold(f64::INFINITY, f64::min);
            complementary_base + (3.0 * (tightest.min(cap) / cap).clamp(0.0, 1.0)).round() as u8
        }
        Tier::Idle => idle,
        Tier::Crowded if cfg.pack_gain.is_some() => {
            let least = chosen
                .iter()
                .filter_map(|f| gain(f.gpu, demand, cfg))
                .fold(1.0, f64::min);
            (5.0 * least.clamp(0.0, 1.0)).round() as u8
        }
        Tier::Crowded => {
            let excess = chosen
                .iter()
                .map(|f| combined(f.gpu, demand) - cap)
                .fold(0.0, f64::max);
            (5.0 * (1.0 - excess.clamp(0.0, 1.0))).round() as u8
        }
    }
}
