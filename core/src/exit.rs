//! How a training process ended, and what that says: success, a GPU out-of-memory crash, a kill
//! by the kernel for host memory, or another failure.
//!
//! A CUDA out-of-memory crash is **not** the kernel's OOM kill: the training process raises an
//! exception and exits with an ordinary error code, so the evidence is text — the termination
//! message or, failing that, the tail of the log — matched against [`OomPatterns`]. A kill by the
//! kernel for *host* memory (a container runtime's `OOMKilled`) has a verdict of its own
//! ([`Verdict::HostOomKilled`]) that never grows the GPU reservation.
//!
//! [`classify_exit`] judges a [`ContainerExit`]; the operator fills one from a pod's container
//! status, `carma local` from a job's exit status and output.

use crate::text::truncate_chars;

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

/// Longest reason kept in status, events and the journal.
pub const MAX_REASON_CHARS: usize = 400;

/// The termination reason container runtimes give a container the kernel's OOM killer ended.
const OOM_KILLED: &str = "OOMKilled";

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
            .map(|line| truncate_chars(line, MAX_REASON_CHARS))
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
    /// The training process exited 0.
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
    /// It was evicted, preempted or lost with its node: not the task's fault. Only the caller
    /// knows this (from the pod, not the process), so [`classify_exit`] never returns it.
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

/// Which [`Verdict`] it is, without its text.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum VerdictKind {
    /// [`Verdict::Succeeded`].
    Succeeded,
    /// [`Verdict::GpuOutOfMemory`].
    GpuOutOfMemory,
    /// [`Verdict::Failed`].
    Failed,
    /// [`Verdict::Evicted`].
    Evicted,
    /// [`Verdict::HostOomKilled`].
    HostOomKilled,
}

impl Verdict {
    /// Which verdict it is.
    pub fn kind(&self) -> VerdictKind {
        match self {
            Verdict::Succeeded => VerdictKind::Succeeded,
            Verdict::GpuOutOfMemory { .. } => VerdictKind::GpuOutOfMemory,
            Verdict::Failed { .. } => VerdictKind::Failed,
            Verdict::Evicted { .. } => VerdictKind::Evicted,
            Verdict::HostOomKilled { .. } => VerdictKind::HostOomKilled,
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

/// How a training container (or process) ended: what [`classify_exit`] judges.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ContainerExit<'a> {
    /// The exit code (container runtimes report a kill by signal `N` as `128 + N`).
    pub exit_code: i32,
    /// The runtime's short reason (`Error`, `Completed`, `OOMKilled`); empty when none was given.
    pub reason: &'a str,
    /// The termination message; empty when there is none. Searched first.
    pub message: &'a str,
    /// The last lines of the output, searched when the message names no GPU OOM (images that
    /// write a termination message of their own, "training failed", leave the traceback in the
    /// log); empty when they were not read or could not be (see [`ContainerExit::reads_log_tail`]).
    pub log_tail: &'a str,
    /// For a kernel OOM kill: which host memory limit to raise, in the caller's terms (the
    /// operator names the container's `resources`). `None` leaves the reason without advice.
    pub host_memory_advice: Option<&'a str>,
}

impl ContainerExit<'_> {
    /// Whether the verdict may rest on [`log_tail`](Self::log_tail): the process failed, was
    /// not killed for host memory, and its termination message names no GPU OOM. A caller for
    /// which reading the log costs something (the operator asks the API server) reads it only
    /// then.
    pub fn reads_log_tail(&self, patterns: &OomPatterns) -> bool {
        self.exit_code != 0 && self.reason != OOM_KILLED && patterns.find(self.message).is_none()
    }
}

/// The verdict on an ended training container: exit 0 succeeded; `OOMKilled` is a host-memory
/// kill whatever the text says; otherwise the first line of the termination message, or failing
/// that of the log tail, that matches a pattern is a GPU out-of-memory crash; anything else
/// failed, with the exit code and the last line of the message (the log's when the message is
/// empty) as the reason.
pub fn classify_exit(exit: &ContainerExit<'_>, patterns: &OomPatterns) -> Verdict {
    if exit.exit_code == 0 {
        return Verdict::Succeeded;
    }
    if exit.reason == OOM_KILLED {
        // The kernel's OOM killer: host memory, not GPU memory. A larger GPU reservation or an
        // exclusive GPU cannot help; it is retried like a failure, and its reason says which
        // limit to raise.
        return Verdict::HostOomKilled {
            reason: host_oom_reason(exit.exit_code, exit.host_memory_advice),
        };
    }
    let message = exit.message.trim();
    if let Some(evidence) = patterns
        .find(message)
        .or_else(|| patterns.find(exit.log_tail))
    {
        return Verdict::GpuOutOfMemory { evidence };
    }
    let text = if message.is_empty() {
        exit.log_tail
    } else {
        message
    };
    let last_line = text
        .lines()
        .map(str::trim)
        .rfind(|l| !l.is_empty())
        .unwrap_or("");
    let head = if exit.reason.is_empty() {
        format!("exit code {}", exit.exit_code)
    } else {
        format!("exit code {} ({})", exit.exit_code, exit.reason)
    };
    Verdict::Failed {
        reason: truncate_chars(&short_reason(&head, last_line), MAX_REASON_CHARS),
    }
}

/// The reason of a kernel OOM kill: what happened, and (with `advice`) the limit to raise.
fn host_oom_reason(exit_code: i32, advice: Option<&str>) -> String {
    let advice = advice.map(str::trim).filter(|a| !a.is_empty());
    let what = match advice {
        Some(a) => format!(": {a}"),
        None => String::new(),
    };
    format!(
        "OOMKilled (exit code {exit_code}): killed by the kernel for host memory, not GPU memory\
         {what}; the GPU reservation is left as it was"
    )
}

/// `reason: message` for status and events (either part may be empty), cut to
/// [`MAX_REASON_CHARS`].
pub fn short_reason(reason: &str, message: &str) -> String {
    let message = message.trim();
    match (reason.is_empty(), message.is_empty()) {
        (true, true) => "no reason given".to_string(),
        (false, true) => reason.to_string(),
        (true, false) => truncate_chars(message, MAX_REASON_CHARS),
        (false, false) => truncate_chars(&format!("{reason}: {message}"), MAX_REASON_CHARS),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A failed exit with a termination message and no log.
    fn failed(exit_code: i32, reason: &str, message: &str) -> Verdict {
        classify_exit(
            &ContainerExit {
                exit_code,
                reason,
                message,
                ..ContainerExit::default()
            },
            &OomPatterns::default(),
        )
    }

    #[test]
    fn termination_message_table() {
        let cases: &[(&str, VerdictKind)] = &[
            (
                "Traceback (most recent call last):\ntorch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB",
                VerdictKind::GpuOutOfMemory,
            ),
            (
                "RuntimeError: CUDA out of memory.",
                VerdictKind::GpuOutOfMemory,
            ),
            (
                "Traceback (most recent call last):\ntorch.OutOfMemoryError",
                VerdictKind::GpuOutOfMemory,
            ),
            (
                "RuntimeError: CUDA error: CUBLAS_STATUS_ALLOC_FAILED when calling cublasCreate(handle)",
                VerdictKind::GpuOutOfMemory,
            ),
            // Without the device TensorFlow names, nothing says it was GPU memory.
            (
                "tensorflow.python.framework.errors_impl.ResourceExhaustedError: OOM when allocating tensor with shape[64,1024]",
                VerdictKind::Failed,
            ),
            (
                "RuntimeError: CUDA error: out of memory\nCUDA kernel errors might be asynchronously reported at some other API call",
                VerdictKind::GpuOutOfMemory,
            ),
            (
                "cupy.cuda.memory.OutOfMemoryError: Out of memory allocating 8,589,934,592 bytes (allocated so far: 0 bytes). cudaErrorMemoryAllocation",
                VerdictKind::GpuOutOfMemory,
            ),
            (
                "RuntimeError: cuDNN error: CUDNN_STATUS_ALLOC_FAILED",
                VerdictKind::GpuOutOfMemory,
            ),
            (
                "node-0:123:456 [0] include/alloc.h:48 NCCL WARN Cuda failure 'out of memory'",
                VerdictKind::GpuOutOfMemory,
            ),
            (
                "ResourceExhaustedError: OOM when allocating tensor with shape[256,1024,1024] and type float on /job:localhost/replica:0/task:0/device:GPU:0 by allocator GPU_0_bfc",
                VerdictKind::GpuOutOfMemory,
            ),
            (
                "jaxlib.xla_extension.XlaRuntimeError: RESOURCE_EXHAUSTED: Failed to allocate request for 16.00GiB (17179869184B) on device ordinal 0 (GPU)",
                VerdictKind::GpuOutOfMemory,
            ),
            // Host-memory and other RESOURCE_EXHAUSTED errors are not GPU OOMs.
            (
                "Exception in thread \"main\" java.lang.OutOfMemoryError: Java heap space",
                VerdictKind::Failed,
            ),
            (
                "grpc._channel._InactiveRpcError: status = StatusCode.RESOURCE_EXHAUSTED details = \"Received message larger than max (5242880 vs. 4194304)\"",
                VerdictKind::Failed,
            ),
            (
                "ResourceExhaustedError: OOM when allocating tensor with shape[4096,4096] on /job:localhost/replica:0/task:0/device:CPU:0 by allocator cpu",
                VerdictKind::Failed,
            ),
            (
                "MemoryError: Unable to allocate 32.0 GiB for an array",
                VerdictKind::Failed,
            ),
            ("ValueError: bad config", VerdictKind::Failed),
            ("Killed", VerdictKind::Failed),
            (
                "the host ran out of memory (not a GPU OOM pattern)",
                VerdictKind::Failed,
            ),
        ];
        for (message, want) in cases {
            let v = failed(1, "Error", message);
            assert_eq!(v.kind(), *want, "{message}: {v:?}");
        }
    }

    #[test]
    fn oom_evidence_is_the_matching_line_and_failure_reason_the_last_line() {
        let v = failed(
            1,
            "Error",
            "epoch 3\ntorch.OutOfMemoryError: CUDA out of memory.\nexiting",
        );
        assert_eq!(
            v,
            Verdict::GpuOutOfMemory {
                evidence: "torch.OutOfMemoryError: CUDA out of memory.".into()
            }
        );
        let v = failed(2, "Error", "loading\nValueError: no such file\n\n");
        assert_eq!(
            v,
            Verdict::Failed {
                reason: "exit code 2 (Error): ValueError: no such file".into()
            }
        );
        // Without a runtime reason the exit code stands alone.
        let v = failed(3, "", "ValueError: bad");
        assert_eq!(
            v,
            Verdict::Failed {
                reason: "exit code 3: ValueError: bad".into()
            }
        );
    }

    #[test]
    fn exit_zero_succeeds_whatever_the_text() {
        let v = failed(0, "Completed", "RuntimeError: CUDA out of memory.");
        assert_eq!(v, Verdict::Succeeded);
        assert_eq!(v.reason(), "training container exited 0");
    }

    #[test]
    fn oomkilled_is_a_host_memory_kill_not_a_gpu_oom() {
        // Seen against the real control plane: OOMKilled grew the GPU reservation and ran the next
        // attempt at recovery priority, which cannot help a host-memory kill.
        let v = failed(137, "OOMKilled", "");
        assert_eq!(v.kind(), VerdictKind::HostOomKilled);
        assert_eq!(
            v.reason(),
            "OOMKilled (exit code 137): killed by the kernel for host memory, not GPU memory; \
             the GPU reservation is left as it was"
        );
        // Even when the message or log names a CUDA OOM, the kernel's kill decides.
        let v = failed(137, "OOMKilled", "RuntimeError: CUDA out of memory.");
        assert_eq!(v.kind(), VerdictKind::HostOomKilled);
        let exit = ContainerExit {
            exit_code: 137,
            reason: "OOMKilled",
            log_tail: "RuntimeError: CUDA out of memory.",
            ..ContainerExit::default()
        };
        // No log is needed to tell.
        assert!(!exit.reads_log_tail(&OomPatterns::default()));
        assert_eq!(
            classify_exit(&exit, &OomPatterns::default()).kind(),
            VerdictKind::HostOomKilled
        );
    }

    #[test]
    fn oomkilled_reason_carries_the_callers_advice() {
        let exit = ContainerExit {
            exit_code: 137,
            reason: "OOMKilled",
            host_memory_advice: Some("raise the job's memory limit"),
            ..ContainerExit::default()
        };
        let r = classify_exit(&exit, &OomPatterns::default()).reason();
        assert!(r.starts_with("OOMKilled (exit code 137)"), "{r}");
        assert!(
            r.contains("not GPU memory: raise the job's memory limit;"),
            "{r}"
        );
        assert!(r.ends_with("the GPU reservation is left as it was"), "{r}");
    }

    #[test]
    fn empty_message_reads_the_log_tail() {
        let exit = ContainerExit {
            exit_code: 1,
            reason: "Error",
            ..ContainerExit::default()
        };
        let patterns = OomPatterns::default();
        assert!(exit.reads_log_tail(&patterns));
        let with_log = |log_tail| classify_exit(&ContainerExit { log_tail, ..exit }, &patterns);
        let v = with_log("step 10\nRuntimeError: CUDA out of memory. Tried");
        assert_eq!(v.kind(), VerdictKind::GpuOutOfMemory);
        assert_eq!(
            with_log(""),
            Verdict::Failed {
                reason: "exit code 1 (Error)".into()
            }
        );
        // A success never needs it, nor a message that already names the OOM.
        assert!(!ContainerExit::default().reads_log_tail(&patterns));
        let named = ContainerExit {
            message: "torch.OutOfMemoryError: CUDA out of memory.",
            ..exit
        };
        assert!(!named.reads_log_tail(&patterns));
    }

    #[test]
    fn a_message_of_the_images_own_does_not_hide_the_oom_in_the_log() {
        // Images that write their own termination message ("training failed") leave PyTorch's
        // traceback in the log: the log tail is still read and decides.
        let patterns = OomPatterns::default();
        let exit = ContainerExit {
            exit_code: 1,
            reason: "Error",
            message: "training failed, see the log",
            log_tail: "step 10\ntorch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB",
            ..ContainerExit::default()
        };
        assert!(exit.reads_log_tail(&patterns));
        assert_eq!(
            classify_exit(&exit, &patterns).kind(),
            VerdictKind::GpuOutOfMemory
        );
        // With no OOM anywhere, the message (not the log) is the reason.
        let plain = ContainerExit {
            log_tail: "step 10\nValueError: bad shape",
            ..exit
        };
        assert_eq!(
            classify_exit(&plain, &patterns),
            Verdict::Failed {
                reason: "exit code 1 (Error): training failed, see the log".into()
            }
        );
    }

    #[test]
    fn custom_patterns() {
        let p = OomPatterns::new(["my allocator gave up"]).unwrap();
        let exit = |message| ContainerExit {
            exit_code: 1,
            reason: "Error",
            message,
            ..ContainerExit::default()
        };
        assert_eq!(
            classify_exit(&exit("fatal: My allocator gave up"), &p),
            Verdict::GpuOutOfMemory {
                evidence: "fatal: My allocator gave up".into()
            }
        );
        assert!(matches!(
            classify_exit(&exit("CUDA out of memory"), &p),
            Verdict::Failed { .. }
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
        let v = failed(1, "Error", &long);
        assert!(v.reason().chars().count() <= MAX_REASON_CHARS + 20);
    }

    #[test]
    fn short_reasons() {
        assert_eq!(short_reason("", " "), "no reason given");
        assert_eq!(short_reason("Evicted", ""), "Evicted");
        assert_eq!(short_reason("", " low on memory "), "low on memory");
        assert_eq!(
            short_reason("Evicted", "low on memory"),
            "Evicted: low on memory"
        );
    }
}
