//! Decision tables of the planner: every lifecycle transition, without I/O.

use super::*;
use crate::classify::{PodProgress, Verdict};
use crate::status::{CONDITION_SCHEDULED, condition};
use carma_api::EstimateAnnotation;
use carma_api::names::{
    ANNOTATION_EXCLUSIVE, ANNOTATION_GPU_MEMORY, ANNOTATION_MODEL_PROFILE, PRIORITY_CLASS_RECOVERY,
};
use carma_core::{AttemptOutcome, AttemptRecord, Reservation};
use serde_json::json;

fn t(secs: i64) -> DateTime<Utc> {
    DateTime::from_timestamp(1_800_000_000 + secs, 0).unwrap()
}

fn task(spec: serde_json::Value) -> TrainingTask {
    let mut base = json!({
        "gpus": 1,
        "template": {"spec": {"containers": [{"name": "train", "image": "pytorch"}]}},
        "modelProfile": {"family": "cnn", "batchSize": 64, "parameters": 25000000, "activations": 9000000}
    });
    if let (Some(b), Some(s)) = (base.as_object_mut(), spec.as_object()) {
        for (k, v) in s {
            b.insert(k.clone(), v.clone());
        }
    }
    serde_json::from_value(json!({
        "apiVersion": "carma.io/v1alpha1",
        "kind": "TrainingTask",
        "metadata": {"name": "train", "namespace": "default", "uid": "uid-1", "generation": 1},
        "spec": base
    }))
    .unwrap()
}

/// An attempt pod as observed.
fn pod(index: u32, progress: PodProgress) -> ObservedAttempt {
    ObservedAttempt {
        index,
        pod: format!("train-a{index}"),
        uid: Some(format!("pod-{index}")),
        node: None,
        gpus: Vec::new(),
        requested_mib: None,
        estimate: None,
        exclusive: false,
        created_at: Some(t(0)),
        running_since: None,
        finished_at: None,
        progress,
        peak_mib: None,
        gpu_memory_mib: None,
        model_profile: None,
        waiting: None,
    }
}

fn bound(mut o: ObservedAttempt, mib: u64) -> ObservedAttempt {
    o.node = Some("gpu-node-1".into());
    o.gpus = vec!["GPU-a".into()];
    o.estimate = Some(EstimateAnnotation {
        mib,
        source: "gpumemnet-cnn".into(),
        class: Some("(0,8000]".into()),
        samples: None,
    });
    o.gpu_memory_mib = Some(40960);
    o
}

/// The memory observation of attempt 1 crashing out of memory under `bound(…, 8000)`.
fn first_oom_memory() -> Observation {
    Observation::AttemptMemory {
        source: "gpumemnet-cnn".into(),
        reserved_mib: Some(8000),
        peak_mib: None,
        out_of_memory: true,
    }
}

fn oom() -> PodProgress {
    PodProgress::Finished(Verdict::GpuOutOfMemory {
        evidence: "torch.OutOfMemoryError: CUDA out of memory".into(),
    })
}

fn ended(mut o: ObservedAttempt, at: DateTime<Utc>) -> ObservedAttempt {
    o.finished_at = Some(at);
    o
}

fn step(task: &TrainingTask, pods: &[ObservedAttempt], now: DateTime<Utc>) -> Plan {
    step_with(task, pods, now, &GpuClaims::DevicePlugin, Ok(None))
}

/// One step with attempt pods of `claims` and the operator's first estimate `first`.
fn step_with(
    task: &TrainingTask,
    pods: &[ObservedAttempt],
    now: DateTime<Utc>,
    claims: &GpuClaims,
    first: Result<Option<&EstimateAnnotation>, &InvalidSpec>,
) -> Plan {
    let defaults = RecoveryConfig::default();
    plan(&PlanInput {
        task,
        pods,
        now,
        defaults: &defaults,
        peak_poll: Duration::from_secs(15),
        scheduler_name: carma_api::names::SCHEDULER_NAME,
        gpu_claims: claims,
        // The chart's default: it leaves tasks that declare no duration as they were.
        queue_order: carma_core::QueueOrder::ALL[3],
        runtime_class_name: None,
        first_estimate: first,
    })
}

/// Write the planned status into the task, as the API server would.
fn apply(task: &mut TrainingTask, p: &Plan) {
    if let Some(s) = &p.status {
        task.status = Some((**s).clone());
    }
}

fn st(task: &TrainingTask) -> &TrainingTaskStatus {
    task.status.as_ref().unwrap()
}

fn ann(p: &Plan, key: &str) -> Option<String> {
    p.create_pod
        .as_ref()?
        .metadata
        .annotations
        .as_ref()?
        .get(key)
        .cloned()
}

fn priority_class(p: &Plan) -> Option<String> {
    p.create_pod
        .as_ref()?
        .spec
        .as_ref()?
        .priority_class_name
        .clone()
}

fn reasons(p: &Plan) -> Vec<&str> {
    p.events.iter().map(|e| e.reason.as_str()).collect()
}

/// A task whose first attempt (8000 MiB estimate) crashed out of GPU memory at t(100).
fn after_first_oom(spec: serde_json::Value) -> (TrainingTask, Vec<ObservedAttempt>, Plan) {
    let mut tk = task(spec);
    let p = step(&tk, &[], t(0));
    apply(&mut tk, &p);
    let pods = vec![ended(bound(pod(1, oom()), 8000), t(100))];
    let p = step(&tk, &pods, t(101));
    (tk, pods, p)
}

#[test]
fn new_task_creates_attempt_one() {
    let tk = task(json!({"gpuMemory": "12Gi"}));
    let p = step(&tk, &[], t(0));
    let pod = p.create_pod.as_ref().expect("a pod");
    assert_eq!(pod.metadata.name.as_deref(), Some("train-a1"));
    assert_eq!(ann(&p, ANNOTATION_GPU_MEMORY).as_deref(), Some("12288Mi"));
    assert!(
        ann(&p, ANNOTATION_MODEL_PROFILE)
            .unwrap()
            .contains("\"family\":\"cnn\"")
    );
    assert_eq!(priority_class(&p), None);
    let s = p.status.as_ref().unwrap();
    assert_eq!(s.phase, Some(TaskPhase::Pending));
    assert_eq!(s.attempt_count, 1);
    assert_eq!(s.attempts.len(), 1);
    assert_eq!(s.attempts[0].pod, "train-a1");
    assert_eq!(s.attempts[0].reserved_mib, Some(12288));
    assert_eq!(s.attempts[0].outcome, None);
    assert_eq!(
        s.attempts[0].started_at.as_deref(),
        Some("2027-01-15T08:00:00Z")
    );
    assert_eq!(s.estimate.as_ref().unwrap().source, "override");
    assert_eq!(s.observed_generation, Some(1));
    assert_eq!(reasons(&p), ["AttemptCreated"]);
    assert_eq!(p.requeue_after, None);
}

/// The chart's `operator.attemptRuntimeClassName` reaches every attempt pod whose template names
/// no runtime class; a template that names one keeps it.
#[test]
fn attempts_run_under_the_configured_runtime_class_unless_the_template_names_one() {
    let defaults = RecoveryConfig::default();
    let runtime_class = |tk: &TrainingTask| {
        let p = plan(&PlanInput {
            task: tk,
            pods: &[],
            now: t(0),
            defaults: &defaults,
            peak_poll: Duration::from_secs(15),
            scheduler_name: carma_api::names::SCHEDULER_NAME,
            gpu_claims: &GpuClaims::DevicePlugin,
            queue_order: carma_core::QueueOrder::Arrival,
            runtime_class_name: Some("nvidia"),
            first_estimate: Ok(None),
        });
        p.create_pod
            .and_then(|pod| pod.spec)
            .and_then(|spec| spec.runtime_class_name)
    };
    assert_eq!(runtime_class(&task(json!({}))).as_deref(), Some("nvidia"));
    let own = task(json!({"template": {"spec": {
        "runtimeClassName": "nvidia-cdi",
        "containers": [{"name": "train", "image": "pytorch"}]
    }}}));
    assert_eq!(runtime_class(&own).as_deref(), Some("nvidia-cdi"));
    // Unset, the template is left as it is.
    let p = step(&task(json!({})), &[], t(0));
    assert_eq!(p.create_pod.unwrap().spec.unwrap().runtime_class_name, None);
}

#[test]
fn without_override_the_extender_estimates() {
    let tk = task(json!({}));
    let p = step(&tk, &[], t(0));
    assert_eq!(ann(&p, ANNOTATION_GPU_MEMORY), None);
    let s = p.status.as_ref().unwrap();
    assert_eq!(s.attempts[0].reserved_mib, None);
    assert_eq!(s.estimate, None);
}

#[test]
fn a_repeated_step_changes_nothing() {
    let mut tk = task(json!({}));
    let p = step(&tk, &[], t(0));
    apply(&mut tk, &p);
    // The pod exists now, still unscheduled: nothing to write, nothing to create.
    let pods = [pod(1, PodProgress::Pending)];
    let p = step(&tk, &pods, t(5));
    apply(&mut tk, &p);
    let p = step(&tk, &pods, t(10));
    assert_eq!(p, Plan::default());
}

#[test]
fn a_pending_attempt_says_why_it_waits() {
    use crate::status::CONDITION_ATTEMPT_STARTED;
    use crate::waiting::Waiting;
    let mut tk = task(json!({}));
    let p = step(&tk, &[], t(0));
    apply(&mut tk, &p);
    let started = |tk: &TrainingTask| {
        condition(st(tk), CONDITION_ATTEMPT_STARTED)
            .cloned()
            .unwrap()
    };
    assert_eq!(started(&tk).reason.as_deref(), Some("NotScheduled"));

    // No node fits: the scheduler's message reaches the Scheduled condition and the message.
    let mut a1 = pod(1, PodProgress::Pending);
    a1.waiting = Some(Waiting::NotScheduled {
        reason: "Unschedulable",
        message: "0/2 nodes are available: 2 carma: no GPU has 8000 MiB free.".into(),
    });
    let p = step(&tk, std::slice::from_ref(&a1), t(5));
    apply(&mut tk, &p);
    let s = st(&tk);
    let want = "attempt 1 (train-a1) cannot be scheduled: 0/2 nodes are available: 2 carma: no GPU has 8000 MiB free.";
    assert_eq!(s.phase, Some(TaskPhase::Pending));
    assert_eq!(s.message.as_deref(), Some(want));
    let c = condition(s, CONDITION_SCHEDULED).unwrap();
    assert_eq!(
        (c.status.as_str(), c.reason.as_deref(), c.message.as_deref()),
        ("False", Some("Unschedulable"), Some(want))
    );
    assert_eq!(started(&tk).reason.as_deref(), Some("NotScheduled"));
    // The same refusal again writes nothing.
    assert_eq!(step(&tk, std::slice::from_ref(&a1), t(10)).status, None);

    // Bound, but its image cannot be pulled: Scheduled, not started, and the message says why.
    let mut a1 = bound(pod(1, PodProgress::Pending), 8000);
    a1.waiting = Some(Waiting::ContainerBlocked {
        container: "train".into(),
        reason: "ImagePullBackOff".into(),
        message: "Back-off pulling image \"pytorch\"".into(),
    });
    let p = step(&tk, std::slice::from_ref(&a1), t(20));
    apply(&mut tk, &p);
    let s = st(&tk);
    let want = "attempt 1 (train-a1) cannot start on node gpu-node-1: container train: ImagePullBackOff: Back-off pulling image \"pytorch\"";
    assert_eq!(s.message.as_deref(), Some(want));
    assert_eq!(condition(s, CONDITION_SCHEDULED).unwrap().status, "True");
    let c = started(&tk);
    assert_eq!(
        (c.status.as_str(), c.reason.as_deref(), c.message.as_deref()),
        ("False", Some("ImagePullBackOff"), Some(want))
    );

    // The image came: the message says it runs, and AttemptStarted turns True.
    let p = step(&tk, &[bound(pod(1, PodProgress::Running), 8000)], t(40));
    apply(&mut tk, &p);
    let s = st(&tk);
    assert_eq!(
        s.message.as_deref(),
        Some("attempt 1 (train-a1) runs on node gpu-node-1")
    );
    let c = started(&tk);
    assert_eq!(
        (
            c.status.as_str(),
            c.reason.as_deref(),
            c.last_transition_time.clone()
        ),
        ("True", Some("Running"), Some(crate::status::rfc3339(t(40))))
    );

    // Once it ended, AttemptStarted is False again.
    let p = step(&tk, &[ended(bound(pod(1, oom()), 8000), t(100))], t(101));
    apply(&mut tk, &p);
    let c = started(&tk);
    assert_eq!(
        (c.status.as_str(), c.reason.as_deref()),
        ("False", Some("AttemptEnded"))
    );
}

#[test]
fn a_recovery_attempt_that_cannot_be_scheduled_says_so_and_keeps_its_reason() {
    use crate::waiting::Waiting;
    let (mut tk, _, p) = after_first_oom(json!({"recovery": {"backoffSeconds": 0}}));
    apply(&mut tk, &p);
    assert_eq!(st(&tk).attempt_count, 2);
    let mut a2 = pod(2, PodProgress::Pending);
    a2.waiting = Some(Waiting::NotScheduled {
        reason: "Unschedulable",
        message: "0/1 nodes are available: 1 carma: no GPU has 9024 MiB free.".into(),
    });
    let pods = vec![ended(bound(pod(1, oom()), 8000), t(100)), a2];
    let p = step(&tk, &pods, t(110));
    apply(&mut tk, &p);
    let s = st(&tk);
    assert_eq!(s.phase, Some(TaskPhase::Recovering));
    assert_eq!(
        s.message.as_deref(),
        Some(
            "attempt 2 (train-a2) cannot be scheduled: 0/1 nodes are available: 1 carma: no GPU has 9024 MiB free."
        )
    );
    // Recovering still says why the task recovers.
    let c = condition(s, "Recovering").unwrap();
    assert_eq!(c.reason.as_deref(), Some("GpuOutOfMemory"));
    assert_eq!(
        condition(s, CONDITION_SCHEDULED).unwrap().reason.as_deref(),
        Some("Unschedulable")
    );
}

#[test]
fn running_attempt_records_placement_and_polls_for_its_peak() {
    let mut tk = task(json!({}));
    let p = step(&tk, &[], t(0));
    apply(&mut tk, &p);
    let mut running = bound(pod(1, PodProgress::Running), 8000);
    running.peak_mib = Some(6100);
    let p = step(&tk, std::slice::from_ref(&running), t(30));
    apply(&mut tk, &p);
    let s = st(&tk);
    assert_eq!(s.phase, Some(TaskPhase::Running));
    assert_eq!(s.node.as_deref(), Some("gpu-node-1"));
    assert_eq!(s.reserved_mib, Some(8000));
    assert_eq!(s.estimate.as_ref().unwrap().source, "gpumemnet-cnn");
    assert_eq!(s.attempts[0].gpus, vec!["GPU-a"]);
    assert_eq!(s.attempts[0].observed_peak_mib, Some(6100));
    assert_eq!(condition(s, CONDITION_SCHEDULED).unwrap().status, "True");
    assert_eq!(condition(s, "Running").unwrap().status, "True");
    assert_eq!(reasons(&p), ["AttemptRunning"]);
    assert_eq!(p.requeue_after, Some(Duration::from_secs(15)));
    assert!(p.observations.is_empty());

    // The peak only grows; no new event while it keeps running.
    running.peak_mib = Some(5000);
    let p = step(&tk, std::slice::from_ref(&running), t(45));
    assert!(p.status.is_none());
    running.peak_mib = Some(7300);
    let p = step(&tk, std::slice::from_ref(&running), t(60));
    assert!(p.events.is_empty());
    assert_eq!(
        p.status.as_ref().unwrap().attempts[0].observed_peak_mib,
        Some(7300)
    );
    assert_eq!(p.requeue_after, Some(Duration::from_secs(15)));
}

#[test]
fn a_declared_duration_gives_every_attempt_but_a_recovery_its_queue_class() {
    const CLASS: &str = "carma-queue-stl30-under-16m";
    // 10 min on 1 GPU: a short task.
    let spec = json!({"expectedDurationSeconds": 600, "recovery": {"retriesOnFailure": 1, "backoffSeconds": 0}});
    let mut tk = task(spec.clone());
    let p = step(&tk, &[], t(0));
    assert_eq!(priority_class(&p).as_deref(), Some(CLASS));
    assert!(
        p.events[0]
            .note
            .contains(&format!("priority class {CLASS}")),
        "{:?}",
        p.events
    );
    apply(&mut tk, &p);
    // A plain retry keeps the class; a recovery from an OOM crash goes ahead of it.
    let failed = || {
        PodProgress::Finished(Verdict::Failed {
            reason: "exit code 1 (Error): ValueError".into(),
        })
    };
    let p = step(&tk, &[ended(bound(pod(1, failed()), 8000), t(10))], t(11));
    assert_eq!(priority_class(&p).as_deref(), Some(CLASS));
    let (_, _, p) = after_first_oom(spec);
    assert_eq!(priority_class(&p).as_deref(), Some(PRIORITY_CLASS_RECOVERY));
    // 3 h on 2 GPUs: a long task, ranked by its 360 GPU-minutes.
    let long = task(json!({"expectedDurationSeconds": 10_800, "gpus": 2}));
    assert_eq!(
        priority_class(&step(&long, &[], t(0))).as_deref(),
        Some("carma-queue-stl30-from-240-gpu-min")
    );
}

#[test]
fn an_attempt_that_outruns_its_declared_duration_costs_its_task_the_queue_class() {
    let spec = json!({"expectedDurationSeconds": 600, "recovery": {"retriesOnFailure": 1, "backoffSeconds": 0}});
    let mut tk = task(spec);
    let p = step(&tk, &[], t(0));
    assert_eq!(
        priority_class(&p).as_deref(),
        Some("carma-queue-stl30-under-16m")
    );
    apply(&mut tk, &p);
    let mut running = bound(pod(1, PodProgress::Running), 8000);
    running.running_since = Some(t(60));
    let outran = |p: &Plan| reasons(p).contains(&"ExpectedDurationExceeded");
    // Within its 600 s: no Event; the next look comes at the poll, or at the deadline if sooner.
    let p = step(&tk, std::slice::from_ref(&running), t(300));
    assert!(!outran(&p));
    assert_eq!(p.requeue_after, Some(Duration::from_secs(15)));
    let p = step(&tk, std::slice::from_ref(&running), t(655));
    assert!(!outran(&p));
    assert_eq!(p.requeue_after, Some(Duration::from_secs(6)));
    apply(&mut tk, &p);
    // 640 s after it started running: one Warning, recorded on the attempt.
    let p = step(&tk, std::slice::from_ref(&running), t(700));
    assert!(outran(&p), "{:?}", reasons(&p));
    let e = p
        .events
        .iter()
        .find(|e| e.reason == "ExpectedDurationExceeded")
        .unwrap();
    assert!(e.warning && e.note.contains("has run 640 s, longer than the 600 s"));
    assert_eq!(
        p.status.as_ref().unwrap().attempts[0].exceeded_expected_duration,
        Some(true)
    );
    assert!(
        p.observations
            .contains(&Observation::ExpectedDurationExceeded)
    );
    apply(&mut tk, &p);
    assert!(!outran(&step(&tk, std::slice::from_ref(&running), t(715))));
    // Its retry goes without a queue class.
    let failed = || {
        PodProgress::Finished(Verdict::Failed {
            reason: "exit code 1 (Error): ValueError".into(),
        })
    };
    let p = step(&tk, &[ended(bound(pod(1, failed()), 8000), t(800))], t(801));
    assert!(p.create_pod.is_some());
    assert_eq!(priority_class(&p), None);
}

#[test]
fn oom_creates_a_recovery_attempt_with_a_larger_reservation() {
    let (_, _, p) = after_first_oom(json!({"recovery": {"backoffSeconds": 0}}));
    let s = p.status.as_ref().unwrap();
    let a1 = &s.attempts[0];
    assert_eq!(a1.outcome, Some(AttemptOutcomeKind::GpuOutOfMemory));
    assert!(a1.reason.as_deref().unwrap().contains("CUDA out of memory"));
    assert_eq!(a1.finished_at.as_deref(), Some("2027-01-15T08:01:40Z"));
    assert_eq!(a1.node.as_deref(), Some("gpu-node-1"));
    assert_eq!(a1.reserved_mib, Some(8000));
    // Next GPUMemNet class edge above 8000 MiB.
    assert_eq!(ann(&p, ANNOTATION_GPU_MEMORY).as_deref(), Some("16000Mi"));
    assert_eq!(priority_class(&p).as_deref(), Some(PRIORITY_CLASS_RECOVERY));
    assert_eq!(ann(&p, ANNOTATION_EXCLUSIVE), None);
    assert_eq!(
        p.create_pod.as_ref().unwrap().metadata.name.as_deref(),
        Some("train-a2")
    );
    let a2 = &s.attempts[1];
    assert_eq!(
        (a2.index, a2.reserved_mib, a2.outcome),
        (2, Some(16000), None)
    );
    assert_eq!(s.attempt_count, 2);
    assert_eq!(s.phase, Some(TaskPhase::Recovering));
    assert_eq!(s.estimate.as_ref().unwrap().source, "recovery");
    let c = condition(s, "Recovering").unwrap();
    assert_eq!(
        (c.status.as_str(), c.reason.as_deref()),
        ("True", Some("GpuOutOfMemory"))
    );
    assert_eq!(
        reasons(&p),
        ["AttemptOutOfMemory", "RecoveryAttemptCreated"]
    );
    assert!(p.events[0].warning);
    assert!(
        p.events[1].note.contains("16000 MiB"),
        "{}",
        p.events[1].note
    );
    assert!(p.events[1].note.contains(PRIORITY_CLASS_RECOVERY));
    assert_eq!(
        p.observations,
        vec![
            Observation::AttemptFinished(AttemptOutcomeKind::GpuOutOfMemory),
            first_oom_memory(),
            Observation::OomRecoveryStarted
        ]
    );
}

#[test]
fn observed_peak_plus_headroom_beats_the_next_edge() {
    let mut tk = task(json!({"recovery": {"backoffSeconds": 0}}));
    let p = step(&tk, &[], t(0));
    apply(&mut tk, &p);
    let mut running = bound(pod(1, PodProgress::Running), 8000);
    running.peak_mib = Some(15500);
    let p = step(&tk, &[running], t(10));
    apply(&mut tk, &p);
    // Telemetry no longer lists the crashed pod: the recorded peak is used.
    let crashed = ended(bound(pod(1, oom()), 8000), t(20));
    let p = step(&tk, &[crashed], t(21));
    assert_eq!(ann(&p, ANNOTATION_GPU_MEMORY).as_deref(), Some("16524Mi"));
}

#[test]
fn backoff_waits_then_creates() {
    let (mut tk, pods, p) = after_first_oom(json!({}));
    assert!(p.create_pod.is_none());
    let s = p.status.as_ref().unwrap();
    // Default backoff 10 s after the crash at t(100).
    assert_eq!(s.next_attempt_at.as_deref(), Some("2027-01-15T08:01:50Z"));
    assert_eq!(s.phase, Some(TaskPhase::Recovering));
    assert_eq!(p.requeue_after, Some(Duration::from_secs(9)));
    assert_eq!(reasons(&p), ["AttemptOutOfMemory", "RecoveryScheduled"]);
    assert_eq!(
        p.observations,
        vec![
            Observation::AttemptFinished(AttemptOutcomeKind::GpuOutOfMemory),
            first_oom_memory(),
        ]
    );
    apply(&mut tk, &p);

    // Early wake-up: still waiting, nothing new.
    let p = step(&tk, &pods, t(105));
    assert!(p.create_pod.is_none() && p.status.is_none() && p.events.is_empty());
    assert_eq!(p.requeue_after, Some(Duration::from_secs(5)));

    let p = step(&tk, &pods, t(110));
    assert_eq!(ann(&p, ANNOTATION_GPU_MEMORY).as_deref(), Some("16000Mi"));
    let s = p.status.as_ref().unwrap();
    assert_eq!(s.next_attempt_at, None);
    assert_eq!(reasons(&p), ["RecoveryAttemptCreated"]);
    assert_eq!(p.observations, vec![Observation::OomRecoveryStarted]);
}

#[test]
fn recovery_duration_is_crash_to_running() {
    let (mut tk, mut pods, p) = after_first_oom(json!({"recovery": {"backoffSeconds": 0}}));
    apply(&mut tk, &p);
    pods.push(bound(pod(2, PodProgress::Pending), 16000));
    let p = step(&tk, &pods, t(110));
    apply(&mut tk, &p);
    assert_eq!(st(&tk).phase, Some(TaskPhase::Recovering));
    assert!(p.observations.is_empty());
    pods[1] = bound(pod(2, PodProgress::Running), 16000);
    let p = step(&tk, &pods, t(145));
    assert_eq!(
        p.observations,
        vec![Observation::RecoveryDuration(Duration::from_secs(45))]
    );
    assert_eq!(p.status.as_ref().unwrap().phase, Some(TaskPhase::Running));
}

#[test]
fn escalates_to_exclusive_after_the_configured_ooms() {
    let (mut tk, mut pods, p) = after_first_oom(json!({"recovery": {"backoffSeconds": 0}}));
    apply(&mut tk, &p);
    pods.push(ended(bound(pod(2, oom()), 16000), t(200)));
    let p = step(&tk, &pods, t(201));
    assert_eq!(ann(&p, ANNOTATION_EXCLUSIVE).as_deref(), Some("true"));
    assert_eq!(ann(&p, ANNOTATION_GPU_MEMORY), None);
    assert_eq!(priority_class(&p).as_deref(), Some(PRIORITY_CLASS_RECOVERY));
    let s = p.status.as_ref().unwrap();
    assert!(s.attempts[2].exclusive);
    assert_eq!(s.estimate.as_ref().unwrap().source, "whole-gpu");
    apply(&mut tk, &p);

    // Out of memory even alone on the GPU: give up.
    let mut excl = ended(bound(pod(3, oom()), 40960), t(300));
    excl.exclusive = true;
    pods.push(excl);
    let p = step(&tk, &pods, t(301));
    assert!(p.create_pod.is_none());
    let s = p.status.as_ref().unwrap();
    assert_eq!(s.phase, Some(TaskPhase::Failed));
    let c = condition(s, "Failed").unwrap();
    assert_eq!(c.reason.as_deref(), Some("OutOfMemoryOnExclusiveGpu"));
    assert_eq!(reasons(&p), ["AttemptOutOfMemory", "TaskFailed"]);
    apply(&mut tk, &p);
    assert!(is_settled(&tk));
    assert_eq!(step(&tk, &pods, t(400)), Plan::default());
}

#[test]
fn gives_up_after_the_attempt_limit() {
    let spec =
        json!({"recovery": {"backoffSeconds": 0, "maxAttempts": 2, "exclusiveAfterOoms": 5}});
    let (mut tk, mut pods, p) = after_first_oom(spec);
    apply(&mut tk, &p);
    pods.push(ended(bound(pod(2, oom()), 16000), t(200)));
    let p = step(&tk, &pods, t(201));
    assert!(p.create_pod.is_none());
    let s = p.status.as_ref().unwrap();
    assert_eq!(s.phase, Some(TaskPhase::Failed));
    assert_eq!(
        condition(s, "Failed").unwrap().reason.as_deref(),
        Some("AttemptsExhausted")
    );
    assert!(
        s.message
            .as_deref()
            .unwrap()
            .contains("2 attempt(s) used of 2")
    );
    assert_eq!(condition(s, "Recovering").unwrap().status, "False");
    assert_eq!(reasons(&p), ["AttemptOutOfMemory", "TaskFailed"]);
}

#[test]
fn grown_reservation_that_does_not_fit_goes_exclusive() {
    let mut tk = task(json!({"recovery": {"backoffSeconds": 0}, "gpuMemory": "24000Mi"}));
    let p = step(&tk, &[], t(0));
    apply(&mut tk, &p);
    let mut crashed = ended(bound(pod(1, oom()), 24000), t(10));
    crashed.gpu_memory_mib = Some(24576);
    let p = step(&tk, &[crashed], t(11));
    assert_eq!(ann(&p, ANNOTATION_EXCLUSIVE).as_deref(), Some("true"));
}

#[test]
fn other_failures_fail_or_retry_per_spec() {
    let failed = || {
        PodProgress::Finished(Verdict::Failed {
            reason: "exit code 1 (Error): ValueError".into(),
        })
    };
    let mut tk = task(json!({}));
    let p = step(&tk, &[], t(0));
    apply(&mut tk, &p);
    let p = step(&tk, &[ended(bound(pod(1, failed()), 8000), t(10))], t(11));
    let s = p.status.as_ref().unwrap();
    assert_eq!(s.phase, Some(TaskPhase::Failed));
    assert_eq!(
        condition(s, "Failed").unwrap().reason.as_deref(),
        Some("AttemptFailed")
    );
    assert_eq!(reasons(&p), ["AttemptFailed", "TaskFailed"]);
    assert_eq!(
        p.observations,
        vec![Observation::AttemptFinished(AttemptOutcomeKind::Failed)]
    );

    let mut tk = task(json!({"recovery": {"retriesOnFailure": 1, "backoffSeconds": 0}}));
    let p = step(&tk, &[], t(0));
    apply(&mut tk, &p);
    let p = step(&tk, &[ended(bound(pod(1, failed()), 8000), t(10))], t(11));
    assert!(p.create_pod.is_some());
    // A plain retry is not a recovery: same reservation, no recovery priority.
    assert_eq!(priority_class(&p), None);
    assert_eq!(ann(&p, ANNOTATION_GPU_MEMORY).as_deref(), Some("8000Mi"));
    assert_eq!(
        condition(p.status.as_ref().unwrap(), "Recovering")
            .unwrap()
            .reason
            .as_deref(),
        Some("AttemptFailed")
    );
    assert!(!p.observations.contains(&Observation::OomRecoveryStarted));
}

fn host_oom() -> PodProgress {
    PodProgress::Finished(Verdict::HostOomKilled {
        reason: "OOMKilled (exit code 137): killed by the kernel for host memory, not GPU memory: \
                 container train exceeded its host memory limit (resources.limits.memory 8Gi); \
                 raise that limit in spec.template; the GPU reservation is left as it was"
            .into(),
    })
}

#[test]
fn host_oom_kill_is_its_own_outcome_and_retries_unchanged_per_spec() {
    let mut tk = task(json!({"recovery": {"retriesOnFailure": 1, "backoffSeconds": 0}}));
    let p = step(&tk, &[], t(0));
    apply(&mut tk, &p);
    let mut killed = ended(bound(pod(1, host_oom()), 8000), t(10));
    // A peak above the reservation must not grow it either.
    killed.peak_mib = Some(12000);
    let mut pods = vec![killed];
    let p = step(&tk, &pods, t(11));
    let s = p.status.as_ref().unwrap();
    let a1 = &s.attempts[0];
    assert_eq!(a1.outcome, Some(AttemptOutcomeKind::HostOomKilled));
    let reason = a1.reason.as_deref().unwrap();
    assert!(reason.contains("resources.limits.memory"), "{reason}");
    // Retried like a failure: same reservation, shared GPU, no recovery priority.
    assert_eq!(ann(&p, ANNOTATION_GPU_MEMORY).as_deref(), Some("8000Mi"));
    assert_eq!(ann(&p, ANNOTATION_EXCLUSIVE), None);
    assert_eq!(priority_class(&p), None);
    assert_eq!(s.attempts[1].reserved_mib, Some(8000));
    assert!(!s.attempts[1].exclusive);
    assert_eq!(s.phase, Some(TaskPhase::Recovering));
    assert_eq!(
        condition(s, "Recovering").unwrap().reason.as_deref(),
        Some("HostOOMKilled")
    );
    assert_eq!(
        reasons(&p),
        ["AttemptHostOOMKilled", "RecoveryAttemptCreated"]
    );
    assert!(p.events[0].warning);
    assert!(
        p.events[0].note.contains("host memory") && p.events[0].note.contains("8Gi"),
        "{}",
        p.events[0].note
    );
    assert_eq!(
        p.observations,
        vec![Observation::AttemptFinished(
            AttemptOutcomeKind::HostOomKilled
        )]
    );
    apply(&mut tk, &p);

    // The second kill uses up retriesOnFailure: the task fails, saying why.
    pods.push(ended(bound(pod(2, host_oom()), 8000), t(20)));
    let p = step(&tk, &pods, t(21));
    assert!(p.create_pod.is_none());
    let s = p.status.as_ref().unwrap();
    assert_eq!(s.phase, Some(TaskPhase::Failed));
    assert_eq!(
        condition(s, "Failed").unwrap().reason.as_deref(),
        Some("HostOOMKilled")
    );
    assert!(
        s.message
            .as_deref()
            .unwrap()
            .contains("resources.limits.memory"),
        "{:?}",
        s.message
    );
    assert_eq!(reasons(&p), ["AttemptHostOOMKilled", "TaskFailed"]);
}

#[test]
fn host_oom_kill_without_retries_fails_the_task() {
    let mut tk = task(json!({}));
    let p = step(&tk, &[], t(0));
    apply(&mut tk, &p);
    let p = step(&tk, &[ended(bound(pod(1, host_oom()), 8000), t(10))], t(11));
    assert!(p.create_pod.is_none());
    let s = p.status.as_ref().unwrap();
    assert_eq!(
        s.attempts[0].outcome,
        Some(AttemptOutcomeKind::HostOomKilled)
    );
    assert_eq!(s.phase, Some(TaskPhase::Failed));
    assert_eq!(
        condition(s, "Failed").unwrap().reason.as_deref(),
        Some("HostOOMKilled")
    );
}

#[test]
fn host_oom_kills_never_count_toward_the_exclusive_gpu() {
    // One GPU OOM already; with exclusiveAfterOoms 2 a second GPU OOM would escalate.
    let spec =
        json!({"recovery": {"backoffSeconds": 0, "retriesOnFailure": 3, "exclusiveAfterOoms": 2}});
    let (mut tk, mut pods, p) = after_first_oom(spec);
    assert_eq!(ann(&p, ANNOTATION_GPU_MEMORY).as_deref(), Some("16000Mi"));
    apply(&mut tk, &p);
    // The recovery attempt is killed for host memory: rerun with the grown
    // reservation, not exclusive, not as a recovery.
    pods.push(ended(bound(pod(2, host_oom()), 16000), t(200)));
    let p = step(&tk, &pods, t(201));
    assert_eq!(ann(&p, ANNOTATION_GPU_MEMORY).as_deref(), Some("16000Mi"));
    assert_eq!(ann(&p, ANNOTATION_EXCLUSIVE), None);
    assert_eq!(priority_class(&p), None);
    assert!(!p.observations.contains(&Observation::OomRecoveryStarted));
    apply(&mut tk, &p);
    pods.push(ended(bound(pod(3, host_oom()), 16000), t(300)));
    let p = step(&tk, &pods, t(301));
    assert_eq!(ann(&p, ANNOTATION_GPU_MEMORY).as_deref(), Some("16000Mi"));
    assert_eq!(ann(&p, ANNOTATION_EXCLUSIVE), None);
    apply(&mut tk, &p);
    // Only the second GPU OOM escalates.
    pods.push(ended(bound(pod(4, oom()), 16000), t(400)));
    let p = step(&tk, &pods, t(401));
    assert_eq!(ann(&p, ANNOTATION_EXCLUSIVE).as_deref(), Some("true"));
}

#[test]
fn evictions_rerun_unchanged_and_do_not_count() {
    let mut tk = task(json!({"recovery": {"maxAttempts": 1}}));
    let p = step(&tk, &[], t(0));
    apply(&mut tk, &p);
    let evicted = PodProgress::Finished(Verdict::Evicted {
        reason: "Preempting".into(),
    });
    let pods = [ended(bound(pod(1, evicted), 8000), t(10))];
    let p = step(&tk, &pods, t(11));
    let s = p.status.as_ref().unwrap();
    assert_eq!(s.attempts[0].outcome, Some(AttemptOutcomeKind::Evicted));
    assert_eq!(s.phase, Some(TaskPhase::Recovering));
    assert_eq!(reasons(&p), ["AttemptEvicted", "RecoveryScheduled"]);
    apply(&mut tk, &p);
    // Backoff for evictions is the base backoff (10 s).
    let p = step(&tk, &pods, t(20));
    assert_eq!(ann(&p, ANNOTATION_GPU_MEMORY).as_deref(), Some("8000Mi"));
    assert_eq!(priority_class(&p), None);
}

#[test]
fn a_vanished_pod_counts_as_evicted() {
    let mut tk = task(json!({}));
    let p = step(&tk, &[], t(0));
    apply(&mut tk, &p);
    let p = step(&tk, &[], t(50));
    let s = p.status.as_ref().unwrap();
    assert_eq!(s.attempts[0].outcome, Some(AttemptOutcomeKind::Evicted));
    assert!(
        s.attempts[0]
            .reason
            .as_deref()
            .unwrap()
            .contains("disappeared")
    );
    assert!(p.create_pod.is_none());
}

#[test]
fn existing_pods_are_adopted_never_duplicated() {
    // The pod was created but the status write was lost (operator restart).
    let tk = task(json!({}));
    let pods = [pod(1, PodProgress::Pending)];
    let p = step(&tk, &pods, t(5));
    assert!(p.create_pod.is_none());
    let s = p.status.as_ref().unwrap();
    assert_eq!(s.attempts.len(), 1);
    assert_eq!(s.attempts[0].pod, "train-a1");
    assert_eq!(
        s.attempts[0].started_at.as_deref(),
        Some("2027-01-15T08:00:00Z")
    );
    assert_eq!(s.attempt_count, 1);
    assert_eq!(reasons(&p), ["AttemptAdopted"]);

    // Recovery attempt created, status not written: adopt a2, do not create a3.
    let (mut tk, mut pods, p) = after_first_oom(json!({"recovery": {"backoffSeconds": 0}}));
    let mut first = (*p.status.unwrap()).clone();
    first.attempts.truncate(1);
    first.attempt_count = 1;
    tk.status = Some(first);
    let mut a2 = pod(2, PodProgress::Pending);
    a2.requested_mib = Some(16000);
    pods.push(a2);
    let p = step(&tk, &pods, t(102));
    assert!(p.create_pod.is_none());
    let s = p.status.as_ref().unwrap();
    assert_eq!(s.attempts.len(), 2);
    assert_eq!(s.attempts[1].reserved_mib, Some(16000));
    assert_eq!(s.attempt_count, 2);
}

#[test]
fn adopting_the_recovery_attempt_ends_the_backoff() {
    let (mut tk, mut pods, p) = after_first_oom(json!({}));
    apply(&mut tk, &p);
    assert!(st(&tk).next_attempt_at.is_some());
    // Another replica created train-a2 at the due time, then lost its status write.
    let mut a2 = pod(2, PodProgress::Pending);
    a2.requested_mib = Some(16000);
    pods.push(a2);
    let p = step(&tk, &pods, t(111));
    assert!(p.create_pod.is_none());
    let s = p.status.as_ref().unwrap();
    assert_eq!(s.next_attempt_at, None);
    assert_eq!(s.attempts.len(), 2);
    assert_eq!(s.phase, Some(TaskPhase::Recovering));
    assert_eq!(reasons(&p), ["AttemptAdopted"]);
}

#[test]
fn success_settles_the_task() {
    let mut tk = task(json!({}));
    let p = step(&tk, &[], t(0));
    apply(&mut tk, &p);
    let pods = [ended(
        bound(pod(1, PodProgress::Finished(Verdict::Succeeded)), 8000),
        t(60),
    )];
    let p = step(&tk, &pods, t(61));
    let s = p.status.as_ref().unwrap();
    assert_eq!(s.phase, Some(TaskPhase::Succeeded));
    assert_eq!(condition(s, "Succeeded").unwrap().status, "True");
    assert_eq!(reasons(&p), ["AttemptSucceeded"]);
    apply(&mut tk, &p);
    assert!(is_settled(&tk));
    assert_eq!(step(&tk, &pods, t(100)), Plan::default());
}

#[test]
fn invalid_spec_fails_once_and_recovers_when_fixed() {
    let mut tk = task(json!({"gpuMemory": "lots"}));
    let p = step(&tk, &[], t(0));
    assert!(p.create_pod.is_none());
    let s = p.status.as_ref().unwrap();
    assert_eq!(s.phase, Some(TaskPhase::Failed));
    assert_eq!(
        condition(s, "Failed").unwrap().reason.as_deref(),
        Some("InvalidSpec")
    );
    assert!(s.message.as_deref().unwrap().contains("spec.gpuMemory"));
    assert_eq!(reasons(&p), ["InvalidSpec"]);
    apply(&mut tk, &p);
    assert!(!is_settled(&tk));
    let p = step(&tk, &[], t(10));
    assert_eq!(p, Plan::default());

    tk.spec.gpu_memory = Some("8Gi".into());
    tk.metadata.generation = Some(2);
    let p = step(&tk, &[], t(20));
    assert!(p.create_pod.is_some());
    let s = p.status.as_ref().unwrap();
    assert_eq!(s.phase, Some(TaskPhase::Pending));
    assert_eq!(s.observed_generation, Some(2));
    assert_eq!(condition(s, "Failed").unwrap().status, "False");

    let mut tk = task(json!({}));
    tk.spec.template.spec = None;
    let p = step(&tk, &[], t(0));
    assert!(
        p.status
            .unwrap()
            .message
            .unwrap()
            .contains("spec.template.spec")
    );
}

#[test]
fn failure_without_any_text_is_a_plain_failure() {
    let mut tk = task(json!({}));
    let p = step(&tk, &[], t(0));
    apply(&mut tk, &p);
    let p = step(
        &tk,
        &[bound(
            pod(
                1,
                PodProgress::NeedsLogs {
                    container: "train".into(),
                },
            ),
            8000,
        )],
        t(5),
    );
    let s = p.status.as_ref().unwrap();
    assert_eq!(s.attempts[0].outcome, Some(AttemptOutcomeKind::Failed));
}

/// A model profile whose reading counted an unknown pattern conservatively: the caveat reaches the
/// attempt's annotation, and where the extender's reservation is that fallback, the status says
/// why and one Event says so.
#[test]
fn a_fallback_reservation_is_reported_with_its_caveats() {
    let profile = json!({"family": "transformer", "batchSize": 16, "parameters": 11221680,
        "activations": 9000000, "depth": 40, "seqLength": 512,
        "caveats": [{"kind": "shared-layers", "modules": ["AlbertLayerGroup"],
                     "counted": "24 runs, ALBERT-large's"}]});
    let mut tk = task(json!({ "modelProfile": profile }));
    let p = step(&tk, &[], t(0));
    // the extender reads the caveat from the pod's profile annotation
    let written: serde_json::Value =
        serde_json::from_str(&ann(&p, ANNOTATION_MODEL_PROFILE).unwrap()).unwrap();
    assert_eq!(written["caveats"], profile["caveats"]);
    let parsed = carma_estimator::parse_profile(&written.to_string()).unwrap();
    let e = carma_estimator::Estimator::new()
        .unwrap()
        .estimate(&parsed)
        .unwrap();
    assert_eq!(e.source, carma_estimator::EstimateSource::AnalyticFallback);
    apply(&mut tk, &p);
    let fallback = |o: ObservedAttempt| {
        let mut o = bound(o, e.mib);
        o.estimate = Some(EstimateAnnotation {
            mib: e.mib,
            source: e.source.as_str().into(),
            class: Some(e.class.clone()),
            samples: None,
        });
        o
    };
    let running = fallback(pod(1, PodProgress::Running));
    let p = step(&tk, std::slice::from_ref(&running), t(30));
    apply(&mut tk, &p);
    let est = st(&tk).estimate.as_ref().unwrap();
    assert_eq!(est.source, "analytic-fallback");
    assert_eq!(est.warnings, e.warnings);
    assert_eq!(
        est.warnings,
        ["shared-layers: AlbertLayerGroup: 24 runs, ALBERT-large's"]
    );
    let ev = p
        .events
        .iter()
        .find(|ev| ev.reason == "EstimateIsFallback")
        .unwrap_or_else(|| panic!("{:?}", reasons(&p)));
    assert!(
        ev.warning && ev.pod.as_deref() == Some("train-a1"),
        "{ev:?}"
    );
    assert!(ev.note.contains("AlbertLayerGroup"), "{}", ev.note);
    assert!(
        ev.note.contains(&format!("{} MiB per GPU", e.mib)),
        "{}",
        ev.note
    );
    // once: the next step finds it reported
    let p = step(&tk, std::slice::from_ref(&running), t(60));
    assert!(
        !reasons(&p).contains(&"EstimateIsFallback"),
        "{:?}",
        reasons(&p)
    );
    // another source says nothing of the caveats
    let mut tk = task(json!({ "modelProfile": profile }));
    let p = step(&tk, &[], t(0));
    apply(&mut tk, &p);
    let p = step(&tk, &[bound(pod(1, PodProgress::Running), 8000)], t(30));
    let s = p.status.as_ref().unwrap();
    assert!(s.estimate.as_ref().unwrap().warnings.is_empty());
    assert!(!reasons(&p).contains(&"EstimateIsFallback"));
}

#[test]
fn records_map_to_the_core() {
    let mut a = AttemptStatus {
        outcome: Some(AttemptOutcomeKind::GpuOutOfMemory),
        reserved_mib: Some(8000),
        observed_peak_mib: Some(9000),
        ..AttemptStatus::default()
    };
    assert_eq!(
        record(&a),
        Some(AttemptRecord {
            outcome: AttemptOutcome::GpuOutOfMemory {
                observed_peak_mib: Some(9000)
            },
            reservation: Reservation::Mib(8000),
            exclusive: false,
        })
    );
    a.exclusive = true;
    assert_eq!(record(&a).unwrap().reservation, Reservation::WholeGpu);
    a.exclusive = false;
    a.reserved_mib = None;
    assert_eq!(record(&a).unwrap().reservation, Reservation::Unknown);
    a.outcome = Some(AttemptOutcomeKind::HostOomKilled);
    a.reason = Some("OOMKilled (exit code 137)".into());
    a.reserved_mib = Some(8000);
    assert_eq!(
        record(&a),
        Some(AttemptRecord {
            outcome: AttemptOutcome::Failed {
                reason: "OOMKilled (exit code 137)".into()
            },
            reservation: Reservation::Mib(8000),
            exclusive: false,
        })
    );
    a.outcome = None;
    assert_eq!(record(&a), None);
}

/// The same lifecycle with GPUs from DRA claims.
mod dra;
