//! Why an attempt pod that has not started waits, read off the pod: kube-scheduler (with carma's
//! extender) found no node for it, or kubelet cannot start one of its containers. Pure; the
//! planner writes what it finds into the task's `Scheduled` and `AttemptStarted` conditions and
//! its `status.message`, so that `kubectl get trainingtasks` says why a task is Pending.

use carma_core::text::truncate_at_char_boundary;
use k8s_openapi::api::core::v1::{ContainerStatus, Pod};

/// Kubelet's reasons for a waiting container that will not start without the user's help.
/// Others (`ContainerCreating`, `PodInitializing`) are the normal way to a running container.
pub const BLOCKING_CONTAINER_REASONS: &[&str] = &[
    "ErrImagePull",
    "ImagePullBackOff",
    "InvalidImageName",
    "CreateContainerConfigError",
];

/// The `PodScheduled` reasons that say why a pod waits for a node. `SchedulingGated` and a pod
/// not tried yet are the ordinary way.
pub const SCHEDULER_REFUSALS: &[&str] = &["Unschedulable", "SchedulerError"];

/// Longest scheduler or kubelet message kept, in bytes. kube-scheduler lists every distinct reason
/// a node was refused for, and the extender's per-node reasons name each node's figures, so on a
/// large cluster the message runs to kilobytes; the printer column and the condition keep its
/// head, which says how many nodes were tried and the first reasons.
pub const MESSAGE_MAX_BYTES: usize = 512;

/// Why an attempt pod waits.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Waiting {
    /// The scheduler has not placed the pod: its `PodScheduled` condition is False with reason
    /// `Unschedulable` (no node fits) or `SchedulerError` (the attempt failed, e.g. carma's
    /// extender asked for a retry because only GPU telemetry or time can free a node).
    NotScheduled {
        /// The condition's reason, one of [`SCHEDULER_REFUSALS`].
        reason: &'static str,
        /// The scheduler's message (its per-node reasons, the extender's among them), summarised.
        message: String,
    },
    /// A container cannot start: its waiting reason is one of [`BLOCKING_CONTAINER_REASONS`].
    ContainerBlocked {
        /// The container's name.
        container: String,
        /// Kubelet's reason, e.g. `ImagePullBackOff`.
        reason: String,
        /// Kubelet's message, summarised (may be empty).
        message: String,
    },
}

impl Waiting {
    /// The CamelCase reason for a condition: the scheduler's or kubelet's.
    pub fn reason(&self) -> &str {
        match self {
            Waiting::NotScheduled { reason, .. } => reason,
            Waiting::ContainerBlocked { reason, .. } => reason,
        }
    }

    /// One line for a person: the scheduler's message, or `container C: REASON: message`.
    pub fn describe(&self) -> String {
        match self {
            Waiting::NotScheduled { message, .. } if message.is_empty() => {
                "no node fits (the scheduler gave no reason)".to_string()
            }
            Waiting::NotScheduled { message, .. } => message.clone(),
            Waiting::ContainerBlocked {
                container,
                reason,
                message,
            } if message.is_empty() => format!("container {container}: {reason}"),
            Waiting::ContainerBlocked {
                container,
                reason,
                message,
            } => format!("container {container}: {reason}: {message}"),
        }
    }
}

/// Why `pod` waits, when its status says: the scheduler's refusal first (a pod that has no node
/// has no container to start), then the first init container, then the first container, whose
/// waiting reason is one of [`BLOCKING_CONTAINER_REASONS`]. `None` for a pod that has left
/// `Pending`, and for one that waits the ordinary way (not tried yet, creating its containers).
pub fn waiting(pod: &Pod) -> Option<Waiting> {
    let status = pod.status.as_ref()?;
    if status.phase.as_deref().is_some_and(|p| p != "Pending") {
        return None;
    }
    let refused = status.conditions.iter().flatten().find_map(|c| {
        let reason = c.reason.as_deref()?;
        let known = SCHEDULER_REFUSALS.iter().find(|r| **r == reason)?;
        (c.type_ == "PodScheduled" && c.status == "False").then_some((*known, c))
    });
    if let Some((reason, c)) = refused {
        return Some(Waiting::NotScheduled {
            reason,
            message: summarize(c.message.as_deref().unwrap_or(""), MESSAGE_MAX_BYTES),
        });
    }
    let blocked = |c: &ContainerStatus| {
        let w = c.state.as_ref()?.waiting.as_ref()?;
        let reason = w.reason.as_deref()?;
        BLOCKING_CONTAINER_REASONS
            .contains(&reason)
            .then(|| Waiting::ContainerBlocked {
                container: c.name.clone(),
                reason: reason.to_string(),
                message: summarize(w.message.as_deref().unwrap_or(""), MESSAGE_MAX_BYTES),
            })
    };
    status
        .init_container_statuses
        .iter()
        .flatten()
        .chain(status.container_statuses.iter().flatten())
        .find_map(blocked)
}

/// `message` on one line (runs of white space, newlines included, become one space) and, when
/// longer than `max_bytes`, cut on a character boundary and ended with how much was left out:
/// `… (+N bytes)`, the whole within `max_bytes`.
pub fn summarize(message: &str, max_bytes: usize) -> String {
    let line = message.split_whitespace().collect::<Vec<_>>().join(" ");
    if line.len() <= max_bytes {
        return line;
    }
    // The marker's length depends on the count it carries; the count is at most the whole line's
    // length, so reserving room for that many digits always fits.
    let marker_len = format!("… (+{} bytes)", line.len()).len();
    let head = truncate_at_char_boundary(&line, max_bytes.saturating_sub(marker_len)).trim_end();
    format!("{head}… (+{} bytes)", line.len() - head.len())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn pod(status: serde_json::Value) -> Pod {
        serde_json::from_value(json!({
            "metadata": {"name": "t-a1"},
            "spec": {"containers": [{"name": "train", "image": "x"}]},
            "status": status,
        }))
        .unwrap()
    }

    fn unschedulable(message: &str) -> Pod {
        pod(json!({"phase": "Pending", "conditions": [{
            "type": "PodScheduled", "status": "False", "reason": "Unschedulable", "message": message
        }]}))
    }

    fn container_waiting(list: &str, name: &str, reason: &str, message: &str) -> Pod {
        pod(json!({"phase": "Pending",
        "conditions": [{"type": "PodScheduled", "status": "True"}],
        list: [{
            "name": name, "image": "x", "imageID": "", "ready": false, "restartCount": 0,
            "state": {"waiting": {"reason": reason, "message": message}}
        }]}))
    }

    #[test]
    fn unschedulable_carries_the_schedulers_message() {
        let msg = "0/3 nodes are available: 1 node(s) had untolerated taint {gpu: true}, \
                   2 carma: no GPU has 8000 MiB free (largest 6000 MiB). preemption: 0/3 nodes \
                   are available: 3 No preemption victims found for incoming pod.";
        let w = waiting(&unschedulable(msg)).unwrap();
        assert_eq!(w.reason(), "Unschedulable");
        assert_eq!(
            w.describe(),
            msg.split_whitespace().collect::<Vec<_>>().join(" ")
        );
        // Without a message it still says something.
        let w = waiting(&unschedulable("")).unwrap();
        assert_eq!(w.describe(), "no node fits (the scheduler gave no reason)");
    }

    #[test]
    fn a_retry_the_extender_asked_for_is_a_reason_to_wait() {
        let msg = "carma: retry: no node takes pod ml/t-a1 yet (0 of 2); on 1 only GPU telemetry \
                   or time, which kube-scheduler does not watch, can lift the refusal: node n1: \
                   GPU 0 (GPU-1) is in its warm-up lock";
        let p = pod(json!({"phase": "Pending", "conditions": [{
            "type": "PodScheduled", "status": "False", "reason": "SchedulerError", "message": msg
        }]}));
        let w = waiting(&p).unwrap();
        assert_eq!(w.reason(), "SchedulerError");
        assert!(w.describe().contains("warm-up lock"), "{w:?}");
    }

    #[test]
    fn a_pod_not_yet_tried_or_scheduled_waits_the_ordinary_way() {
        assert_eq!(waiting(&pod(json!({"phase": "Pending"}))), None);
        assert_eq!(waiting(&pod(json!(null))), None);
        // Other PodScheduled reasons (gated, or not tried) are not a refusal.
        let gated = pod(json!({"phase": "Pending", "conditions": [{
            "type": "PodScheduled", "status": "False", "reason": "SchedulingGated"}]}));
        assert_eq!(waiting(&gated), None);
        let creating = container_waiting("containerStatuses", "train", "ContainerCreating", "");
        assert_eq!(waiting(&creating), None);
    }

    #[test]
    fn each_blocking_container_reason_is_reported() {
        // Spelled out rather than read from the list, so that a reason dropped from it fails here.
        for reason in [
            "ErrImagePull",
            "ImagePullBackOff",
            "InvalidImageName",
            "CreateContainerConfigError",
        ] {
            let message = format!("{reason} for image \"registry.example/pytorch:nope\"");
            let w = waiting(&container_waiting(
                "containerStatuses",
                "train",
                reason,
                &message,
            ))
            .unwrap();
            assert_eq!(w.reason(), reason);
            assert_eq!(
                w.describe(),
                format!("container train: {reason}: {message}")
            );
        }
        let w = waiting(&container_waiting(
            "containerStatuses",
            "train",
            "ImagePullBackOff",
            "",
        ))
        .unwrap();
        assert_eq!(w.describe(), "container train: ImagePullBackOff");
    }

    #[test]
    fn init_containers_are_read_too() {
        let w = waiting(&container_waiting(
            "initContainerStatuses",
            "fetch-data",
            "ErrImagePull",
            "pull access denied",
        ))
        .unwrap();
        assert_eq!(
            w,
            Waiting::ContainerBlocked {
                container: "fetch-data".into(),
                reason: "ErrImagePull".into(),
                message: "pull access denied".into(),
            }
        );
    }

    #[test]
    fn a_pod_past_pending_does_not_wait() {
        let mut p = container_waiting("containerStatuses", "train", "ImagePullBackOff", "x");
        p.status.as_mut().unwrap().phase = Some("Running".into());
        assert_eq!(waiting(&p), None);
        let mut p = unschedulable("0/1 nodes are available");
        p.status.as_mut().unwrap().phase = Some("Failed".into());
        assert_eq!(waiting(&p), None);
    }

    #[test]
    fn long_messages_are_cut_on_a_character_boundary_with_a_count() {
        // kube-scheduler lists each distinct per-node reason; the extender's name each node.
        let reasons: Vec<String> = (0..200)
            .map(|i| format!("1 carma: gpu-node-{i}: GPU 0 has {i}00 MiB free, needs 9000 MiB"))
            .collect();
        let msg = format!("0/200 nodes are available: {}.", reasons.join(", "));
        let w = waiting(&unschedulable(&msg)).unwrap();
        let text = w.describe();
        assert!(text.len() <= MESSAGE_MAX_BYTES, "{} bytes", text.len());
        assert!(
            text.starts_with("0/200 nodes are available: 1 carma: gpu-node-0:"),
            "{text}"
        );
        let (head, tail) = text.rsplit_once("… (+").unwrap();
        let omitted: usize = tail.trim_end_matches(" bytes)").parse().unwrap();
        assert_eq!(
            head.len() + omitted,
            msg.len(),
            "the count is what was left out"
        );

        // Multi-byte characters are never split, whatever the limit.
        let wide = "é".repeat(400);
        for max in 20..60 {
            let s = summarize(&wide, max);
            assert!(s.len() <= max, "{max}: {} bytes", s.len());
            assert!(s.contains("… (+"), "{s}");
        }
        // Short messages are kept, on one line.
        assert_eq!(summarize("a\n  b\tc ", 100), "a b c");
    }
}
