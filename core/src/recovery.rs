//! What to do after an attempt ends: finish, retry with a larger reservation,
//! escalate to an exclusive GPU, or give up.
//!
//! CARMA reruns a crashed task exclusively with the same estimate and no retry
//! limit. carma first retries *shared* with a larger reservation — the next
//! GPUMemNet class edge, or the observed peak plus headroom when telemetry saw it
//! (the improvement CARMA's authors list as future work) — escalates to an
//! exclusive GPU after a configured number of OOMs, and gives up after a bounded
//! number of attempts.

use serde::{Deserialize, Serialize};

use crate::config::RecoveryConfig;
use crate::model::Reservation;

/// How an attempt ended.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", tag = "kind")]
pub enum AttemptOutcome {
    /// The training container exited 0.
    Succeeded,
    /// The attempt crashed out of GPU memory.
    GpuOutOfMemory {
        /// Peak GPU memory the attempt was seen using, when telemetry caught it.
        observed_peak_mib: Option<u64>,
    },
    /// Any other failure (the task's fault).
    Failed {
        /// Reason, e.g. the exit code and message.
        reason: String,
    },
    /// Evicted or preempted: not the task's fault, not counted as an attempt.
    Evicted {
        /// Reason given by Kubernetes.
        reason: String,
    },
}

/// One finished attempt.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct AttemptRecord {
    /// How it ended.
    pub outcome: AttemptOutcome,
    /// What it had reserved per GPU.
    pub reservation: Reservation,
    /// Whether it ran on exclusive GPUs.
    pub exclusive: bool,
}

/// The next step for a task.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", tag = "action")]
pub enum RecoveryDecision {
    /// The task succeeded.
    Done,
    /// Run another attempt.
    Retry {
        /// Reservation per GPU for the next attempt.
        reservation: Reservation,
        /// Whether the next attempt must have its GPUs alone.
        exclusive: bool,
        /// Wait this long before creating it.
        backoff_ms: u64,
        /// Whether it goes to the recovery queue (scheduled before new work).
        recovery_priority: bool,
        /// Why, for status and events.
        reason: String,
    },
    /// Stop: the task failed.
    GiveUp {
        /// Why, for status and events.
        reason: String,
    },
}

/// Decide what follows the last attempt in `history` (oldest first).
///
/// `gpu_memory_mib` is the memory of the GPUs the task can get, when known: a
/// grown reservation that no longer fits becomes an exclusive attempt.
pub fn decide_next(
    history: &[AttemptRecord],
    gpu_memory_mib: Option<u64>,
    cfg: &RecoveryConfig,
) -> RecoveryDecision {
    let Some(last) = history.last() else {
        return RecoveryDecision::GiveUp {
            reason: "no attempt has run yet".to_string(),
        };
    };
    let attempts = history
        .iter()
        .filter(|a| !matches!(a.outcome, AttemptOutcome::Evicted { .. }))
        .count() as u32;
    let ooms = history
        .iter()
        .filter(|a| matches!(a.outcome, AttemptOutcome::GpuOutOfMemory { .. }))
        .count() as u32;
    let failures = history
        .iter()
        .filter(|a| matches!(a.outcome, AttemptOutcome::Failed { .. }))
        .count() as u32;
    let evictions = history.len() as u32 - attempts;
    let backoff_ms = backoff(cfg, attempts.max(1));

    match &last.outcome {
        AttemptOutcome::Succeeded => RecoveryDecision::Done,
        AttemptOutcome::Evicted { reason } => {
            if evictions > cfg.max_evictions {
                return RecoveryDecision::GiveUp {
                    reason: format!(
                        "evicted {evictions} times (limit {}); last: {reason}",
                        cfg.max_evictions
                    ),
                };
            }
            RecoveryDecision::Retry {
                reservation: last.reservation,
                exclusive: last.exclusive,
                backoff_ms: cfg.backoff_base_ms,
                recovery_priority: false,
                reason: format!("evicted ({reason}); rerunning unchanged"),
            }
        }
        _ if attempts >= cfg.max_attempts => RecoveryDecision::GiveUp {
            reason: format!(
                "{attempts} attempt(s) used of {}; last: {}",
                cfg.max_attempts,
                describe(&last.outcome)
            ),
        },
        AttemptOutcome::Failed { reason } => {
            if failures <= cfg.retries_on_failure {
                RecoveryDecision::Retry {
                    reservation: last.reservation,
                    exclusive: last.exclusive,
                    backoff_ms,
                    recovery_priority: false,
                    reason: format!(
                        "failed ({reason}); retry {failures} of {}",
                        cfg.retries_on_failure
                    ),
                }
            } else {
                RecoveryDecision::GiveUp {
                    reason: format!(
                        "failed ({reason}); retries on failure exhausted ({})",
                        cfg.retries_on_failure
                    ),
                }
            }
        }
        AttemptOutcome::GpuOutOfMemory { observed_peak_mib } => {
            if last.exclusive || last.reservation == Reservation::WholeGpu {
                return RecoveryDecision::GiveUp {
                    reason: "crashed out of GPU memory while running alone on its GPU(s): the job does not fit this GPU".to_string(),
                };
            }
            if ooms >= cfg.exclusive_after_ooms {
                return RecoveryDecision::Retry {
                    reservation: Reservation::WholeGpu,
                    exclusive: true,
                    backoff_ms,
                    recovery_priority: true,
                    reason: format!(
                        "out of GPU memory {ooms} time(s) (escalation after {}): rerunning on exclusive GPU(s)",
                        cfg.exclusive_after_ooms
                    ),
                };
            }
            let next = grown_reservation(last.reservation, *observed_peak_mib, cfg);
            if let Some(total) = gpu_memory_mib
                && next >= total
            {
                return RecoveryDecision::Retry {
                    reservation: Reservation::WholeGpu,
                    exclusive: true,
                    backoff_ms,
                    recovery_priority: true,
                    reason: format!(
                        "out of GPU memory; the grown reservation {next} MiB does not fit a {total} MiB GPU beside others: rerunning exclusively"
                    ),
                };
            }
            RecoveryDecision::Retry {
                reservation: Reservation::Mib(next),
                exclusive: false,
                backoff_ms,
                recovery_priority: true,
                reason: format!(
                    "out of GPU memory with {}; rerunning with {next} MiB",
                    last.reservation
                ),
            }
        }
    }
}

/// The reservation after an OOM: the next class edge above the failed
/// reservation, or the observed peak plus headroom, whichever is larger.
pub fn grown_reservation(
    failed: Reservation,
    observed_peak_mib: Option<u64>,
    cfg: &RecoveryConfig,
) -> u64 {
    let current = match failed {
        Reservation::Mib(m) => m,
        Reservation::Unknown | Reservation::WholeGpu => 0,
    };
    let next_edge = cfg
        .class_edges_mib
        .iter()
        .copied()
        .find(|e| *e > current)
        .unwrap_or_else(|| current.saturating_mul(2).max(1));
    let from_peak = observed_peak_mib
        .map(|p| p.saturating_add(cfg.headroom_mib))
        .unwrap_or(0);
    next_edge.max(from_peak)
}

fn backoff(cfg: &RecoveryConfig, attempts: u32) -> u64 {
    let factor = 1u64 << (attempts - 1).min(20);
    cfg.backoff_base_ms
        .saturating_mul(factor)
        .min(cfg.backoff_max_ms)
}

fn describe(outcome: &AttemptOutcome) -> String {
    match outcome {
        AttemptOutcome::Succeeded => "succeeded".into(),
        AttemptOutcome::GpuOutOfMemory { .. } => "out of GPU memory".into(),
        AttemptOutcome::Failed { reason } => format!("failed ({reason})"),
        AttemptOutcome::Evicted { reason } => format!("evicted ({reason})"),
    }
}
