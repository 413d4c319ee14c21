//! How an attempt ended, judged by the operator's classifier (`carma_operator::classify`).
//!
//! The classifier reads a Kubernetes pod; a local job is described to it as the pod a TrainingTask
//! attempt would be: one training container, terminated with the job's exit code, an empty
//! termination message, and the tail of the job's stderr and stdout as its log. Whatever the
//! operator decides for that pod is the verdict here, so a job that crashes out of GPU memory is
//! recognised by exactly the operator's patterns.

use carma_core::AttemptOutcome;
use carma_operator::{OomPatterns, PodProgress, Verdict, classify};
use k8s_openapi::api::core::v1::{
    Container, ContainerState, ContainerStateTerminated, ContainerStatus, Pod, PodSpec, PodStatus,
};

/// The patterns `carma local` uses: the operator's defaults.
pub fn default_patterns() -> OomPatterns {
    OomPatterns::default()
}

/// The verdict on an attempt that exited with `exit_code` and printed `log_tail`.
pub fn verdict(exit_code: i32, log_tail: &str, patterns: &OomPatterns) -> Verdict {
    let pod = attempt_pod(exit_code);
    match classify(&pod, Some(log_tail), patterns) {
        PodProgress::Finished(v) => v,
        other => Verdict::Failed {
            reason: format!("exit code {exit_code} (unclassified: {other:?})"),
        },
    }
}

/// carma-core's outcome for a verdict, with the peak memory telemetry saw.
pub fn outcome(verdict: &Verdict, observed_peak_mib: Option<u64>) -> AttemptOutcome {
    match verdict {
        Verdict::Succeeded => AttemptOutcome::Succeeded,
        Verdict::GpuOutOfMemory { .. } => AttemptOutcome::GpuOutOfMemory { observed_peak_mib },
        Verdict::Evicted { reason } => AttemptOutcome::Evicted {
            reason: reason.clone(),
        },
        Verdict::Failed { .. } | Verdict::HostOomKilled { .. } => AttemptOutcome::Failed {
            reason: verdict.reason(),
        },
    }
}

fn attempt_pod(exit_code: i32) -> Pod {
    const NAME: &str = "training";
    Pod {
        spec: Some(PodSpec {
            containers: vec![Container {
                name: NAME.to_string(),
                ..Default::default()
            }],
            ..Default::default()
        }),
        status: Some(PodStatus {
            phase: Some(
                if exit_code == 0 {
                    "Succeeded"
                } else {
                    "Failed"
                }
                .to_string(),
            ),
            container_statuses: Some(vec![ContainerStatus {
                name: NAME.to_string(),
                state: Some(ContainerState {
                    terminated: Some(ContainerStateTerminated {
                        exit_code,
                        ..Default::default()
                    }),
                    ..Default::default()
                }),
                ..Default::default()
            }]),
            ..Default::default()
        }),
        ..Default::default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cuda_oom_text_is_an_oom_and_other_failures_are_not() {
        let p = default_patterns();
        assert!(matches!(
            verdict(
                1,
                "Traceback\ntorch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2 GiB",
                &p
            ),
            Verdict::GpuOutOfMemory { .. }
        ));
        assert!(matches!(
            verdict(1, "torch.OutOfMemoryError", &p),
            Verdict::GpuOutOfMemory { .. }
        ));
        assert!(matches!(verdict(0, "", &p), Verdict::Succeeded));
        let Verdict::Failed { reason } = verdict(3, "ValueError: bad\n", &p) else {
            panic!("not a failure");
        };
        assert!(reason.contains("exit code 3"), "{reason}");
    }
}
