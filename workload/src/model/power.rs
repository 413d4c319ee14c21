//! Power and energy of a GPU from its SM activity.
//!
//! ```text
//! P(u) = P_idle + (P_max − P_idle) · u        u = reported SM activity (0..1)
//! ```
//!
//! Every simulated GPU draws power over the whole makespan, idle or not, so the
//! energy of a run is at least `P_idle × GPUs × makespan`. Defaults are for the
//! NVIDIA A100 SXM4 40 GB of CARMA's DGX Station: 400 W maximum board power (the
//! A100 datasheet's TDP for SXM4) and 55 W idle (nvidia-smi reports 50–60 W for
//! an A100 with no process). Power that is linear in SM activity is a common
//! first-order model; it ignores memory-bound phases, clocks and temperature.

use serde::Serialize;

/// Linear power model between idle and maximum power.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct PowerModel {
    /// Power of an idle GPU in watts (default 55).
    pub idle_w: f64,
    /// Power at SM activity 1 in watts (default 400).
    pub max_w: f64,
}

impl Default for PowerModel {
    fn default() -> Self {
        Self {
            idle_w: 55.0,
            max_w: 400.0,
        }
    }
}

impl PowerModel {
    /// Power in watts at reported SM activity `sm_activity` (clamped to 0..1).
    pub fn watts(&self, sm_activity: f64) -> f64 {
        self.idle_w + (self.max_w - self.idle_w) * sm_activity.clamp(0.0, 1.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn endpoints() {
        let p = PowerModel::default();
        assert_eq!(p.watts(0.0), 55.0);
        assert_eq!(p.watts(1.0), 400.0);
        assert_eq!(p.watts(2.0), 400.0);
        assert!((p.watts(0.5) - 227.5).abs() < 1e-9);
    }
}
