//! Per-task GPU activity: SM activity, SM occupancy and DRAM activity (0..1)
//! of a task running alone, assigned per model class.
//!
//! CARMA publishes no per-task activity figures, so carma assigns them per class
//! and says so. The anchors:
//!
//! * small CIFAR/MNIST models leave most of an A100 idle — CARMA measured ~5.35×
//!   throughput for ResNet-26 on CIFAR-10 (batch 32) collocated, which is only
//!   possible if one such job keeps well under a fifth of the SMs busy: **0.15 /
//!   0.20 / 0.25** at batch 32 / 64 / 128;
//! * ImageNet CNNs keep the GPU busy but not full (data loading, small kernels):
//!   **0.50 / 0.60 / 0.70** at batch 32 / 64 / 128;
//! * Transformers fill the SMs; CARMA saw large models gain almost nothing from
//!   collocation: **0.80**;
//! * DLRM is bound by embedding lookups and the host: **0.35**.
//!
//! SM occupancy and DRAM activity are fixed fractions of SM activity per class
//! (CNNs: 0.45 / 0.40, Transformers: 0.60 / 0.50, small models 0.50 / 0.30,
//! DLRM 0.50 / 0.90), chosen so that CARMA's utilization gate (SM activity ≥ 0.80
//! and (occupancy ≥ 0.45 or DRAM ≥ 0.40)) closes on a GPU that runs a
//! Transformer or two ImageNet CNNs, and stays open for a few small models.
//!
//! Activities of the tasks on one GPU add up; telemetry reports the sum capped at
//! 1 (a metric cannot exceed 100 %), and the [`slowdown`](super::slowdown) model
//! reads the uncapped sum as the GPU's demand.

use serde::Serialize;

/// Activity of one task, or the sum over tasks on a GPU.
#[derive(Debug, Clone, Copy, PartialEq, Default, Serialize)]
pub struct Activity {
    /// SM activity (DCGM field 1002), 0..1 for one task.
    pub sm_activity: f64,
    /// SM occupancy (DCGM field 1003).
    pub sm_occupancy: f64,
    /// DRAM activity (DCGM field 1005).
    pub dram_activity: f64,
}

impl Activity {
    /// What telemetry reports for this demand: each metric capped at 1.
    pub fn observed(self) -> Activity {
        Activity {
            sm_activity: self.sm_activity.min(1.0),
            sm_occupancy: self.sm_occupancy.min(1.0),
            dram_activity: self.dram_activity.min(1.0),
        }
    }

    /// Every metric multiplied by `factor` (clamped to 0..1).
    pub fn scaled(self, factor: f64) -> Activity {
        let f = |v: f64| (v * factor).clamp(0.0, 1.0);
        Activity {
            sm_activity: f(self.sm_activity),
            sm_occupancy: f(self.sm_occupancy),
            dram_activity: f(self.dram_activity),
        }
    }
}

impl std::ops::Add for Activity {
    type Output = Activity;

    /// Component-wise sum.
    fn add(self, other: Activity) -> Activity {
        Activity {
            sm_activity: self.sm_activity + other.sm_activity,
            sm_occupancy: self.sm_occupancy + other.sm_occupancy,
            dram_activity: self.dram_activity + other.dram_activity,
        }
    }
}

/// The model classes activity is assigned by.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum ActivityClass {
    /// CIFAR-100 / MNIST sized CNNs (32×32 or 28×28 inputs).
    Small,
    /// ImageNet-class CNNs, UNet, Mask R-CNN.
    Vision,
    /// BERT, XLNet, GPT-2.
    Transformer,
    /// Recommendation models (DLRM).
    Recsys,
}

impl ActivityClass {
    /// Activity of a task of this class at `batch_size` when it runs alone.
    pub fn activity(self, batch_size: u32) -> Activity {
        let by_batch = |b32: f64, b64: f64, b128: f64| match batch_size {
            0..=32 => b32,
            33..=64 => b64,
            _ => b128,
        };
        let (sm, occ, dram) = match self {
            ActivityClass::Small => (by_batch(0.15, 0.20, 0.25), 0.50, 0.30),
            ActivityClass::Vision => (by_batch(0.50, 0.60, 0.70), 0.45, 0.40),
            ActivityClass::Transformer => (0.80, 0.60, 0.50),
            ActivityClass::Recsys => (0.35, 0.50, 0.90),
        };
        Activity {
            sm_activity: sm,
            sm_occupancy: sm * occ,
            dram_activity: sm * dram,
        }
    }

    /// Lower-case name.
    pub fn as_str(self) -> &'static str {
        match self {
            ActivityClass::Small => "small",
            ActivityClass::Vision => "vision",
            ActivityClass::Transformer => "transformer",
            ActivityClass::Recsys => "recsys",
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gate_closes_on_a_transformer_and_on_two_cnns_but_not_on_small_models() {
        let gate = |a: Activity| {
            let o = a.observed();
            o.sm_activity >= 0.8 && (o.sm_occupancy >= 0.45 || o.dram_activity >= 0.40)
        };
        assert!(gate(ActivityClass::Transformer.activity(8)));
        let cnn = ActivityClass::Vision.activity(64);
        assert!(gate(cnn + cnn));
        let small = ActivityClass::Small.activity(64);
        assert!(!gate(small + small + small));
        assert!(!gate(cnn));
    }

    #[test]
    fn observed_caps_at_one() {
        let t = ActivityClass::Transformer.activity(8);
        let o = (t + t).observed();
        assert_eq!(o.sm_activity, 1.0);
    }
}
