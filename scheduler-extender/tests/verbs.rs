//! filter, prioritize and bind with kube-scheduler-shaped payloads, against the
//! example snapshot, in both node modes.

mod common;

use carma_api::names::{
    ANNOTATION_ASSIGNED_AT, ANNOTATION_ASSIGNED_GPUS, ANNOTATION_ASSIGNED_NODE,
    ANNOTATION_ESTIMATE, ANNOTATION_GPU_MEMORY,
};
use carma_scheduler_extender::router;
use carma_scheduler_extender::synthetic::pod_json;
use common::*;
use http::StatusCode;
use serde_json::{Value, json};

const A: &str = "gpu-node-a";
const B: &str = "gpu-node-b";
const GPU_A1: &str = "GPU-0a000000-0000-4000-8000-000000000001";

#[tokio::test]
async fn filter_with_node_names_answers_node_names() {
    let (ext, _) = fixture_extender();
    let r = router(ext);
    let (status, out) = post(
        &r,
        "/filter",
        &args_names(&fixture_pod("pending-override"), &[A, B]),
    )
    .await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(passing(&out), vec![A, B]);
    assert_eq!(out["Error"], "");
    assert_eq!(out["Nodes"], Value::Null);
    assert_eq!(out["FailedNodes"], json!({}));
    assert_eq!(out["FailedAndUnresolvableNodes"], json!({}));
}

#[tokio::test]
async fn filter_with_node_objects_hands_back_the_objects_unchanged() {
    let (ext, _) = fixture_extender();
    let r = router(ext);
    let body = args_nodes(&fixture_pod("pending-two-gpus"), &[A, B]);
    let (status, out) = post(&r, "/filter", &body).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(out["NodeNames"], Value::Null);
    // Two idle GPUs only on node a; node b has one idle GPU (one unhealthy, two in use).
    assert_eq!(passing(&out), vec![A]);
    assert_eq!(
        out["Nodes"]["items"][0], body["Nodes"]["items"][0],
        "node object echoed as sent"
    );
    let reason = out["FailedNodes"][B].as_str().unwrap();
    assert!(
        reason.contains("needs 2 GPU(s) exclusively, 1 pass"),
        "{reason}"
    );
    assert!(reason.contains("unhealthy"), "{reason}");
}

#[tokio::test]
async fn lowercase_keys_are_accepted() {
    let (ext, _) = fixture_extender();
    let r = router(ext);
    let body = json!({ "pod": fixture_pod("pending-override"), "nodenames": [A] });
    let (status, out) = post(&r, "/filter", &body).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(passing(&out), vec![A]);
    let body = json!({ "pod": fixture_pod("pending-override"), "nodeNames": [B] });
    let (_, out) = post(&r, "/prioritize", &body).await;
    assert_eq!(out, json!([{ "Host": B, "Score": 10 }]));
}

#[tokio::test]
async fn prioritize_scores_every_candidate() {
    let (ext, _) = fixture_extender();
    let r = router(ext);
    // 30 GiB on one GPU: only idle GPUs or node a's GPU 0 (30660 free) could ever fit.
    let pod = pod_json(
        "ml",
        "big",
        "uid-big",
        1,
        &[(ANNOTATION_GPU_MEMORY, "30Gi")],
    );
    let (status, out) = post(&r, "/prioritize", &args_names(&pod, &[A, B, "gpu-node-x"])).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(
        out,
        json!([
            { "Host": A, "Score": 10 },
            { "Host": B, "Score": 10 },
            { "Host": "gpu-node-x", "Score": 0 },
        ])
    );
    // Both modes give the same scores.
    let (_, again) = post(&r, "/prioritize", &args_nodes(&pod, &[A, B, "gpu-node-x"])).await;
    assert_eq!(again, out);
}

#[tokio::test]
async fn bind_picks_gpus_and_writes_annotations_then_holds_them() {
    let (ext, rec) = fixture_extender();
    let r = router(ext.clone());
    let pod = fixture_pod("pending-override");
    let (_, f) = post(&r, "/filter", &args_names(&pod, &[A, B])).await;
    assert_eq!(passing(&f), vec![A, B]);
    let (status, out) = post(&r, "/bind", &bind_args(&pod, A)).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(out["Error"], "", "{out}");
    assert_eq!(
        out["Decision"]["GPUs"],
        json!([GPU_A1]),
        "first idle GPU on node a"
    );
    assert_eq!(out["Decision"]["ReservedMiB"], 10240);
    assert_eq!(out["Decision"]["Source"], "override");
    assert_eq!(out["Decision"]["DryRun"], true);

    let binds = rec.binds.lock().clone();
    assert_eq!(binds.len(), 1);
    let (target, ann) = &binds[0];
    assert_eq!(
        (
            target.namespace.as_str(),
            target.name.as_str(),
            target.node.as_str()
        ),
        ("ml", "pending-override", A)
    );
    let ann = ann.as_ref().unwrap();
    assert_eq!(ann[ANNOTATION_ASSIGNED_GPUS], GPU_A1);
    assert_eq!(ann[ANNOTATION_ASSIGNED_NODE], A);
    assert!(ann[ANNOTATION_ASSIGNED_AT].ends_with('Z'));
    let est: Value = serde_json::from_str(&ann[ANNOTATION_ESTIMATE]).unwrap();
    assert_eq!(est, json!({ "mib": 10240, "source": "override" }));

    // The booking is in flight and the GPU is in its warm-up lock.
    let ledger = ext.cluster().ledger_snapshot();
    let record = ledger.get("aaaaaaaa-0000-4000-8000-000000000001").unwrap();
    assert!(!record.visible);
    assert_eq!(record.gpus, vec![GPU_A1]);
    // The next whole-GPU pod cannot have GPU 1 any more: node a has only GPU 3 idle now.
    let (_, f) = post(
        &r,
        "/filter",
        &args_names(&fixture_pod("pending-two-gpus"), &[A]),
    )
    .await;
    assert!(passing(&f).is_empty(), "{f}");
    // A second bind of the same pod is refused (it already holds GPUs).
    let (_, again) = post(&r, "/bind", &bind_args(&pod, A)).await;
    assert!(
        again["Error"]
            .as_str()
            .unwrap()
            .contains("already has a placement"),
        "{again}"
    );
}

#[tokio::test]
async fn bind_estimates_from_the_profile_and_counts_reservation_sources() {
    let (ext, _) = fixture_extender();
    let r = router(ext.clone());
    let pod = fixture_pod("pending-profile");
    let (_, out) = post(&r, "/bind", &bind_args(&pod, B)).await;
    assert_eq!(out["Error"], "", "{out}");
    assert_eq!(out["Decision"]["Source"], "gpumemnet-mlp");
    let est: Value = serde_json::from_str(
        out["Decision"]["Annotations"][ANNOTATION_ESTIMATE]
            .as_str()
            .unwrap(),
    )
    .unwrap();
    assert!(est["class"].is_string(), "{est}");
    let whole = fixture_pod("pending-two-gpus");
    let (_, out) = post(&r, "/bind", &bind_args(&whole, A)).await;
    assert_eq!(out["Error"], "", "{out}");
    assert_eq!(out["Decision"]["Source"], "whole-gpu");
    assert_eq!(out["Decision"]["Exclusive"], true);
    assert_eq!(out["Decision"]["ReservedMiB"], 40960);
    assert_eq!(out["Decision"]["GPUs"].as_array().unwrap().len(), 2);
    let (_, metrics) = get(&r, "/metrics").await;
    assert!(
        metrics.contains(r#"carma_extender_reservations_total{source="gpumemnet-mlp"} 1"#),
        "{metrics}"
    );
    assert!(
        metrics.contains(r#"carma_extender_reservations_total{source="whole-gpu"} 1"#),
        "{metrics}"
    );
    assert!(
        metrics.contains(r#"carma_extender_binds_total{result="recorded"} 2"#),
        "{metrics}"
    );
    // Two new placements in flight plus mlp-sweep-7 from the snapshot.
    assert!(
        metrics.contains("carma_extender_placements_in_flight 3"),
        "{metrics}"
    );
}

#[tokio::test]
async fn bad_annotation_fails_every_node_and_warns_once() {
    let (ext, rec) = fixture_extender();
    let r = router(ext);
    let pod = fixture_pod("pending-bad-annotation");
    for _ in 0..3 {
        let (status, out) = post(&r, "/filter", &args_names(&pod, &[A, B])).await;
        assert_eq!(status, StatusCode::OK);
        assert!(passing(&out).is_empty());
        assert_eq!(out["Error"], "");
        for n in [A, B] {
            let reason = out["FailedAndUnresolvableNodes"][n].as_str().unwrap();
            assert!(reason.contains(ANNOTATION_GPU_MEMORY), "{reason}");
            assert!(reason.contains("ml/pending-bad-annotation"), "{reason}");
        }
    }
    let warnings = rec.warnings.lock().clone();
    assert_eq!(warnings.len(), 1, "one Event per pod, not per request");
    assert_eq!(warnings[0].reason, "InvalidCarmaAnnotation");
    assert_eq!(warnings[0].name, "pending-bad-annotation");
    assert!(warnings[0].note.contains(ANNOTATION_GPU_MEMORY));
    let (_, out) = post(&r, "/prioritize", &args_names(&pod, &[A, B])).await;
    assert_eq!(
        out,
        json!([{ "Host": A, "Score": 0 }, { "Host": B, "Score": 0 }])
    );
    let (_, out) = post(&r, "/bind", &bind_args(&pod, A)).await;
    assert!(
        out["Error"]
            .as_str()
            .unwrap()
            .contains(ANNOTATION_GPU_MEMORY),
        "{out}"
    );
    let (_, metrics) = get(&r, "/metrics").await;
    assert!(
        metrics.contains(r#"carma_extender_rejections_total{reason="invalid-annotation"} 6"#),
        "{metrics}"
    );
    assert!(
        metrics.contains(r#"carma_extender_binds_total{result="error"} 1"#),
        "{metrics}"
    );
    assert!(
        metrics.contains(r#"carma_extender_requests_total{verb="bind",outcome="error"} 1"#),
        "{metrics}"
    );
}

#[tokio::test]
async fn pod_without_carma_gpus_passes_everywhere_and_binds_without_annotations() {
    let (ext, rec) = fixture_extender();
    let r = router(ext.clone());
    let pod = pod_json("ml", "cpu-only", "uid-cpu", 0, &[]);
    let (_, out) = post(&r, "/filter", &args_names(&pod, &[A, B, "cpu-node"])).await;
    assert_eq!(passing(&out), vec![A, B, "cpu-node"]);
    let (_, out) = post(&r, "/bind", &bind_args(&pod, "cpu-node")).await;
    assert_eq!(out["Error"], "");
    assert!(rec.binds.lock()[0].1.is_none());
    assert!(ext.cluster().ledger_snapshot().get("uid-cpu").is_none());
}

#[tokio::test]
async fn bind_of_an_unknown_pod_is_an_error() {
    let (ext, _) = fixture_extender();
    let r = router(ext);
    let (status, out) = post(
        &r,
        "/bind",
        &json!({ "PodName": "ghost", "PodNamespace": "ml", "PodUID": "nope", "Node": A }),
    )
    .await;
    assert_eq!(status, StatusCode::OK);
    assert!(
        out["Error"]
            .as_str()
            .unwrap()
            .contains("ml/ghost not found"),
        "{out}"
    );
}

#[tokio::test]
async fn bind_of_a_pod_that_no_longer_fits_is_a_conflict() {
    let (ext, _) = fixture_extender();
    let r = router(ext);
    // 36 GiB fits only an idle GPU; node b has one (GPU 3).
    let p1 = pod_json("ml", "p1", "uid-p1", 1, &[(ANNOTATION_GPU_MEMORY, "36Gi")]);
    let p2 = pod_json("ml", "p2", "uid-p2", 1, &[(ANNOTATION_GPU_MEMORY, "36Gi")]);
    for p in [&p1, &p2] {
        let (_, f) = post(&r, "/filter", &args_names(p, &[B])).await;
        assert_eq!(passing(&f), vec![B]);
    }
    let (_, ok) = post(&r, "/bind", &bind_args(&p1, B)).await;
    assert_eq!(ok["Error"], "");
    let (_, lost) = post(&r, "/bind", &bind_args(&p2, B)).await;
    assert!(
        lost["Error"].as_str().unwrap().contains("no longer fits"),
        "{lost}"
    );
    let (_, metrics) = get(&r, "/metrics").await;
    assert!(
        metrics.contains(r#"carma_extender_binds_total{result="conflict"} 1"#),
        "{metrics}"
    );
}

#[tokio::test]
async fn malformed_json_is_a_400_with_a_message() {
    let (ext, _) = fixture_extender();
    let r = router(ext);
    for path in ["/filter", "/prioritize", "/bind"] {
        let (status, out) = post_raw(&r, path, b"{\"Pod\": {".to_vec()).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{path}");
        let msg = out["Error"].as_str().unwrap();
        assert!(msg.contains("malformed") && msg.contains(path), "{msg}");
    }
    // Valid JSON of the wrong shape is a 400 too, naming the field.
    let (status, out) = post(&r, "/bind", &json!({ "PodName": "x" })).await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    assert!(
        out["Error"].as_str().unwrap().contains("PodNamespace"),
        "{out}"
    );
    let (status, out) = post(
        &r,
        "/filter",
        &json!({ "Pod": { "spec": { "containers": 3 } } }),
    )
    .await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{out}");
    let (_, metrics) = get(&r, "/metrics").await;
    assert!(
        metrics.contains(r#"carma_extender_requests_total{verb="filter",outcome="bad-request"} 2"#),
        "{metrics}"
    );
    assert!(
        metrics.contains("carma_extender_request_duration_seconds_bucket"),
        "{metrics}"
    );
}

#[tokio::test]
async fn health_and_readiness() {
    let (ext, _) = fixture_extender();
    let r = router(ext);
    assert_eq!(get(&r, "/healthz").await.0, StatusCode::OK);
    assert_eq!(get(&r, "/readyz").await.0, StatusCode::OK);

    // Not synced: not ready, and the verbs refuse to judge.
    let rec = std::sync::Arc::new(Recorder::default());
    let unsynced = std::sync::Arc::new(carma_scheduler_extender::Extender::new(
        std::sync::Arc::new(carma_scheduler_extender::ClusterState::new()),
        carma_scheduler_extender::Decisions::new(
            carma_estimator::Estimator::new().unwrap(),
            carma_core::Policy::Magm,
        ),
        rec,
        Default::default(),
    ));
    let r = router(unsynced);
    assert_eq!(get(&r, "/readyz").await.0, StatusCode::SERVICE_UNAVAILABLE);
    let (_, out) = post(
        &r,
        "/filter",
        &args_names(&fixture_pod("pending-override"), &[A]),
    )
    .await;
    assert!(
        out["Error"].as_str().unwrap().contains("not synced"),
        "{out}"
    );
}

#[tokio::test]
async fn a_bind_must_name_the_pod_its_uid_was_filtered_as() {
    // A bind naming another namespace/name with the UID of a filtered pod used to be booked
    // and recorded under that other name (snapshot mode never reads the pod back).
    let (ext, rec) = fixture_extender();
    let r = router(ext);
    let pod = fixture_pod("pending-override");
    let (_, f) = post(&r, "/filter", &args_names(&pod, &[A, B])).await;
    assert_eq!(passing(&f), vec![A, B]);
    for (namespace, name) in [("ml", "someone-else"), ("other", "pending-override")] {
        let mut args = bind_args(&pod, A);
        args["PodNamespace"] = json!(namespace);
        args["PodName"] = json!(name);
        let (status, out) = post(&r, "/bind", &args).await;
        assert_eq!(status, StatusCode::OK);
        let error = out["Error"].as_str().unwrap();
        assert!(
            error.contains("was filtered as ml/pending-override")
                && error.contains(&format!("{namespace}/{name}")),
            "{out}"
        );
    }
    assert!(rec.binds.lock().is_empty(), "nothing was bound");
    // The pod itself still binds.
    let (_, out) = post(&r, "/bind", &bind_args(&pod, A)).await;
    assert_eq!(out["Error"], "", "{out}");
}
