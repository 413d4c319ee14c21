//! One telemetry step of a node agent, the part the device plugin and the DRA driver share: ask
//! the backend for a sample, log a failure once (and the recovery), and turn the sample into a
//! [`Snapshot`] through the agent's [`Telemetry`]. What each agent does with the snapshot (the
//! kubelet's device list, the ResourceSlice's inventory) stays with it.

use std::sync::Arc;
use std::time::Duration;

use chrono::Utc;
use tokio::time::{Interval, MissedTickBehavior};
use tracing::{info, warn};

use crate::backends::{GpuBackend, SampleContext};
use crate::pod::PodInfo;
use crate::telemetry::{Snapshot, Telemetry};
use crate::windows::stale_after;

/// The utilization caps of the exported gate verdict: SM activity, SM occupancy, DRAM activity.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct GateCaps {
    /// SM activity cap.
    pub sm_activity: f64,
    /// SM occupancy cap.
    pub sm_occupancy: f64,
    /// DRAM activity cap.
    pub dram_activity: f64,
}

impl Default for GateCaps {
    /// CARMA's caps, as the extender's placement defaults have them.
    fn default() -> Self {
        let p = carma_core::PlacementConfig::default();
        Self {
            sm_activity: p.sm_activity_cap,
            sm_occupancy: p.sm_occupancy_cap,
            dram_activity: p.dram_activity_cap,
        }
    }
}

impl GateCaps {
    /// What is wrong with the caps, naming the flag: each must be a ratio between 0 and 1.
    pub fn problem(&self) -> Option<String> {
        [
            ("--sm-activity-cap", self.sm_activity),
            ("--sm-occupancy-cap", self.sm_occupancy),
            ("--dram-activity-cap", self.dram_activity),
        ]
        .into_iter()
        .find(|(_, cap)| !(cap.is_finite() && (0.0..=1.0).contains(cap)))
        .map(|(flag, cap)| format!("{flag} {cap}: expected a ratio between 0 and 1"))
    }
}

/// A backend and the node's telemetry, sampled together.
#[derive(Debug)]
pub struct Sampling {
    backend: Arc<dyn GpuBackend>,
    telemetry: Telemetry,
    failing: bool,
}

impl Sampling {
    /// Sample `backend` every `interval` into windows of `window` samples for `node`: metrics
    /// expire after [`stale_after`] of the interval, the gate is judged with `caps`.
    pub fn new(
        backend: Arc<dyn GpuBackend>,
        node: impl Into<String>,
        window: usize,
        interval: Duration,
        caps: GateCaps,
    ) -> Self {
        Self {
            backend,
            telemetry: Telemetry::new(node, window)
                .with_stale_after(stale_after(interval))
                .with_caps(caps.sm_activity, caps.sm_occupancy, caps.dram_activity),
            failing: false,
        }
    }

    /// One sample with `ctx` (what the backend is told about pods) and `pods` (the pods on the
    /// node) into a snapshot; `None` when the backend failed (logged once until it works again).
    pub async fn sample(&mut self, ctx: &SampleContext, pods: &[PodInfo]) -> Option<Snapshot> {
        let samples = match self.backend.sample(ctx).await {
            Ok(s) => {
                if self.failing {
                    info!("GPU sampling works again");
                    self.failing = false;
                }
                s
            }
            Err(e) => {
                if !self.failing {
                    warn!("GPU sampling failed: {e}");
                    self.failing = true;
                }
                return None;
            }
        };
        Some(self.telemetry.update(samples, pods, Utc::now()))
    }
}

/// The sampling loop's ticker: every `interval`, a late tick delays the next ones instead of
/// bunching them, and the first (immediate) tick is already taken, as the agents sample once
/// before they serve.
pub async fn ticker(interval: Duration) -> Interval {
    let mut ticker = tokio::time::interval(interval);
    ticker.set_missed_tick_behavior(MissedTickBehavior::Delay);
    ticker.tick().await;
    ticker
}
