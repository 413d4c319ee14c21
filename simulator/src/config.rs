//! Everything a simulation run is parameterised by.

use carma_core::{PlacementConfig, RecoveryConfig};
use serde::Serialize;

use crate::error::SimError;
use crate::model::{PowerModel, SlowdownModel, TelemetryModel};

/// The simulated cluster: identical nodes of identical GPUs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct ClusterSpec {
    /// Nodes.
    pub nodes: u32,
    /// GPUs per node.
    pub gpus_per_node: u32,
    /// Memory of each GPU in MiB.
    pub gpu_memory_mib: u64,
}

impl Default for ClusterSpec {
    /// CARMA's DGX Station A100: one node, 4 × 40 GiB.
    fn default() -> Self {
        Self {
            nodes: 1,
            gpus_per_node: 4,
            gpu_memory_mib: 40 * 1024,
        }
    }
}

impl ClusterSpec {
    /// Total GPUs.
    pub fn total_gpus(&self) -> u32 {
        self.nodes * self.gpus_per_node
    }
}

/// Parameters of a run; defaults are CARMA's figures and the documented models.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct SimConfig {
    /// The cluster.
    pub cluster: ClusterSpec,
    /// Placement thresholds (carma-core; CARMA's defaults).
    pub placement: PlacementConfig,
    /// Recovery settings (carma-core).
    pub recovery: RecoveryConfig,
    /// Slowdown while sharing.
    pub slowdown: SlowdownModel,
    /// Power model.
    pub power: PowerModel,
    /// Telemetry lag, window and scheduler period.
    pub telemetry: TelemetryModel,
    /// Multiplier on every task's activity figures.
    pub activity_scale: f64,
    /// Whether the utilization gate applies.
    pub gate: bool,
    /// Whether to keep per-GPU timelines and attempt logs (for the HTML report).
    pub record_timelines: bool,
    /// Remember each node's placement answer until the node changes (same
    /// results, much faster on large clusters). Off only to check exactly that.
    pub memoize: bool,
}

impl Default for SimConfig {
    fn default() -> Self {
        Self {
            cluster: ClusterSpec::default(),
            placement: PlacementConfig::default(),
            recovery: RecoveryConfig::default(),
            slowdown: SlowdownModel::default(),
            power: PowerModel::default(),
            telemetry: TelemetryModel::default(),
            activity_scale: 1.0,
            gate: true,
            record_timelines: false,
            memoize: true,
        }
    }
}

impl SimConfig {
    /// Reject values the models cannot work with.
    pub fn validate(&self) -> Result<(), SimError> {
        let bad = |m: String| Err(SimError::Config(m));
        let c = &self.cluster;
        if c.nodes == 0 || c.gpus_per_node == 0 {
            return bad(format!(
                "the cluster needs at least one node and one GPU per node (got {} × {})",
                c.nodes, c.gpus_per_node
            ));
        }
        if c.gpu_memory_mib < 1024 {
            return bad(format!("GPU memory {} MiB is too small", c.gpu_memory_mib));
        }
        let s = &self.slowdown;
        if !(s.threshold.is_finite() && s.threshold > 0.0) {
            return bad(format!(
                "slowdown threshold must be positive, got {}",
                s.threshold
            ));
        }
        if !(s.exponent.is_finite() && s.exponent >= 0.0) {
            return bad(format!("slowdown exponent must be ≥ 0, got {}", s.exponent));
        }
        let p = &self.power;
        if !(p.idle_w.is_finite() && p.max_w.is_finite() && 0.0 <= p.idle_w && p.idle_w <= p.max_w)
        {
            return bad(format!(
                "power must satisfy 0 ≤ idle ≤ max, got idle {} W, max {} W",
                p.idle_w, p.max_w
            ));
        }
        if !(self.activity_scale.is_finite() && self.activity_scale > 0.0) {
            return bad(format!(
                "activity scale must be positive, got {}",
                self.activity_scale
            ));
        }
        if self.telemetry.interval_ms == 0 || self.telemetry.window == 0 {
            return bad("telemetry interval and window must be positive".into());
        }
        if self.recovery.max_attempts == 0 {
            return bad("max attempts must be at least 1".into());
        }
        Ok(())
    }

    /// The placement thresholds the engine hands to carma-core, with the gate
    /// switched off by an unreachable SM-activity cap when `gate` is false.
    pub fn effective_placement(&self) -> PlacementConfig {
        let mut p = self.placement.clone();
        if !self.gate {
            p.sm_activity_cap = f64::INFINITY;
        }
        p
    }
}
