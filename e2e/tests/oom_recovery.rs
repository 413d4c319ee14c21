//! Whole-system tests: a `TrainingTask` from submission through CUDA
//! out-of-memory crashes to success, through the real code of carma's operator
//! (planner), scheduler extender (filter / prioritize / bind) and device plugin
//! (simulated GPUs, telemetry, Allocate). See `harness/mod.rs` for what stands
//! in for the API server, kube-scheduler and kubelet.

mod harness;

use carma_api::names::*;
use carma_api::{AttemptOutcomeKind, EstimateAnnotation, GpuPodStatus, TaskPhase, TrainingTask};
use carma_core::Reservation;
use carma_core::recovery::grown_reservation;
use carma_estimator::{Estimator, parse_profile};
use carma_operator::plan::{Observation, is_settled};
use carma_operator::status::condition;
use carma_operator::{Plan, attempt};
use chrono::DateTime;
use harness::*;
use k8s_openapi::api::core::v1::Pod;
use serde_json::json;

/// What PyTorch prints when an allocation fails on the GPU; with
/// `terminationMessagePolicy: FallbackToLogsOnError` it is the termination message.
const CUDA_OOM: &str = "Traceback (most recent call last):\n  File \"/workspace/train.py\", line 88, in <module>\n    loss.backward()\ntorch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity of 40.00 GiB of which 1.12 GiB is free. Process 4242 has 38.87 GiB memory in use.";

fn events(p: &Plan) -> Vec<&str> {
    p.events.iter().map(|e| e.reason.as_str()).collect()
}

fn status(w: &World) -> &carma_api::TrainingTaskStatus {
    w.task.status.as_ref().expect("the operator wrote a status")
}

fn created(p: &Plan) -> &Pod {
    p.create_pod.as_deref().expect("the plan creates a pod")
}

fn ann(pod: &Pod, key: &str) -> Option<String> {
    annotation(pod, key).map(str::to_string)
}

/// The pod's entry in its node's published `GpuNode`, on GPU `gpu`.
fn on_gpu(w: &World, node: &str, gpu: &str, pod: &Pod) -> Option<GpuPodStatus> {
    w.gpu_node(node)
        .status
        .as_ref()?
        .gpus
        .iter()
        .find(|g| g.uuid == gpu)?
        .pods
        .iter()
        .find(|p| p.uid == uid(pod))
        .cloned()
}

/// Assert what the extender wrote at bind and return the assignment's estimate.
fn assert_bound(w: &World, cycle: &Cycle, pod: &Pod, node: &str, gpu: &str) -> EstimateAnnotation {
    let bind = cycle.bind.as_ref().expect("bound");
    assert_eq!(bind.error, "", "bind error");
    assert_eq!(cycle.node.as_deref(), Some(node));
    let (ns, name) = key(pod);
    let now = w.api.pod(&ns, &name);
    assert_eq!(
        now.spec.as_ref().and_then(|s| s.node_name.as_deref()),
        Some(node),
        "the Binding set spec.nodeName"
    );
    assert_eq!(ann(&now, ANNOTATION_ASSIGNED_GPUS).as_deref(), Some(gpu));
    assert_eq!(ann(&now, ANNOTATION_ASSIGNED_NODE).as_deref(), Some(node));
    let at = ann(&now, ANNOTATION_ASSIGNED_AT).expect("assigned-at");
    assert!(DateTime::parse_from_rfc3339(&at).is_ok(), "{at}");
    let estimate: EstimateAnnotation =
        serde_json::from_str(&ann(&now, ANNOTATION_ESTIMATE).expect("estimate")).expect("JSON");
    // The write went through the backend, with the pod's UID as precondition,
    // and the decision in the answer is what was written.
    let write = w.api.binds().last().cloned().expect("a bind write");
    assert_eq!(write.target.uid, uid(pod));
    assert_eq!(write.target.node, node);
    let decision = bind.decision.as_ref().expect("carma's decision");
    assert_eq!(Some(&decision.annotations), write.annotations.as_ref());
    assert_eq!(decision.gpus, vec![gpu.to_string()]);
    assert_eq!(decision.reserved_mib, estimate.mib);
    assert!(!decision.dry_run);
    // The extender books the GPU until telemetry shows the pod.
    let ledger = w.extender.cluster().ledger_snapshot();
    let record = ledger.get(&uid(pod)).expect("booked");
    assert_eq!(record.gpus, vec![gpu.to_string()]);
    assert_eq!(record.reserved_mib, estimate.mib);
    assert!(!record.visible);
    estimate
}

#[tokio::test]
async fn training_task_recovers_from_a_cuda_oom() {
    // ---- 1. Submission: the CNN example, as a user applies it. ----------------
    let task: TrainingTask =
        serde_yaml_ng::from_str(include_str!("../../deploy/examples/trainingtask-cnn.yaml"))
            .expect("the example parses as a TrainingTask");
    let task_name = task.metadata.name.clone().unwrap();
    assert_eq!(task.spec.gpu_memory, None, "the extender estimates it");
    let mut w = World::new(task).await;
    let cfg = w.task.spec.recovery.to_config(&w.defaults);
    let gpu1 = w.uuid(NODE_A, 1);

    let p = w.reconcile();
    assert_eq!(events(&p), ["AttemptCreated"]);
    let pod1 = created(&p).clone();
    assert_eq!(
        pod1.metadata.name.as_deref(),
        Some(format!("{task_name}-a1").as_str())
    );
    assert_eq!(pod1.metadata.namespace.as_deref(), Some(NS));
    let spec = pod1.spec.as_ref().unwrap();
    assert_eq!(spec.scheduler_name.as_deref(), Some(SCHEDULER_NAME));
    assert_eq!(spec.restart_policy.as_deref(), Some("Never"));
    assert_eq!(
        spec.priority_class_name.as_deref(),
        Some("carma-queue-stl30-under-8m"),
        "the first attempt is new work, queued by the 5 min the example declares"
    );
    let train = &spec.containers[0];
    assert_eq!(
        train.resources.as_ref().unwrap().limits.as_ref().unwrap()[RESOURCE_GPU].0,
        "1"
    );
    assert_eq!(
        train.termination_message_policy.as_deref(),
        Some("FallbackToLogsOnError")
    );
    let labels = pod1.metadata.labels.as_ref().unwrap();
    assert_eq!(labels[LABEL_TASK], task_name);
    assert_eq!(labels[LABEL_ATTEMPT], "1");
    assert_eq!(labels[LABEL_MANAGED_BY], attempt::MANAGER);
    let profile: serde_json::Value =
        serde_json::from_str(&ann(&pod1, ANNOTATION_MODEL_PROFILE).unwrap()).unwrap();
    assert_eq!(profile["family"], "cnn");
    assert_eq!(profile["batchSize"], 128);
    assert_eq!(ann(&pod1, ANNOTATION_POLICY).as_deref(), Some("magm"));
    assert_eq!(ann(&pod1, ANNOTATION_GPU_MEMORY), None);
    assert_eq!(ann(&pod1, ANNOTATION_EXCLUSIVE), None);
    let owner = &pod1.metadata.owner_references.as_ref().unwrap()[0];
    assert_eq!(
        (owner.api_version.as_str(), owner.kind.as_str()),
        ("carma.io/v1alpha1", "TrainingTask")
    );
    assert_eq!(owner.name, task_name);
    assert_eq!(Some(&owner.uid), w.task.metadata.uid.as_ref());
    assert_eq!(owner.controller, Some(true));
    assert_eq!(owner.block_owner_deletion, Some(true));
    assert_eq!(status(&w).phase, Some(TaskPhase::Pending));
    assert_eq!(status(&w).attempts.len(), 1);
    assert_eq!(status(&w).attempt_count, 1);
    // The API server gave the pod its identity.
    let pod1 = w.api.pod(NS, &format!("{task_name}-a1"));
    assert!(pod1.metadata.uid.is_some() && pod1.metadata.creation_timestamp.is_some());
    // Nothing new until the pod changes.
    let p = w.reconcile();
    assert!(p.create_pod.is_none());

    // ---- 2. kube-scheduler's carma-scheduler profile: filter → prioritize → bind.
    let cycle = w.schedule(NS, &format!("{task_name}-a1")).await;
    // filter answers with Go's field names and keeps both GPU nodes; the CPU
    // node is rejected for good (preemption cannot give it GPUs).
    assert_eq!(cycle.filter_json["NodeNames"], json!([NODE_A, NODE_B]));
    assert_eq!(cycle.filter_json["Error"], "");
    assert!(
        cycle
            .filter
            .failed_and_unresolvable_nodes
            .get(CPU_NODE)
            .is_some_and(|r| r.contains("reports no carma GPUs")),
        "{:?}",
        cycle.filter_json
    );
    // magm: node A's GPU 1 leaves the most memory; node B's 24 GiB GPUs less.
    let (a, b) = (cycle.score(NODE_A).unwrap(), cycle.score(NODE_B).unwrap());
    assert!(a > b && b > 0, "scores {a} {b}");
    assert!(
        a < 10,
        "no GPU is idle, so this is collocation, not exclusive-first"
    );
    assert_eq!(
        cycle.score(CPU_NODE),
        None,
        "prioritize sees only filtered nodes"
    );
    let estimate1 = assert_bound(&w, &cycle, &pod1, NODE_A, &gpu1);
    // The reservation is GPUMemNet's answer for the task's model profile.
    let expected = Estimator::new()
        .unwrap()
        .estimate(&parse_profile(&ann(&pod1, ANNOTATION_MODEL_PROFILE).unwrap()).unwrap())
        .unwrap();
    assert_eq!(estimate1.mib, expected.mib);
    assert_eq!(estimate1.source, expected.source.as_str());
    assert_eq!(estimate1.class.as_deref(), Some(expected.class.as_str()));
    assert_ne!(estimate1.source, "override");
    let pod1 = w.api.pod(NS, &format!("{task_name}-a1"));
    w.sync_pods();
    // The operator reads the placement off the pod.
    w.reconcile();
    let a1 = &status(&w).attempts[0];
    assert_eq!(a1.node.as_deref(), Some(NODE_A));
    assert_eq!(a1.gpus, vec![gpu1.clone()]);
    assert_eq!(a1.reserved_mib, Some(estimate1.mib));
    assert_eq!(
        status(&w).estimate.as_ref().map(|e| e.source.as_str()),
        Some(estimate1.source.as_str())
    );
    assert_eq!(
        condition(status(&w), "Scheduled").map(|c| c.status.as_str()),
        Some("True")
    );

    // ---- 3. kubelet admits the pod: the device plugin finds it and exposes its GPU.
    let admission = w
        .admit(NS, &pod1.metadata.name.clone().unwrap())
        .await
        .unwrap();
    assert_eq!(admission.device_ids, vec![format!("{gpu1}::0")]);
    let envs = &admission.response.envs;
    assert_eq!(envs[ENV_VISIBLE_DEVICES], gpu1);
    assert_eq!(envs[ENV_ASSIGNED_GPUS], gpu1);
    assert_eq!(envs[ENV_RESERVED_MIB], estimate1.mib.to_string());
    let pod1 = w.api.pod(NS, &format!("{task_name}-a1"));
    assert_eq!(ann(&pod1, ANNOTATION_ALLOCATED).as_deref(), Some("true"));
    // The pod is served once: the same request finds no pod waiting any more.
    let again = w.allocate(NODE_A, &admission.device_ids).await.unwrap_err();
    assert!(again.contains("no pod on node gpu-node-a"), "{again}");

    // ---- 4. It runs; telemetry sees it; then it dies out of GPU memory. -------
    w.start(NS, &format!("{task_name}-a1"));
    w.sync_pods();
    w.tick(5).await;
    let seen = on_gpu(&w, NODE_A, &gpu1, &pod1).expect("GpuNode lists the pod on its GPU");
    assert_eq!(seen.reserved_mib, estimate1.mib);
    let observed = seen.observed_mib.expect("its processes are attributed");
    assert!(observed > 0, "{observed}");
    let ledger = w.extender.cluster().ledger_snapshot();
    assert!(
        ledger.get(&uid(&pod1)).unwrap().visible,
        "the extender saw the pod's memory in telemetry: no longer in flight"
    );
    let p = w.reconcile();
    assert_eq!(status(&w).phase, Some(TaskPhase::Running));
    assert_eq!(events(&p), ["AttemptRunning"]);
    assert_eq!(p.requeue_after, Some(PEAK_POLL), "the peak is polled");
    // Poll the peak once more, as the requeue does.
    w.tick(15).await;
    let observed_later = on_gpu(&w, NODE_A, &gpu1, &pod1)
        .unwrap()
        .observed_mib
        .unwrap();
    w.reconcile();
    let peak = status(&w).attempts[0]
        .observed_peak_mib
        .expect("peak recorded");
    assert_eq!(peak, observed.max(observed_later));

    w.tick(3).await;
    let crashed_at = w.now;
    w.terminate(NS, &format!("{task_name}-a1"), 1, "Error", CUDA_OOM);
    let pod1 = w.api.pod(NS, &format!("{task_name}-a1"));
    let term = pod1
        .status
        .as_ref()
        .unwrap()
        .container_statuses
        .as_ref()
        .unwrap()[0]
        .state
        .as_ref()
        .unwrap()
        .terminated
        .clone()
        .unwrap();
    assert_eq!(
        (term.exit_code, term.reason.as_deref()),
        (1, Some("Error")),
        "a CUDA OOM is an ordinary error exit, not OOMKilled"
    );
    let p = w.reconcile();
    let a1 = &status(&w).attempts[0];
    assert_eq!(a1.outcome, Some(AttemptOutcomeKind::GpuOutOfMemory));
    let reason = a1.reason.as_deref().unwrap();
    assert!(
        reason.contains("torch.OutOfMemoryError: CUDA out of memory"),
        "{reason}"
    );
    assert!(a1.finished_at.is_some());
    assert_eq!(status(&w).phase, Some(TaskPhase::Recovering));
    assert_eq!(
        condition(status(&w), "Recovering").and_then(|c| c.reason.as_deref()),
        Some("GpuOutOfMemory")
    );
    // The example backs off 15 s before the recovery attempt.
    assert!(p.create_pod.is_none());
    assert_eq!(events(&p), ["AttemptOutOfMemory", "RecoveryScheduled"]);
    assert!(p.events[0].warning);
    assert_eq!(
        p.requeue_after,
        Some(std::time::Duration::from_millis(cfg.backoff_base_ms))
    );
    assert!(status(&w).next_attempt_at.is_some());
    assert!(p.observations.contains(&Observation::AttemptFinished(
        AttemptOutcomeKind::GpuOutOfMemory
    )));
    // The crash step read the last telemetry too: the peak is the largest seen.
    let peak_at_crash = status(&w).attempts[0].observed_peak_mib.unwrap();
    let last_seen = on_gpu(&w, NODE_A, &gpu1, &pod1)
        .unwrap()
        .observed_mib
        .unwrap();
    assert_eq!(peak_at_crash, peak.max(last_seen));
    let peak = peak_at_crash;

    // The extender's watcher sees the pod end and releases its booking; the
    // device plugin stops attributing load to it.
    w.sync_pods();
    assert!(!w.booked().contains(&uid(&pod1)));
    w.tick(15).await;
    assert_eq!(on_gpu(&w, NODE_A, &gpu1, &pod1), None);

    let p = w.reconcile();
    assert_eq!(events(&p), ["RecoveryAttemptCreated"]);
    assert!(p.observations.contains(&Observation::OomRecoveryStarted));
    let pod2 = created(&p).clone();
    let pod2_name = format!("{task_name}-a2");
    assert_eq!(pod2.metadata.name.as_deref(), Some(pod2_name.as_str()));
    let spec2 = pod2.spec.as_ref().unwrap();
    assert_eq!(
        spec2.priority_class_name.as_deref(),
        Some(PRIORITY_CLASS_RECOVERY)
    );
    assert_eq!(spec2.priority, None);
    assert_eq!(spec2.scheduler_name.as_deref(), Some(SCHEDULER_NAME));
    assert_eq!(
        ann(&pod2, ANNOTATION_EXCLUSIVE),
        None,
        "one OOM: still shared"
    );
    let grown = grown_reservation(Reservation::Mib(estimate1.mib), Some(peak), &cfg);
    assert!(grown > estimate1.mib);
    assert_eq!(
        ann(&pod2, ANNOTATION_GPU_MEMORY),
        Some(format!("{grown}Mi")),
        "the next class edge above {} MiB, or the peak {peak} MiB plus headroom",
        estimate1.mib
    );
    assert_eq!(status(&w).phase, Some(TaskPhase::Recovering));
    assert_eq!(status(&w).attempt_count, 2);
    assert_eq!(status(&w).reserved_mib, Some(grown));
    assert_eq!(
        status(&w).estimate.as_ref().map(|e| e.source.as_str()),
        Some("recovery")
    );

    // ---- 5. The recovery attempt is scheduled, allocated, and succeeds. --------
    let cycle = w.schedule(NS, &pod2_name).await;
    let pod2 = w.api.pod(NS, &pod2_name);
    let estimate2 = assert_bound(&w, &cycle, &pod2, NODE_A, &gpu1);
    assert_eq!(
        estimate2,
        EstimateAnnotation {
            mib: grown,
            source: "override".into(),
            class: None,
            samples: None
        }
    );
    w.sync_pods();
    let admission = w.admit(NS, &pod2_name).await.unwrap();
    assert_eq!(admission.response.envs[ENV_VISIBLE_DEVICES], gpu1);
    assert_eq!(admission.response.envs[ENV_RESERVED_MIB], grown.to_string());
    w.start(NS, &pod2_name);
    w.sync_pods();
    w.tick(5).await;
    let seen = on_gpu(&w, NODE_A, &gpu1, &pod2).expect("telemetry sees attempt 2");
    assert_eq!(seen.reserved_mib, grown);
    let p = w.reconcile();
    assert_eq!(status(&w).phase, Some(TaskPhase::Running));
    assert_eq!(events(&p), ["AttemptRunning"]);
    let recovery = (w.now - crashed_at).to_std().unwrap();
    assert!(
        p.observations
            .contains(&Observation::RecoveryDuration(recovery)),
        "{:?}",
        p.observations
    );

    w.tick(20).await;
    w.terminate(NS, &pod2_name, 0, "Completed", "");
    let p = w.reconcile();
    assert_eq!(events(&p), ["AttemptSucceeded"]);
    let st = status(&w);
    assert_eq!(st.phase, Some(TaskPhase::Succeeded));
    assert_eq!(
        condition(st, "Succeeded").map(|c| c.status.as_str()),
        Some("True")
    );
    let outcomes: Vec<_> = st.attempts.iter().map(|a| a.outcome).collect();
    assert_eq!(
        outcomes,
        [
            Some(AttemptOutcomeKind::GpuOutOfMemory),
            Some(AttemptOutcomeKind::Succeeded)
        ]
    );
    let reserved: Vec<_> = st.attempts.iter().map(|a| a.reserved_mib).collect();
    assert_eq!(reserved, [Some(estimate1.mib), Some(grown)]);
    let pods: Vec<_> = st.attempts.iter().map(|a| a.pod.as_str()).collect();
    assert_eq!(pods, [format!("{task_name}-a1"), pod2_name.clone()]);
    assert!(st.attempts.iter().all(|a| a.node.as_deref() == Some(NODE_A)
        && a.gpus == [gpu1.clone()]
        && a.finished_at.is_some()
        && !a.exclusive));
    assert!(is_settled(&w.task));
    // A settled task needs nothing more.
    assert_eq!(w.reconcile(), Plan::default());
    // Every GPU is back to its background job.
    w.sync_pods();
    assert_eq!(w.booked().len(), BACKGROUND.len());
    assert!(w.api.warnings().is_empty(), "{:?}", w.api.warnings());
}

#[tokio::test]
async fn repeated_ooms_escalate_to_an_exclusive_gpu() {
    // An explicit, too small reservation; exclusive after the second OOM.
    let task: TrainingTask = serde_json::from_value(json!({
        "apiVersion": "carma.io/v1alpha1",
        "kind": "TrainingTask",
        "metadata": {"name": "llm-finetune", "namespace": NS},
        "spec": {
            "gpus": 1,
            "gpuMemory": "6000Mi",
            "recovery": {"maxAttempts": 4, "exclusiveAfterOoms": 2, "backoffSeconds": 5},
            "template": {"spec": {"containers": [{"name": "train", "image": "pytorch"}]}}
        }
    }))
    .unwrap();
    let mut w = World::new(task).await;
    let cfg = w.task.spec.recovery.to_config(&w.defaults);
    assert_eq!(cfg.exclusive_after_ooms, 2);
    let gpu1 = w.uuid(NODE_A, 1);

    // Attempts 1 and 2 share node A's GPU 1 and crash out of memory.
    let p = w.reconcile();
    assert_eq!(
        ann(created(&p), ANNOTATION_GPU_MEMORY).as_deref(),
        Some("6000Mi")
    );
    let mut reservations = Vec::new();
    for index in 1..=2u32 {
        let name = format!("llm-finetune-a{index}");
        let cycle = w.schedule(NS, &name).await;
        let pod = w.api.pod(NS, &name);
        let estimate = assert_bound(&w, &cycle, &pod, NODE_A, &gpu1);
        assert_eq!(estimate.source, "override");
        reservations.push(estimate.mib);
        w.sync_pods();
        w.admit(NS, &name).await.unwrap();
        w.start(NS, &name);
        w.sync_pods();
        w.tick(5).await;
        w.reconcile();
        assert_eq!(status(&w).phase, Some(TaskPhase::Running));
        w.terminate(NS, &name, 1, "Error", CUDA_OOM);
        w.sync_pods();
        let p = w.reconcile();
        assert_eq!(events(&p), ["AttemptOutOfMemory", "RecoveryScheduled"]);
        assert_eq!(status(&w).phase, Some(TaskPhase::Recovering));
        // Back off (5 s, doubled per attempt), then the next attempt is created.
        let wait = p.requeue_after.unwrap();
        w.tick(wait.as_secs() as u32).await;
        let p = w.reconcile();
        assert_eq!(events(&p), ["RecoveryAttemptCreated"]);
    }
    assert_eq!(reservations[0], 6000);
    assert!(reservations[1] > reservations[0]);

    // Attempt 3 asks for an exclusive GPU: no reservation figure, the
    // exclusive annotation, the recovery priority class.
    let name3 = "llm-finetune-a3";
    let pod3 = w.api.pod(NS, name3);
    assert_eq!(ann(&pod3, ANNOTATION_EXCLUSIVE).as_deref(), Some("true"));
    assert_eq!(ann(&pod3, ANNOTATION_GPU_MEMORY), None);
    assert_eq!(
        pod3.spec.as_ref().unwrap().priority_class_name.as_deref(),
        Some(PRIORITY_CLASS_RECOVERY)
    );
    let a3 = &status(&w).attempts[2];
    assert!(a3.exclusive);
    assert_eq!(
        status(&w).estimate.as_ref().map(|e| e.source.as_str()),
        Some("whole-gpu")
    );
    let outcomes: Vec<_> = status(&w).attempts.iter().map(|a| a.outcome).collect();
    assert_eq!(
        outcomes,
        [
            Some(AttemptOutcomeKind::GpuOutOfMemory),
            Some(AttemptOutcomeKind::GpuOutOfMemory),
            None
        ]
    );

    // Every GPU is shared by a background job: the extender refuses to share one.
    let cycle = w.schedule(NS, name3).await;
    assert_eq!(cycle.node, None, "no node passes");
    assert_eq!(cycle.filter_json["NodeNames"], json!([]));
    for node in [NODE_A, NODE_B] {
        let reason = cycle.reason(node).unwrap();
        assert!(
            reason.contains("exclusively") && reason.contains("is not idle"),
            "{node}: {reason}"
        );
    }
    assert!(
        cycle
            .reason(CPU_NODE)
            .unwrap()
            .contains("reports no carma GPUs")
    );
    assert!(!w.booked().contains(&uid(&pod3)));

    // The background job on node A's GPU 0 finishes; telemetry shows the GPU idle.
    let gpu0 = w.uuid(NODE_A, 0);
    w.terminate(NS, "bg-a0", 0, "Completed", "");
    w.sync_pods();
    w.tick(2).await;
    let idle = w
        .gpu_node(NODE_A)
        .status
        .as_ref()
        .unwrap()
        .gpus
        .iter()
        .find(|g| g.uuid == gpu0)
        .cloned()
        .unwrap();
    assert!(idle.pods.is_empty() && idle.processes == 0);

    // kube-scheduler retries the pod: only node A can give it a GPU alone.
    let cycle = w.schedule(NS, name3).await;
    assert_eq!(cycle.filter_json["NodeNames"], json!([NODE_A]));
    assert!(cycle.reason(NODE_B).unwrap().contains("is not idle"));
    assert_eq!(cycle.score(NODE_A), Some(10), "exclusive-first scores 10");
    let estimate3 = assert_bound(&w, &cycle, &pod3, NODE_A, &gpu0);
    assert_eq!(
        estimate3,
        EstimateAnnotation {
            mib: 40 * 1024,
            source: "whole-gpu".into(),
            class: None,
            samples: None
        }
    );
    let pod3 = w.api.pod(NS, name3);
    assert_eq!(ann(&pod3, ANNOTATION_EXCLUSIVE).as_deref(), Some("true"));
    assert!(
        cycle
            .bind
            .as_ref()
            .unwrap()
            .decision
            .as_ref()
            .unwrap()
            .exclusive
    );
    let ledger = w.extender.cluster().ledger_snapshot();
    assert_eq!(ledger.exclusive_holder(&gpu0), Some(uid(&pod3).as_str()));
    w.sync_pods();
    let admission = w.admit(NS, name3).await.unwrap();
    assert_eq!(admission.response.envs[ENV_VISIBLE_DEVICES], gpu0);
    assert_eq!(
        admission.response.envs[ENV_RESERVED_MIB],
        (40 * 1024).to_string()
    );
    w.start(NS, name3);
    w.sync_pods();
    w.tick(5).await;
    assert!(on_gpu(&w, NODE_A, &gpu0, &pod3).is_some());
    assert!(
        w.extender
            .cluster()
            .ledger_snapshot()
            .get(&uid(&pod3))
            .unwrap()
            .visible,
        "past the warm-up lock: only exclusivity keeps others off now"
    );

    // Another user's pod that only GPU 0 could hold by memory is refused: GPU 0
    // is held exclusively, the others have too little free memory. Free memory is
    // telemetry, which kube-scheduler does not watch, so the refusal is a retry request.
    let probe: Pod = serde_json::from_value(json!({
        "metadata": {"name": "big-probe", "namespace": NS,
                     "annotations": {ANNOTATION_GPU_MEMORY: "37000Mi"}},
        "spec": {"schedulerName": SCHEDULER_NAME,
                 "containers": [{"name": "c", "image": "x",
                                 "resources": {"limits": {RESOURCE_GPU: "1"}}}]}
    }))
    .unwrap();
    let probe = w.api.create_pod(probe, w.now);
    let (filter, fj) = w.filter(&probe, &ALL_NODES);
    assert_eq!(filter.node_names, None, "{fj:#}");
    assert!(filter.failed_nodes.is_empty(), "{fj:#}");
    let reason = &filter.error;
    assert!(
        reason.starts_with(carma_scheduler_extender::verbs::RETRY_PREFIX),
        "{reason}"
    );
    assert!(
        reason.contains(&format!(
            "GPU 0 ({gpu0}) is held exclusively by {}",
            uid(&pod3)
        )),
        "{reason}"
    );

    // Attempt 3 succeeds; the task is done after three attempts.
    w.tick(10).await;
    w.terminate(NS, name3, 0, "Completed", "");
    let p = w.reconcile();
    assert_eq!(events(&p), ["AttemptSucceeded"]);
    let st = status(&w);
    assert_eq!(st.phase, Some(TaskPhase::Succeeded));
    let summary: Vec<_> = st
        .attempts
        .iter()
        .map(|a| (a.outcome, a.exclusive, a.gpus.clone()))
        .collect();
    assert_eq!(
        summary,
        [
            (
                Some(AttemptOutcomeKind::GpuOutOfMemory),
                false,
                vec![gpu1.clone()]
            ),
            (Some(AttemptOutcomeKind::GpuOutOfMemory), false, vec![gpu1]),
            (
                Some(AttemptOutcomeKind::Succeeded),
                true,
                vec![gpu0.clone()]
            ),
        ]
    );

    // With attempt 3 gone, the probe's GPU is free again.
    w.sync_pods();
    w.tick(2).await;
    let (filter, _) = w.filter(&probe, &ALL_NODES);
    assert_eq!(filter.node_names, Some(vec![NODE_A.to_string()]));
}
