//! Slowdown while sharing a GPU, as a function of summed SM activity.
//!
//! Let `D` be the summed SM activity of the tasks whose kernels run on a GPU (each
//! task's figure when alone, see [`activity`](super::activity)), `s` one task's own
//! figure, `θ` the threshold and `γ` the exponent. The task progresses at
//!
//! ```text
//! rate(s, D) = ( max(θ, s) / max(θ, D) )^γ        (1 = its exclusive speed)
//! ```
//!
//! * While `D ≤ θ` every task runs at full speed: CARMA found that collocation
//!   pays off while the summed SM activity stays at or below ~0.8 (θ = 0.8).
//! * Beyond it the GPU is saturated: with `γ = 1` it delivers `max(θ, ·)` worth of
//!   work shared in proportion to demand, so two tasks that each fill it run at
//!   half speed — no gain, each twice as slow. That is what CARMA observed for
//!   large models (ResNet-152 on ImageNet gained almost nothing and slowed down
//!   badly). `γ > 1` adds interference losses (cache and DRAM contention, context
//!   switches); `γ < 1` is optimistic.
//! * A task alone always has rate 1, whatever its activity, because its run time
//!   is the one measured alone.
//!
//! A multi-GPU task advances at the rate of its slowest GPU (synchronous data
//! parallelism waits for the slowest replica).
//!
//! # Measured on an H100
//!
//! Five training jobs time-sliced on one H100 (one process each, no MPS; see
//! `docs/slowdown-on-h100.md`, reproduced by `python3 tools/fit-slowdown.py --table`):
//!
//! * Two saturating jobs each ran at 0.453–0.465 of their speed alone (summed
//!   0.912–0.924), close to `γ = 1` (0.474–0.526 here) and far from `γ = 2`
//!   (0.224–0.277).
//! * The free region below `θ` did not hold: the one pair with `D` below 0.8
//!   (0.587 and 0.617) slowed one of its jobs to 0.878 and 0.836.
//! * A light job (`s` = 0.113) slowed a saturating partner to 0.641–0.684, where this
//!   form predicts 0.877–0.889 at the defaults, and itself ran at 0.900–1.063.
//!
//! Fitted to all 52 measured rates this form gives `θ = 0.88`, `γ = 1.182` (mean
//! absolute rate error 0.090; 0.107 at the defaults, whose values are kept); a
//! time-slicing form in which each job gets a max-min fair share of the GPU's time
//! fits to 0.025, near the run-to-run spread of 0.026. That form is available as
//! [`TimeSlicing`] (`carma simulate --slowdown-model time-slicing`, parameters defaulting
//! to that fit); the default stays this one, `saturation`, with `θ = 0.8`, `γ = 1`.

use serde::Serialize;

pub use carma_core::slowdown::TimeSlicing;

/// Parameters of the slowdown function.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct SlowdownModel {
    /// Summed SM activity up to which sharing costs nothing (θ, default 0.8).
    /// Saturation form only.
    pub threshold: f64,
    /// Exponent γ of the saturation penalty (default 1.0). Saturation form only.
    pub exponent: f64,
    /// `None` (the default): the saturation form above. `Some`: the [`TimeSlicing`]
    /// form with these parameters, which ignores `threshold` and `exponent`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub time_slicing: Option<TimeSlicing>,
}

impl Default for SlowdownModel {
    fn default() -> Self {
        Self {
            threshold: 0.8,
            exponent: 1.0,
            time_slicing: None,
        }
    }
}

impl SlowdownModel {
    /// Progress rate (0..1] of a task with SM activity `own` on a GPU whose tasks (this
    /// one included) have the SM activities `all`, summing to `total`. The saturation
    /// form reads only `own` and `total` (and never iterates `all`); the time-slicing
    /// form needs each task's activity.
    pub fn rate_among(&self, own: f64, total: f64, all: impl IntoIterator<Item = f64>) -> f64 {
        match &self.time_slicing {
            None => self.rate(own, total),
            Some(ts) => ts.rate(own, all),
        }
    }

    /// The saturation form's progress rate (0..1] of a task with SM activity `own` on
    /// a GPU whose summed SM activity (this task included) is `total`.
    pub fn rate(&self, own: f64, total: f64) -> f64 {
        carma_core::slowdown::saturation_rate(self.threshold, self.exponent, own, total)
    }

    /// The same model as `pack`'s throughput test predicts with.
    pub fn sharing_model(&self) -> carma_core::config::SharingModel {
        match self.time_slicing {
            Some(ts) => carma_core::config::SharingModel::TimeSlicing {
                full_activity: ts.full_activity,
                exponent: ts.exponent,
                efficiency: ts.efficiency,
            },
            None => carma_core::config::SharingModel::Saturation {
                threshold: self.threshold,
                exponent: self.exponent,
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn no_slowdown_below_threshold_and_alone() {
        let m = SlowdownModel::default();
        assert_eq!(m.rate(0.2, 0.6), 1.0);
        assert_eq!(m.rate(0.8, 0.8), 1.0);
        assert_eq!(m.rate(0.95, 0.95), 1.0);
    }

    #[test]
    fn two_saturating_tasks_each_run_at_half_speed() {
        let m = SlowdownModel::default();
        assert!((m.rate(0.8, 1.6) - 0.5).abs() < 1e-12);
        let harsh = SlowdownModel { exponent: 2.0, ..m };
        assert!((harsh.rate(0.8, 1.6) - 0.25).abs() < 1e-12);
    }

    #[test]
    fn rate_falls_as_demand_grows() {
        let m = SlowdownModel::default();
        let mut last = 1.0;
        for d in [0.9, 1.0, 1.3, 2.0, 3.0] {
            let r = m.rate(0.5, d);
            assert!(r < last, "{d}: {r}");
            last = r;
        }
    }

    #[test]
    fn rate_among_reads_the_form_it_is_given() {
        let m = SlowdownModel::default();
        assert_eq!(m.rate_among(0.8, 1.6, [0.8, 0.8]), m.rate(0.8, 1.6));
        let ts = SlowdownModel {
            time_slicing: Some(TimeSlicing::default()),
            ..m
        };
        let want = TimeSlicing::default().rate(0.8, [0.8, 0.8]);
        assert_eq!(ts.rate_among(0.8, 1.6, [0.8, 0.8]), want);
        assert!((want - 0.93 / 2.0 / TimeSlicing::default().demand(0.8)).abs() < 1e-12);
    }
}
