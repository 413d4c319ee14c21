//! How an attempt ended, judged by carma-core's rule ([`carma_core::classify_exit`]), the one the
//! operator applies to a TrainingTask's attempt pods.
//!
//! A local job ends with an exit status and its output: the verdict is read from the exit code
//! and the tail of its stderr and stdout, with no termination reason or message, so a job that
//! crashes out of GPU memory is recognised by exactly the operator's patterns.

use carma_core::AttemptOutcome;
use carma_core::exit::{ContainerExit, OomPatterns, Verdict, classify_exit};

/// The patterns `carma local` uses: the operator's defaults.
pub fn default_patterns() -> OomPatterns {
    OomPatterns::default()
}

/// The verdict on an attempt that exited with `exit_code` and printed `log_tail`.
pub fn verdict(exit_code: i32, log_tail: &str, patterns: &OomPatterns) -> Verdict {
    let exit = ContainerExit {
        exit_code,
        log_tail,
        ..ContainerExit::default()
    };
    classify_exit(&exit, patterns)
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
        // A local job has no runtime reason: a SIGKILL (137) is a failure, not a host OOM kill.
        assert_eq!(
            verdict(137, "step 4\nKilled\n", &p),
            Verdict::Failed {
                reason: "exit code 137: Killed".into()
            }
        );
    }
}
