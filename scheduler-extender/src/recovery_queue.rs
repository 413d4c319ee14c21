//! The recovery attempts waiting for GPUs, as the pod watch shows them: pods of priority class
//! `carma-recovery` (the operator's retries after an out-of-memory crash) that ask for
//! `carma.io/gpu`, are not bound yet and are not being deleted.
//!
//! While one waits, every other pod is judged with `carma_core::placement::recovery_first` and may
//! take idle GPUs only — CARMA's rule, which the simulator applies with its recovery queue.

use std::collections::HashSet;

use carma_api::names::PRIORITY_CLASS_RECOVERY;
use carma_api::resources::container_gpus;
use k8s_openapi::api::core::v1::Pod;
use parking_lot::RwLock;

/// UIDs of the recovery pods waiting for GPUs.
#[derive(Debug, Default)]
pub struct RecoveryQueue {
    waiting: RwLock<HashSet<String>>,
}

/// Whether `pod` is a recovery attempt (priority class `carma-recovery`).
pub fn is_recovery(pod: &Pod) -> bool {
    pod.spec
        .as_ref()
        .and_then(|s| s.priority_class_name.as_deref())
        == Some(PRIORITY_CLASS_RECOVERY)
}

fn waits_for_gpus(pod: &Pod) -> bool {
    let Some(spec) = pod.spec.as_ref() else {
        return false;
    };
    let finished = pod
        .status
        .as_ref()
        .and_then(|s| s.phase.as_deref())
        .is_some_and(|p| p != "Pending");
    is_recovery(pod)
        && spec.node_name.is_none()
        && pod.metadata.deletion_timestamp.is_none()
        && !finished
        && spec
            .containers
            .iter()
            .chain(spec.init_containers.iter().flatten())
            .any(|c| matches!(container_gpus(c), Ok(n) if n > 0))
}

impl RecoveryQueue {
    /// An empty queue.
    pub fn new() -> Self {
        Self::default()
    }

    /// A pod was added or changed.
    pub fn observe(&self, pod: &Pod) {
        let Some(uid) = pod.metadata.uid.as_deref() else {
            return;
        };
        if waits_for_gpus(pod) {
            if !self.waiting.read().contains(uid) {
                self.waiting.write().insert(uid.to_string());
            }
        } else {
            self.forget(uid);
        }
    }

    /// A pod is gone, or was just bound by this extender.
    pub fn forget(&self, uid: &str) {
        if self.waiting.read().contains(uid) {
            self.waiting.write().remove(uid);
        }
    }

    /// Keep only the pods in `uids` (after a re-list).
    pub fn retain(&self, uids: &HashSet<String>) {
        self.waiting.write().retain(|u| uids.contains(u));
    }

    /// Whether a recovery attempt other than `uid` waits for GPUs.
    pub fn waiting_besides(&self, uid: &str) -> bool {
        self.waiting.read().iter().any(|u| u != uid)
    }

    /// How many recovery attempts wait.
    #[cfg(test)]
    fn len(&self) -> usize {
        self.waiting.read().len()
    }

    /// Whether none waits.
    #[cfg(test)]
    fn is_empty(&self) -> bool {
        self.waiting.read().is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn pod(uid: &str, class: Option<&str>, node: Option<&str>, gpus: u32) -> Pod {
        serde_json::from_value(json!({
            "metadata": {"name": uid, "namespace": "ml", "uid": uid},
            "spec": {
                "priorityClassName": class,
                "nodeName": node,
                "containers": [{"name": "train", "resources": {"limits": {"carma.io/gpu": gpus.to_string()}}}]
            },
            "status": {"phase": "Pending"}
        }))
        .unwrap()
    }

    #[test]
    fn only_unbound_recovery_pods_asking_for_gpus_wait() {
        let q = RecoveryQueue::new();
        q.observe(&pod("r1", Some("carma-recovery"), None, 1));
        q.observe(&pod("n1", None, None, 1));
        q.observe(&pod("r2", Some("carma-recovery"), Some("node-a"), 1));
        q.observe(&pod("r3", Some("carma-recovery"), None, 0));
        assert_eq!(q.len(), 1);
        assert!(q.waiting_besides("n1"));
        assert!(
            !q.waiting_besides("r1"),
            "a recovery pod does not wait for itself"
        );
        // Bound: no longer waiting.
        q.observe(&pod("r1", Some("carma-recovery"), Some("node-a"), 1));
        assert!(q.is_empty());
        q.observe(&pod("r4", Some("carma-recovery"), None, 2));
        q.retain(&HashSet::new());
        assert!(q.is_empty());
    }
}
