//! The end of attempts: noticing it, classifying it with the operator's classifier, and asking
//! carma-core's `decide_next` what follows.

use carma_core::{AttemptOutcome, RecoveryDecision, decide_next};

use super::Daemon;
use crate::classify::{outcome, verdict};
use crate::error::Result;
use crate::jobs::JobState;
use crate::journal::{AttemptUsage, Event};
use crate::launch::{exit_status, launcher_alive, launcher_pid, tail};
use crate::spec::now_ms;

/// Bytes of each of stdout and stderr handed to the classifier.
const LOG_TAIL_BYTES: usize = 32 * 1024;

impl Daemon {
    /// Finish every running attempt whose launcher recorded an exit status, and declare lost an
    /// adopted one whose process vanished without one.
    pub(super) fn poll_attempts(&mut self) -> Result<()> {
        self.exiting
            .retain_mut(|child| matches!(child.try_wait(), Ok(None)));
        let running: Vec<(String, u32, Option<u32>)> = self
            .table
            .jobs()
            .iter()
            .filter_map(|j| j.running().map(|a| (j.spec.id.clone(), a.number, a.pid)))
            .collect();
        for (id, attempt, pid) in running {
            let dir = self.dir.attempt(&id, attempt);
            // Reap our own child first, so that its exit file is complete when we read it.
            let child_exit = match self.children.get_mut(&id) {
                Some(child) => match child.try_wait() {
                    Ok(Some(status)) => Some(status.code().unwrap_or(-1)),
                    Ok(None) => None,
                    Err(e) => {
                        tracing::warn!(job = %id, error = %e, "cannot wait for the job's launcher");
                        None
                    }
                },
                None => None,
            };
            if let Some(code) = exit_status(&dir) {
                // The launcher writes the status just before it exits: reap it on a later pass.
                if let Some(child) = self.children.remove(&id)
                    && child_exit.is_none()
                {
                    self.exiting.push(child);
                }
                self.finish(&id, attempt, code)?;
            } else if let Some(code) = child_exit {
                // The launcher itself failed before it could record the job's status.
                self.children.remove(&id);
                self.finish(&id, attempt, code)?;
            } else if !self.children.contains_key(&id) {
                let alive = pid
                    .or_else(|| launcher_pid(&dir))
                    .is_some_and(|p| launcher_alive(p, &dir));
                if !alive && exit_status(&dir).is_none() {
                    self.lose(
                        &id,
                        attempt,
                        "its process ended while no daemon watched it and left no exit status",
                    )?;
                }
            }
        }
        Ok(())
    }

    /// Record the end of attempt `attempt` of job `id` with exit status `code`.
    fn finish(&mut self, id: &str, attempt: u32, code: i32) -> Result<()> {
        let dir = self.dir.attempt(id, attempt);
        let logs = format!(
            "{}\n{}",
            tail(&dir.stderr(), LOG_TAIL_BYTES),
            tail(&dir.stdout(), LOG_TAIL_BYTES)
        );
        let v = verdict(code, &logs, &self.cfg.oom_patterns);
        let usage = self
            .usage
            .remove(id)
            .map(|u| u.finish())
            .unwrap_or_default();
        let outcome = outcome(&v, usage.peak_mib);
        tracing::info!(job = id, attempt, exit_code = code, verdict = ?v.kind(), "attempt ended");
        self.end(id, attempt, outcome, Some(code), v.reason(), usage)
    }

    /// Record that an attempt was lost with the daemon (no exit status): carma-core treats it as an
    /// eviction, which reruns the job unchanged and does not count as one of its attempts.
    pub(super) fn lose(&mut self, id: &str, attempt: u32, why: &str) -> Result<()> {
        tracing::warn!(job = id, attempt, why, "attempt lost");
        let reason = format!("attempt {attempt} lost: {why}");
        self.end(
            id,
            attempt,
            AttemptOutcome::Evicted {
                reason: reason.clone(),
            },
            None,
            reason,
            AttemptUsage::default(),
        )
    }

    pub(super) fn end(
        &mut self,
        id: &str,
        attempt: u32,
        outcome: AttemptOutcome,
        exit_code: Option<i32>,
        reason: String,
        usage: AttemptUsage,
    ) -> Result<()> {
        self.record(Event::Ended {
            id: id.to_string(),
            attempt,
            outcome,
            exit_code,
            reason,
            usage,
            at_ms: now_ms(),
        })?;
        self.ledger.release(id);
        self.decide(id)
    }

    /// Decide for every job whose last attempt ended without a decision (after a restart).
    pub(super) fn decide_pending(&mut self) -> Result<()> {
        let pending: Vec<String> = self
            .table
            .jobs()
            .iter()
            .filter(|j| j.awaiting_decision())
            .map(|j| j.spec.id.clone())
            .collect();
        for id in pending {
            self.decide(&id)?;
        }
        Ok(())
    }

    /// carma-core's decision after the job's last attempt, journaled.
    fn decide(&mut self, id: &str) -> Result<()> {
        let Some(job) = self.table.get(id) else {
            return Ok(());
        };
        let gpu_memory = self.gpus.iter().map(|r| r.gpu.memory_total_mib).min();
        let decision = decide_next(&job.history(), gpu_memory, &self.cfg.recovery);
        match &decision {
            RecoveryDecision::Done => tracing::info!(job = id, "succeeded"),
            RecoveryDecision::Retry { reason, .. } => tracing::info!(job = id, reason, "requeued"),
            RecoveryDecision::GiveUp { reason } => tracing::warn!(job = id, reason, "failed"),
        }
        self.record(Event::Decided {
            id: id.to_string(),
            decision,
            at_ms: now_ms(),
        })
    }

    /// A job asking for more GPUs than the machine has can never run: it fails at once instead of
    /// blocking the first-in-first-out queue for ever.
    pub(super) fn refuse_if_unplaceable(&mut self, id: &str) -> Result<()> {
        let have = self.gpus.len();
        let Some(job) = self.table.get(id) else {
            return Ok(());
        };
        if have == 0 || job.state != JobState::Queued || job.spec.gpus as usize <= have {
            return Ok(());
        }
        let reason = format!("asks for {} GPUs; this machine has {have}", job.spec.gpus);
        tracing::warn!(job = id, reason, "refused");
        self.record(Event::Decided {
            id: id.to_string(),
            decision: RecoveryDecision::GiveUp { reason },
            at_ms: now_ms(),
        })
    }
}
