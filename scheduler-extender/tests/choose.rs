//! `choose` (the chart's `scheduler.extenderConfig.mode: choose`): filter answering only the node
//! carma would bind to, so kube-scheduler needs no prioritize call; a pod that fits nowhere still
//! gets every node's reason.

mod common;

use carma_api::names::ANNOTATION_GPU_MEMORY;
use carma_core::{PlacementConfig, Policy};
use carma_scheduler_extender::router;
use carma_scheduler_extender::synthetic::{cluster, node_name, pod_json};
use carma_scheduler_extender::verbs::CHOICE_HOLD;
use common::*;
use http::StatusCode;
use serde_json::{Value, json};

const A: &str = "gpu-node-a";
const B: &str = "gpu-node-b";

/// The best score `/prioritize` gives any of `nodes`, and the nodes that have it.
async fn best_by_prioritize(r: &axum::Router, pod: &Value, nodes: &[&str]) -> (i64, Vec<String>) {
    let (_, scores) = post(r, "/prioritize", &args_names(pod, nodes)).await;
    let scores = scores.as_array().unwrap().clone();
    let top = scores
        .iter()
        .map(|s| s["Score"].as_i64().unwrap())
        .max()
        .unwrap();
    let best = scores
        .iter()
        .filter(|s| s["Score"].as_i64() == Some(top))
        .map(|s| s["Host"].as_str().unwrap().to_string())
        .collect();
    (top, best)
}

#[tokio::test]
async fn choose_answers_exactly_one_node_that_filter_passes_and_prioritize_ranks_best() {
    let (ext, _) = fixture_extender();
    let r = router(ext);
    // 30 GiB on one GPU: node a and node b pass, the unknown node does not.
    let pod = pod_json(
        "ml",
        "big",
        "uid-big",
        1,
        &[(ANNOTATION_GPU_MEMORY, "30Gi")],
    );
    let nodes = [A, B, "gpu-node-x"];
    let (_, filtered) = post(&r, "/filter", &args_names(&pod, &nodes)).await;
    assert_eq!(passing(&filtered), vec![A, B]);
    let (top, best) = best_by_prioritize(&r, &pod, &nodes).await;
    assert!(top > 0);

    let (status, out) = post(&r, "/choose", &args_names(&pod, &nodes)).await;
    assert_eq!(status, StatusCode::OK);
    let chosen = passing(&out);
    assert_eq!(chosen.len(), 1, "exactly one node: {out}");
    assert!(best.contains(&chosen[0]), "{chosen:?} not among {best:?}");
    assert_eq!(out["Error"], "");
    assert_eq!(out["Nodes"], Value::Null);
    // The pod fits: no reasons travel (kube-scheduler reads them only when no node is left).
    assert_eq!(out["FailedNodes"], json!({}));
    assert_eq!(out["FailedAndUnresolvableNodes"], json!({}));
}

#[tokio::test]
async fn choose_with_node_objects_hands_back_the_chosen_object_unchanged() {
    let (ext, _) = fixture_extender();
    let r = router(ext);
    let body = args_nodes(&fixture_pod("pending-override"), &[A, B]);
    let (status, out) = post(&r, "/choose", &body).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(out["NodeNames"], Value::Null);
    let items = out["Nodes"]["items"].as_array().unwrap();
    assert_eq!(items.len(), 1, "{out}");
    let sent = body["Nodes"]["items"].as_array().unwrap();
    assert!(
        sent.contains(&items[0]),
        "the node object is echoed as sent"
    );
}

#[tokio::test]
async fn a_pod_that_fits_nowhere_gets_every_nodes_reason_as_from_filter() {
    let (ext, _) = fixture_extender();
    let r = router(ext);
    // Two idle GPUs exclusively: node b has one idle GPU (one unhealthy, two in use).
    let pod = fixture_pod("pending-two-gpus");
    let (_, filtered) = post(&r, "/filter", &args_names(&pod, &[B, "gpu-node-x"])).await;
    let (status, out) = post(&r, "/choose", &args_names(&pod, &[B, "gpu-node-x"])).await;
    assert_eq!(status, StatusCode::OK);
    assert!(passing(&out).is_empty(), "{out}");
    assert_eq!(out, filtered, "the same reasons as filter's");
    let reason = out["FailedNodes"][B].as_str().unwrap();
    assert!(
        reason.contains("needs 2 GPU(s) exclusively, 1 pass"),
        "{reason}"
    );
    assert!(
        out["FailedAndUnresolvableNodes"]["gpu-node-x"].is_string(),
        "{out}"
    );
    // Malformed carma input: every node's reason, unresolvable, as from filter.
    let bad = fixture_pod("pending-bad-annotation");
    let (_, out) = post(&r, "/choose", &args_names(&bad, &[A, B])).await;
    assert!(passing(&out).is_empty());
    for n in [A, B] {
        let reason = out["FailedAndUnresolvableNodes"][n].as_str().unwrap();
        assert!(reason.contains(ANNOTATION_GPU_MEMORY), "{reason}");
    }
}

#[tokio::test]
async fn a_burst_of_pods_is_spread_over_nodes_before_their_binds_arrive() {
    // 20 identical nodes with idle GPUs: every node scores the same for every pod.
    let nodes: Vec<String> = (0..20).map(node_name).collect();
    let names: Vec<&str> = nodes.iter().map(String::as_str).collect();
    let mut snapshot = cluster(20, 8);
    for gn in &mut snapshot.gpu_nodes {
        for g in &mut gn.status.as_mut().unwrap().gpus {
            g.memory_free_mib = g.memory_total_mib;
            g.sm_activity = Some(0.0);
            g.processes = 0;
        }
    }
    let ext = extender_with(
        &snapshot,
        Policy::Magm,
        PlacementConfig::default(),
        Default::default(),
    );
    let r = router(ext.clone());
    // kube-scheduler schedules the next pod while the previous one's bind is still on its way: ten
    // choices before any bind. Each goes to a node no earlier choice holds.
    let mut chosen = Vec::new();
    let pods: Vec<Value> = (0..10)
        .map(|i| {
            pod_json(
                "ml",
                &format!("p{i}"),
                &format!("uid-{i}"),
                1,
                &[(ANNOTATION_GPU_MEMORY, "4Gi")],
            )
        })
        .collect();
    for pod in &pods {
        let (_, out) = post(&r, "/choose", &args_names(pod, &names)).await;
        let one = passing(&out);
        assert_eq!(one.len(), 1, "{out}");
        chosen.push(one[0].clone());
    }
    let mut distinct = chosen.clone();
    distinct.sort();
    distinct.dedup();
    assert_eq!(distinct.len(), chosen.len(), "one node per pod: {chosen:?}");
    assert_eq!(ext.choices().len(), 10);
    // The same pod asked again (kube-scheduler's retry) keeps its node: its own choice holds nothing
    // against it.
    let (_, again) = post(&r, "/choose", &args_names(&pods[0], &names)).await;
    assert_eq!(passing(&again), vec![chosen[0].clone()]);
    // A bind ends the choice (bound, the node's admission wait takes over; refused, it is free).
    let (_, bound) = post(&r, "/bind", &bind_args(&pods[0], &chosen[0])).await;
    assert_eq!(bound["Error"], "", "{bound}");
    assert_eq!(ext.choices().len(), 9);
    assert!(
        CHOICE_HOLD.as_secs() >= 1,
        "holds outlast kube-scheduler's cycle"
    );
}

#[tokio::test]
async fn when_every_node_is_busy_the_queues_stay_even() {
    // Two identical nodes and twelve pods chosen before any bind: six binds on their way to each,
    // not a pile on one node while the other's turn goes unused.
    let mut snapshot = cluster(2, 8);
    for gn in &mut snapshot.gpu_nodes {
        for g in &mut gn.status.as_mut().unwrap().gpus {
            g.memory_free_mib = g.memory_total_mib;
            g.sm_activity = Some(0.0);
            g.processes = 0;
        }
    }
    let ext = extender_with(
        &snapshot,
        Policy::Magm,
        PlacementConfig::default(),
        Default::default(),
    );
    let r = router(ext);
    let names = [node_name(0), node_name(1)];
    let names: Vec<&str> = names.iter().map(String::as_str).collect();
    let mut per_node = std::collections::BTreeMap::<String, usize>::new();
    for i in 0..12 {
        let pod = pod_json(
            "ml",
            &format!("q{i}"),
            &format!("uid-q{i}"),
            1,
            &[(ANNOTATION_GPU_MEMORY, "2Gi")],
        );
        let (_, out) = post(&r, "/choose", &args_names(&pod, &names)).await;
        *per_node.entry(passing(&out)[0].clone()).or_default() += 1;
    }
    assert_eq!(
        per_node.values().copied().collect::<Vec<_>>(),
        vec![6, 6],
        "{per_node:?}"
    );
}

#[tokio::test]
async fn choose_is_counted_and_timed_and_refuses_malformed_json() {
    let (ext, _) = fixture_extender();
    let r = router(ext);
    let (status, out) = post_raw(&r, "/choose", b"{\"Pod\": {".to_vec()).await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    let msg = out["Error"].as_str().unwrap();
    assert!(
        msg.contains("malformed") && msg.contains("/choose"),
        "{msg}"
    );
    post(
        &r,
        "/choose",
        &args_names(&fixture_pod("pending-override"), &[A, B]),
    )
    .await;
    let (_, metrics) = get(&r, "/metrics").await;
    for line in [
        r#"carma_extender_requests_total{verb="choose",outcome="bad-request"} 1"#,
        r#"carma_extender_requests_total{verb="choose",outcome="success"} 1"#,
    ] {
        assert!(metrics.contains(line), "{line} in {metrics}");
    }
}
