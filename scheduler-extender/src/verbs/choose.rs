//! `choose`: filter and prioritize in one round trip. The answer keeps only the node carma would
//! bind the pod to, so kube-scheduler, left with one feasible node, skips scoring (its own and the
//! extender's `prioritize`) and binds there.
//!
//! kube-scheduler calls `filter` and then `prioritize` for every carma pod, one pod at a time in its
//! scheduling cycle, each call a request over HTTPS with the pod's JSON; the second call only asks
//! again what the first one already judged. The chart's `scheduler.extenderConfig.mode: choose`
//! sets `filterVerb: choose` and no `prioritizeVerb` (docs/scale.md). What kube-scheduler still
//! decides: its in-tree filters run first, so the candidates sent here already fit the node's
//! resources, taints and affinities; only its soft preferences (in-tree scores) no longer weigh in
//! for carma pods.
//!
//! The choice is the best score by the pod's policy, a node whose bind would wait
//! ([`Handoff::admitting`](crate::handoff::Handoff::admitting)) ranked lowest, as in `prioritize`.
//! A node chosen for another pod a moment ago also ranks lowest ([`Choices`]): kube-scheduler
//! binds asynchronously and schedules the next pod meanwhile, so without it a burst of pods would
//! be sent to the same node before the first bind reached the extender, and their binds would
//! queue behind one kubelet's admission. When every good node is busy, the one with the fewest binds
//! on their way to it comes first, so that the queues stay even (kube-scheduler's own scores did that
//! in `rank` mode: they count the pods it assumed on each node). Remaining ties go to the node the same
//! pod was sent to before (a retry), else to one picked by the pod's UID, so that pods with equal
//! scores spread over the equally good nodes.
//!
//! A pod that fits nowhere gets every node's reason, as from `filter` (kube-scheduler's
//! FailedScheduling event and preemption read them). A pod that fits gets no reasons: the other
//! nodes did not fail, they were not chosen, and kube-scheduler reads the reasons only when no
//! node is left.

use std::collections::HashMap;
use std::hash::{DefaultHasher, Hash, Hasher};
use std::time::{Duration, Instant};

use parking_lot::Mutex;

use super::{ADMITTING_SCORE, Extender};
use crate::wire::{ExtenderArgs, ExtenderFilterResult};

/// How long a node chosen for a pod ranks lowest for other pods when that pod's bind does not come
/// (kube-scheduler dropped it after the choice: a later plugin refused it, or it was deleted). A
/// bind normally follows within milliseconds and ends the hold; the node's admission wait
/// ([`crate::handoff`]) takes over from there.
pub const CHOICE_HOLD: Duration = Duration::from_secs(5);

/// The nodes chosen for pods whose bind has not ended yet: node → (pod UID, when chosen), oldest
/// first.
#[derive(Debug, Default)]
pub struct Choices(Mutex<HashMap<String, Vec<(String, Instant)>>>);

/// What [`Choices`] holds of one node for one pod.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Held {
    /// Pods other than the asking one chosen for the node and not yet bound.
    others: usize,
    /// Whether the asking pod was sent there before.
    own: bool,
}

impl Choices {
    /// No pending choice.
    pub fn new() -> Self {
        Self::default()
    }

    /// Pod `uid` was sent to `node`.
    pub fn record(&self, node: &str, uid: &str) {
        let mut map = self.0.lock();
        let pods = map.entry(node.to_string()).or_default();
        pods.retain(|(held, at)| held != uid && at.elapsed() < CHOICE_HOLD);
        pods.push((uid.to_string(), Instant::now()));
    }

    /// What `map` holds of `node` for pod `uid`, counting choices younger than [`CHOICE_HOLD`].
    fn held(map: &HashMap<String, Vec<(String, Instant)>>, node: &str, uid: &str) -> Held {
        let mut h = Held {
            others: 0,
            own: false,
        };
        for (held, at) in map.get(node).into_iter().flatten() {
            if at.elapsed() < CHOICE_HOLD {
                if held == uid {
                    h.own = true;
                } else {
                    h.others += 1;
                }
            }
        }
        h
    }

    /// Pod `uid`'s bind ended (bound or not), or the pod is bound or gone: its choice holds no
    /// node any more. Expired choices are dropped too.
    pub fn forget(&self, uid: &str) {
        let mut map = self.0.lock();
        if map.is_empty() {
            return;
        }
        map.retain(|_, pods| {
            pods.retain(|(held, at)| held != uid && at.elapsed() < CHOICE_HOLD);
            !pods.is_empty()
        });
    }

    /// Pending choices now, over all nodes (tests, diagnostics).
    pub fn len(&self) -> usize {
        self.0
            .lock()
            .values()
            .flatten()
            .filter(|(_, at)| at.elapsed() < CHOICE_HOLD)
            .count()
    }

    /// Whether no node is held.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

impl Extender {
    /// `choose`: the one node carma would bind the pod to, or every node's reason when none can
    /// take it (see the module docs). A pod that asks for no carma GPU passes everywhere, as
    /// from `filter`.
    pub fn choose<'a>(&self, args: &'a ExtenderArgs<'_>) -> ExtenderFilterResult<'a> {
        let mut judged = match self.judge_candidates(args) {
            Ok(j) => j,
            Err(error) => {
                return ExtenderFilterResult {
                    error,
                    ..Default::default()
                };
            }
        };
        if !judged.needs_gpus || !judged.passed.contains(&true) {
            return judged.into_result(args);
        }
        let uid = Self::uid_of(&args.pod);
        let best = {
            let admitting = self.cluster.handoff().admitting();
            let held = self.choices.0.lock();
            // Each passing node's rank: its score, lowered to ADMITTING_SCORE while its bind would
            // wait; then fewer binds on their way to it first; then the pod's own earlier choice.
            let key = |i: usize| {
                let name = judged.names[i];
                let h = Choices::held(&held, name, uid);
                let score = if admitting.contains(name) || h.others > 0 {
                    judged.scores[i].min(ADMITTING_SCORE)
                } else {
                    judged.scores[i]
                };
                (score, std::cmp::Reverse(h.others), h.own)
            };
            let keys: Vec<_> = (0..judged.names.len())
                .map(|i| judged.passed[i].then(|| key(i)))
                .collect();
            let top = keys.iter().flatten().max().copied();
            let tied: Vec<usize> = (0..keys.len()).filter(|&i| keys[i] == top).collect();
            let mut h = DefaultHasher::new();
            uid.hash(&mut h);
            // `tied` is not empty: at least one candidate passed.
            tied[(h.finish() % tied.len() as u64) as usize]
        };
        self.choices.record(judged.names[best], uid);
        judged.passed.iter_mut().for_each(|p| *p = false);
        judged.passed[best] = true;
        judged.failed.clear();
        judged.unresolvable.clear();
        judged.into_result(args)
    }

    /// The pending choices (tests, diagnostics).
    pub fn choices(&self) -> &Choices {
        &self.choices
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn held(c: &Choices, node: &str, uid: &str) -> Held {
        Choices::held(&c.0.lock(), node, uid)
    }

    #[test]
    fn a_choice_holds_its_node_for_other_pods_until_forgotten() {
        let c = Choices::new();
        c.record("n1", "a");
        c.record("n1", "b");
        c.record("n1", "a");
        assert_eq!(
            held(&c, "n1", "c"),
            Held {
                others: 2,
                own: false
            }
        );
        assert_eq!(
            held(&c, "n1", "a"),
            Held {
                others: 1,
                own: true
            }
        );
        assert_eq!(
            held(&c, "n2", "c"),
            Held {
                others: 0,
                own: false
            }
        );
        c.forget("b");
        assert_eq!(c.len(), 1);
        c.forget("a");
        assert!(c.is_empty());
        assert!(
            c.0.lock().is_empty(),
            "a node with no choice left is dropped"
        );
    }

    #[test]
    fn an_old_choice_holds_nothing() {
        let c = Choices::new();
        let long_ago = Instant::now()
            .checked_sub(CHOICE_HOLD + Duration::from_millis(1))
            .expect("the clock is past the hold");
        c.0.lock().insert("n1".into(), vec![("a".into(), long_ago)]);
        assert_eq!(
            held(&c, "n1", "b"),
            Held {
                others: 0,
                own: false
            }
        );
        assert!(c.is_empty());
        c.forget("x");
        assert!(c.0.lock().is_empty(), "expired choices are dropped");
    }
}
