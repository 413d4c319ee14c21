//! How an attempt pod stands, and how a finished one ended: the Kubernetes adapter of
//! [`carma_core::exit`].
//!
//! Pure functions over a [`Pod`] (and, when its termination message is empty, the last lines of
//! its log). What the pod says of itself — eviction, preemption, a node lost, a pod that failed
//! before or around its training container — is judged here; how the training container ended is
//! read into a [`ContainerExit`] and judged by [`classify_exit`], the rule `carma local` uses too.
//! The operator sets `terminationMessagePolicy: FallbackToLogsOnError`, which copies the log tail
//! into the termination message, so the log is read only when that is empty.

use k8s_openapi::api::core::v1::{Container, ContainerStateTerminated, ContainerStatus, Pod};

use carma_api::AttemptOutcomeKind;
use carma_core::exit::short_reason;
pub use carma_core::exit::{
    ContainerExit, DEFAULT_OOM_PATTERNS, OomPatterns, PatternError, Verdict, VerdictKind,
    classify_exit,
};
pub(crate) use carma_core::text::truncate_chars as truncate;

/// Pod `status.reason` values that mean the pod was removed or refused through no
/// fault of its own (eviction, preemption, node shutdown or loss, admission).
const DISRUPTION_REASONS: &[&str] = &[
    "Evicted",
    "Preempting",
    "NodeLost",
    "Shutdown",
    "NodeShutdown",
    "Terminated",
    "UnexpectedAdmissionError",
    "NodeAffinity",
];

/// The status outcome (`status.attempts[].outcome`) of a verdict.
pub fn outcome_kind(kind: VerdictKind) -> AttemptOutcomeKind {
    match kind {
        VerdictKind::Succeeded => AttemptOutcomeKind::Succeeded,
        VerdictKind::GpuOutOfMemory => AttemptOutcomeKind::GpuOutOfMemory,
        VerdictKind::Failed => AttemptOutcomeKind::Failed,
        VerdictKind::Evicted => AttemptOutcomeKind::Evicted,
        VerdictKind::HostOomKilled => AttemptOutcomeKind::HostOomKilled,
    }
}

/// Where an attempt pod stands.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PodProgress {
    /// Not running yet (waiting for the scheduler, pulling images, …).
    Pending,
    /// The training container runs.
    Running,
    /// It ended.
    Finished(Verdict),
    /// It failed with an empty termination message: read the last log lines of
    /// `container` and classify again with them.
    NeedsLogs {
        /// The training container.
        container: String,
    },
}

/// Classify an attempt pod. `logs` is the tail of the training container's log,
/// when it was read (pass `Some("")` when reading it failed).
pub fn classify(pod: &Pod, logs: Option<&str>, patterns: &OomPatterns) -> PodProgress {
    let Some(status) = pod.status.as_ref() else {
        return PodProgress::Pending;
    };
    let phase = status.phase.as_deref().unwrap_or("Pending");
    let training = training_container_status(pod);
    let terminated = training
        .and_then(|c| c.state.as_ref())
        .and_then(|s| s.terminated.as_ref());

    let pod_failed = phase == "Failed";
    if phase == "Succeeded" {
        return PodProgress::Finished(Verdict::Succeeded);
    }
    if !pod_failed && terminated.is_none() {
        return if phase == "Running" {
            PodProgress::Running
        } else {
            PodProgress::Pending
        };
    }

    // The pod (or its training container) has ended.
    let pod_reason = status.reason.as_deref().unwrap_or("");
    let pod_message = status.message.as_deref().unwrap_or("");
    if pod_failed && (DISRUPTION_REASONS.contains(&pod_reason) || pod_reason.starts_with("OutOf")) {
        return PodProgress::Finished(Verdict::Evicted {
            reason: short_reason(pod_reason, pod_message),
        });
    }
    if let Some(cond) = status
        .conditions
        .iter()
        .flatten()
        .find(|c| c.type_ == "DisruptionTarget" && c.status == "True")
    {
        return PodProgress::Finished(Verdict::Evicted {
            reason: short_reason(
                cond.reason.as_deref().unwrap_or("DisruptionTarget"),
                cond.message.as_deref().unwrap_or(""),
            ),
        });
    }

    match terminated {
        Some(t) => classify_terminated(t, pod_failed, pod_reason, pod_message, logs, patterns, pod),
        None => PodProgress::Finished(Verdict::Failed {
            reason: if pod_reason.is_empty() && pod_message.is_empty() {
                "pod failed before the training container ran".to_string()
            } else {
                short_reason(pod_reason, pod_message)
            },
        }),
    }
}

fn classify_terminated(
    t: &ContainerStateTerminated,
    pod_failed: bool,
    pod_reason: &str,
    pod_message: &str,
    logs: Option<&str>,
    patterns: &OomPatterns,
    pod: &Pod,
) -> PodProgress {
    if t.exit_code == 0 && pod_failed {
        return PodProgress::Finished(Verdict::Failed {
            reason: format!(
                "training container exited 0 but the pod failed: {}",
                short_reason(pod_reason, pod_message)
            ),
        });
    }
    let advice = host_memory_advice(training_container(pod));
    let exit = ContainerExit {
        exit_code: t.exit_code,
        reason: t.reason.as_deref().unwrap_or(""),
        message: t.message.as_deref().unwrap_or(""),
        log_tail: logs.unwrap_or(""),
        host_memory_advice: Some(&advice),
    };
    if logs.is_none() && exit.reads_log_tail(patterns) {
        return PodProgress::NeedsLogs {
            container: training_container_name(pod).unwrap_or_default(),
        };
    }
    PodProgress::Finished(classify_exit(&exit, patterns))
}

/// For the reason of an `OOMKilled` training container: the memory limit to raise (the
/// container's own, when it has one).
fn host_memory_advice(container: Option<&Container>) -> String {
    let name = container.map_or("training", |c| c.name.as_str());
    let resources = container.and_then(|c| c.resources.as_ref());
    let limit = resources
        .and_then(|r| r.limits.as_ref())
        .and_then(|l| l.get("memory"));
    let request = resources
        .and_then(|r| r.requests.as_ref())
        .and_then(|l| l.get("memory"));
    match (limit, request) {
        (Some(l), _) => format!(
            "container {name} exceeded its host memory limit (resources.limits.memory {}); \
             raise that limit in spec.template",
            l.0
        ),
        (None, Some(r)) => format!(
            "container {name} has no host memory limit and the node ran short of memory \
             (resources.requests.memory {}); raise its memory request and set a memory limit in \
             spec.template",
            r.0
        ),
        (None, None) => format!(
            "container {name} has no host memory request or limit and the node ran short of \
             memory; set resources.requests.memory and resources.limits.memory in spec.template"
        ),
    }
}

/// Name of the training container: the first container of the pod.
pub fn training_container_name(pod: &Pod) -> Option<String> {
    training_container(pod).map(|c| c.name.clone())
}

fn training_container(pod: &Pod) -> Option<&Container> {
    pod.spec.as_ref().and_then(|s| s.containers.first())
}

/// The status of the pod's training container (its first), once kubelet reports one.
pub(crate) fn training_container_status(pod: &Pod) -> Option<&ContainerStatus> {
    let name = training_container_name(pod)?;
    pod.status
        .as_ref()?
        .container_statuses
        .iter()
        .flatten()
        .find(|c| c.name == name)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn pod(status: serde_json::Value) -> Pod {
        serde_json::from_value(json!({
            "metadata": {"name": "t-a1"},
            "spec": {"containers": [{"name": "train", "image": "x"}, {"name": "side", "image": "y"}]},
            "status": status,
        }))
        .unwrap()
    }

    fn failed(exit: i32, reason: &str, message: &str) -> Pod {
        pod(json!({
            "phase": "Failed",
            "containerStatuses": [{
                "name": "train", "image": "x", "imageID": "", "ready": false, "restartCount": 0,
                "state": {"terminated": {"exitCode": exit, "reason": reason, "message": message}}
            }]
        }))
    }

    fn finished(p: &Pod, logs: Option<&str>) -> Verdict {
        match classify(p, logs, &OomPatterns::default()) {
            PodProgress::Finished(v) => v,
            other => panic!("not finished: {other:?}"),
        }
    }

    /// The pattern table itself is carma-core's (`carma_core::exit`); here, that the pod's
    /// termination message reaches it.
    #[test]
    fn termination_message_is_the_evidence() {
        let cases: &[(&str, AttemptOutcomeKind)] = &[
            (
                "Traceback (most recent call last):\ntorch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB",
                AttemptOutcomeKind::GpuOutOfMemory,
            ),
            (
                "ResourceExhaustedError: OOM when allocating tensor with shape[256,1024,1024] and type float on /job:localhost/replica:0/task:0/device:GPU:0 by allocator GPU_0_bfc",
                AttemptOutcomeKind::GpuOutOfMemory,
            ),
            (
                "Exception in thread \"main\" java.lang.OutOfMemoryError: Java heap space",
                AttemptOutcomeKind::Failed,
            ),
            ("ValueError: bad config", AttemptOutcomeKind::Failed),
        ];
        for (message, want) in cases {
            // Some(""): a message that names no OOM sends the operator to the log; here it was empty.
            let v = finished(&failed(1, "Error", message), Some(""));
            assert_eq!(outcome_kind(v.kind()), *want, "{message}: {v:?}");
        }
    }

    #[test]
    fn oom_evidence_is_the_matching_line_and_failure_reason_the_last_line() {
        let v = finished(
            &failed(
                1,
                "Error",
                "epoch 3\ntorch.OutOfMemoryError: CUDA out of memory.\nexiting",
            ),
            None,
        );
        assert_eq!(
            v,
            Verdict::GpuOutOfMemory {
                evidence: "torch.OutOfMemoryError: CUDA out of memory.".into()
            }
        );
        let v = finished(
            &failed(2, "Error", "loading\nValueError: no such file\n\n"),
            Some(""),
        );
        assert_eq!(
            v,
            Verdict::Failed {
                reason: "exit code 2 (Error): ValueError: no such file".into()
            }
        );
    }

    #[test]
    fn oomkilled_is_a_host_memory_kill_not_a_gpu_oom() {
        // Seen against the real control plane: OOMKilled grew the GPU reservation and ran the next
        // attempt at recovery priority, which cannot help a host-memory kill.
        let v = finished(&failed(137, "OOMKilled", ""), None);
        assert_eq!(outcome_kind(v.kind()), AttemptOutcomeKind::HostOomKilled);
        let reason = v.reason();
        assert!(reason.starts_with("OOMKilled (exit code 137)"), "{reason}");
        assert!(reason.contains("not GPU memory"), "{reason}");
        assert!(reason.contains("resources.limits.memory"), "{reason}");
        // Even when the message or log names a CUDA OOM, the kernel's kill decides.
        let v = finished(
            &failed(137, "OOMKilled", "RuntimeError: CUDA out of memory."),
            None,
        );
        assert_eq!(outcome_kind(v.kind()), AttemptOutcomeKind::HostOomKilled);
        // No log is needed to tell.
        assert!(matches!(
            classify(&failed(137, "OOMKilled", ""), None, &OomPatterns::default()),
            PodProgress::Finished(Verdict::HostOomKilled { .. })
        ));
    }

    #[test]
    fn oomkilled_reason_names_the_limit_to_raise() {
        let with = |resources: serde_json::Value| {
            let mut p = failed(137, "OOMKilled", "");
            let spec: k8s_openapi::api::core::v1::PodSpec = serde_json::from_value(json!({
                "containers": [{"name": "train", "image": "x", "resources": resources}]
            }))
            .unwrap();
            p.spec = Some(spec);
            finished(&p, None).reason()
        };
        let r = with(json!({"limits": {"memory": "8Gi"}, "requests": {"memory": "6Gi"}}));
        assert!(
            r.contains(
                "container train exceeded its host memory limit (resources.limits.memory 8Gi)"
            ),
            "{r}"
        );
        assert!(r.contains("raise that limit"), "{r}");
        let r = with(json!({"requests": {"memory": "6Gi"}}));
        assert!(r.contains("no host memory limit"), "{r}");
        assert!(r.contains("resources.requests.memory 6Gi"), "{r}");
        let r = with(json!({}));
        assert!(
            r.contains("set resources.requests.memory and resources.limits.memory"),
            "{r}"
        );
    }

    #[test]
    fn empty_message_asks_for_logs_then_uses_them() {
        let p = failed(1, "Error", "");
        assert_eq!(
            classify(&p, None, &OomPatterns::default()),
            PodProgress::NeedsLogs {
                container: "train".into()
            }
        );
        let v = finished(&p, Some("step 10\nRuntimeError: CUDA out of memory. Tried"));
        assert_eq!(outcome_kind(v.kind()), AttemptOutcomeKind::GpuOutOfMemory);
        let v = finished(&p, Some(""));
        assert_eq!(
            v,
            Verdict::Failed {
                reason: "exit code 1 (Error)".into()
            }
        );
    }

    #[test]
    fn success_and_running_and_pending() {
        assert_eq!(
            finished(&pod(json!({"phase": "Succeeded"})), None),
            Verdict::Succeeded
        );
        let p = pod(json!({"phase": "Running", "containerStatuses": [{
            "name": "train", "image": "x", "imageID": "", "ready": true, "restartCount": 0,
            "state": {"running": {"startedAt": "2026-01-01T00:00:00Z"}}}]}));
        assert_eq!(
            classify(&p, None, &OomPatterns::default()),
            PodProgress::Running
        );
        let p = pod(json!({"phase": "Pending"}));
        assert_eq!(
            classify(&p, None, &OomPatterns::default()),
            PodProgress::Pending
        );
        let p: Pod = serde_json::from_value(json!({"metadata": {"name": "x"}})).unwrap();
        assert_eq!(
            classify(&p, None, &OomPatterns::default()),
            PodProgress::Pending
        );
    }

    #[test]
    fn training_container_exit_decides_while_a_sidecar_runs() {
        let p = pod(json!({"phase": "Running", "containerStatuses": [
            {"name": "train", "image": "x", "imageID": "", "ready": false, "restartCount": 0,
             "state": {"terminated": {"exitCode": 1, "message": "torch.OutOfMemoryError: CUDA out of memory"}}},
            {"name": "side", "image": "y", "imageID": "", "ready": true, "restartCount": 0,
             "state": {"running": {}}}]}));
        assert_eq!(
            outcome_kind(finished(&p, None).kind()),
            AttemptOutcomeKind::GpuOutOfMemory
        );
        let p = pod(json!({"phase": "Running", "containerStatuses": [
            {"name": "train", "image": "x", "imageID": "", "ready": false, "restartCount": 0,
             "state": {"terminated": {"exitCode": 0}}}]}));
        assert_eq!(finished(&p, None), Verdict::Succeeded);
    }

    #[test]
    fn exit_zero_in_a_failed_pod_is_a_failure() {
        let v = finished(
            &pod(
                json!({"phase": "Failed", "reason": "DeadlineExceeded", "containerStatuses": [{
                "name": "train", "image": "x", "imageID": "", "ready": false, "restartCount": 0,
                "state": {"terminated": {"exitCode": 0}}}]}),
            ),
            None,
        );
        assert_eq!(
            v,
            Verdict::Failed {
                reason: "training container exited 0 but the pod failed: DeadlineExceeded".into()
            }
        );
    }

    #[test]
    fn disruption_table() {
        let cases = [
            json!({"phase": "Failed", "reason": "Evicted", "message": "The node was low on resource: memory."}),
            json!({"phase": "Failed", "reason": "Preempting"}),
            json!({"phase": "Failed", "reason": "NodeLost"}),
            json!({"phase": "Failed", "reason": "Terminated", "message": "Pod was terminated in response to imminent node shutdown."}),
            json!({"phase": "Failed", "reason": "UnexpectedAdmissionError"}),
            json!({"phase": "Failed", "reason": "OutOfcarma.io/gpu"}),
            json!({"phase": "Failed", "conditions": [{"type": "DisruptionTarget", "status": "True",
                "reason": "PreemptionByScheduler", "message": "preempted by a higher priority pod"}],
                "containerStatuses": [{"name": "train", "image": "x", "imageID": "", "ready": false,
                "restartCount": 0, "state": {"terminated": {"exitCode": 137, "reason": "Error"}}}]}),
        ];
        for status in cases {
            let v = finished(&pod(status.clone()), None);
            assert_eq!(
                outcome_kind(v.kind()),
                AttemptOutcomeKind::Evicted,
                "{status}: {v:?}"
            );
        }
        let v = finished(
            &pod(json!({"phase": "Failed", "reason": "Evicted", "message": "low on memory"})),
            None,
        );
        assert_eq!(v.reason(), "Evicted: low on memory");
    }

    #[test]
    fn disruption_waits_until_the_pod_has_ended() {
        let p = pod(
            json!({"phase": "Running", "conditions": [{"type": "DisruptionTarget", "status": "True",
            "reason": "EvictionByEvictionAPI"}]}),
        );
        assert_eq!(
            classify(&p, None, &OomPatterns::default()),
            PodProgress::Running
        );
    }

    #[test]
    fn other_pod_failures() {
        let v = finished(
            &pod(json!({"phase": "Failed", "reason": "DeadlineExceeded", "message": "too long"})),
            None,
        );
        assert_eq!(
            v,
            Verdict::Failed {
                reason: "DeadlineExceeded: too long".into()
            }
        );
        let v = finished(&pod(json!({"phase": "Failed"})), None);
        assert_eq!(outcome_kind(v.kind()), AttemptOutcomeKind::Failed);
    }

    #[test]
    fn custom_patterns() {
        let p = OomPatterns::new(["my allocator gave up"]).unwrap();
        let pod = failed(1, "Error", "fatal: My allocator gave up");
        assert_eq!(
            classify(&pod, None, &p),
            PodProgress::Finished(Verdict::GpuOutOfMemory {
                evidence: "fatal: My allocator gave up".into()
            })
        );
        let pod = failed(1, "Error", "CUDA out of memory");
        // The message names no OOM by these patterns, so the log is asked for, then decides.
        assert!(matches!(
            classify(&pod, None, &p),
            PodProgress::NeedsLogs { .. }
        ));
        assert!(matches!(
            classify(&pod, Some("step 3"), &p),
            PodProgress::Finished(Verdict::Failed { .. })
        ));
        assert_eq!(
            classify(&pod, Some("step 3\nMy allocator gave up"), &p),
            PodProgress::Finished(Verdict::GpuOutOfMemory {
                evidence: "My allocator gave up".into()
            })
        );
    }

    #[test]
    fn long_reasons_are_cut() {
        let max = carma_core::exit::MAX_REASON_CHARS;
        let long = "x".repeat(5000);
        let v = finished(&failed(1, "Error", &long), Some(""));
        assert!(v.reason().chars().count() <= max + 20);
        let v = finished(
            &pod(json!({"phase": "Failed", "reason": "DeadlineExceeded", "message": long})),
            None,
        );
        assert!(v.reason().chars().count() <= max + 20);
    }
}
