//! The planner: from a task, its attempt pods and the clock to the actions of
//! one reconcile step — pure, so every transition is tested without a cluster.
//!
//! One step does, in this order: adopt attempt pods the status does not list yet
//! (a create whose status write was lost), record how finished attempts ended,
//! then either wait, create the next attempt (the first, or a recovery attempt
//! chosen by [`carma_core::decide_next`]), or settle the task as `Succeeded` or
//! `Failed`. The executor creates the pod *before* writing the status, so a crash
//! in between is repaired by adoption on the next step, never by a duplicate.

use std::time::Duration;

use chrono::{DateTime, Utc};
use k8s_openapi::api::core::v1::Pod;

use carma_api::names::*;
use carma_api::{
    AttemptOutcomeKind, AttemptStatus, EstimateStatus, TaskPhase, TrainingTask, TrainingTaskStatus,
};
use carma_core::quantity::parse_mib;
use carma_core::{AttemptOutcome, AttemptRecord, RecoveryConfig, RecoveryDecision, Reservation};

use crate::attempt::{AttemptRequest, InvalidSpec, build_attempt_pod};
use crate::classify::{PodProgress, Verdict};
use crate::observe::ObservedAttempt;
use crate::status::{self, CONDITION_SCHEDULED, parse_time, rfc3339};

/// Everything one planning step looks at.
#[derive(Debug, Clone, Copy)]
pub struct PlanInput<'a> {
    /// The task, with the status last written.
    pub task: &'a TrainingTask,
    /// The task's attempt pods that exist now.
    pub pods: &'a [ObservedAttempt],
    /// The current time.
    pub now: DateTime<Utc>,
    /// Recovery defaults that `spec.recovery` overrides.
    pub defaults: &'a RecoveryConfig,
    /// How often a running attempt is looked at again (to record its memory peak).
    pub peak_poll: Duration,
    /// The kube-scheduler profile attempt pods name (`spec.schedulerName`).
    pub scheduler_name: &'a str,
}

/// An Event to publish about the task.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PlannedEvent {
    /// Warning rather than Normal.
    pub warning: bool,
    /// CamelCase reason, e.g. `AttemptOutOfMemory`.
    pub reason: String,
    /// CamelCase action, e.g. `CreateAttempt`.
    pub action: String,
    /// Human-readable note.
    pub note: String,
    /// The attempt pod it concerns, when one does.
    pub pod: Option<String>,
}

/// Something the metrics record once the step's writes succeeded.
#[derive(Debug, Clone, PartialEq)]
pub enum Observation {
    /// An attempt ended with this outcome.
    AttemptFinished(AttemptOutcomeKind),
    /// A recovery attempt was created after a GPU out-of-memory crash.
    OomRecoveryStarted,
    /// Time from an out-of-memory crash to the next attempt running.
    RecoveryDuration(Duration),
    /// An attempt that succeeded or ran out of GPU memory, with what it reserved and used.
    AttemptMemory {
        /// Where its reservation came from (`carma.io/estimate` source), `unknown` when unbound.
        source: String,
        /// Reservation per GPU, MiB (`None`: whole GPUs).
        reserved_mib: Option<u64>,
        /// Observed peak per GPU, MiB.
        peak_mib: Option<u64>,
        /// It crashed out of GPU memory.
        out_of_memory: bool,
    },
}

/// The actions of one step, executed in field order.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Plan {
    /// Create this attempt pod (409 AlreadyExists means adopt it).
    pub create_pod: Option<Box<Pod>>,
    /// Write this status (merge patch on the status subresource); `None` when unchanged.
    pub status: Option<Box<TrainingTaskStatus>>,
    /// Publish these Events.
    pub events: Vec<PlannedEvent>,
    /// Record these metrics.
    pub observations: Vec<Observation>,
    /// Add these ended attempts to their model profiles' `MemoryHistory` (before the status
    /// write: a retried step finds them recorded and adds nothing).
    pub peak_records: Vec<crate::history::PeakRecord>,
    /// Look again after this long (else only when something changes).
    pub requeue_after: Option<Duration>,
}

/// Whether the task is finished for good: `Succeeded` or `Failed` after at least
/// one attempt, every attempt ended, and no crash waits to be recorded in its model's
/// MemoryHistory. Settled tasks need no API call at all.
pub fn is_settled(task: &TrainingTask) -> bool {
    is_over(task)
        && !task.status.as_ref().is_some_and(|st| {
            st.attempts
                .iter()
                .any(|a| a.history_recorded == Some(false))
        })
}

/// `Succeeded` or `Failed` after at least one attempt, every attempt ended: nothing is left to
/// run (a crash may still wait to be recorded).
fn is_over(task: &TrainingTask) -> bool {
    let Some(st) = task.status.as_ref() else {
        return false;
    };
    matches!(st.phase, Some(TaskPhase::Succeeded | TaskPhase::Failed))
        && !st.attempts.is_empty()
        && st.attempts.iter().all(|a| a.outcome.is_some())
}

/// Plan one reconcile step.
pub fn plan(input: &PlanInput<'_>) -> Plan {
    let mut out = Plan::default();
    if is_settled(input.task) {
        return out;
    }
    let old = input.task.status.clone().unwrap_or_default();
    let mut st = old.clone();
    st.observed_generation = input.task.metadata.generation;
    let mut step = Step {
        input,
        old: &old,
        st: &mut st,
        out: &mut out,
    };
    if is_over(input.task) {
        // Only the MemoryHistory write of a crash is left.
        step.retry_history();
    } else {
        step.adopt();
        step.refresh_open_attempts();
        step.retry_history();
        step.next();
    }
    if st != old {
        out.status = Some(Box::new(st));
    }
    out
}

struct Step<'a, 'i> {
    input: &'a PlanInput<'i>,
    old: &'a TrainingTaskStatus,
    st: &'a mut TrainingTaskStatus,
    out: &'a mut Plan,
}

impl Step<'_, '_> {
    fn now(&self) -> DateTime<Utc> {
        self.input.now
    }

    fn pod(&self, index: u32) -> Option<&ObservedAttempt> {
        self.input.pods.iter().find(|o| o.index == index)
    }

    fn event(
        &mut self,
        warning: bool,
        reason: &str,
        action: &str,
        note: String,
        pod: Option<&str>,
    ) {
        self.out.events.push(PlannedEvent {
            warning,
            reason: reason.to_string(),
            action: action.to_string(),
            note: crate::classify::truncate(&note, 1000),
            pod: pod.map(str::to_string),
        });
    }

    /// Record pods the status does not list (a create whose status write was lost).
    fn adopt(&mut self) {
        let mut pods: Vec<&ObservedAttempt> = self.input.pods.iter().collect();
        pods.sort_by_key(|o| o.index);
        for o in pods {
            if self.st.attempts.iter().any(|a| a.index == o.index) {
                continue;
            }
            self.st.attempts.push(AttemptStatus {
                index: o.index,
                pod: o.pod.clone(),
                node: o.node.clone(),
                gpus: o.gpus.clone(),
                reserved_mib: o.estimate.as_ref().map(|e| e.mib).or(o.requested_mib),
                exclusive: o.exclusive,
                started_at: Some(rfc3339(o.created_at.unwrap_or(self.input.now))),
                ..AttemptStatus::default()
            });
            self.event(
                false,
                "AttemptAdopted",
                "AdoptAttempt",
                format!(
                    "pod {} exists and is recorded as attempt {}",
                    o.pod, o.index
                ),
                Some(&o.pod),
            );
        }
        self.st.attempts.sort_by_key(|a| a.index);
        let last = self.st.attempts.last().map_or(0, |a| a.index);
        self.st.attempt_count = self.st.attempt_count.max(last);
    }

    /// Update attempts that have not ended: placement, memory peak, outcome.
    fn refresh_open_attempts(&mut self) {
        let now = self.now();
        let mut finished: Vec<(usize, Verdict, DateTime<Utc>)> = Vec::new();
        for (i, a) in self.st.attempts.iter_mut().enumerate() {
            if a.outcome.is_some() {
                continue;
            }
            let Some(o) = self.input.pods.iter().find(|o| o.index == a.index) else {
                finished.push((
                    i,
                    Verdict::Evicted {
                        reason: format!(
                            "pod {} disappeared before it finished (deleted, or its node was lost)",
                            a.pod
                        ),
                    },
                    now,
                ));
                continue;
            };
            if o.node.is_some() {
                a.node.clone_from(&o.node);
            }
            if !o.gpus.is_empty() {
                a.gpus.clone_from(&o.gpus);
            }
            if let Some(e) = &o.estimate {
                a.reserved_mib = Some(e.mib);
            } else if a.reserved_mib.is_none() {
                a.reserved_mib = o.requested_mib;
            }
            a.exclusive |= o.exclusive;
            a.observed_peak_mib = a.observed_peak_mib.max(o.peak_mib);
            match &o.progress {
                PodProgress::Finished(v) => {
                    finished.push((i, v.clone(), o.finished_at.unwrap_or(now)));
                }
                PodProgress::NeedsLogs { .. } => finished.push((
                    i,
                    Verdict::Failed {
                        reason: "terminated with an error; neither its termination message nor its log says why"
                            .to_string(),
                    },
                    o.finished_at.unwrap_or(now),
                )),
                PodProgress::Pending | PodProgress::Running => {}
            }
        }
        for (i, verdict, at) in finished {
            self.finish(i, verdict, at);
        }
    }

    fn finish(&mut self, i: usize, verdict: Verdict, at: DateTime<Utc>) {
        let kind = verdict.kind();
        let reason = verdict.reason();
        let a = &mut self.st.attempts[i];
        a.outcome = Some(kind);
        a.reason = Some(reason.clone());
        a.finished_at = Some(rfc3339(at));
        let (index, pod, reserved) = (a.index, a.pod.clone(), describe_reservation(a));
        self.out
            .observations
            .push(Observation::AttemptFinished(kind));
        self.record_memory(i, kind);
        let (warning, ev_reason, note) = match kind {
            AttemptOutcomeKind::Succeeded => (
                false,
                "AttemptSucceeded",
                format!("attempt {index} ({pod}) succeeded"),
            ),
            AttemptOutcomeKind::GpuOutOfMemory => (
                true,
                "AttemptOutOfMemory",
                format!(
                    "attempt {index} ({pod}) crashed out of GPU memory with {reserved}: {reason}"
                ),
            ),
            AttemptOutcomeKind::Failed => (
                true,
                "AttemptFailed",
                format!("attempt {index} ({pod}) failed: {reason}"),
            ),
            AttemptOutcomeKind::Evicted => (
                true,
                "AttemptEvicted",
                format!("attempt {index} ({pod}) was evicted or preempted (not counted): {reason}"),
            ),
            AttemptOutcomeKind::HostOomKilled => (
                true,
                "AttemptHostOOMKilled",
                format!("attempt {index} ({pod}) ran out of host memory with {reserved}: {reason}"),
            ),
        };
        self.event(warning, ev_reason, "RecordOutcome", note, Some(&pod));
    }

    /// What an attempt that succeeded or ran out of GPU memory reserved and used: a metric, and
    /// a sample for its model profile's `MemoryHistory`.
    fn record_memory(&mut self, i: usize, kind: AttemptOutcomeKind) {
        let out_of_memory = kind == AttemptOutcomeKind::GpuOutOfMemory;
        if kind != AttemptOutcomeKind::Succeeded && !out_of_memory {
            return;
        }
        let a = &self.st.attempts[i];
        let input = self.input;
        let pod = input.pods.iter().find(|o| o.index == a.index);
        self.out.observations.push(Observation::AttemptMemory {
            source: pod
                .and_then(|p| p.estimate.as_ref())
                .map_or_else(|| "unknown".to_string(), |e| e.source.clone()),
            reserved_mib: if a.exclusive { None } else { a.reserved_mib },
            peak_mib: a.observed_peak_mib,
            out_of_memory,
        });
        let finished_at = a.finished_at.clone().unwrap_or_default();
        if let Some(rec) = crate::history::peak_record(input.task, a, pod, kind, &finished_at) {
            self.out.peak_records.push(rec);
            if out_of_memory {
                // Optimistic: the executor writes `false` when the record could not be written.
                self.st.attempts[i].history_recorded = Some(true);
            }
        }
    }

    /// Crashes out of GPU memory whose MemoryHistory write failed are recorded again: a lost one
    /// would leave later tasks of the model reserved at the size that crashed.
    fn retry_history(&mut self) {
        let input = self.input;
        for a in &mut self.st.attempts {
            if a.history_recorded != Some(false)
                || a.outcome != Some(AttemptOutcomeKind::GpuOutOfMemory)
            {
                continue;
            }
            let pod = input.pods.iter().find(|o| o.index == a.index);
            let finished_at = a.finished_at.clone().unwrap_or_default();
            match crate::history::peak_record(
                input.task,
                a,
                pod,
                AttemptOutcomeKind::GpuOutOfMemory,
                &finished_at,
            ) {
                Some(rec) => {
                    self.out.peak_records.push(rec);
                    a.history_recorded = Some(true);
                }
                None => {
                    // The pod (and with it the profile it ran with) is gone: nothing to write.
                    a.history_recorded = None;
                    self.out.events.push(PlannedEvent {
                        warning: true,
                        reason: "HistoryNotRecorded".into(),
                        action: "RecordPeak".into(),
                        note: format!(
                            "attempt {} ran out of GPU memory but its pod is gone; the crash is not in its model's MemoryHistory",
                            a.index
                        ),
                        pod: None,
                    });
                }
            }
        }
    }

    fn next(&mut self) {
        match self.st.attempts.last().cloned() {
            None => self.first_attempt(),
            Some(a) if a.outcome.is_none() => self.in_flight(&a),
            Some(a) => self.after(&a),
        }
    }

    fn first_attempt(&mut self) {
        let spec = &self.input.task.spec;
        let gpu_memory_mib = match spec.gpu_memory.as_deref().map(parse_mib).transpose() {
            Ok(v) => v,
            Err(e) => return self.invalid(&InvalidSpec::GpuMemory(e.to_string())),
        };
        let req = AttemptRequest {
            index: 1,
            gpu_memory_mib,
            exclusive: spec.exclusive,
            recovery_priority: false,
        };
        if let Err(e) = self.create(&req, "") {
            return self.invalid(&e);
        }
        let now = self.now();
        status::set_phase(
            self.st,
            TaskPhase::Pending,
            "AttemptCreated",
            &format!(
                "attempt 1 waits for scheduler {}",
                self.input.scheduler_name
            ),
            now,
        );
    }

    fn invalid(&mut self, e: &InvalidSpec) {
        let message = format!("invalid TrainingTask: {e}");
        if self.old.phase != Some(TaskPhase::Failed)
            || self.old.message.as_deref() != Some(&message)
        {
            self.event(true, "InvalidSpec", "Validate", message.clone(), None);
        }
        let now = self.now();
        status::set_phase(self.st, TaskPhase::Failed, "InvalidSpec", &message, now);
    }

    /// Create attempt `req.index` and record it.
    fn create(&mut self, req: &AttemptRequest, why: &str) -> Result<(), InvalidSpec> {
        let pod = build_attempt_pod(self.input.task, req, self.input.scheduler_name)?;
        let ann = pod.metadata.annotations.clone().unwrap_or_default();
        let exclusive = ann
            .get(ANNOTATION_EXCLUSIVE)
            .is_some_and(|v| v.trim() == "true");
        let reserved = ann
            .get(ANNOTATION_GPU_MEMORY)
            .and_then(|v| parse_mib(v).ok());
        let name = pod.metadata.name.clone().unwrap_or_default();
        let now = self.now();
        let a = AttemptStatus {
            index: req.index,
            pod: name.clone(),
            reserved_mib: reserved,
            exclusive,
            started_at: Some(rfc3339(now)),
            ..AttemptStatus::default()
        };
        let what = describe_reservation(&a);
        self.st.attempts.push(a);
        self.st.attempt_count = req.index;
        self.st.node = None;
        self.st.reserved_mib = reserved;
        self.st.next_attempt_at = None;
        self.st.estimate = match (reserved, exclusive) {
            (Some(mib), _) => Some(EstimateStatus {
                mib: Some(mib),
                source: if req.index == 1 {
                    "override"
                } else {
                    "recovery"
                }
                .to_string(),
                class: None,
            }),
            (None, true) => Some(EstimateStatus {
                mib: None,
                source: "whole-gpu".to_string(),
                class: None,
            }),
            // The extender estimates at bind and writes carma.io/estimate.
            (None, false) => None,
        };
        status::set_condition(
            &mut self.st.conditions,
            CONDITION_SCHEDULED,
            false,
            "WaitingForScheduler",
            &format!(
                "attempt {} waits for scheduler {}",
                req.index, self.input.scheduler_name
            ),
            now,
        );
        let (reason, note) = if req.index == 1 {
            (
                "AttemptCreated",
                format!("created attempt 1 ({name}) with {what}"),
            )
        } else {
            let class = if req.recovery_priority {
                format!(", priority class {PRIORITY_CLASS_RECOVERY}")
            } else {
                String::new()
            };
            (
                "RecoveryAttemptCreated",
                format!(
                    "created attempt {} ({name}) with {what}{class}: {why}",
                    req.index
                ),
            )
        };
        self.event(false, reason, "CreateAttempt", note, Some(&name));
        self.out.create_pod = Some(Box::new(pod));
        Ok(())
    }

    /// The last attempt has not ended.
    fn in_flight(&mut self, a: &AttemptStatus) {
        let now = self.now();
        let Some(o) = self.pod(a.index).cloned() else {
            return;
        };
        self.st.node.clone_from(&a.node);
        self.st.reserved_mib = a.reserved_mib;
        // An adopted recovery attempt ends the backoff its creator was waiting out.
        self.st.next_attempt_at = None;
        if let Some(e) = &o.estimate {
            self.st.estimate = Some(EstimateStatus {
                mib: Some(e.mib),
                source: e.source.clone(),
                class: e.class.clone(),
            });
        }
        match &o.node {
            Some(node) => status::set_condition(
                &mut self.st.conditions,
                CONDITION_SCHEDULED,
                true,
                "Bound",
                &format!("attempt {} is on node {node}", a.index),
                now,
            ),
            None => status::set_condition(
                &mut self.st.conditions,
                CONDITION_SCHEDULED,
                false,
                "WaitingForScheduler",
                &format!(
                    "attempt {} waits for scheduler {}",
                    a.index, self.input.scheduler_name
                ),
                now,
            ),
        }
        if o.progress == PodProgress::Running {
            let node = a.node.as_deref().unwrap_or("?");
            let message = format!("attempt {} ({}) runs on node {node}", a.index, a.pod);
            if self.old.phase != Some(TaskPhase::Running) {
                let gpus = if a.gpus.is_empty() {
                    String::new()
                } else {
                    format!(", GPUs {}", a.gpus.join(","))
                };
                self.event(
                    false,
                    "AttemptRunning",
                    "ObserveAttempt",
                    format!("{message}{gpus}, {}", describe_reservation(a)),
                    Some(&a.pod),
                );
                if let Some(d) = self.recovery_duration(a.index) {
                    self.out.observations.push(Observation::RecoveryDuration(d));
                }
            }
            status::set_phase(self.st, TaskPhase::Running, "AttemptRunning", &message, now);
            self.out.requeue_after = Some(self.input.peak_poll);
            return;
        }
        let waiting = match &o.node {
            Some(node) => format!("attempt {} ({}) is starting on node {node}", a.index, a.pod),
            None => format!(
                "attempt {} ({}) waits for scheduler {}",
                a.index, a.pod, self.input.scheduler_name
            ),
        };
        if a.index == 1 {
            status::set_phase(self.st, TaskPhase::Pending, "AttemptPending", &waiting, now);
        } else {
            let reason = self
                .previous(a.index)
                .and_then(|p| p.outcome)
                .map_or("AttemptPending", recovering_reason);
            status::set_phase(self.st, TaskPhase::Recovering, reason, &waiting, now);
        }
    }

    fn previous(&self, index: u32) -> Option<&AttemptStatus> {
        self.st.attempts.iter().rev().find(|p| p.index < index)
    }

    /// Time since the out-of-memory crash of the attempt before `index`.
    fn recovery_duration(&self, index: u32) -> Option<Duration> {
        let prev = self.previous(index)?;
        if prev.outcome != Some(AttemptOutcomeKind::GpuOutOfMemory) {
            return None;
        }
        let crashed = parse_time(prev.finished_at.as_deref()?)?;
        (self.now() - crashed).to_std().ok()
    }

    /// The last attempt ended: finish, wait, or create the next one.
    fn after(&mut self, a: &AttemptStatus) {
        let now = self.now();
        let task = self.input.task;
        let cfg = task.spec.recovery.to_config(self.input.defaults);
        let history: Vec<AttemptRecord> = self.st.attempts.iter().filter_map(record).collect();
        let gpu_memory = self.pod(a.index).and_then(|o| o.gpu_memory_mib);
        let kind = a.outcome.unwrap_or(AttemptOutcomeKind::Failed);
        self.st.node.clone_from(&a.node);
        match carma_core::decide_next(&history, gpu_memory, &cfg) {
            RecoveryDecision::Done => {
                let message = format!("attempt {} ({}) succeeded", a.index, a.pod);
                status::set_phase(
                    self.st,
                    TaskPhase::Succeeded,
                    "AttemptSucceeded",
                    &message,
                    now,
                );
                self.st.next_attempt_at = None;
            }
            RecoveryDecision::GiveUp { reason } => {
                let used = history
                    .iter()
                    .filter(|r| !matches!(r.outcome, AttemptOutcome::Evicted { .. }))
                    .count() as u32;
                let cond_reason = if used >= cfg.max_attempts && kind != AttemptOutcomeKind::Evicted
                {
                    "AttemptsExhausted"
                } else {
                    match kind {
                        AttemptOutcomeKind::GpuOutOfMemory => "OutOfMemoryOnExclusiveGpu",
                        AttemptOutcomeKind::Evicted => "TooManyEvictions",
                        AttemptOutcomeKind::HostOomKilled => "HostOOMKilled",
                        _ => "AttemptFailed",
                    }
                };
                if self.old.phase != Some(TaskPhase::Failed) {
                    self.event(
                        true,
                        "TaskFailed",
                        "GiveUp",
                        format!("{cond_reason}: {reason}"),
                        None,
                    );
                }
                status::set_phase(self.st, TaskPhase::Failed, cond_reason, &reason, now);
                self.st.next_attempt_at = None;
            }
            RecoveryDecision::Retry {
                reservation,
                exclusive,
                backoff_ms,
                recovery_priority,
                reason,
            } => {
                let cond_reason = recovering_reason(kind);
                let ended = a.finished_at.as_deref().and_then(parse_time).unwrap_or(now);
                let due = self
                    .st
                    .next_attempt_at
                    .as_deref()
                    .and_then(parse_time)
                    .unwrap_or_else(|| ended + chrono::Duration::milliseconds(backoff_ms as i64));
                if now < due {
                    if self.st.next_attempt_at.is_none() {
                        self.st.next_attempt_at = Some(rfc3339(due));
                        self.event(
                            false,
                            "RecoveryScheduled",
                            "ScheduleRecovery",
                            format!("{reason}; next attempt at {}", rfc3339(due)),
                            None,
                        );
                    }
                    status::set_phase(self.st, TaskPhase::Recovering, cond_reason, &reason, now);
                    let wait = (due - now).to_std().unwrap_or_default();
                    self.out.requeue_after = Some(wait.max(Duration::from_secs(1)));
                    return;
                }
                let index = self.st.attempt_count.max(a.index) + 1;
                let req = AttemptRequest {
                    index,
                    gpu_memory_mib: match reservation {
                        Reservation::Mib(m) => Some(m),
                        Reservation::WholeGpu | Reservation::Unknown => None,
                    },
                    exclusive: exclusive || reservation == Reservation::WholeGpu,
                    recovery_priority,
                };
                if let Err(e) = self.create(&req, &reason) {
                    return self.invalid(&e);
                }
                if kind == AttemptOutcomeKind::GpuOutOfMemory {
                    self.out.observations.push(Observation::OomRecoveryStarted);
                }
                status::set_phase(self.st, TaskPhase::Recovering, cond_reason, &reason, now);
            }
        }
    }
}

/// Condition reason of `Recovering` after an attempt ended this way.
fn recovering_reason(kind: AttemptOutcomeKind) -> &'static str {
    match kind {
        AttemptOutcomeKind::GpuOutOfMemory => "GpuOutOfMemory",
        AttemptOutcomeKind::Evicted => "Evicted",
        AttemptOutcomeKind::Failed => "AttemptFailed",
        AttemptOutcomeKind::Succeeded => "AttemptSucceeded",
        AttemptOutcomeKind::HostOomKilled => "HostOOMKilled",
    }
}

/// The core's view of a finished attempt; `None` while it runs. A host-memory kill
/// is an ordinary failure to the core: retried per `retriesOnFailure` with the same
/// reservation, never counted as a GPU out-of-memory crash.
pub fn record(a: &AttemptStatus) -> Option<AttemptRecord> {
    let reason = a.reason.clone().unwrap_or_default();
    let outcome = match a.outcome? {
        AttemptOutcomeKind::Succeeded => AttemptOutcome::Succeeded,
        AttemptOutcomeKind::GpuOutOfMemory => AttemptOutcome::GpuOutOfMemory {
            observed_peak_mib: a.observed_peak_mib,
        },
        AttemptOutcomeKind::Failed | AttemptOutcomeKind::HostOomKilled => {
            AttemptOutcome::Failed { reason }
        }
        AttemptOutcomeKind::Evicted => AttemptOutcome::Evicted { reason },
    };
    let reservation = if a.exclusive {
        Reservation::WholeGpu
    } else {
        a.reserved_mib
            .map_or(Reservation::Unknown, Reservation::Mib)
    };
    Some(AttemptRecord {
        outcome,
        reservation,
        exclusive: a.exclusive,
    })
}

fn describe_reservation(a: &AttemptStatus) -> String {
    match (a.reserved_mib, a.exclusive) {
        (_, true) => "exclusive GPU(s)".to_string(),
        (Some(m), false) => format!("{m} MiB reserved per GPU"),
        (None, false) => "the extender's estimate".to_string(),
    }
}

#[cfg(test)]
mod tests;
