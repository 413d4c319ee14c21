//! The priority classes through which an unmodified kube-scheduler applies a [`QueueOrder`].
//!
//! A pod's priority comes from a PriorityClass, and the API server rejects a pod whose priority
//! disagrees with its class, so an operator cannot give each pod the exact priority
//! [`QueueOrder::priority`] computes. It picks one class from a fixed ladder instead: buckets
//! whose bounds double (durations for the short side, GPU time for the long side), ranked in the
//! order's direction. Within a bucket pods keep the order they were queued in. The ladder is
//! defined here once: the operator names a pod's class from it, `carma queue-classes` prints the
//! PriorityClass objects (the chart's copy is generated from it) and the simulator can sort by it
//! (`carma simulate --queue-priority classes`).

use crate::queue_order::{Declared, QueueOrder};

/// The value of the lowest class. Pods without a class have priority 0, so every declared task
/// ranks ahead of every undeclared one, as [`QueueOrder::priority`] ranks them; carma's recovery
/// class (1,000,000 by default) stays above every queue class.
pub const QUEUE_CLASS_BASE: i32 = 1_000;

/// Buckets of durations under [`QueueOrder::ShortestFirst`]: below 1, 2, 4, … 2¹³ minutes (about
/// 5.7 days), then one class for everything longer.
const SHORTEST_FIRST_DOUBLINGS: u32 = 14;
/// Buckets of GPU time under [`QueueOrder::LongestFirst`]: from 1, 2, 4, … 2¹⁶ GPU-minutes
/// (about 45 GPU-days) on, the first bucket taking everything shorter.
const LONGEST_FIRST_DOUBLINGS: u32 = 17;
/// Buckets of the long side of [`QueueOrder::ShortThenLongest`]: from the threshold's GPU time
/// ×1, ×2, … ×2⁸ on (0.5 to 128 GPU-hours at the default 30 minutes).
const LONG_SIDE_DOUBLINGS: u32 = 9;

/// One PriorityClass of a ladder.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct QueueClass {
    /// The PriorityClass name: `carma-queue-…`, naming the order and the bucket.
    pub name: String,
    /// Its priority value; higher is tried first.
    pub value: i32,
    /// For `kubectl get priorityclass` readers: what the class holds.
    pub description: String,
}

/// Which declared quantity a bucket bounds, and how.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Bound {
    /// Declared duration below this many minutes (buckets are tried highest first, so the
    /// tightest that matches wins).
    DurationUnder(u64),
    /// Declared duration of at least this many minutes.
    DurationFrom(u64),
    /// Declared duration × GPUs of at least this many GPU-minutes.
    GpuTimeFrom(u64),
}

/// An order's buckets, highest priority first.
fn buckets(order: QueueOrder) -> Vec<Bound> {
    match order {
        QueueOrder::Arrival => Vec::new(),
        QueueOrder::ShortestFirst => {
            let mut b: Vec<Bound> = (0..SHORTEST_FIRST_DOUBLINGS)
                .map(|k| Bound::DurationUnder(1 << k))
                .collect();
            b.push(Bound::DurationFrom(1 << (SHORTEST_FIRST_DOUBLINGS - 1)));
            b
        }
        QueueOrder::LongestFirst => (0..LONGEST_FIRST_DOUBLINGS)
            .rev()
            .map(|k| Bound::GpuTimeFrom(1 << k))
            .collect(),
        QueueOrder::ShortThenLongest { short_below_ms } => {
            let threshold = short_below_ms.div_ceil(60_000).max(1);
            let mut b: Vec<Bound> = (0..)
                .map(|k| 1u64 << k)
                .take_while(|&m| m < threshold)
                .map(Bound::DurationUnder)
                .collect();
            b.push(Bound::DurationUnder(threshold));
            b.extend(
                (0..LONG_SIDE_DOUBLINGS)
                    .rev()
                    .map(|k| Bound::GpuTimeFrom(threshold << k)),
            );
            b
        }
    }
}

/// The class-name prefix of an order with classes; the threshold is part of it so that two
/// thresholds never share a name with different meanings.
fn prefix(order: QueueOrder) -> String {
    match order {
        QueueOrder::ShortThenLongest { short_below_ms } => {
            format!("carma-queue-stl{}", short_below_ms.div_ceil(60_000).max(1))
        }
        QueueOrder::LongestFirst => "carma-queue-lf".to_string(),
        QueueOrder::ShortestFirst => "carma-queue-sf".to_string(),
        // Arrival order has no classes to name.
        QueueOrder::Arrival => String::new(),
    }
}

/// Rank `i` (0 highest) of `n` classes as a PriorityClass value.
fn value_of(i: usize, n: usize) -> i32 {
    QUEUE_CLASS_BASE + (n - 1 - i) as i32
}

impl QueueOrder {
    /// The PriorityClasses this order needs, highest value first; none under arrival order.
    pub fn classes(self) -> Vec<QueueClass> {
        let b = buckets(self);
        let (n, prefix) = (b.len(), prefix(self));
        b.into_iter()
            .enumerate()
            .map(|(i, bound)| {
                let (bucket, what) = match bound {
                    Bound::DurationUnder(m) => (
                        format!("under-{m}m"),
                        format!("tasks declared to run under {m} min"),
                    ),
                    Bound::DurationFrom(m) => (
                        format!("from-{m}m"),
                        format!("tasks declared to run {m} min or more"),
                    ),
                    Bound::GpuTimeFrom(m) => (
                        format!("from-{m}-gpu-min"),
                        format!("tasks declaring {m} GPU-minutes (duration × GPUs) or more"),
                    ),
                };
                QueueClass {
                    name: format!("{prefix}-{bucket}"),
                    value: value_of(i, n),
                    description: format!(
                        "carma queue order {}: {what}; tried before lower classes, never preempts",
                        self.as_str()
                    ),
                }
            })
            .collect()
    }

    /// Where a task that declares `d` ranks among the order's classes: (rank, 0 highest; number
    /// of classes). The first bucket it falls in, i.e. the tightest; `None` under arrival order
    /// and for a task that declares no duration.
    fn class_rank(self, d: &Declared) -> Option<(usize, usize)> {
        let ms = d.duration_ms?;
        let gpus = u64::from(d.gpus.max(1));
        let b = buckets(self);
        let i = b.iter().position(|bound| match *bound {
            Bound::DurationUnder(m) => ms < m * 60_000,
            Bound::DurationFrom(m) => ms >= m * 60_000,
            Bound::GpuTimeFrom(m) => ms.saturating_mul(gpus) >= m * 60_000,
        });
        // Below the last GPU-time bucket's bound: the lowest class.
        let i = i.or_else(|| b.len().checked_sub(1))?;
        Some((i, b.len()))
    }

    /// The class of a task that declares `d`. `None` under arrival order and for a task that
    /// declares no duration (it keeps priority 0, behind every declared task).
    pub fn class(self, d: &Declared) -> Option<QueueClass> {
        let (i, _) = self.class_rank(d)?;
        self.classes().into_iter().nth(i)
    }

    /// [`QueueOrder::class`]'s value as a queue priority (0 without a class): the order a
    /// cluster can apply, where [`QueueOrder::priority`] is the exact one. Names no class, so
    /// the simulator's per-task call builds no strings.
    pub fn class_priority(self, d: &Declared) -> i64 {
        self.class_rank(d)
            .map_or(0, |(i, n)| i64::from(value_of(i, n)))
    }
}
