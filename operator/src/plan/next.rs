//! What comes after the attempts are up to date: the first attempt, watching the one in flight,
//! or — once the last one ended — [`carma_core::decide_next`]'s finish, wait or next attempt.

use std::time::Duration;

use carma_api::names::*;
use carma_api::{AttemptOutcomeKind, AttemptStatus, EstimateAnnotation, EstimateStatus, TaskPhase};
use carma_core::quantity::parse_mib;
use carma_core::{AttemptOutcome, AttemptRecord, Declared, RecoveryDecision, Reservation};

use super::{Observation, Step, describe_reservation};
use crate::attempt::{
    AttemptRequest, GpuClaims, InvalidSpec, build_attempt_pod, build_dra_attempt,
    given_reservation_source,
};
use crate::classify::PodProgress;
use crate::observe::ObservedAttempt;
use crate::status::{self, CONDITION_ATTEMPT_STARTED, CONDITION_SCHEDULED, parse_time, rfc3339};
use crate::waiting::Waiting;

impl Step<'_, '_> {
    pub(super) fn next(&mut self) {
        match self.st.attempts.last().cloned() {
            None => self.first_attempt(),
            Some(a) if a.outcome.is_none() => self.in_flight(&a),
            Some(a) => self.after(&a),
        }
    }

    fn first_attempt(&mut self) {
        let spec = &self.input.task.spec;
        let mut gpu_memory_mib = match spec.gpu_memory.as_deref().map(parse_mib).transpose() {
            Ok(v) => v,
            Err(e) => return self.invalid(&InvalidSpec::GpuMemory(e.to_string())),
        };
        // On DRA the claim is sized now; the operator's estimate stands in for the extender's.
        let mut estimate = None;
        if gpu_memory_mib.is_none()
            && !spec.exclusive
            && matches!(self.input.gpu_claims, GpuClaims::Dra { .. })
        {
            match self.input.first_estimate {
                Ok(Some(e)) => {
                    gpu_memory_mib = Some(e.mib);
                    estimate = Some(e.clone());
                }
                Ok(None) => {}
                Err(e) => return self.invalid(e),
            }
        }
        let req = AttemptRequest {
            index: 1,
            gpu_memory_mib,
            exclusive: spec.exclusive,
            recovery_priority: false,
            queue_class: self.queue_class(),
        };
        if let Err(e) = self.create(&req, "", estimate.as_ref()) {
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

    /// The priority class of the task's attempts under the operator's queue order: from its
    /// declared duration and GPU count, `None` when it declares no duration or an attempt has
    /// already outrun it.
    fn queue_class(&self) -> Option<String> {
        let spec = &self.input.task.spec;
        if self
            .st
            .attempts
            .iter()
            .any(|a| a.exceeded_expected_duration == Some(true))
        {
            return None;
        }
        let declared = Declared {
            duration_ms: spec
                .expected_duration_seconds
                .map(|s| s.saturating_mul(1000)),
            gpus: spec.gpus,
        };
        self.input.queue_order.class(&declared).map(|c| c.name)
    }

    /// A running attempt that has outrun the duration its task declares: one Warning Event, and
    /// the task's later attempts lose their queue class (the declaration put it ahead of others).
    /// Before that, the next look is due no later than the moment it would outrun it.
    fn check_expected_duration(&mut self, a: &AttemptStatus, o: &ObservedAttempt) {
        let (Some(declared), Some(since)) = (
            self.input.task.spec.expected_duration_seconds,
            o.running_since,
        ) else {
            return;
        };
        if a.exceeded_expected_duration == Some(true) {
            return;
        }
        let declared_s = i64::try_from(declared).unwrap_or(i64::MAX);
        let ran_s = (self.now() - since).num_seconds();
        if ran_s <= declared_s {
            let due = Duration::from_secs((declared_s - ran_s + 1).unsigned_abs());
            self.out.requeue_after = self.out.requeue_after.map(|r| r.min(due)).or(Some(due));
            return;
        }
        if let Some(st) = self.st.attempts.iter_mut().find(|x| x.index == a.index) {
            st.exceeded_expected_duration = Some(true);
        }
        self.out
            .observations
            .push(Observation::ExpectedDurationExceeded);
        self.event(
            true,
            "ExpectedDurationExceeded",
            "ObserveAttempt",
            format!(
                "attempt {} has run {ran_s} s, longer than the {declared} s that \
                 spec.expectedDurationSeconds declares; later attempts of this task get no \
                 queue priority class",
                a.index
            ),
            Some(&a.pod),
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

    /// Create attempt `req.index` and record it; `estimate` is the operator's sizing of a DRA
    /// attempt from the model profile.
    fn create(
        &mut self,
        req: &AttemptRequest,
        why: &str,
        estimate: Option<&EstimateAnnotation>,
    ) -> Result<(), InvalidSpec> {
        let (task, scheduler) = (self.input.task, self.input.scheduler_name);
        let (mut pod, template) = match self.input.gpu_claims {
            GpuClaims::DevicePlugin => (build_attempt_pod(task, req, scheduler)?, None),
            GpuClaims::Dra { device_class } => {
                let (pod, template) =
                    build_dra_attempt(task, req, scheduler, device_class, estimate)?;
                (pod, Some(Box::new(template)))
            }
        };
        if let (Some(class), Some(spec)) = (self.input.runtime_class_name, pod.spec.as_mut()) {
            // A template that names its own runtime class keeps it.
            spec.runtime_class_name
                .get_or_insert_with(|| class.to_string());
        }
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
        self.st.estimate = match (reserved, exclusive, estimate) {
            (Some(_), false, Some(e)) => Some(self.estimate_status(e)),
            (Some(mib), _, _) => Some(EstimateStatus {
                mib: Some(mib),
                source: given_reservation_source(req.index).to_string(),
                ..EstimateStatus::default()
            }),
            (None, true, _) => Some(EstimateStatus {
                mib: None,
                source: "whole-gpu".to_string(),
                ..EstimateStatus::default()
            }),
            // The extender estimates at bind and writes carma.io/estimate.
            (None, false, _) => None,
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
        status::set_condition(
            &mut self.st.conditions,
            CONDITION_ATTEMPT_STARTED,
            false,
            "NotScheduled",
            &not_on_a_node(req.index, &name),
            now,
        );
        let class = match pod
            .spec
            .as_ref()
            .and_then(|s| s.priority_class_name.as_deref())
        {
            Some(c) if req.recovery_priority || req.queue_class.as_deref() == Some(c) => {
                format!(", priority class {c}")
            }
            _ => String::new(),
        };
        let (reason, note) = if req.index == 1 {
            (
                "AttemptCreated",
                format!("created attempt 1 ({name}) with {what}{class}"),
            )
        } else {
            (
                "RecoveryAttemptCreated",
                format!(
                    "created attempt {} ({name}) with {what}{class}: {why}",
                    req.index
                ),
            )
        };
        self.event(false, reason, "CreateAttempt", note, Some(&name));
        self.announce_fallback(req.index, &name);
        self.out.ensure_claim_template = template;
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
            self.st.estimate = Some(self.estimate_status(e));
            self.announce_fallback(a.index, &a.pod);
        }
        // Why it waits, when the pod says: no node fits, or a container cannot start.
        let blocked = match (&o.node, &o.waiting) {
            (None, Some(w @ Waiting::NotScheduled { .. })) => Some((
                w.reason(),
                format!(
                    "attempt {} ({}) cannot be scheduled: {}",
                    a.index,
                    a.pod,
                    w.describe()
                ),
            )),
            (Some(node), Some(w @ Waiting::ContainerBlocked { .. })) => Some((
                w.reason(),
                format!(
                    "attempt {} ({}) cannot start on node {node}: {}",
                    a.index,
                    a.pod,
                    w.describe()
                ),
            )),
            _ => None,
        };
        let (scheduled, reason, message) = match (&o.node, &blocked) {
            (Some(node), _) => (
                true,
                "Bound",
                format!("attempt {} is on node {node}", a.index),
            ),
            (None, Some((reason, message))) => (false, *reason, message.clone()),
            (None, None) => (
                false,
                "WaitingForScheduler",
                format!(
                    "attempt {} waits for scheduler {}",
                    a.index, self.input.scheduler_name
                ),
            ),
        };
        status::set_condition(
            &mut self.st.conditions,
            CONDITION_SCHEDULED,
            scheduled,
            reason,
            &message,
            now,
        );
        let (started, reason, message) = match (&o.progress, &o.node, &blocked) {
            (PodProgress::Running, node, _) => (
                true,
                "Running",
                format!(
                    "attempt {} ({}) runs on node {}",
                    a.index,
                    a.pod,
                    node.as_deref().unwrap_or("?")
                ),
            ),
            (_, Some(_), Some((reason, message))) => (false, *reason, message.clone()),
            (_, Some(node), None) => (
                false,
                "Starting",
                format!("attempt {} ({}) is starting on node {node}", a.index, a.pod),
            ),
            (_, None, _) => (false, "NotScheduled", not_on_a_node(a.index, &a.pod)),
        };
        status::set_condition(
            &mut self.st.conditions,
            CONDITION_ATTEMPT_STARTED,
            started,
            reason,
            &message,
            now,
        );
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
            self.check_expected_duration(a, &o);
            return;
        }
        let waiting = match (&o.node, blocked) {
            (_, Some((_, message))) => message,
            (Some(node), None) => {
                format!("attempt {} ({}) is starting on node {node}", a.index, a.pod)
            }
            (None, None) => format!(
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
        status::clear_condition(
            &mut self.st.conditions,
            CONDITION_ATTEMPT_STARTED,
            "AttemptEnded",
            now,
        );
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
                    queue_class: self.queue_class(),
                };
                if let Err(e) = self.create(&req, &reason, None) {
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

/// The `AttemptStarted` message of an attempt whose pod has no node yet.
fn not_on_a_node(index: u32, pod: &str) -> String {
    format!("attempt {index} ({pod}) is not on a node yet")
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
