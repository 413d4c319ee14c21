//! One kubelet admission at a time per node.
//!
//! kubelet's Allocate names device replicas but not the pod (kubernetes#82606), so when two carma
//! pods bound to one node await admission together, the device plugin can only guess which one
//! kubelet is admitting — and the real kubelet device manager showed that guesses go wrong under load
//! (a container got another pod's GPU and reservation). HAMi avoids this with a node lock; carma
//! does it inside the (single-active) extender: a node whose last carma pod is bound but not yet
//! admitted takes no other carma pod.
//!
//! The rule has no timeout that lets a bind through. A bind takes the node's turn
//! ([`Handoff::turn`]): it waits, at most [`Handoff::lock_wait`], for any bind in progress on the
//! node to finish and for every pod bound there before to be admitted. A bind that cannot get the
//! turn in that time is refused as a conflict and kube-scheduler retries it later; that wait and the
//! write stay below kube-scheduler's extender `httpTimeout` (5 s in the chart), and a bind it hangs
//! up on still runs to its end (`crate::server`). The bind that got the turn answers kube-scheduler
//! as soon as its Binding is written; the node stays closed to carma pods until the pod watch sees
//! that pod admitted.
//!
//! A pod counts as admitted once the device plugin marked it allocated (`carma.io/allocated`), the
//! kubelet started it (`status.startTime` is set only after admission), it runs or ended, or it is
//! gone. Each of those ends the wait; time alone never does. A pod the kubelet never admits and
//! nobody deletes keeps its node closed to carma pods; the node cannot admit one anyway (its kubelet
//! or device plugin is not answering), and the pod's eviction from a `NotReady` node reopens it.
//!
//! The awaited pods are rebuilt from the pod watch ([`Handoff::await_admission`]), so a restarted or
//! newly elected extender keeps the rule for pods bound before it started.

use std::collections::{BTreeSet, HashMap};
use std::sync::Arc;
use std::time::Duration;

use parking_lot::Mutex;
use tokio::sync::{Mutex as AsyncMutex, Notify, OwnedMutexGuard};

/// Per-node bind serialization and admission tracking.
#[derive(Debug)]
pub struct Handoff {
    /// Held for the length of one bind to the node.
    binding: Mutex<HashMap<String, Arc<AsyncMutex<()>>>>,
    /// Pods bound to each node and not yet seen admitted.
    awaited: Mutex<HashMap<String, BTreeSet<String>>>,
    admitted: Notify,
    /// Longest wait for the node's turn before the bind is refused as a conflict.
    pub lock_wait: Duration,
}

impl Default for Handoff {
    fn default() -> Self {
        Self::new(Duration::from_millis(2500))
    }
}

/// Why a bind did not get its node's turn within [`Handoff::lock_wait`].
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TurnRefused {
    /// Another bind to the node was still writing.
    #[error("another bind to node {node} is still in progress")]
    Binding {
        /// The node.
        node: String,
    },
    /// A pod bound to the node before has not been admitted by its kubelet.
    #[error("node {node} has not yet admitted pod {pod} (uid), bound to it before")]
    Admitting {
        /// The node.
        node: String,
        /// UID of one pod it still has to admit.
        pod: String,
    },
}

/// Held by the bind that may place a pod on the node; dropping it lets the next bind see the node's
/// awaited pods.
#[derive(Debug)]
pub struct NodeTurn {
    _guard: OwnedMutexGuard<()>,
}

impl Handoff {
    /// A handoff whose binds wait at most `lock_wait` for their node's turn.
    pub fn new(lock_wait: Duration) -> Self {
        Self {
            binding: Mutex::new(HashMap::new()),
            awaited: Mutex::new(HashMap::new()),
            admitted: Notify::new(),
            lock_wait,
        }
    }

    /// Take `node`'s turn: no other bind to it in progress and every pod bound to it admitted.
    /// Refused after [`Self::lock_wait`], with the reason.
    pub async fn turn(&self, node: &str) -> Result<NodeTurn, TurnRefused> {
        let deadline = tokio::time::Instant::now() + self.lock_wait;
        let lock = self
            .binding
            .lock()
            .entry(node.to_string())
            .or_insert_with(|| Arc::new(AsyncMutex::new(())))
            .clone();
        let guard = tokio::time::timeout_at(deadline, lock.lock_owned())
            .await
            .map_err(|_| TurnRefused::Binding {
                node: node.to_string(),
            })?;
        loop {
            let notified = self.admitted.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            let Some(pod) = self.first_awaited(node) else {
                return Ok(NodeTurn { _guard: guard });
            };
            if tokio::time::timeout_at(deadline, notified).await.is_err() {
                return Err(TurnRefused::Admitting {
                    node: node.to_string(),
                    pod,
                });
            }
        }
    }

    fn first_awaited(&self, node: &str) -> Option<String> {
        self.awaited
            .lock()
            .get(node)
            .and_then(|pods| pods.first().cloned())
    }

    /// The nodes a bind would wait for now: each is binding a carma pod or waiting for its kubelet
    /// to admit one.
    pub fn admitting(&self) -> BTreeSet<String> {
        let mut nodes: BTreeSet<String> = self
            .awaited
            .lock()
            .iter()
            .filter(|(_, pods)| !pods.is_empty())
            .map(|(node, _)| node.clone())
            .collect();
        nodes.extend(
            self.binding
                .lock()
                .iter()
                .filter(|(_, turn)| turn.try_lock().is_err())
                .map(|(node, _)| node.clone()),
        );
        nodes
    }

    /// Pod `uid` is bound to `node`, or about to be (bind calls it holding the node's turn; the pod
    /// watch for pods bound before this extender started): the node takes no other carma pod until
    /// this one is [`Self::admitted`] (or its bind failed, which counts the same).
    pub fn await_admission(&self, node: &str, uid: &str) {
        self.awaited
            .lock()
            .entry(node.to_string())
            .or_default()
            .insert(uid.to_string());
    }

    /// After a re-list: stop waiting for the pods that no longer exist (`exists` is false for them).
    pub fn retain_pods(&self, exists: impl Fn(&str) -> bool) {
        let mut changed = false;
        self.awaited.lock().retain(|_, pods| {
            let before = pods.len();
            pods.retain(|uid| exists(uid));
            changed |= pods.len() != before;
            !pods.is_empty()
        });
        if changed {
            self.admitted.notify_waiters();
        }
    }

    /// The pod watch saw pod `uid` allocated, started, running, ended or gone, or its bind failed.
    pub fn admitted(&self, uid: &str) {
        let mut changed = false;
        self.awaited.lock().retain(|_, pods| {
            changed |= pods.remove(uid);
            !pods.is_empty()
        });
        if changed {
            self.admitted.notify_waiters();
        }
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;

    use super::*;

    fn set(nodes: &[&str]) -> BTreeSet<String> {
        nodes.iter().map(|n| n.to_string()).collect()
    }

    #[tokio::test]
    async fn a_node_takes_its_next_pod_only_after_the_previous_is_admitted() {
        let h = Arc::new(Handoff::new(Duration::from_millis(100)));
        let first = h.turn("n1").await.expect("free node");
        h.await_admission("n1", "a");
        drop(first);
        // A second bind to the same node waits; to another node it does not.
        assert_eq!(h.admitting(), set(&["n1"]));
        assert_eq!(
            h.turn("n1").await.unwrap_err(),
            TurnRefused::Admitting {
                node: "n1".into(),
                pod: "a".into()
            }
        );
        assert!(h.turn("n2").await.is_ok());
        let h2 = h.clone();
        let waiter = tokio::spawn(async move { h2.turn("n1").await.is_ok() });
        tokio::time::sleep(Duration::from_millis(20)).await;
        h.admitted("b"); // not awaited: ignored
        assert!(!waiter.is_finished());
        h.admitted("a");
        assert!(waiter.await.unwrap(), "the turn passes once a is admitted");
        assert!(h.admitting().is_empty());
    }

    /// The guard never gives way to time: however long the kubelet takes, the next bind is refused
    /// (kube-scheduler retries it) until the pod bound before is admitted.
    #[tokio::test(start_paused = true)]
    async fn a_pod_never_admitted_keeps_its_node_closed_however_long_it_takes() {
        let h = Handoff::new(Duration::from_millis(100));
        drop(h.turn("n1").await.expect("free node"));
        h.await_admission("n1", "stuck");
        for _ in 0..5 {
            tokio::time::sleep(Duration::from_secs(60)).await;
            assert!(matches!(
                h.turn("n1").await,
                Err(TurnRefused::Admitting { .. })
            ));
        }
        assert_eq!(h.admitting(), set(&["n1"]));
        h.admitted("stuck");
        assert!(h.turn("n1").await.is_ok());
    }

    #[tokio::test]
    async fn a_bind_in_progress_holds_its_node_and_a_failed_bind_frees_it() {
        let h = Handoff::new(Duration::from_millis(50));
        let turn = h.turn("n1").await.expect("free node");
        assert_eq!(h.admitting(), set(&["n1"]), "binding");
        assert_eq!(
            h.turn("n1").await.unwrap_err(),
            TurnRefused::Binding { node: "n1".into() }
        );
        h.await_admission("n1", "a");
        // The Binding write failed: the node waits for nothing.
        h.admitted("a");
        drop(turn);
        assert!(h.admitting().is_empty());
        assert!(h.turn("n1").await.is_ok());
    }

    #[tokio::test]
    async fn pods_bound_before_a_restart_are_awaited_from_the_watch() {
        let h = Handoff::new(Duration::from_millis(50));
        h.await_admission("n1", "old-1");
        h.await_admission("n1", "old-2");
        h.admitted("old-1");
        assert!(matches!(
            h.turn("n1").await,
            Err(TurnRefused::Admitting { pod, .. }) if pod == "old-2"
        ));
        // A re-list no longer shows old-2: it was deleted while the watch was down.
        h.retain_pods(|uid| uid != "old-2");
        assert!(h.turn("n1").await.is_ok());
    }
}
