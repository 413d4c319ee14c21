//! On DRA the operator sizes each attempt's claim when it creates the pod: the first from its own
//! estimate, each recovery from `decide_next`'s larger reservation, the last a whole GPU.

use super::*;
use carma_api::names::{ANNOTATION_ESTIMATE, RESOURCE_GPU};

const CLASS: &str = "carma-gpu";

fn dra_step(
    task: &TrainingTask,
    pods: &[ObservedAttempt],
    now: DateTime<Utc>,
    first: Option<&EstimateAnnotation>,
) -> Plan {
    let claims = GpuClaims::Dra {
        device_class: CLASS.to_string(),
    };
    step_with(task, pods, now, &claims, Ok(first))
}

/// The device request of the template the step ensures.
fn exact(p: &Plan) -> &k8s_openapi::api::resource::v1::ExactDeviceRequest {
    let t = p.ensure_claim_template.as_ref().unwrap();
    let requests = t
        .spec
        .spec
        .devices
        .as_ref()
        .unwrap()
        .requests
        .as_ref()
        .unwrap();
    requests[0].exactly.as_ref().unwrap()
}

/// The uid of the task that controls `pod`.
fn p_task_uid(pod: &k8s_openapi::api::core::v1::Pod) -> Option<&str> {
    let refs = pod.metadata.owner_references.as_ref()?;
    refs.iter()
        .find(|o| o.controller == Some(true))
        .map(|o| o.uid.as_str())
}

fn traced(mib: u64) -> EstimateAnnotation {
    EstimateAnnotation {
        mib,
        source: "traced".into(),
        class: Some("traced".into()),
        samples: None,
    }
}

/// The readable part of the template name the planned pod references (the name ends in a hash of
/// the template's spec), and the memory that template books.
fn booking(p: &Plan) -> (String, Option<String>) {
    let pod = p.create_pod.as_ref().unwrap();
    let spec = pod.spec.as_ref().unwrap();
    let claims = spec.resource_claims.as_ref().unwrap();
    assert_eq!(claims.len(), 1);
    let name = claims[0].resource_claim_template_name.clone().unwrap();
    let t = p.ensure_claim_template.as_ref().unwrap();
    assert_eq!(t.metadata.name.as_deref(), Some(name.as_str()));
    // Owned, not controlled, by the task: tasks of the same booking share the template.
    let owners = t.metadata.owner_references.as_ref().unwrap();
    assert_eq!(owners.len(), 1);
    assert_eq!(owners[0].kind, "TrainingTask");
    assert_eq!(Some(owners[0].uid.as_str()), p_task_uid(pod));
    assert_eq!(owners[0].controller, None);
    let (readable, hash) = name.rsplit_once('-').unwrap();
    assert!(
        hash.len() == 10 && hash.chars().all(|c| c.is_ascii_hexdigit()),
        "{name}"
    );
    let name = readable.to_string();
    let exact = exact(p);
    assert_eq!(exact.device_class_name, CLASS);
    let memory = exact
        .capacity
        .as_ref()
        .and_then(|c| c.requests.as_ref())
        .and_then(|r| r.get("memory"))
        .map(|q| q.0.clone());
    // The training container takes the claim and no device-plugin GPUs.
    let train = &spec.containers[0];
    let res = train.resources.as_ref().unwrap();
    assert_eq!(res.claims.as_ref().unwrap()[0].name, claims[0].name);
    for list in [res.limits.as_ref(), res.requests.as_ref()]
        .into_iter()
        .flatten()
    {
        assert!(!list.contains_key(RESOURCE_GPU), "{list:?}");
    }
    (name, memory)
}

#[test]
fn the_first_claim_books_the_operators_estimate() {
    let tk = task(json!({}));
    let e = traced(7_421);
    let p = dra_step(&tk, &[], t(0), Some(&e));
    assert_eq!(
        booking(&p),
        ("carma-gpu-g1-m7421".to_string(), Some("7421Mi".to_string()))
    );
    let written: EstimateAnnotation =
        serde_json::from_str(&ann(&p, ANNOTATION_ESTIMATE).unwrap()).unwrap();
    assert_eq!(written, e);
    assert_eq!(ann(&p, ANNOTATION_GPU_MEMORY).as_deref(), Some("7421Mi"));
    let s = p.status.as_ref().unwrap();
    assert_eq!(s.attempts[0].reserved_mib, Some(7_421));
    assert_eq!(s.estimate.as_ref().unwrap().source, "traced");
    assert_eq!(
        p.create_pod
            .as_ref()
            .unwrap()
            .spec
            .as_ref()
            .unwrap()
            .scheduler_name
            .as_deref(),
        Some(carma_api::names::SCHEDULER_NAME)
    );
}

#[test]
fn spec_gpu_memory_beats_the_estimate_and_no_estimate_books_the_whole_gpu() {
    let tk = task(json!({"gpuMemory": "10Gi"}));
    let p = dra_step(&tk, &[], t(0), Some(&traced(7_421)));
    assert_eq!(booking(&p).0, "carma-gpu-g1-m10240");
    assert_eq!(
        p.status.as_ref().unwrap().estimate.as_ref().unwrap().source,
        "override"
    );

    let tk = task(json!({"gpus": 2}));
    let p = dra_step(&tk, &[], t(0), None);
    assert_eq!(booking(&p), ("carma-gpu-g2-whole".to_string(), None));
    assert_eq!(ann(&p, ANNOTATION_EXCLUSIVE).as_deref(), Some("true"));
    assert!(p.status.as_ref().unwrap().attempts[0].exclusive);
    let exact = exact(&p);
    assert_eq!(exact.count, Some(2));
    assert!(exact.tolerations.as_ref().is_some_and(|t| !t.is_empty()));
}

#[test]
fn an_oom_gets_a_bigger_claim_then_a_whole_gpu() {
    let mut tk = task(json!({"recovery": {"backoffSeconds": 0}}));
    let p = dra_step(&tk, &[], t(0), Some(&traced(8_000)));
    assert_eq!(booking(&p).1.as_deref(), Some("8000Mi"));
    apply(&mut tk, &p);
    // No GpuNode on DRA nodes: neither a peak nor the GPU's size is observed.
    let mut a1 = ended(bound(pod(1, oom()), 8000), t(100));
    a1.gpu_memory_mib = None;
    let mut pods = vec![a1];
    let p = dra_step(&tk, &pods, t(101), None);
    // The same growth as on the device-plugin path: the next class edge above 8000 MiB.
    assert_eq!(
        booking(&p),
        (
            "carma-gpu-g1-m16000".to_string(),
            Some("16000Mi".to_string())
        )
    );
    assert_eq!(priority_class(&p).as_deref(), Some(PRIORITY_CLASS_RECOVERY));
    let written: EstimateAnnotation =
        serde_json::from_str(&ann(&p, ANNOTATION_ESTIMATE).unwrap()).unwrap();
    assert_eq!((written.mib, written.source.as_str()), (16_000, "recovery"));
    assert!(p.observations.contains(&Observation::OomRecoveryStarted));
    apply(&mut tk, &p);

    let mut a2 = ended(bound(pod(2, oom()), 16000), t(200));
    a2.gpu_memory_mib = None;
    pods.push(a2);
    let p = dra_step(&tk, &pods, t(201), None);
    assert_eq!(booking(&p), ("carma-gpu-g1-whole".to_string(), None));
    assert_eq!(ann(&p, ANNOTATION_EXCLUSIVE).as_deref(), Some("true"));
    assert_eq!(
        p.status.as_ref().unwrap().estimate.as_ref().unwrap().source,
        "whole-gpu"
    );
}

#[test]
fn a_refused_model_profile_fails_the_task_before_any_pod() {
    let tk = task(json!({}));
    let claims = GpuClaims::Dra {
        device_class: CLASS.to_string(),
    };
    let refused = InvalidSpec::ModelProfile("batchSize must be at least 1".into());
    let p = step_with(&tk, &[], t(0), &claims, Err(&refused));
    assert!(p.create_pod.is_none() && p.ensure_claim_template.is_none());
    let s = p.status.as_ref().unwrap();
    assert_eq!(s.phase, Some(TaskPhase::Failed));
    assert!(s.message.as_deref().unwrap().contains("batchSize"), "{s:?}");
    assert_eq!(reasons(&p), ["InvalidSpec"]);
}

/// On DRA the operator's own sizing is the reservation: a fallback is reported when the attempt is
/// created, and not again once the pod carries it.
#[test]
fn a_fallback_first_estimate_is_reported_at_creation() {
    let mut tk = task(
        json!({"modelProfile": {"family": "transformer", "batchSize": 8,
        "parameters": 1000000, "activations": 1000000, "depth": 3,
        "caveats": [{"kind": "unknown-attention", "modules": ["MysteryAttention"],
                     "counted": "as eager attention"}]}}),
    );
    let fallback = EstimateAnnotation {
        mib: 2048,
        source: "analytic-fallback".into(),
        class: Some("(0,2048]".into()),
        samples: None,
    };
    let p = dra_step(&tk, &[], t(0), Some(&fallback));
    let est = p.status.as_ref().unwrap().estimate.as_ref().unwrap();
    assert_eq!(est.source, "analytic-fallback");
    assert_eq!(
        est.warnings,
        ["unknown-attention: MysteryAttention: as eager attention"]
    );
    assert_eq!(
        reasons(&p),
        ["AttemptCreated", "EstimateIsFallback"],
        "{:?}",
        p.events
    );
    apply(&mut tk, &p);
    let mut running = pod(1, PodProgress::Running);
    running.node = Some("gpu-node-1".into());
    running.estimate = Some(fallback.clone());
    let p = dra_step(&tk, &[running], t(30), Some(&fallback));
    assert!(
        !reasons(&p).contains(&"EstimateIsFallback"),
        "{:?}",
        reasons(&p)
    );
}
