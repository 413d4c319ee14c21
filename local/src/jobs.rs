//! Jobs as the journal tells them: [`JobTable::apply`] folds journal events into each job's state,
//! attempts and next reservation. The daemon and `status`/`report` build the same table from the
//! same journal, so what they show is what the daemon acts on.

use std::collections::BTreeMap;

use carma_core::{
    AttemptOutcome, AttemptRecord, Declared, QueueOrder, RecoveryDecision, Reservation,
};
use serde::Serialize;

use crate::Millis;
use crate::journal::{AttemptUsage, Event};
use crate::spec::JobSpec;

/// Where a job stands (exactly these four words in `status`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum JobState {
    /// Waiting in the main or the recovery queue (or in its back-off before a retry).
    Queued,
    /// An attempt runs.
    Running,
    /// Finished with exit code 0.
    Succeeded,
    /// Gave up (recovery's decision).
    Failed,
}

/// How an attempt ended.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct AttemptEnd {
    /// carma-core's outcome.
    pub outcome: AttemptOutcome,
    /// Exit code, when seen.
    pub exit_code: Option<i32>,
    /// Why, for people.
    pub reason: String,
    /// What telemetry saw.
    pub usage: AttemptUsage,
    /// When.
    pub at_ms: Millis,
}

/// One attempt of a job.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Attempt {
    /// 1-based.
    pub number: u32,
    /// GPU indices.
    pub gpus: Vec<u32>,
    /// GPU UUIDs.
    pub uuids: Vec<String>,
    /// MiB booked per GPU.
    pub reserved_mib: u64,
    /// The reservation asked for.
    pub reservation: Reservation,
    /// Whether it had its GPUs alone.
    pub exclusive: bool,
    /// When it entered the queue it was dispatched from.
    pub queued_at_ms: Millis,
    /// When it was launched.
    pub launched_at_ms: Millis,
    /// The launcher's pid, once started.
    pub pid: Option<u32>,
    /// How it ended, once it has.
    pub end: Option<AttemptEnd>,
}

/// One job.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Job {
    /// As submitted.
    pub spec: JobSpec,
    /// Where it stands.
    pub state: JobState,
    /// Attempts, oldest first.
    pub attempts: Vec<Attempt>,
    /// Reservation of the next attempt.
    pub reservation: Reservation,
    /// Whether the next attempt must have its GPUs alone.
    pub exclusive: bool,
    /// Whether it waits in the recovery queue (scheduled before new work).
    pub recovery: bool,
    /// Not to be launched before this time (recovery back-off).
    pub not_before_ms: Millis,
    /// When it entered its current queue.
    pub queued_at_ms: Millis,
    /// Journal position of its latest queue entry (ties in `queued_at_ms`).
    pub queue_seq: u64,
    /// Why it ended, or why its last attempt ended.
    pub exit_reason: Option<String>,
}

impl Attempt {
    /// Whether it ended with a GPU out-of-memory crash.
    pub fn ended_in_oom(&self) -> bool {
        matches!(
            self.end.as_ref().map(|e| &e.outcome),
            Some(AttemptOutcome::GpuOutOfMemory { .. })
        )
    }

    /// Whether it was lost (evicted: the daemon stopped and its process was gone).
    pub fn was_evicted(&self) -> bool {
        matches!(
            self.end.as_ref().map(|e| &e.outcome),
            Some(AttemptOutcome::Evicted { .. })
        )
    }
}

impl Job {
    /// Attempts that crashed out of GPU memory.
    pub fn ooms(&self) -> usize {
        self.attempts.iter().filter(|a| a.ended_in_oom()).count()
    }

    /// carma-core's view of its finished attempts.
    pub fn history(&self) -> Vec<AttemptRecord> {
        self.attempts
            .iter()
            .filter_map(|a| {
                a.end.as_ref().map(|e| AttemptRecord {
                    outcome: e.outcome.clone(),
                    reservation: a.reservation,
                    exclusive: a.exclusive,
                })
            })
            .collect()
    }

    /// The attempt that runs now.
    pub fn running(&self) -> Option<&Attempt> {
        self.attempts
            .last()
            .filter(|a| a.end.is_none() && self.state == JobState::Running)
    }

    /// Whether its last attempt ended and no decision followed (the daemon died in between).
    pub fn awaiting_decision(&self) -> bool {
        self.state == JobState::Running && self.attempts.last().is_some_and(|a| a.end.is_some())
    }
}

/// Every job of a state directory.
#[derive(Debug, Clone, Default)]
pub struct JobTable {
    jobs: BTreeMap<String, Job>,
    seq: u64,
}

impl JobTable {
    /// The table after `events`.
    pub fn from_events(events: &[Event]) -> Self {
        let mut t = Self::default();
        for e in events {
            t.apply(e);
        }
        t
    }

    /// A job.
    pub fn get(&self, id: &str) -> Option<&Job> {
        self.jobs.get(id)
    }

    /// Whether the job is known.
    pub fn contains(&self, id: &str) -> bool {
        self.jobs.contains_key(id)
    }

    /// Every job, in submission order.
    pub fn jobs(&self) -> Vec<&Job> {
        let mut v: Vec<&Job> = self.jobs.values().collect();
        v.sort_by(|a, b| {
            (a.spec.submitted_at_ms, &a.spec.id).cmp(&(b.spec.submitted_at_ms, &b.spec.id))
        });
        v
    }

    /// Queued jobs of one queue (recovery or main) in `order`: by the priority of what each
    /// job declares ([`QueueOrder::priority`], highest first), then first in first out. Under
    /// [`QueueOrder::Arrival`], CARMA's first in first out.
    pub fn queue(&self, recovery: bool, order: QueueOrder) -> Vec<&Job> {
        let mut v: Vec<&Job> = self
            .jobs
            .values()
            .filter(|j| j.state == JobState::Queued && j.recovery == recovery)
            .collect();
        v.sort_by_key(|j| {
            let declared = Declared {
                duration_ms: j.spec.expected_duration_ms,
                gpus: j.spec.gpus,
            };
            (
                std::cmp::Reverse(order.priority(&declared)),
                j.queued_at_ms,
                j.queue_seq,
            )
        });
        v
    }

    /// Fold one event in. Events about unknown jobs or attempts are ignored (with a warning).
    pub fn apply(&mut self, event: &Event) {
        self.seq += 1;
        let seq = self.seq;
        match event {
            Event::Submitted { job, at_ms } => {
                self.jobs.entry(job.id.clone()).or_insert_with(|| Job {
                    spec: job.clone(),
                    state: JobState::Queued,
                    attempts: Vec::new(),
                    reservation: job.reservation,
                    exclusive: false,
                    recovery: false,
                    not_before_ms: 0,
                    queued_at_ms: *at_ms,
                    queue_seq: seq,
                    exit_reason: None,
                });
            }
            Event::Launching {
                id,
                attempt,
                gpus,
                uuids,
                reserved_mib,
                reservation,
                exclusive,
                at_ms,
            } => {
                let Some(job) = self.job_mut(id) else { return };
                job.attempts.push(Attempt {
                    number: *attempt,
                    gpus: gpus.clone(),
                    uuids: uuids.clone(),
                    reserved_mib: *reserved_mib,
                    reservation: *reservation,
                    exclusive: *exclusive,
                    queued_at_ms: job.queued_at_ms,
                    launched_at_ms: *at_ms,
                    pid: None,
                    end: None,
                });
                job.state = JobState::Running;
            }
            Event::Started {
                id, attempt, pid, ..
            } => {
                if let Some(a) = self.attempt_mut(id, *attempt) {
                    a.pid = Some(*pid);
                }
            }
            Event::Ended {
                id,
                attempt,
                outcome,
                exit_code,
                reason,
                usage,
                at_ms,
            } => {
                if let Some(a) = self.attempt_mut(id, *attempt) {
                    a.end = Some(AttemptEnd {
                        outcome: outcome.clone(),
                        exit_code: *exit_code,
                        reason: reason.clone(),
                        usage: usage.clone(),
                        at_ms: *at_ms,
                    });
                }
                if let Some(job) = self.job_mut(id) {
                    job.exit_reason = Some(reason.clone());
                }
            }
            Event::Decided {
                id,
                decision,
                at_ms,
            } => {
                let Some(job) = self.job_mut(id) else { return };
                match decision {
                    RecoveryDecision::Done => job.state = JobState::Succeeded,
                    RecoveryDecision::GiveUp { reason } => {
                        job.state = JobState::Failed;
                        job.exit_reason = Some(reason.clone());
                    }
                    RecoveryDecision::Retry {
                        reservation,
                        exclusive,
                        backoff_ms,
                        recovery_priority,
                        reason,
                    } => {
                        job.state = JobState::Queued;
                        job.reservation = *reservation;
                        job.exclusive = *exclusive;
                        job.recovery = *recovery_priority;
                        job.not_before_ms = at_ms.saturating_add(*backoff_ms);
                        job.queued_at_ms = *at_ms;
                        job.queue_seq = seq;
                        job.exit_reason = Some(reason.clone());
                    }
                }
            }
        }
    }

    fn job_mut(&mut self, id: &str) -> Option<&mut Job> {
        let job = self.jobs.get_mut(id);
        if job.is_none() {
            tracing::warn!(job = id, "journal event about an unknown job ignored");
        }
        job
    }

    fn attempt_mut(&mut self, id: &str, attempt: u32) -> Option<&mut Attempt> {
        self.job_mut(id)?
            .attempts
            .iter_mut()
            .find(|a| a.number == attempt)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn submitted(id: &str, at_ms: Millis, minutes: Option<u64>) -> Event {
        Event::Submitted {
            job: JobSpec {
                id: id.into(),
                name: id.into(),
                command: vec!["true".into()],
                cwd: "/".into(),
                gpus: 1,
                reservation: Reservation::Mib(1024),
                reservation_source: "override".into(),
                policy: None,
                expected_sm_activity: None,
                expected_duration_ms: minutes.map(|m| m * 60_000),
                submitted_at_ms: at_ms,
            },
            at_ms,
        }
    }

    fn ids(t: &JobTable, order: QueueOrder) -> Vec<&str> {
        t.queue(false, order)
            .iter()
            .map(|j| j.spec.id.as_str())
            .collect()
    }

    #[test]
    fn a_queue_order_ranks_by_the_declared_duration_then_arrival() {
        let mut t = JobTable::default();
        t.apply(&submitted("long", 1, Some(120)));
        t.apply(&submitted("undeclared", 2, None));
        t.apply(&submitted("short", 3, Some(5)));
        t.apply(&submitted("short-too", 4, Some(5)));
        assert_eq!(
            ids(&t, QueueOrder::Arrival),
            ["long", "undeclared", "short", "short-too"]
        );
        assert_eq!(
            ids(&t, QueueOrder::ShortestFirst),
            ["short", "short-too", "long", "undeclared"]
        );
    }
}
