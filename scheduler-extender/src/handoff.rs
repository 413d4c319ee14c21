//! One kubelet admission at a time per node.
//!
//! kubelet's Allocate names device replicas but not the pod (kubernetes#82606), so when two carma
//! pods bound to one node await admission together, the device plugin can only guess which one
//! kubelet is admitting — and the real kubelet device manager showed that guesses go wrong under load
//! (a container got another pod's GPU and reservation). HAMi avoids this with a node lock; carma
//! does it inside the (single-active) extender: a bind to a node waits until the previous carma pod
//! bound there has been allocated by the device plugin (`carma.io/allocated`), has started, or has
//! ended — at most [`Handoff::admission_wait`] — so at most one carma pod per node is ever pending
//! admission. The bind that took the turn answers kube-scheduler once its Binding is written and
//! leaves the turn to a task that waits for the admission. A bind that cannot get its node within
//! [`Handoff::lock_wait`] is refused as a conflict and kube-scheduler retries it; that wait and the
//! write stay below kube-scheduler's extender `httpTimeout` (5 s in the chart), and a bind it hangs
//! up on still runs to its end (`crate::server`).

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

use parking_lot::Mutex;
use tokio::sync::{Mutex as AsyncMutex, Notify, OwnedMutexGuard};

/// Per-node bind serialization and admission tracking.
#[derive(Debug)]
pub struct Handoff {
    nodes: Mutex<HashMap<String, Arc<AsyncMutex<()>>>>,
    waiting: Mutex<Awaited>,
    admitted: Notify,
    /// Longest wait for the previous pod on the node to be admitted.
    pub admission_wait: Duration,
    /// Longest wait for the node's turn.
    pub lock_wait: Duration,
}

impl Default for Handoff {
    fn default() -> Self {
        Self::new(Duration::from_secs(2), Duration::from_millis(2500))
    }
}

/// The pods the nodes' turns wait on.
#[derive(Debug, Default)]
struct Awaited {
    /// The pod each node's turn waits on, by node.
    by_node: HashMap<String, String>,
    /// Those of them seen admitted.
    admitted: HashSet<String>,
}

impl Awaited {
    fn awaits(&self, uid: &str) -> bool {
        self.by_node.values().any(|u| u == uid)
    }
}

/// Held while a node admits the pod just bound to it.
#[derive(Debug)]
pub struct NodeTurn {
    _guard: OwnedMutexGuard<()>,
}

impl Handoff {
    /// Waits as documented on the module.
    pub fn new(admission_wait: Duration, lock_wait: Duration) -> Self {
        Self {
            nodes: Mutex::new(HashMap::new()),
            waiting: Mutex::new(Awaited::default()),
            admitted: Notify::new(),
            admission_wait,
            lock_wait,
        }
    }

    /// Wait for `node`'s turn; `None` after [`Self::lock_wait`].
    pub async fn turn(&self, node: &str) -> Option<NodeTurn> {
        let lock = self
            .nodes
            .lock()
            .entry(node.to_string())
            .or_insert_with(|| Arc::new(AsyncMutex::new(())))
            .clone();
        tokio::time::timeout(self.lock_wait, lock.lock_owned())
            .await
            .ok()
            .map(|g| NodeTurn { _guard: g })
    }

    /// The nodes whose turn a bind holds: each is binding a carma pod or waiting for the kubelet to
    /// admit it, and a bind to it now would wait for that. A node whose awaited pod has been seen
    /// admitted is not among them, even before its turn is handed on.
    pub fn admitting(&self) -> HashSet<String> {
        let w = self.waiting.lock();
        self.nodes
            .lock()
            .iter()
            .filter(|(_, turn)| turn.try_lock().is_err())
            .filter(|(node, _)| {
                w.by_node
                    .get(*node)
                    .is_none_or(|uid| !w.admitted.contains(uid))
            })
            .map(|(node, _)| node.clone())
            .collect()
    }

    /// Start watching for the admission of pod `uid`, about to be bound to `node` (call before
    /// binding it, holding the node's turn).
    pub fn expect(&self, node: &str, uid: &str) {
        self.waiting
            .lock()
            .by_node
            .insert(node.to_string(), uid.to_string());
    }

    /// Stop watching `uid` (a failed bind, or its wait is over).
    pub fn forget(&self, uid: &str) {
        let mut w = self.waiting.lock();
        w.by_node.retain(|_, awaited| awaited != uid);
        w.admitted.remove(uid);
    }

    /// The pod watcher saw pod `uid` allocated, running or ended.
    pub fn admitted(&self, uid: &str) {
        let mut w = self.waiting.lock();
        if w.awaits(uid) && w.admitted.insert(uid.to_string()) {
            drop(w);
            self.admitted.notify_waiters();
        }
    }

    /// Wait until `uid` is admitted or [`Self::admission_wait`] passes; whether it was admitted.
    /// Either way `uid` is no longer watched afterwards.
    pub async fn wait_admitted(&self, uid: &str) -> bool {
        let deadline = tokio::time::Instant::now() + self.admission_wait;
        let seen = loop {
            let notified = self.admitted.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            if self.waiting.lock().admitted.contains(uid) {
                break true;
            }
            if tokio::time::timeout_at(deadline, notified).await.is_err() {
                break false;
            }
        };
        self.forget(uid);
        seen
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_node_takes_its_next_pod_only_after_the_previous_is_admitted() {
        let h = Arc::new(Handoff::new(
            Duration::from_secs(5),
            Duration::from_millis(100),
        ));
        let first = h.turn("n1").await.expect("free node");
        h.expect("n1", "a");
        // A second bind to the same node waits; to another node it does not.
        assert_eq!(h.admitting(), HashSet::from(["n1".to_string()]));
        assert!(h.turn("n1").await.is_none(), "n1 is busy admitting a");
        assert!(h.turn("n2").await.is_some());
        let h2 = h.clone();
        let waiter = tokio::spawn(async move { h2.wait_admitted("a").await });
        tokio::time::sleep(Duration::from_millis(20)).await;
        h.admitted("b"); // not awaited: ignored
        h.admitted("a");
        assert!(waiter.await.unwrap());
        drop(first);
        assert!(h.admitting().is_empty());
        assert!(h.turn("n1").await.is_some());
    }

    #[tokio::test]
    async fn a_pod_never_admitted_releases_its_node_after_the_wait() {
        let h = Handoff::new(Duration::from_millis(30), Duration::from_millis(100));
        h.expect("n1", "stuck");
        assert!(!h.wait_admitted("stuck").await);
        // Admission seen before the wait began still counts.
        h.expect("n1", "quick");
        h.admitted("quick");
        assert!(h.wait_admitted("quick").await);
    }

    #[tokio::test]
    async fn a_node_whose_pod_is_admitted_is_no_longer_admitting_before_its_turn_passes() {
        let h = Handoff::new(Duration::from_secs(5), Duration::from_millis(100));
        let turn = h.turn("n1").await.expect("free node");
        assert_eq!(h.admitting(), HashSet::from(["n1".to_string()]), "binding");
        h.expect("n1", "a");
        assert_eq!(
            h.admitting(),
            HashSet::from(["n1".to_string()]),
            "awaiting a"
        );
        // The pod watch saw it admitted; the task holding the turn has not run yet.
        h.admitted("a");
        assert!(h.admitting().is_empty());
        assert!(h.wait_admitted("a").await);
        drop(turn);
        assert!(h.admitting().is_empty());
    }
}
