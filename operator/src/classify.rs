//! How an attempt pod stands, and how a finished one ended.
//!
//! Pure functions over a [`Pod`] (and, when its termination message is empty, the
//! last lines of its log). A CUDA out-of-memory crash is **not** `OOMKilled`: the
//! training process raises an exception and exits with an ordinary error code,
//! so the evidence is text — the termination message (the operator sets
//! `terminationMessagePolicy: FallbackToLogsOnError`, which copies the log tail
//! there) or, failing that, the log itself. `OOMKilled` is the kernel killing the
//! container for *host* memory; it has a verdict of its own ([`Verdict::HostOomKilled`])
//! that never grows the GPU reservation.

use k8s_openapi::api::core::v1::{Container, ContainerStateTerminated, ContainerStatus, Pod};

use carma_api::AttemptOutcomeKind;

/// Text that marks a GPU out-of-memory crash, matched case-insensitively within one line; parts
/// joined by `&&` must all appear in that line. GPU wording only: a JVM `OutOfMemoryError`, a gRPC
/// `RESOURCE_EXHAUSTED` or a Python `MemoryError` is a failure of another kind.
pub const DEFAULT_OOM_PATTERNS: &[&str] = &[
    // PyTorch's caching allocator (torch.OutOfMemoryError / RuntimeError); the exception's name
    // alone too (PyTorch raises it only for device allocations), for logs cut before the message.
    "CUDA out of memory",
    "torch.OutOfMemoryError",
    "torch.cuda.OutOfMemoryError",
    // The CUDA runtime's cudaErrorMemoryAllocation, as PyTorch and CuPy print it.
    "CUDA error: out of memory",
    "cudaErrorMemoryAllocation",
    "CUBLAS_STATUS_ALLOC_FAILED",
    "CUDNN_STATUS_ALLOC_FAILED",
    // NCCL's warning when a CUDA allocation fails.
    "Cuda failure 'out of memory'",
    // TensorFlow and XLA: only with a GPU device or allocator in the same line.
    "OOM when allocating && GPU",
    "RESOURCE_EXHAUSTED && GPU",
];

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

/// Longest reason kept in status and events.
const MAX_REASON_CHARS: usize = 400;

/// The OOM patterns in use (`--oom-patterns`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OomPatterns {
    patterns: Vec<String>,
    lowered: Vec<String>,
}

/// An unusable `--oom-patterns` list.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PatternError {
    /// No pattern at all.
    #[error("at least one OOM pattern is needed")]
    Empty,
    /// A pattern that is empty or only whitespace would match everything.
    #[error("OOM pattern {0} is blank")]
    Blank(usize),
}

impl OomPatterns {
    /// Patterns from a list; blank entries and an empty list are errors.
    pub fn new<I, S>(patterns: I) -> Result<Self, PatternError>
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        let patterns: Vec<String> = patterns.into_iter().map(Into::into).collect();
        if patterns.is_empty() {
            return Err(PatternError::Empty);
        }
        if let Some(i) = patterns.iter().position(|p| p.trim().is_empty()) {
            return Err(PatternError::Blank(i + 1));
        }
        let lowered = patterns.iter().map(|p| p.to_lowercase()).collect();
        Ok(Self { patterns, lowered })
    }

    /// Whether one lowered line matches one lowered pattern (every `&&` part present).
    fn matches(line: &str, pattern: &str) -> bool {
        pattern
            .split("&&")
            .map(str::trim)
            .filter(|part| !part.is_empty())
            .all(|part| line.contains(part))
    }

    /// The patterns as given.
    pub fn patterns(&self) -> &[String] {
        &self.patterns
    }

    /// The first line of `text` that contains a pattern, trimmed.
    pub fn find(&self, text: &str) -> Option<String> {
        text.lines()
            .map(str::trim)
            .find(|line| {
                let l = line.to_lowercase();
                self.lowered.iter().any(|p| Self::matches(&l, p))
            })
            .map(|line| truncate(line, MAX_REASON_CHARS))
    }
}

impl Default for OomPatterns {
    fn default() -> Self {
        Self::new(DEFAULT_OOM_PATTERNS.iter().copied()).unwrap_or_else(|_| Self {
            patterns: Vec::new(),
            lowered: Vec::new(),
        })
    }
}

/// How a finished attempt ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    /// The training container exited 0.
    Succeeded,
    /// It crashed out of GPU memory.
    GpuOutOfMemory {
        /// The line (or container state) that shows it.
        evidence: String,
    },
    /// It failed for another reason: the task's fault.
    Failed {
        /// Exit code and message.
        reason: String,
    },
    /// It was evicted, preempted or lost with its node: not the task's fault.
    Evicted {
        /// What Kubernetes said.
        reason: String,
    },
    /// The kernel killed it for host memory (`OOMKilled`): the task's fault, but
    /// one that a GPU reservation cannot fix.
    HostOomKilled {
        /// What happened and which memory limit to raise.
        reason: String,
    },
}

impl Verdict {
    /// The status outcome of this verdict.
    pub fn kind(&self) -> AttemptOutcomeKind {
        match self {
            Verdict::Succeeded => AttemptOutcomeKind::Succeeded,
            Verdict::GpuOutOfMemory { .. } => AttemptOutcomeKind::GpuOutOfMemory,
            Verdict::Failed { .. } => AttemptOutcomeKind::Failed,
            Verdict::Evicted { .. } => AttemptOutcomeKind::Evicted,
            Verdict::HostOomKilled { .. } => AttemptOutcomeKind::HostOomKilled,
        }
    }

    /// A human-readable reason for status and events.
    pub fn reason(&self) -> String {
        match self {
            Verdict::Succeeded => "training container exited 0".to_string(),
            Verdict::GpuOutOfMemory { evidence } => format!("out of GPU memory: {evidence}"),
            Verdict::Failed { reason } => reason.clone(),
            Verdict::Evicted { reason } | Verdict::HostOomKilled { reason } => reason.clone(),
        }
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
            reason: join_reason(pod_reason, pod_message),
        });
    }
    if let Some(cond) = status
        .conditions
        .iter()
        .flatten()
        .find(|c| c.type_ == "DisruptionTarget" && c.status == "True")
    {
        return PodProgress::Finished(Verdict::Evicted {
            reason: join_reason(
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
                join_reason(pod_reason, pod_message)
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
    let reason = t.reason.as_deref().unwrap_or("");
    if t.exit_code == 0 {
        if pod_failed {
            return PodProgress::Finished(Verdict::Failed {
                reason: format!(
                    "training container exited 0 but the pod failed: {}",
                    join_reason(pod_reason, pod_message)
                ),
            });
        }
        return PodProgress::Finished(Verdict::Succeeded);
    }
    if reason == "OOMKilled" {
        // The kernel's OOM killer: host memory, not GPU memory. A larger GPU reservation or an
        // exclusive GPU cannot help; it is retried per spec.recovery like a failure, and its reason
        // says which limit to raise.
        return PodProgress::Finished(Verdict::HostOomKilled {
            reason: host_oom_reason(t.exit_code, training_container(pod)),
        });
    }
    let message = t.message.as_deref().unwrap_or("").trim();
    let text = if message.is_empty() {
        match logs {
            Some(l) => l,
            None => {
                return PodProgress::NeedsLogs {
                    container: training_container_name(pod).unwrap_or_default(),
                };
            }
        }
    } else {
        message
    };
    if let Some(evidence) = patterns.find(text) {
        return PodProgress::Finished(Verdict::GpuOutOfMemory { evidence });
    }
    let last_line = text
        .lines()
        .map(str::trim)
        .rfind(|l| !l.is_empty())
        .unwrap_or("");
    let head = if reason.is_empty() {
        format!("exit code {}", t.exit_code)
    } else {
        format!("exit code {} ({reason})", t.exit_code)
    };
    PodProgress::Finished(Verdict::Failed {
        reason: truncate(&join_reason(&head, last_line), MAX_REASON_CHARS),
    })
}

/// The status reason of an `OOMKilled` training container: what happened, and
/// the memory limit to raise (the container's own, when it has one).
fn host_oom_reason(exit_code: i32, container: Option<&Container>) -> String {
    let name = container.map_or("training", |c| c.name.as_str());
    let resources = container.and_then(|c| c.resources.as_ref());
    let limit = resources
        .and_then(|r| r.limits.as_ref())
        .and_then(|l| l.get("memory"));
    let request = resources
        .and_then(|r| r.requests.as_ref())
        .and_then(|l| l.get("memory"));
    let what = match (limit, request) {
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
    };
    format!(
        "OOMKilled (exit code {exit_code}): killed by the kernel for host memory, not GPU memory: \
         {what}; the GPU reservation is left as it was"
    )
}

/// Name of the training container: the first container of the pod.
pub fn training_container_name(pod: &Pod) -> Option<String> {
    training_container(pod).map(|c| c.name.clone())
}

fn training_container(pod: &Pod) -> Option<&Container> {
    pod.spec.as_ref().and_then(|s| s.containers.first())
}

fn training_container_status(pod: &Pod) -> Option<&ContainerStatus> {
    let name = training_container_name(pod)?;
    pod.status
        .as_ref()?
        .container_statuses
        .iter()
        .flatten()
        .find(|c| c.name == name)
}

fn join_reason(reason: &str, message: &str) -> String {
    let message = message.trim();
    match (reason.is_empty(), message.is_empty()) {
        (true, true) => "no reason given".to_string(),
        (false, true) => reason.to_string(),
        (true, false) => truncate(message, MAX_REASON_CHARS),
        (false, false) => truncate(&format!("{reason}: {message}"), MAX_REASON_CHARS),
    }
}

/// `text` cut to at most `max` characters (on a character boundary), with an ellipsis.
pub(crate) fn truncate(text: &str, max: usize) -> String {
    if text.chars().count() <= max {
        return text.to_string();
    }
    let mut out: String = text.chars().take(max.saturating_sub(1)).collect();
    out.push('…');
    out
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

    #[test]
    fn termination_message_table() {
        let cases: &[(&str, AttemptOutcomeKind)] = &[
            (
                "Traceback (most recent call last):\ntorch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB",
                AttemptOutcomeKind::GpuOutOfMemory,
            ),
            (
                "RuntimeError: CUDA out of memory.",
                AttemptOutcomeKind::GpuOutOfMemory,
            ),
            (
                "Traceback (most recent call last):\ntorch.OutOfMemoryError",
                AttemptOutcomeKind::GpuOutOfMemory,
            ),
            (
                "RuntimeError: CUDA error: CUBLAS_STATUS_ALLOC_FAILED when calling cublasCreate(handle)",
                AttemptOutcomeKind::GpuOutOfMemory,
            ),
            // Without the device TensorFlow names, nothing says it was GPU memory.
            (
                "tensorflow.python.framework.errors_impl.ResourceExhaustedError: OOM when allocating tensor with shape[64,1024]",
                AttemptOutcomeKind::Failed,
            ),
            (
                "RuntimeError: CUDA error: out of memory\nCUDA kernel errors might be asynchronously reported at some other API call",
                AttemptOutcomeKind::GpuOutOfMemory,
            ),
            (
                "cupy.cuda.memory.OutOfMemoryError: Out of memory allocating 8,589,934,592 bytes (allocated so far: 0 bytes). cudaErrorMemoryAllocation",
                AttemptOutcomeKind::GpuOutOfMemory,
            ),
            (
                "RuntimeError: cuDNN error: CUDNN_STATUS_ALLOC_FAILED",
                AttemptOutcomeKind::GpuOutOfMemory,
            ),
            (
                "node-0:123:456 [0] include/alloc.h:48 NCCL WARN Cuda failure 'out of memory'",
                AttemptOutcomeKind::GpuOutOfMemory,
            ),
            (
                "ResourceExhaustedError: OOM when allocating tensor with shape[256,1024,1024] and type float on /job:localhost/replica:0/task:0/device:GPU:0 by allocator GPU_0_bfc",
                AttemptOutcomeKind::GpuOutOfMemory,
            ),
            (
                "jaxlib.xla_extension.XlaRuntimeError: RESOURCE_EXHAUSTED: Failed to allocate request for 16.00GiB (17179869184B) on device ordinal 0 (GPU)",
                AttemptOutcomeKind::GpuOutOfMemory,
            ),
            // Host-memory and other RESOURCE_EXHAUSTED errors are not GPU OOMs.
            (
                "Exception in thread \"main\" java.lang.OutOfMemoryError: Java heap space",
                AttemptOutcomeKind::Failed,
            ),
            (
                "grpc._channel._InactiveRpcError: status = StatusCode.RESOURCE_EXHAUSTED details = \"Received message larger than max (5242880 vs. 4194304)\"",
                AttemptOutcomeKind::Failed,
            ),
            (
                "ResourceExhaustedError: OOM when allocating tensor with shape[4096,4096] on /job:localhost/replica:0/task:0/device:CPU:0 by allocator cpu",
                AttemptOutcomeKind::Failed,
            ),
            (
                "MemoryError: Unable to allocate 32.0 GiB for an array",
                AttemptOutcomeKind::Failed,
            ),
            ("ValueError: bad config", AttemptOutcomeKind::Failed),
            ("Killed", AttemptOutcomeKind::Failed),
            (
                "the host ran out of memory (not a GPU OOM pattern)",
                AttemptOutcomeKind::Failed,
            ),
        ];
        for (message, want) in cases {
            let v = finished(&failed(1, "Error", message), None);
            assert_eq!(v.kind(), *want, "{message}: {v:?}");
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
            None,
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
        assert_eq!(v.kind(), AttemptOutcomeKind::HostOomKilled);
        let reason = v.reason();
        assert!(reason.starts_with("OOMKilled (exit code 137)"), "{reason}");
        assert!(reason.contains("not GPU memory"), "{reason}");
        assert!(reason.contains("resources.limits.memory"), "{reason}");
        // Even when the message or log names a CUDA OOM, the kernel's kill decides.
        let v = finished(
            &failed(137, "OOMKilled", "RuntimeError: CUDA out of memory."),
            None,
        );
        assert_eq!(v.kind(), AttemptOutcomeKind::HostOomKilled);
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
        assert_eq!(v.kind(), AttemptOutcomeKind::GpuOutOfMemory);
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
            finished(&p, None).kind(),
            AttemptOutcomeKind::GpuOutOfMemory
        );
        let p = pod(json!({"phase": "Running", "containerStatuses": [
            {"name": "train", "image": "x", "imageID": "", "ready": false, "restartCount": 0,
             "state": {"terminated": {"exitCode": 0}}}]}));
        assert_eq!(finished(&p, None), Verdict::Succeeded);
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
            assert_eq!(v.kind(), AttemptOutcomeKind::Evicted, "{status}: {v:?}");
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
        assert_eq!(v.kind(), AttemptOutcomeKind::Failed);
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
        assert!(matches!(
            classify(&pod, None, &p),
            PodProgress::Finished(Verdict::Failed { .. })
        ));
        assert_eq!(
            OomPatterns::new(Vec::<String>::new()),
            Err(PatternError::Empty)
        );
        assert_eq!(OomPatterns::new(["a", " "]), Err(PatternError::Blank(2)));
        assert_eq!(
            OomPatterns::default().patterns().len(),
            DEFAULT_OOM_PATTERNS.len()
        );
    }

    #[test]
    fn long_reasons_are_cut() {
        let long = "x".repeat(5000);
        let v = finished(&failed(1, "Error", &long), None);
        assert!(v.reason().chars().count() <= MAX_REASON_CHARS + 20);
    }
}
