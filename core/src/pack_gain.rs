//! `pack`'s optional throughput test: whether sharing a busy GPU is worth it under a slowdown
//! model the scheduler is configured with ([`PackGain`]).
//!
//! A pod placed on a busy GPU is worth it when the tasks on the GPU, the pod included, progress
//! faster together than those already there do without it: the sum of their predicted rates
//! (each a fraction of the task's speed alone) after placement minus the sum before is the
//! *gain* of the placement, 1 on an idle GPU and 1 wherever the model predicts that sharing costs
//! nothing. With [`PackGain`] set, `pack` reads a busy GPU as complementary when the gain is 1
//! (the model's "free" sharing), lets it be crowded only when the gain reaches
//! [`PackGain::min_gain`], and crowds the highest gain first. Nothing migrates, so a pod placed
//! where it runs at half speed keeps running there; the margin says how much throughput a
//! placement must add to be preferred over waiting for a GPU.
//!
//! The model is configuration, not the simulator's truth: the extender gets it from its
//! [`PlacementConfig`](crate::config::PlacementConfig) (the form and parameters fitted for the
//! cluster's GPUs, as on an H100 in docs/slowdown-on-h100.md), and it reads the activities
//! booked with the pods on each GPU, plus any measured SM activity beyond them.

use serde::{Deserialize, Serialize};

use crate::slowdown::{TimeSlicing, saturation_rate};

/// A slowdown model `pack` predicts rates with.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", tag = "form")]
pub enum SharingModel {
    /// rate = (max(θ, s) / max(θ, D))^γ for a task of activity s on a GPU of summed activity D.
    #[serde(rename_all = "camelCase")]
    Saturation {
        /// θ: summed activity up to which sharing costs nothing.
        threshold: f64,
        /// γ: exponent of the slowdown beyond it.
        exponent: f64,
    },
    /// Max-min fair shares of the GPU's time: a task of activity s needs b = min(1, (s/θ)^β); once
    /// the demands exceed η the GPU hands out η in max-min shares and a task runs at share ÷ b; a
    /// task alone runs at full speed.
    #[serde(rename_all = "camelCase")]
    TimeSlicing {
        /// θ: activity at which a task needs the whole GPU.
        full_activity: f64,
        /// β: exponent of the demand.
        exponent: f64,
        /// η: share of the GPU's time handed out once it is contended.
        efficiency: f64,
    },
}

impl SharingModel {
    /// The time-slicing form with the fit measured on an H100 ([`TimeSlicing::H100`]).
    pub const H100_TIME_SLICING: SharingModel = SharingModel::TimeSlicing {
        full_activity: TimeSlicing::H100.full_activity,
        exponent: TimeSlicing::H100.exponent,
        efficiency: TimeSlicing::H100.efficiency,
    };

    /// The sum of the predicted rates of tasks of `activities` sharing one GPU, by the forms of
    /// [`crate::slowdown`].
    pub fn total_rate(&self, activities: &[f64]) -> f64 {
        if activities.len() <= 1 {
            return activities.len() as f64;
        }
        match *self {
            SharingModel::Saturation {
                threshold,
                exponent,
            } => {
                let total = activities.iter().sum::<f64>();
                activities
                    .iter()
                    .map(|s| saturation_rate(threshold, exponent, *s, total))
                    .sum()
            }
            SharingModel::TimeSlicing {
                full_activity,
                exponent,
                efficiency,
            } => TimeSlicing {
                full_activity,
                exponent,
                efficiency,
            }
            .total_rate(activities),
        }
    }

    /// The gain of adding a task of activity `pod` to tasks of `before`: the sum of the rates
    /// after minus the sum before (1 on an idle GPU; 1 where sharing costs nothing).
    pub fn gain(&self, before: &[f64], pod: f64) -> f64 {
        let mut after = Vec::with_capacity(before.len() + 1);
        after.extend_from_slice(before);
        after.push(pod);
        self.total_rate(&after) - self.total_rate(before)
    }
}

/// `pack`'s throughput test ([`PlacementConfig::pack_gain`](crate::config::PlacementConfig)).
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PackGain {
    /// The least gain (0 to 1) for which a pod that has not aged may crowd a busy GPU.
    pub min_gain: f64,
    /// The model the gain is predicted with.
    pub model: SharingModel,
}

/// Gains within this of 1 count as free sharing.
pub(super) const FREE: f64 = 1e-6;

#[cfg(test)]
mod tests {
    use super::*;

    fn close(a: f64, b: f64) -> bool {
        (a - b).abs() < 1e-3
    }

    #[test]
    fn time_slicing_rates_match_the_measured_pairings() {
        let m = SharingModel::H100_TIME_SLICING;
        // A 0.5 beside a 0.25: 0.619 and 1.0 (docs/policies-under-measured-slowdown.md).
        assert!(close(m.total_rate(&[0.5, 0.25]), 1.619));
        assert!(close(m.gain(&[0.25], 0.5), 0.619));
        // Two saturating tasks: 0.465 each, less than one alone.
        assert!(close(m.total_rate(&[0.9, 0.9]), 0.93));
        assert!(m.gain(&[0.9], 0.9) < 0.0);
        // Three of 0.25 at 0.685 each.
        assert!(close(m.total_rate(&[0.25, 0.25, 0.25]), 3.0 * 0.685));
        // Small demands fit in η: free.
        assert_eq!(m.gain(&[0.1], 0.1), 1.0);
        assert_eq!(m.gain(&[], 0.9), 1.0);
    }

    #[test]
    fn saturation_is_free_under_its_threshold() {
        let m = SharingModel::Saturation {
            threshold: 0.8,
            exponent: 1.0,
        };
        assert_eq!(m.gain(&[0.5], 0.25), 1.0);
        // γ = 1 conserves throughput past the threshold; γ = 2 loses it.
        assert!(close(m.gain(&[0.8], 0.8), 0.0));
        let g2 = SharingModel::Saturation {
            threshold: 0.8,
            exponent: 2.0,
        };
        assert!(close(g2.gain(&[0.8], 0.8), -0.5));
    }
}
