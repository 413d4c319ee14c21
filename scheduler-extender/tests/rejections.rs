//! Every rejection reason reaches kube-scheduler with a readable reason, in the
//! right map, and is counted under its code.

mod common;

use std::sync::Arc;

use carma_api::GpuPodStatus;
use carma_api::names::*;
use carma_core::{PlacementConfig, Policy};
use carma_scheduler_extender::router;
use carma_scheduler_extender::snapshot::Snapshot;
use carma_scheduler_extender::synthetic::{gpu, gpu_node, node, pod_json};
use common::*;
use k8s_openapi::api::core::v1::Pod;
use serde_json::json;

/// A pod bound to `node` and assigned `gpu` by carma at `at`.
fn assigned(
    name: &str,
    node_name: &str,
    gpu_uuid: &str,
    mib: u64,
    at: &str,
    exclusive: bool,
) -> Pod {
    let est = format!(r#"{{"mib":{mib},"source":"override"}}"#);
    let mut ann = vec![
        (ANNOTATION_ASSIGNED_GPUS, gpu_uuid),
        (ANNOTATION_ASSIGNED_AT, at),
        (ANNOTATION_ASSIGNED_NODE, node_name),
        (ANNOTATION_ESTIMATE, est.as_str()),
    ];
    if exclusive {
        ann.push((ANNOTATION_EXCLUSIVE, "true"));
    }
    let mut v = pod_json("ml", name, &format!("uid-{name}"), 1, &ann);
    v["spec"]["nodeName"] = json!(node_name);
    v["status"]["phase"] = json!("Running");
    serde_json::from_value(v).unwrap()
}

fn visible(name: &str, mib: u64) -> GpuPodStatus {
    GpuPodStatus {
        namespace: "ml".into(),
        name: name.into(),
        uid: format!("uid-{name}"),
        reserved_mib: mib,
        observed_mib: Some(mib / 2),
        peak_mib: None,
    }
}

/// One single-GPU node per GPU rule, plus node-level cases.
fn cluster() -> Snapshot {
    let now = chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Millis, true);
    let mut s = Snapshot::default();
    let mut add = |name: &str, g: carma_api::GpuStatus| {
        s.nodes.push(node(name, 1));
        s.gpu_nodes.push(gpu_node(name, vec![g]));
    };
    let busy = |uuid: &str| gpu(uuid, 0, 30_000, 0.2, 1);

    let mut g = busy("GPU-unhealthy");
    g.healthy = false;
    add("unhealthy", g);
    add("exclusive", busy("GPU-exclusive"));
    add("warmup", busy("GPU-warmup"));
    add("memory", gpu("GPU-memory", 0, 6_000, 0.2, 1));
    let mut g = gpu("GPU-reserved", 0, 38_000, 0.2, 1);
    g.pods = vec![visible("r1", 20_000), visible("r2", 16_000)];
    add("reserved", g);
    let mut g = busy("GPU-gate");
    g.sm_activity = Some(0.9);
    g.sm_occupancy = Some(0.6);
    add("gate", g);
    let mut g = busy("GPU-cold");
    g.sm_activity = None;
    add("cold", g);
    add("fits", busy("GPU-fits"));
    // A Kubernetes node without a GpuNode.
    s.nodes.push(node("no-gpunode", 0));

    let mut g = busy("GPU-exclusive");
    g.pods = vec![visible("holder", 30_000)];
    s.gpu_nodes[1] = gpu_node("exclusive", vec![g]);
    s.pods.push(assigned(
        "holder",
        "exclusive",
        "GPU-exclusive",
        30_000,
        "2026-01-01T00:00:00.000Z",
        true,
    ));
    s.pods.push(assigned(
        "fresh",
        "warmup",
        "GPU-warmup",
        4_000,
        &now,
        false,
    ));
    s.pods.push(assigned(
        "r1",
        "reserved",
        "GPU-reserved",
        20_000,
        "2026-01-01T00:00:00.000Z",
        false,
    ));
    s.pods.push(assigned(
        "r2",
        "reserved",
        "GPU-reserved",
        16_000,
        "2026-01-01T00:00:00.000Z",
        false,
    ));
    s
}

/// The text of an answer that asks kube-scheduler for a retry (no node passes, no node listed).
fn retry_request(out: &serde_json::Value) -> &str {
    let error = out["Error"].as_str().unwrap_or_default();
    assert!(
        error.starts_with(carma_scheduler_extender::verbs::RETRY_PREFIX),
        "not a retry request: {out:#}"
    );
    assert_eq!(out["FailedNodes"], json!({}), "{out:#}");
    error
}

#[tokio::test]
async fn every_rule_has_its_reason_and_code() {
    let rec = Arc::new(Recorder::default());
    // `pack`'s crowding limit at 1.0, so that one GPU of the cluster is enough to refuse a pod by it.
    let cfg = PlacementConfig {
        pack_crowding_limit: 1.0,
        ..PlacementConfig::default()
    };
    let ext = extender_with(&cluster(), Policy::Magm, cfg, rec);
    let r = router(ext);
    let pod = pod_json("ml", "p", "uid-p", 1, &[(ANNOTATION_GPU_MEMORY, "8Gi")]);
    let nodes = [
        "unhealthy",
        "exclusive",
        "warmup",
        "memory",
        "reserved",
        "gate",
        "cold",
        "fits",
        "no-gpunode",
        "unknown",
    ];
    let (_, out) = post(&r, "/filter", &args_names(&pod, &nodes)).await;
    assert_eq!(passing(&out), vec!["fits"], "{out:#}");
    let failed = &out["FailedNodes"];
    let expect = [
        ("unhealthy", "is unhealthy"),
        ("exclusive", "is held exclusively by uid-holder"),
        ("warmup", "is in its warm-up lock: pod uid-fresh"),
        ("memory", "needs 8192 + 2048 margin"),
        (
            "reserved",
            "has 36000 MiB of 40960 MiB reserved by 2 pod(s)",
        ),
        ("gate", "fails the utilization gate"),
        ("cold", "telemetry window still filling"),
    ];
    for (n, needle) in expect {
        let reason = failed[n]
            .as_str()
            .unwrap_or_else(|| panic!("{n} not in FailedNodes: {out:#}"));
        assert!(reason.contains(needle), "{n}: {reason}");
        assert!(reason.starts_with(&format!("node {n}:")), "{reason}");
    }
    let unresolvable = &out["FailedAndUnresolvableNodes"];
    for n in ["no-gpunode", "unknown"] {
        assert_eq!(unresolvable[n], format!("node {n} reports no carma GPUs"));
    }

    // Too few GPUs for a two-GPU pod: unresolvable.
    let two = pod_json("ml", "two", "uid-two", 2, &[(ANNOTATION_GPU_MEMORY, "8Gi")]);
    let (_, out) = post(&r, "/filter", &args_nodes(&two, &["fits"])).await;
    assert_eq!(
        out["FailedAndUnresolvableNodes"]["fits"],
        "node fits has 1 GPU(s), the pod needs 2 on one node"
    );

    // An exclusive pod on a GPU that is in use.
    let excl = pod_json("ml", "x", "uid-x", 1, &[(ANNOTATION_POLICY, "exclusive")]);
    // Busy only by a process that telemetry sees, which no event kube-scheduler watches will
    // report gone: as the only candidate it makes the answer a retry request.
    let (_, out) = post(&r, "/filter", &args_names(&excl, &["fits"])).await;
    let reason = retry_request(&out);
    assert!(
        reason.contains("is not idle") && reason.contains("exclusively"),
        "{reason}"
    );

    // `pack`: a pod expected at 0.9 SM activity does not join a GPU already at 0.2.
    let mut pk = pod_json(
        "ml",
        "pk",
        "uid-pk",
        1,
        &[
            (ANNOTATION_GPU_MEMORY, "8Gi"),
            (ANNOTATION_POLICY, "pack"),
            (ANNOTATION_SM_ACTIVITY, "0.9"),
        ],
    );
    // Created just now: not aged (a pod waiting `packAgingSeconds` may crowd).
    pk["metadata"]["creationTimestamp"] = json!(chrono::Utc::now().to_rfc3339());
    let (_, out) = post(&r, "/filter", &args_names(&pk, &["fits"])).await;
    let reason = retry_request(&out);
    assert!(
        reason.contains("loaded to SM activity 0.20") && reason.contains("would pass 1.00"),
        "{reason}"
    );

    let (_, metrics) = get(&r, "/metrics").await;
    for code in [
        "unhealthy",
        "exclusively-held",
        "warm-up-lock",
        "insufficient-memory",
        "over-reserved",
        "utilization-gate",
        "telemetry-warming-up",
        "not-idle",
        "activity-cap",
    ] {
        assert!(
            metrics.contains(&format!(
                r#"carma_extender_rejections_total{{reason="{code}"}} 1"#
            )),
            "{code}: {metrics}"
        );
    }
    assert!(
        metrics.contains(r#"carma_extender_requests_total{verb="filter",outcome="retry"} 2"#),
        "{metrics}"
    );
    assert!(
        metrics.contains(r#"carma_extender_rejections_total{reason="no-gpus"} 2"#),
        "{metrics}"
    );
    assert!(
        metrics.contains(r#"carma_extender_rejections_total{reason="too-few-gpus"} 1"#),
        "{metrics}"
    );
}

#[tokio::test]
async fn every_malformed_input_names_what_to_fix() {
    let rec = Arc::new(Recorder::default());
    let ext = extender_with(
        &cluster(),
        Policy::Magm,
        PlacementConfig::default(),
        rec.clone(),
    );
    let r = router(ext);
    type Case<'a> = (&'a str, u32, &'a [(&'a str, &'a str)], &'a str);
    let cases: [Case<'_>; 5] = [
        (
            "m1",
            1,
            &[(ANNOTATION_GPU_MEMORY, "-3Gi")],
            ANNOTATION_GPU_MEMORY,
        ),
        (
            "m2",
            1,
            &[(ANNOTATION_POLICY, "fastest")],
            ANNOTATION_POLICY,
        ),
        (
            "m3",
            1,
            &[(ANNOTATION_EXCLUSIVE, "yes")],
            ANNOTATION_EXCLUSIVE,
        ),
        (
            "m4",
            1,
            &[(
                ANNOTATION_MODEL_PROFILE,
                r#"{"family":"mlp","batchSize":"big"}"#,
            )],
            "batchSize",
        ),
        (
            "m5",
            1,
            &[(ANNOTATION_MODEL_PROFILE, r#"{"family":"mlp","flops":1}"#)],
            "flops",
        ),
    ];
    for (name, gpus, ann, needle) in cases {
        let pod = pod_json("ml", name, &format!("uid-{name}"), gpus, ann);
        let (_, out) = post(&r, "/filter", &args_names(&pod, &["fits", "memory"])).await;
        assert!(passing(&out).is_empty(), "{name}");
        for n in ["fits", "memory"] {
            let reason = out["FailedAndUnresolvableNodes"][n].as_str().unwrap();
            assert!(reason.contains(needle), "{name}: {reason}");
        }
    }
    // A GPU request that is not a whole number.
    let mut pod = pod_json("ml", "m6", "uid-m6", 1, &[]);
    pod["spec"]["containers"][0]["resources"]["limits"][RESOURCE_GPU] = json!("500m");
    let (_, out) = post(&r, "/filter", &args_names(&pod, &["fits"])).await;
    let reason = out["FailedAndUnresolvableNodes"]["fits"].as_str().unwrap();
    assert!(
        reason.contains(RESOURCE_GPU) && reason.contains("500m"),
        "{reason}"
    );

    let warnings = rec.warnings.lock();
    assert_eq!(warnings.len(), 6);
    assert_eq!(warnings[5].reason, "InvalidCarmaRequest");
    assert!(
        warnings[..5]
            .iter()
            .all(|w| w.reason == "InvalidCarmaAnnotation")
    );
}

/// kube-scheduler retries a pod that no node passed only on cluster events its own plugins name
/// (a pod deleted, a node's allocatable grown) or after five minutes. A pod held back by bookings
/// is freed by a pod's deletion, which it sees; one held back by a warm-up lock or telemetry is
/// freed by the clock or a GpuNode write, which it does not. The second gets a retry request.
#[tokio::test]
async fn only_what_kube_scheduler_cannot_see_lift_asks_for_a_retry() {
    let rec = Arc::new(Recorder::default());
    let ext = extender_with(&cluster(), Policy::Magm, PlacementConfig::default(), rec);
    let r = router(ext);
    let pod = pod_json("ml", "p", "uid-p", 1, &[(ANNOTATION_GPU_MEMORY, "8Gi")]);

    let (_, out) = post(
        &r,
        "/filter",
        &args_names(&pod, &["reserved", "exclusive", "no-gpunode"]),
    )
    .await;
    assert_eq!(out["Error"], "", "{out:#}");
    assert!(out["FailedNodes"]["reserved"].is_string(), "{out:#}");
    assert!(out["FailedNodes"]["exclusive"].is_string(), "{out:#}");

    for lifting in ["warmup", "memory", "gate", "cold"] {
        let (_, out) = post(
            &r,
            "/filter",
            &args_names(&pod, &["reserved", lifting, "exclusive", "no-gpunode"]),
        )
        .await;
        let error = retry_request(&out);
        assert!(error.contains(&format!("node {lifting}:")), "{error}");
        assert!(error.contains("(0 of 4); on 1 only"), "{error}");
        assert!(!error.contains("node reserved:"), "{error}");
    }
    // Every lifting node is counted, before the reasons (the answer is cut to 512 bytes); the
    // reasons of the first two by name are quoted, whatever order kube-scheduler sends them in, so
    // a waiting pod's message (and its status) changes only when those reasons do.
    let mut messages = Vec::new();
    for order in [
        ["warmup", "memory", "gate", "cold"],
        ["cold", "gate", "memory", "warmup"],
        ["memory", "warmup", "cold", "gate"],
    ] {
        let (_, out) = post(&r, "/filter", &args_names(&pod, &order)).await;
        let error = retry_request(&out);
        assert!(error.contains("(0 of 4); on 4 only"), "{error}");
        assert!(
            error.contains("can lift the refusal (2 quoted): node cold:"),
            "{error}"
        );
        assert!(error.contains("node gate:"), "{error}");
        assert!(
            !error.contains("node warmup:") && !error.contains("node memory:"),
            "{error}"
        );
        messages.push(error.to_string());
    }
    assert!(messages.windows(2).all(|w| w[0] == w[1]), "{messages:#?}");
    // A node that passes makes it an ordinary answer.
    let (_, out) = post(&r, "/filter", &args_names(&pod, &["warmup", "fits"])).await;
    assert_eq!(out["Error"], "", "{out:#}");
    assert_eq!(passing(&out), vec!["fits"], "{out:#}");
}
