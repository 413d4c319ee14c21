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
}

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
#[error("unknown queue order {0:?} (expected arrival, shortest-first or longest-first)")]
pub struct QueueOrderParseError(pub String);

impl QueueOrder {
    /// Every order, the default first.
    pub const ALL: [QueueOrder; 3] = [
        QueueOrder::Arrival,
        QueueOrder::ShortestFirst,
        QueueOrder::LongestFirst,
    ];

    /// The order's name on the command line.
    pub fn as_str(self) -> &'static str {
        match self {
            QueueOrder::Arrival => "arrival",
            QueueOrder::ShortestFirst => "shortest-first",
            QueueOrder::LongestFirst => "longest-first",
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
        match self {
            QueueOrder::Arrival => 0,
            QueueOrder::ShortestFirst => -secs,
            QueueOrder::LongestFirst => secs.saturating_mul(i64::from(d.gpus.max(1))),
        }
    }
}

impl fmt::Display for QueueOrder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for QueueOrder {
    type Err = QueueOrderParseError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let t = s.trim().to_ascii_lowercase();
        QueueOrder::ALL
            .into_iter()
            .find(|o| o.as_str() == t)
            .ok_or_else(|| QueueOrderParseError(s.to_string()))
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
