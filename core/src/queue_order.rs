//! The order in which pending pods are tried: by a priority derived from what the user declares
//! about a task (its expected duration and GPU count), then by arrival.
//!
//! kube-scheduler's queue pops pods by pod priority (higher first), then by when they entered the
//! queue; an operator can set a pod's priority from its TrainingTask. [`QueueOrder::priority`] is
//! that rule's one definition: the simulator's queue sorts by it, and an operator would map it to
//! a priority class. [`QueueOrder::Arrival`] gives every pod the same priority, which is the order
//! pods are queued in today.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};
use thiserror::Error;

use crate::Millis;

/// How pending pods are ordered beyond their arrival.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum QueueOrder {
    /// Arrival order alone (every pod the same priority).
    #[default]
    Arrival,
    /// The shortest declared duration first (shortest-job-first: lowers mean completion time).
    ShortestFirst,
    /// The most declared GPU time first (duration × GPUs: long and multi-GPU tasks start early,
    /// so that none of them is left to run alone at the end).
    LongestFirst,
    /// Tasks declared shorter than `short_below_ms` first, shortest first; then the rest, the
    /// most GPU time first. The short ones are most of the tasks and most of what mean JCT
    /// counts; the long ones, started early, leave no long task alone at the end.
    ShortThenLongest {
        /// Declared durations below this count as short.
        short_below_ms: Millis,
    },
}

/// [`QueueOrder::ShortThenLongest`]'s threshold unless one is named: 30 minutes.
pub const DEFAULT_SHORT_BELOW_MS: Millis = 30 * 60_000;

/// The priority of the shortest short task under [`QueueOrder::ShortThenLongest`]; long tasks
/// rank below every short one (their GPU-seconds are capped just under the shortest's priority
/// minus the threshold). Under 2^31, a Kubernetes pod priority's range.
const SHORT_BASE: i64 = 1_000_000_000;

/// What a task declares about itself, as an operator would read it from a TrainingTask.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Declared {
    /// Expected run time with its GPUs to itself; `None` when not declared.
    pub duration_ms: Option<Millis>,
    /// GPUs it asks for.
    pub gpus: u32,
}

/// A `--queue-order` value that names no order.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
#[error(
    "unknown queue order {0:?} (expected arrival, shortest-first, longest-first or \
     short-then-longest[:MINUTES])"
)]
pub struct QueueOrderParseError(pub String);

impl QueueOrder {
    /// Every order, the default first.
    pub const ALL: [QueueOrder; 4] = [
        QueueOrder::Arrival,
        QueueOrder::ShortestFirst,
        QueueOrder::LongestFirst,
        QueueOrder::ShortThenLongest {
            short_below_ms: DEFAULT_SHORT_BELOW_MS,
        },
    ];

    /// The order's name on the command line, without a threshold.
    pub fn as_str(self) -> &'static str {
        match self {
            QueueOrder::Arrival => "arrival",
            QueueOrder::ShortestFirst => "shortest-first",
            QueueOrder::LongestFirst => "longest-first",
            QueueOrder::ShortThenLongest { .. } => "short-then-longest",
        }
    }

    /// The pod priority of a task that declares `d`: higher is tried first, equal priorities keep
    /// arrival order (kube-scheduler's rule). In whole seconds, so that it fits a Kubernetes
    /// priority (a 32-bit integer) for any duration under 68 years.
    ///
    /// A task that declares no duration ranks behind every task that does under the orders that
    /// read one, so that leaving the field out never moves a pod ahead. (Under shortest-first
    /// that is the only thing keeping a pod from gaining by declaring less than it will need.)
    pub fn priority(self, d: &Declared) -> i64 {
        let Some(ms) = d.duration_ms else {
            return match self {
                QueueOrder::Arrival => 0,
                _ => i64::MIN,
            };
        };
        let secs = i64::try_from(ms / 1000).unwrap_or(i64::MAX);
        let gpu_secs = secs.saturating_mul(i64::from(d.gpus.max(1)));
        match self {
            QueueOrder::Arrival => 0,
            QueueOrder::ShortestFirst => -secs,
            QueueOrder::LongestFirst => gpu_secs,
            QueueOrder::ShortThenLongest { short_below_ms } if ms < short_below_ms => {
                SHORT_BASE - secs
            }
            QueueOrder::ShortThenLongest { short_below_ms } => {
                let below_short = SHORT_BASE - i64::try_from(short_below_ms / 1000).unwrap_or(0);
                gpu_secs.min(below_short - 1)
            }
        }
    }
}

/// The priority of a pod promoted by [`QueueOrder::aged_priority`]: above every declared
/// priority, under 2^31.
pub const PROMOTED: i64 = 2_000_000_000;

impl QueueOrder {
    /// The priority of a pod that declares `d` and has waited `waited_ms` in the queue: its
    /// [`priority`](Self::priority) until it has waited `promote_after_ms`, then [`PROMOTED`],
    /// ahead of every pod not yet promoted (among promoted pods, the earlier promoted first). A
    /// static priority keeps a long task behind every short one that arrives while it waits;
    /// this bounds that wait. kube-scheduler never changes a pod's priority, so an operator would
    /// have to replace the pending pod with one of a higher priority class; `None`: never.
    pub fn aged_priority(
        self,
        d: &Declared,
        waited_ms: Millis,
        promote_after_ms: Option<Millis>,
    ) -> i64 {
        match promote_after_ms {
            Some(after) if waited_ms >= after => PROMOTED,
            _ => self.priority(d),
        }
    }
}

/// The declared GPU time still ahead of a cluster, spread over its GPUs: how long its GPUs stay
/// busy if every declaration is right and no more tasks arrive. `ahead` gives, for each queued
/// task and each running one, the declared time it still needs (for a running task: its
/// declared duration less what it has run, at least 0) and its GPU count; a task that declares
/// nothing adds nothing. `None` for a cluster of no GPUs.
pub fn backlog_ms(ahead: impl IntoIterator<Item = (Millis, u32)>, gpus: u32) -> Option<Millis> {
    if gpus == 0 {
        return None;
    }
    let total: u128 = ahead
        .into_iter()
        .map(|(ms, g)| u128::from(ms) * u128::from(g))
        .sum();
    Some(Millis::try_from(total / u128::from(gpus)).unwrap_or(Millis::MAX))
}

/// Whether a queued task that declares `d` should be promoted because it would otherwise end
/// the run alone: it declares at least `factor` times the backlog of everything else, i.e. the
/// cluster's [`backlog_ms`] (this task included, over `gpus` GPUs) less its own share. Started
/// only once the rest has drained, it would end its whole duration after the rest; started now,
/// it runs beside the rest. Under an order that keeps long tasks behind short ones this starts
/// them while there is still work to run beside them. A task that declares nothing is never
/// promoted.
pub fn outlasts_backlog(d: &Declared, backlog_ms: Millis, gpus: u32, factor: f64) -> bool {
    let Some(ms) = d.duration_ms else {
        return false;
    };
    let own = ms as f64 * f64::from(d.gpus.max(1)) / f64::from(gpus.max(1));
    let others = (backlog_ms as f64 - own).max(0.0);
    ms as f64 >= factor.max(0.0) * others
}

/// `short-then-longest` with its threshold in minutes when it is not the default.
impl fmt::Display for QueueOrder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())?;
        match *self {
            QueueOrder::ShortThenLongest { short_below_ms }
                if short_below_ms != DEFAULT_SHORT_BELOW_MS =>
            {
                write!(f, ":{}", short_below_ms as f64 / 60_000.0)
            }
            _ => Ok(()),
        }
    }
}

/// A name from [`QueueOrder::ALL`]; `short-then-longest:M` sets the threshold to M minutes (more
/// than 0, at most a week).
impl FromStr for QueueOrder {
    type Err = QueueOrderParseError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let bad = || QueueOrderParseError(s.to_string());
        let t = s.trim().to_ascii_lowercase();
        let (name, minutes) = match t.split_once(':') {
            Some((name, m)) => (name, Some(m.trim().parse::<f64>().map_err(|_| bad())?)),
            None => (t.as_str(), None),
        };
        let order = QueueOrder::ALL
            .into_iter()
            .find(|o| o.as_str() == name)
            .ok_or_else(bad)?;
        match (order, minutes) {
            (_, None) => Ok(order),
            (QueueOrder::ShortThenLongest { .. }, Some(m)) if m > 0.0 && m <= 7.0 * 24.0 * 60.0 => {
                Ok(QueueOrder::ShortThenLongest {
                    short_below_ms: (m * 60_000.0).round() as Millis,
                })
            }
            _ => Err(bad()),
        }
    }
}

/// Where a pod with `priority` goes in a queue whose pods have `queued` priorities (front first,
/// sorted by priority, highest first): behind every pod of the same or a higher priority. With
/// equal priorities this is the back, i.e. plain arrival order.
pub fn insert_position<I>(queued: I, priority: i64) -> usize
where
    I: DoubleEndedIterator<Item = i64> + ExactSizeIterator,
{
    let len = queued.len();
    len - queued.rev().take_while(|&p| p < priority).count()
}
