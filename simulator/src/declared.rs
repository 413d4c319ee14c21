//! The durations tasks declare for the queue's order ([`carma_core::QueueOrder`]), and the
//! priorities the queue sorts by.
//!
//! The simulator declares each task's exclusive run time from the trace: perfect information,
//! which no user has. `error` above 1 spreads each declaration by a factor drawn log-uniformly
//! between `1/error` and `error` (seeded, one draw per task), to see how much of an ordering's
//! effect survives estimates that are off by that much.

use carma_core::{Declared, Millis, QueueOrder};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use crate::error::SimError;
use crate::task::Task;

/// How a run orders its queues.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct QueueOrdering {
    /// The order.
    pub order: QueueOrder,
    /// Largest factor by which a declared duration misses the exclusive run time (1: exact).
    pub error: f64,
    /// Seed of the declarations' errors.
    pub seed: u64,
    /// A task that has waited this long in the queue goes ahead of every task not yet promoted
    /// ([`carma_core::QueueOrder::aged_priority`]); `None`: never. Only under an order other
    /// than arrival.
    pub promote_after_ms: Option<Millis>,
    /// A queued task whose declared duration is at least this many times the cluster's backlog
    /// (declared GPU time still ahead ÷ GPUs) goes ahead of every task not yet promoted
    /// ([`carma_core::queue_order::outlasts_backlog`]); `None`: never. Only under an order other
    /// than arrival.
    pub promote_beyond_backlog: Option<f64>,
    /// `pack` only: once a task needing several GPUs has waited this long, keep the idle GPUs it
    /// could use next from every task queued behind it until it is placed
    /// ([`carma_core::placement::hold`]); `None`: never. Any queue order.
    pub hold_for_multi_gpu_ms: Option<Millis>,
    /// Sort by the priority classes a cluster applies ([`QueueOrder::class_priority`]: buckets
    /// of doubling bounds, arrival order within one) instead of the exact priority.
    pub by_class: bool,
    /// Share of tasks that declare a duration at all (drawn per task, seeded); the others
    /// declare none and queue behind every task that does. 1: every task declares.
    pub share: f64,
}

impl Default for QueueOrdering {
    fn default() -> Self {
        Self {
            order: QueueOrder::Arrival,
            error: 1.0,
            seed: 1,
            promote_after_ms: None,
            promote_beyond_backlog: None,
            hold_for_multi_gpu_ms: None,
            by_class: false,
            share: 1.0,
        }
    }
}

/// Mixed into the seed for the draws of who declares.
const WHO_DECLARES_STREAM: u64 = 0x0005_eed0_fdec_1a4e;

/// Largest `--queue-promote-beyond-backlog` factor.
pub const MAX_BACKLOG_FACTOR: f64 = 100.0;

/// Largest `--declared-duration-error`.
pub const MAX_DECLARED_ERROR: f64 = 100.0;

impl QueueOrdering {
    /// An error for an out-of-range `error`.
    pub fn validate(&self) -> Result<(), SimError> {
        if !(1.0..=MAX_DECLARED_ERROR).contains(&self.error) {
            return Err(SimError::Config(format!(
                "--declared-duration-error is {}; it must be between 1 and {MAX_DECLARED_ERROR}",
                self.error
            )));
        }
        if let Some(f) = self.promote_beyond_backlog
            && !(f.is_finite() && f > 0.0 && f <= MAX_BACKLOG_FACTOR)
        {
            return Err(SimError::Config(format!(
                "--queue-promote-beyond-backlog is {f}; it must be more than 0 and at most {MAX_BACKLOG_FACTOR}"
            )));
        }
        if !(0.0..=1.0).contains(&self.share) {
            return Err(SimError::Config(format!(
                "--declared-share is {}; it must be between 0 and 1",
                self.share
            )));
        }
        Ok(())
    }

    /// What each task declares: its exclusive run time, off by the drawn factor; nothing for
    /// the tasks outside the declaring share. (Who declares is drawn from a stream of its own,
    /// so the errors do not change with the share.)
    pub fn declared(&self, tasks: &[Task]) -> Vec<Declared> {
        let mut rng = StdRng::seed_from_u64(self.seed);
        let mut who = StdRng::seed_from_u64(self.seed ^ WHO_DECLARES_STREAM);
        tasks
            .iter()
            .map(|t| {
                let factor = if self.error > 1.0 {
                    self.error.powf(2.0 * rng.random::<f64>() - 1.0)
                } else {
                    1.0
                };
                let declares = self.share >= 1.0 || who.random::<f64>() < self.share;
                Declared {
                    duration_ms: declares.then(|| (t.exclusive_ms as f64 * factor).round() as u64),
                    gpus: t.gpus,
                }
            })
            .collect()
    }

    /// Each task's queue priority (higher first; all equal under arrival order).
    pub fn priorities(&self, tasks: &[Task]) -> Vec<i64> {
        self.declared(tasks)
            .iter()
            .map(|d| self.priority(d))
            .collect()
    }

    /// The queue priority of a task that declares `d`, exact or by class.
    pub fn priority(&self, d: &Declared) -> i64 {
        if self.by_class {
            self.order.class_priority(d)
        } else {
            self.order.priority(d)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::trace;

    fn tasks() -> Vec<Task> {
        trace::generate(&trace::GeneratorConfig {
            tasks: 200,
            ..Default::default()
        })
        .unwrap()
        .tasks
    }

    #[test]
    fn exact_declarations_are_the_exclusive_run_times() {
        let tasks = tasks();
        let d = QueueOrdering::default().declared(&tasks);
        for (t, d) in tasks.iter().zip(&d) {
            assert_eq!(d.duration_ms, Some(t.exclusive_ms));
            assert_eq!(d.gpus, t.gpus);
        }
        assert!(
            QueueOrdering::default()
                .priorities(&tasks)
                .iter()
                .all(|&p| p == 0)
        );
    }

    #[test]
    fn errors_stay_within_their_factor_and_follow_the_seed() {
        let tasks = tasks();
        let noisy = QueueOrdering {
            order: QueueOrder::ShortestFirst,
            error: 2.0,
            seed: 7,
            promote_after_ms: None,
            promote_beyond_backlog: None,
            hold_for_multi_gpu_ms: None,
            by_class: false,
            share: 1.0,
        };
        let d = noisy.declared(&tasks);
        let mut moved = 0;
        for (t, d) in tasks.iter().zip(&d) {
            let ratio = d.duration_ms.unwrap() as f64 / t.exclusive_ms as f64;
            assert!((0.499..=2.001).contains(&ratio), "{ratio}");
            moved += usize::from((ratio - 1.0).abs() > 0.01);
        }
        assert!(moved > tasks.len() / 2, "{moved}");
        assert_eq!(noisy.declared(&tasks), d);
        assert_ne!(QueueOrdering { seed: 8, ..noisy }.declared(&tasks), d);
        assert!(
            QueueOrdering {
                error: 0.5,
                ..noisy
            }
            .validate()
            .is_err()
        );
        assert!(noisy.validate().is_ok());
    }

    #[test]
    fn a_share_of_tasks_declares_and_the_errors_stay_as_they_were() {
        let tasks = tasks();
        let all = QueueOrdering {
            order: QueueOrder::ShortestFirst,
            error: 2.0,
            ..QueueOrdering::default()
        };
        let half = QueueOrdering { share: 0.5, ..all };
        let (d_all, d_half) = (all.declared(&tasks), half.declared(&tasks));
        let declaring = d_half.iter().filter(|d| d.duration_ms.is_some()).count();
        assert!((70..=130).contains(&declaring), "{declaring} of 200");
        // A task that declares says what it said with every task declaring.
        for (a, h) in d_all.iter().zip(&d_half) {
            assert!(h.duration_ms.is_none() || h == a);
        }
        let none = QueueOrdering { share: 0.0, ..all };
        assert!(
            none.declared(&tasks)
                .iter()
                .all(|d| d.duration_ms.is_none())
        );
        assert!(QueueOrdering { share: 1.5, ..all }.validate().is_err());
    }
}
