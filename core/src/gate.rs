//! The utilization gate for the activity metrics a GPU's telemetry source really delivers.
//!
//! CARMA's gate excludes a GPU from sharing when its SM activity risk is at or above the cap and
//! either its SM occupancy or its DRAM activity risk is at or above theirs. Not every source has all
//! three metrics:
//!
//! | source | metrics | rule |
//! |---|---|---|
//! | DCGM profiling fields (1002, 1003, 1005) | SM activity, SM occupancy, DRAM activity | `smact-smocc-drama` |
//! | NVML GPM (Hopper and newer) | SM activity, SM occupancy, DRAM bandwidth | `smact-smocc-drama` |
//! | NVML without GPM (Volta, Ampere, Ada, Turing) | kernel-time utilization, memory-controller utilization | `smact-drama` |
//! | nothing usable (e.g. dcgm-exporter without the profiling counters) | — | `none` |
//!
//! Each rule keeps CARMA's shape — "busy SMs *and* evidence of saturation" — over the metrics that
//! exist: the secondary condition is the OR of the secondary metrics the source has, and a source
//! with SM activity alone is gated on SM activity alone. Without any SM activity figure nothing
//! can be judged, and the GPU takes exclusive pods only (reported as such, never silently).
//!
//! On NVML without GPM the "SM activity" is the fraction of time any kernel ran, which is never
//! lower than DCGM's SM activity for the same load, so `smact-drama` excludes a GPU at least as
//! early on the first condition; dropping occupancy from the second condition makes it more
//! permissive there. Operators see which rule each GPU is under in `GpuNode.status` and in
//! `carma_gpu_sharing_allowed{rule}`.
//!
//! A source change never mixes metrics: the device plugin publishes the rule of the source that
//! delivered the latest sample and only the risk scores of windows filled by that source.

use crate::Millis;
use crate::config::PlacementConfig;
use crate::model::Gpu;
use crate::reason::GpuRejection;

pub use crate::gate_rule::{GateRule, GateRuleParseError};

/// Whether `gpu`'s telemetry lets it take another shared pod: fresh enough, judged by its rule,
/// and below the caps. Memory, replicas and locks are placement's business, not the gate's.
pub fn utilization_gate(gpu: &Gpu, cfg: &PlacementConfig, now: Millis) -> Result<(), GpuRejection> {
    let uuid = || gpu.uuid.clone();
    if let (Some(at), Some(max_age)) = (gpu.telemetry_at, cfg.max_telemetry_age_ms)
        && now.saturating_sub(at) > max_age
    {
        return Err(GpuRejection::TelemetryStale {
            uuid: uuid(),
            index: gpu.index,
            age_s: now.saturating_sub(at) as f64 / 1000.0,
            max_age_s: max_age as f64 / 1000.0,
        });
    }
    gate_rule_passes(gpu, cfg)
}

/// The utilization gate without the staleness test: what the GPU's last telemetry says under its
/// rule, whatever its age.
pub fn gate_rule_passes(gpu: &Gpu, cfg: &PlacementConfig) -> Result<(), GpuRejection> {
    let uuid = || gpu.uuid.clone();
    let rule = gpu.gate_rule;
    if rule == GateRule::NoActivity {
        return Err(GpuRejection::NoActivityTelemetry {
            uuid: uuid(),
            index: gpu.index,
        });
    }
    let warming = || GpuRejection::TelemetryWarmingUp {
        uuid: uuid(),
        index: gpu.index,
        gate: rule,
    };
    let smact = gpu.sm_activity.ok_or_else(warming)?;
    let smocc = if rule.reads_occupancy() {
        Some(gpu.sm_occupancy.ok_or_else(warming)?)
    } else {
        None
    };
    let drama = if rule.reads_dram() {
        Some(gpu.dram_activity.ok_or_else(warming)?)
    } else {
        None
    };
    let saturated = match (smocc, drama) {
        (None, None) => true,
        _ => {
            smocc.is_some_and(|v| v >= cfg.sm_occupancy_cap)
                || drama.is_some_and(|v| v >= cfg.dram_activity_cap)
        }
    };
    if smact >= cfg.sm_activity_cap && saturated {
        return Err(GpuRejection::UtilizationGate {
            uuid: uuid(),
            index: gpu.index,
            gate: rule,
            sm_activity: smact,
            sm_occupancy: smocc,
            dram_activity: drama,
            sm_activity_cap: cfg.sm_activity_cap,
            sm_occupancy_cap: cfg.sm_occupancy_cap,
            dram_activity_cap: cfg.dram_activity_cap,
        });
    }
    Ok(())
}

/// The earliest time at which `gpu`'s telemetry turns stale, when it is fresh now and can.
pub fn stale_at(gpu: &Gpu, cfg: &PlacementConfig, now: Millis) -> Option<Millis> {
    stale_deadline(gpu, cfg).filter(|&deadline| deadline > now)
}

/// From when `gpu`'s telemetry is stale (the first millisecond past the maximum age); `None`: it
/// never turns stale (no publication time, or no maximum age).
pub fn stale_deadline(gpu: &Gpu, cfg: &PlacementConfig) -> Option<Millis> {
    let at = gpu.telemetry_at?;
    let max_age = cfg.max_telemetry_age_ms?;
    Some(at.saturating_add(max_age).saturating_add(1))
}

/// The gate for a GPU it has already closed: the GPU reopens only once its readings are `margin`
/// below every cap, so a GPU hovering at a cap does not flip between closed and open on every
/// sample. `margin` 0 is [`gate_rule_passes`].
pub fn gate_rule_reopens(
    gpu: &Gpu,
    cfg: &PlacementConfig,
    margin: f64,
) -> Result<(), GpuRejection> {
    let lowered = PlacementConfig {
        sm_activity_cap: (cfg.sm_activity_cap - margin).max(0.0),
        sm_occupancy_cap: (cfg.sm_occupancy_cap - margin).max(0.0),
        dram_activity_cap: (cfg.dram_activity_cap - margin).max(0.0),
        ..cfg.clone()
    };
    gate_rule_passes(gpu, &lowered)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn busy(sm: f64, occ: f64) -> Gpu {
        let mut g = Gpu::idle("GPU-1", 0, 0);
        g.sm_activity = Some(sm);
        g.sm_occupancy = Some(occ);
        g.dram_activity = Some(0.0);
        g
    }

    #[test]
    fn a_closed_gate_reopens_only_below_the_caps_minus_the_margin() {
        let cfg = PlacementConfig::default();
        let just_under = busy(cfg.sm_activity_cap - 0.02, cfg.sm_occupancy_cap - 0.02);
        assert!(
            gate_rule_passes(&just_under, &cfg).is_ok(),
            "open for a GPU that was open"
        );
        assert!(
            gate_rule_reopens(&just_under, &cfg, 0.05).is_err(),
            "still closed inside the margin"
        );
        let well_under = busy(cfg.sm_activity_cap - 0.06, cfg.sm_occupancy_cap - 0.06);
        assert!(gate_rule_reopens(&well_under, &cfg, 0.05).is_ok());
        assert_eq!(
            gate_rule_reopens(&just_under, &cfg, 0.0).is_ok(),
            gate_rule_passes(&just_under, &cfg).is_ok()
        );
    }
}
