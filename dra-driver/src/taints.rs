//! Device taints from telemetry: the utilization gate, missing activity telemetry, stale
//! telemetry and GPU health, each a `NoSchedule` taint on the GPU's device.
//!
//! The gate is `carma_core::gate_rule_passes`, the extender's own function, on the risk scores of
//! the GPU layer's telemetry windows. `NoSchedule` keeps new claims off a device and leaves the
//! running ones alone: a busy GPU must not evict the jobs that make it busy, so `NoExecute` is
//! never used.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use carma_core::{GpuRejection, PlacementConfig};
use carma_gpu::sampling::GateCaps;
use carma_gpu::telemetry::{GpuView, Snapshot, gate_input};
use chrono::{DateTime, Utc};

pub use carma_api::dra::{
    EFFECT_NO_SCHEDULE, TAINT_NO_ACTIVITY_TELEMETRY, TAINT_TELEMETRY_STALE, TAINT_UNHEALTHY,
    TAINT_UTILIZATION_GATE,
};

/// The taint value while the activity windows are still filling.
pub const WINDOW_FILLING: &str = "window-filling";

/// One taint on a device (effect [`EFFECT_NO_SCHEDULE`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Taint {
    /// Key, one of the `TAINT_*` constants.
    pub key: &'static str,
    /// Value: a label value (at most 63 characters), when the key needs one.
    pub value: Option<String>,
}

impl Taint {
    fn new(key: &'static str, value: Option<&str>) -> Self {
        Self {
            key,
            value: value.map(str::to_string),
        }
    }
}

/// Decides each GPU's taints and remembers which GPUs are gated, for the reopening margin.
#[derive(Debug, Clone)]
pub struct Tainter {
    gate: PlacementConfig,
    reopen_margin: f64,
    stale_after: Duration,
    gated: BTreeSet<String>,
}

impl Tainter {
    /// Gate with the given caps; a gated GPU reopens only below every cap minus `reopen_margin`;
    /// a snapshot older than `stale_after` taints every GPU as stale.
    pub fn new(caps: GateCaps, reopen_margin: f64, stale_after: Duration) -> Self {
        let gate = PlacementConfig {
            sm_activity_cap: caps.sm_activity,
            sm_occupancy_cap: caps.sm_occupancy,
            dram_activity_cap: caps.dram_activity,
            ..PlacementConfig::default()
        };
        Self {
            gate,
            reopen_margin,
            stale_after,
            gated: BTreeSet::new(),
        }
    }

    /// The taints of every GPU of `snap` (by UUID) at `now`.
    pub fn taints(&mut self, snap: &Snapshot, now: DateTime<Utc>) -> BTreeMap<String, Vec<Taint>> {
        let age = now
            .signed_duration_since(snap.taken_at)
            .to_std()
            .unwrap_or_default();
        let stale = age > self.stale_after;
        let present: BTreeSet<&String> = snap.gpus.iter().map(|g| &g.sample.uuid).collect();
        self.gated.retain(|u| present.contains(u));
        snap.gpus
            .iter()
            .map(|g| {
                let taints = if !g.sample.healthy {
                    vec![Taint::new(TAINT_UNHEALTHY, None)]
                } else if stale {
                    vec![Taint::new(TAINT_TELEMETRY_STALE, None)]
                } else {
                    self.gate_taint(g).into_iter().collect()
                };
                (g.sample.uuid.clone(), taints)
            })
            .collect()
    }

    fn gate_taint(&mut self, g: &GpuView) -> Option<Taint> {
        let uuid = &g.sample.uuid;
        let input = gate_input(g);
        let verdict = if self.gated.contains(uuid) {
            carma_core::gate::gate_rule_reopens(&input, &self.gate, self.reopen_margin)
        } else {
            carma_core::gate::gate_rule_passes(&input, &self.gate)
        };
        match verdict {
            Ok(()) => {
                self.gated.remove(uuid);
                None
            }
            Err(GpuRejection::NoActivityTelemetry { .. }) => {
                Some(Taint::new(TAINT_NO_ACTIVITY_TELEMETRY, None))
            }
            Err(GpuRejection::TelemetryWarmingUp { .. }) => {
                Some(Taint::new(TAINT_UTILIZATION_GATE, Some(WINDOW_FILLING)))
            }
            Err(GpuRejection::UtilizationGate { gate, .. }) => {
                self.gated.insert(uuid.clone());
                Some(Taint::new(TAINT_UTILIZATION_GATE, Some(gate.as_str())))
            }
            Err(other) => Some(Taint::new(TAINT_UTILIZATION_GATE, Some(other.code()))),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use carma_gpu::backends::{Activity, ActivitySource, GpuSample};
    use carma_gpu::telemetry::Telemetry;

    const MIB: u64 = 1024 * 1024;

    fn gpu(index: u32, sm: f64, occ: f64, dram: f64) -> GpuSample {
        let mut s = GpuSample::basic(index, format!("GPU-{index}"), "m", 40 * 1024 * MIB, 0);
        s.sm_activity = Activity::new(sm, ActivitySource::Dcgm);
        s.sm_occupancy = Activity::new(occ, ActivitySource::Dcgm);
        s.dram_activity = Activity::new(dram, ActivitySource::Dcgm);
        s
    }

    fn tainter() -> Tainter {
        Tainter::new(GateCaps::default(), 0.05, Duration::from_secs(5))
    }

    fn keys(t: &BTreeMap<String, Vec<Taint>>, uuid: &str) -> Vec<(String, Option<String>)> {
        t[uuid]
            .iter()
            .map(|t| (t.key.to_string(), t.value.clone()))
            .collect()
    }

    #[test]
    fn the_gate_closes_over_the_caps_and_reopens_below_the_margin() {
        let mut tel = Telemetry::new("n1", 1);
        let mut tn = tainter();
        let now = Utc::now();
        let snap = tel.update(vec![gpu(0, 0.2, 0.1, 0.1), gpu(1, 0.9, 0.6, 0.1)], &[], now);
        let t = tn.taints(&snap, now);
        assert!(t["GPU-0"].is_empty());
        assert_eq!(
            keys(&t, "GPU-1"),
            [(
                TAINT_UTILIZATION_GATE.into(),
                Some("smact-smocc-drama".into())
            )]
        );
        // Just under the caps: still gated (within the margin).
        let snap = tel.update(
            vec![gpu(0, 0.2, 0.1, 0.1), gpu(1, 0.78, 0.6, 0.1)],
            &[],
            now,
        );
        assert_eq!(tn.taints(&snap, now)["GPU-1"].len(), 1, "inside the margin");
        // Below cap - margin: open again.
        let snap = tel.update(
            vec![gpu(0, 0.2, 0.1, 0.1), gpu(1, 0.74, 0.6, 0.1)],
            &[],
            now,
        );
        assert!(tn.taints(&snap, now)["GPU-1"].is_empty());
        // And a GPU that was never gated opens right under the cap.
        let snap = tel.update(
            vec![gpu(0, 0.2, 0.1, 0.1), gpu(1, 0.78, 0.6, 0.1)],
            &[],
            now,
        );
        assert!(tn.taints(&snap, now)["GPU-1"].is_empty());
    }

    #[test]
    fn busy_sms_without_saturation_keep_the_gate_open() {
        let mut tel = Telemetry::new("n1", 1);
        let now = Utc::now();
        let snap = tel.update(vec![gpu(0, 0.95, 0.2, 0.2)], &[], now);
        assert!(tainter().taints(&snap, now)["GPU-0"].is_empty());
    }

    #[test]
    fn filling_windows_missing_activity_stale_and_unhealthy() {
        let now = Utc::now();
        let mut tel = Telemetry::new("n1", 3);
        let snap = tel.update(vec![gpu(0, 0.1, 0.1, 0.1)], &[], now);
        let mut tn = tainter();
        assert_eq!(
            keys(&tn.taints(&snap, now), "GPU-0"),
            [(TAINT_UTILIZATION_GATE.into(), Some(WINDOW_FILLING.into()))]
        );

        let mut tel = Telemetry::new("n1", 1);
        let mut blind = GpuSample::basic(0, "GPU-0", "m", 40 * 1024 * MIB, 0);
        blind.sm_activity = None;
        let mut sick = gpu(1, 0.1, 0.1, 0.1);
        sick.healthy = false;
        let snap = tel.update(vec![blind, sick, gpu(2, 0.1, 0.1, 0.1)], &[], now);
        let t = tn.taints(&snap, now);
        assert_eq!(
            keys(&t, "GPU-0"),
            [(TAINT_NO_ACTIVITY_TELEMETRY.into(), None)]
        );
        assert_eq!(keys(&t, "GPU-1"), [(TAINT_UNHEALTHY.into(), None)]);
        assert!(t["GPU-2"].is_empty());

        let later = now + chrono::Duration::seconds(6);
        let t = tn.taints(&snap, later);
        assert_eq!(keys(&t, "GPU-2"), [(TAINT_TELEMETRY_STALE.into(), None)]);
        assert_eq!(keys(&t, "GPU-1"), [(TAINT_UNHEALTHY.into(), None)]);
    }
}
