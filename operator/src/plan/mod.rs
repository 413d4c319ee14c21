//! The planner: from a task, its attempt pods and the clock to the actions of
//! one reconcile step — pure, so every transition is tested without a cluster.
//!
//! One step does, in this order: adopt attempt pods the status does not list yet
//! (a create whose status write was lost), record how finished attempts ended,
//! then either wait, create the next attempt (the first, or a recovery attempt
//! chosen by [`carma_core::decide_next`]), or settle the task as `Succeeded` or
//! `Failed`. The executor creates the pod *before* writing the status, so a crash
//! in between is repaired by adoption on the next step, never by a duplicate.

mod estimate;
mod next;
mod outcomes;

use std::time::Duration;

use chrono::{DateTime, Utc};
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::resource::v1::ResourceClaimTemplate;

use carma_api::{
    AttemptOutcomeKind, AttemptStatus, EstimateAnnotation, TaskPhase, TrainingTask,
    TrainingTaskStatus,
};
use carma_core::{QueueOrder, RecoveryConfig};

use crate::attempt::{GpuClaims, InvalidSpec};
use crate::observe::ObservedAttempt;

pub use next::record;

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
    /// How attempt pods get their GPUs.
    pub gpu_claims: &'a GpuClaims,
    /// The queue order whose priority class an attempt of a task that declares its duration
    /// gets (`spec.expectedDurationSeconds`).
    pub queue_order: QueueOrder,
    /// The RuntimeClass attempt pods run under when their template names none (the NVIDIA runtime
    /// where it is not the nodes' default); `None` leaves the template as it is.
    pub runtime_class_name: Option<&'a str>,
    /// For DRA claims: the operator's sizing of the first attempt from the template's
    /// `carma.io/gpu-memory` or the model profile (`Ok(None)`: the whole GPU; `Err`: a profile
    /// the estimator refuses). Device-plugin attempts leave it to the extender.
    pub first_estimate: Result<Option<&'a EstimateAnnotation>, &'a InvalidSpec>,
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
    /// An attempt ran longer than its task's declared duration.
    ExpectedDurationExceeded,
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
    /// Make sure this claim template exists, owned among others by the task, before the pod that
    /// references it is created (an existing one is checked and shared, [`carma_api::dra::template`]).
    pub ensure_claim_template: Option<Box<ResourceClaimTemplate>>,
    /// Create this attempt pod (409 AlreadyExists means adopt it).
    pub create_pod: Option<Box<Pod>>,
    /// Write this status (server-side apply on the status subresource); `None` when unchanged.
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
