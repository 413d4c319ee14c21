//! How tasks sharing a GPU slow each other: the forms the simulator runs and `pack`'s optional
//! throughput test predicts with ([`crate::config::SharingModel`]), written once here.
//!
//! The saturation form is [`saturation_rate`]. The time-slicing form, [`TimeSlicing`], gives
//! each task a max-min fair share of the GPU's time.
//!
//! Each task on a GPU needs a fraction `b` of the GPU's time to run at its speed alone,
//! from its SM activity alone `s`:
//!
//! ```text
//! b(s) = min(1, (s / θ)^β)
//! ```
//!
//! `θ` is the activity from which a task needs the GPU all the time (not the saturation
//! form's threshold). While the demands of the tasks on a GPU sum to at most `η`, every
//! task runs at full speed. Beyond it the GPU hands out `η` of its time (`η < 1`: what
//! switching between contexts costs) by water-filling: a task that needs less than an
//! equal share of what is left gets all it needs, the others split the rest equally, at
//! the level `L` where the shares `min(b, L)` sum to `η`. A task then runs at
//!
//! ```text
//! rate = min(b, L) / b
//! ```
//!
//! A task alone on its GPU has rate 1 whatever its demand, because its run time is the
//! one measured alone (the measured rates this form was fitted to are relative to each
//! job's speed alone, and its alone rows are not part of the fit).
//!
//! Fitted to the 52 rates measured on an H100 (`docs/slowdown-on-h100.md`,
//! `python3 tools/fit-slowdown.py --table`, which this reproduces): `θ = 0.70`,
//! `β = 0.77`, `η = 0.93`, mean absolute rate error 0.025 (0.033 with each job left out
//! of the fit), against 0.107 for the saturation form at its defaults. These are the
//! defaults of `carma simulate --slowdown-model time-slicing` ([`TimeSlicing::H100`]).

use serde::Serialize;

/// The saturation form's progress rate (0..1] of a task with SM activity `own` on a GPU whose
/// summed SM activity (this task included) is `total`: `(max(θ, own) / max(θ, total))^γ`, 1 while
/// `total` stays at or under the threshold `θ` (the simulator's default form, and `pack`'s
/// throughput test with the saturation model).
pub fn saturation_rate(threshold: f64, exponent: f64, own: f64, total: f64) -> f64 {
    let theta = threshold.max(1e-6);
    let num = theta.max(own);
    let den = theta.max(total).max(num);
    (num / den).powf(exponent).clamp(1e-6, 1.0)
}

/// Parameters of the time-slicing form; the defaults are the H100 fit.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct TimeSlicing {
    /// SM activity alone from which a task needs the GPU all the time (θ, default 0.70).
    pub full_activity: f64,
    /// Exponent β of the demand below `full_activity` (default 0.77).
    pub exponent: f64,
    /// Share of the GPU's time handed out while it is crowded (η, default 0.93).
    pub efficiency: f64,
}

impl Default for TimeSlicing {
    fn default() -> Self {
        Self::H100
    }
}

impl TimeSlicing {
    /// The fit measured on an H100: θ 0.70, β 0.77, η 0.93.
    pub const H100: TimeSlicing = TimeSlicing {
        full_activity: 0.70,
        exponent: 0.77,
        efficiency: 0.93,
    };

    /// The sum of the rates of tasks of `activities` sharing one GPU (a task alone: 1), from one
    /// water level.
    pub fn total_rate(&self, activities: &[f64]) -> f64 {
        if activities.len() <= 1 {
            return activities.len() as f64;
        }
        let shares = self.shares(activities);
        activities
            .iter()
            .zip(shares)
            .map(|(s, share)| (share / self.demand(*s)).clamp(1e-6, 1.0))
            .sum()
    }

    /// The fraction `b` of the GPU's time a task of SM activity `s` needs (0..1].
    pub fn demand(&self, s: f64) -> f64 {
        (s.max(1e-9) / self.full_activity)
            .powf(self.exponent)
            .min(1.0)
    }

    /// The water level `L` of these demands: `None` while they sum to at most `η` (every
    /// task served in full), else the share each task that needs more than `L` gets.
    fn level(&self, demands: &mut [f64]) -> Option<f64> {
        if demands.iter().sum::<f64>() <= self.efficiency {
            return None;
        }
        demands.sort_by(f64::total_cmp);
        let (mut left, n) = (self.efficiency, demands.len());
        for (i, b) in demands.iter().enumerate() {
            let share = left / (n - i) as f64;
            if *b <= share {
                left -= b;
            } else {
                return Some(share);
            }
        }
        None
    }

    /// The share of the GPU's time each task gets, in the order of `activities` (each
    /// task's SM activity alone): its demand alone or while the demands fit in `η`,
    /// else `min(b, L)`.
    pub fn shares(&self, activities: &[f64]) -> Vec<f64> {
        let demands: Vec<f64> = activities.iter().map(|s| self.demand(*s)).collect();
        let level = if demands.len() > 1 {
            self.level(&mut demands.clone())
        } else {
            None
        };
        match level {
            None => demands,
            Some(l) => demands.iter().map(|b| b.min(l)).collect(),
        }
    }

    /// Progress rate (0..1] of a task with SM activity `own` on a GPU whose tasks (this
    /// one included) have the SM activities `all`.
    pub fn rate(&self, own: f64, all: impl IntoIterator<Item = f64>) -> f64 {
        let mut demands: Vec<f64> = all.into_iter().map(|s| self.demand(s)).collect();
        if demands.len() <= 1 {
            return 1.0;
        }
        let b = self.demand(own);
        match self.level(&mut demands) {
            Some(l) if b > l => (l / b).clamp(1e-6, 1.0),
            _ => 1.0,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const ETA: f64 = 0.93;

    fn close(a: f64, b: f64) -> bool {
        (a - b).abs() < 1e-12
    }

    #[test]
    fn a_task_alone_runs_at_full_speed_whatever_its_demand() {
        let m = TimeSlicing::default();
        for s in [0.0, 0.05, 0.5, 0.7, 0.95, 3.0] {
            assert_eq!(m.rate(s, [s]), 1.0, "{s}");
        }
        // Its demand exceeds η, and it still gets all of it.
        assert_eq!(m.shares(&[0.95]), vec![1.0]);
    }

    #[test]
    fn two_saturating_equal_tasks_each_get_half_of_eta() {
        let m = TimeSlicing::default();
        assert_eq!(m.demand(0.9), 1.0);
        let r = m.rate(0.9, [0.9, 0.9]);
        assert!(close(r, ETA / 2.0 / m.demand(0.9)), "{r}");
        let shares = m.shares(&[0.9, 0.9]);
        assert!(shares.iter().all(|a| close(*a, ETA / 2.0)), "{shares:?}");
        // Three such tasks: a third of η each.
        assert!(close(m.rate(0.8, [0.8, 0.9, 1.0]), ETA / 3.0));
    }

    #[test]
    fn a_light_task_beside_a_heavy_one_gets_all_it_needs() {
        let m = TimeSlicing::default();
        let (light, heavy) = (0.11, 0.9);
        let b = m.demand(light);
        assert!(b < ETA / 2.0, "{b}");
        assert_eq!(m.rate(light, [light, heavy]), 1.0);
        // The heavy one gets what is left of η.
        assert!(close(m.rate(heavy, [light, heavy]), ETA - b));
        let shares = m.shares(&[light, heavy]);
        assert!(
            close(shares[0], b) && close(shares[1], ETA - b),
            "{shares:?}"
        );
    }

    #[test]
    fn demands_that_fit_in_eta_cost_nothing() {
        let m = TimeSlicing::default();
        let acts = [0.05, 0.1];
        assert!(acts.iter().map(|s| m.demand(*s)).sum::<f64>() <= ETA);
        for s in acts {
            assert_eq!(m.rate(s, acts), 1.0);
        }
    }

    #[test]
    fn rates_are_in_0_1_and_shares_sum_to_at_most_eta() {
        let m = TimeSlicing::default();
        // A fixed pseudo-random sweep of GPUs with 1 to 6 tasks.
        let mut x: u64 = 0x2545_f491_4f6c_dd1d;
        let mut next = || {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            (x >> 11) as f64 / (1u64 << 53) as f64
        };
        for _ in 0..2000 {
            let n = 1 + (next() * 6.0) as usize;
            let acts: Vec<f64> = (0..n).map(|_| next() * 1.2).collect();
            let shares = m.shares(&acts);
            let total: f64 = shares.iter().sum();
            let cap = if n == 1 { 1.0 } else { ETA };
            assert!(total <= cap + 1e-12, "{acts:?}: {total}");
            for (s, a) in acts.iter().zip(&shares) {
                let r = m.rate(*s, acts.iter().copied());
                assert!(r > 0.0 && r <= 1.0, "{acts:?}: {r}");
                if n > 1 {
                    assert!(close(r, a / m.demand(*s)), "{acts:?}: {r} vs {a}");
                }
            }
        }
    }
}
