//! The live watchers against a scripted API server (tower-test): the pod list, decoded as
//! `WatchedPod`s by kube's own watcher, rebuilds the ledger from a carma pod dressed as the API
//! server shows it, and a Deployment pod that is not carma's changes nothing.

use std::sync::Arc;
use std::time::Duration;

use carma_api::names::{
    ANNOTATION_ASSIGNED_AT, ANNOTATION_ASSIGNED_GPUS, ANNOTATION_ASSIGNED_NODE, ANNOTATION_ESTIMATE,
};
use carma_core::{PlacementConfig, Policy};
use carma_estimator::Estimator;
use carma_scheduler_extender::kube_backend::{KubeBackend, spawn_watchers};
use carma_scheduler_extender::synthetic::{self, deployment_pod_json, pod_json};
use carma_scheduler_extender::{ClusterState, Decisions, Extender};
use http::{Request, Response};
use kube::client::Body;
use serde_json::{Value, json};
use tower_test::mock;

fn list(kind: &str, api_version: &str, items: Vec<Value>) -> Response<Body> {
    let body = json!({ "apiVersion": api_version, "kind": kind,
                       "metadata": { "resourceVersion": "100" }, "items": items });
    Response::builder()
        .header("content-type", "application/json")
        .body(Body::from(serde_json::to_vec(&body).unwrap()))
        .unwrap()
}

#[tokio::test]
async fn the_pod_list_rebuilds_the_ledger_through_watched_pods() {
    let (service, mut handle) = mock::pair::<Request<Body>, Response<Body>>();
    let client = kube::Client::new(service, "default");
    let ext = Arc::new(Extender::new(
        Arc::new(ClusterState::new()),
        Decisions::new(Estimator::new().unwrap(), Policy::Magm),
        Arc::new(KubeBackend::new(client.clone())),
        PlacementConfig::default(),
    ));
    let node = synthetic::node_name(0);
    let gpu = synthetic::gpu_uuid(0, 0);
    let mut carma_pod = pod_json(
        "ml",
        "train",
        "uid-train",
        1,
        &[
            (ANNOTATION_ASSIGNED_GPUS, gpu.as_str()),
            (ANNOTATION_ASSIGNED_AT, "2026-01-01T00:00:01.000Z"),
            (ANNOTATION_ASSIGNED_NODE, node.as_str()),
            (ANNOTATION_ESTIMATE, r#"{"mib":9000,"source":"override"}"#),
        ],
    );
    carma_pod["spec"]["nodeName"] = json!(node);
    carma_pod["status"]["phase"] = json!("Running");
    let gpu_nodes: Vec<Value> = synthetic::cluster(1, 8)
        .gpu_nodes
        .iter()
        .map(|g| serde_json::to_value(g).unwrap())
        .collect();
    let tasks = spawn_watchers(client, Arc::clone(&ext));
    // Watches after the lists are left waiting.
    let mut waiting = Vec::new();
    let mut pods_listed = None;
    let served = async {
        while let Some((req, send)) = handle.next_request().await {
            let uri = req.uri().clone();
            if uri.query().is_some_and(|q| q.contains("watch=true")) {
                waiting.push(send);
                // Each watcher watches once it has listed and its objects are applied.
                if waiting.len() == 4 {
                    break;
                }
                continue;
            }
            let resp = match uri.path() {
                "/api/v1/nodes" => list(
                    "PartialObjectMetadataList",
                    "meta.k8s.io/v1",
                    vec![
                        json!({ "apiVersion": "meta.k8s.io/v1", "kind": "PartialObjectMetadata",
                                 "metadata": { "name": node, "resourceVersion": "1" } }),
                    ],
                ),
                "/apis/carma.io/v1alpha1/gpunodes" => {
                    list("GpuNodeList", "carma.io/v1alpha1", gpu_nodes.clone())
                }
                "/apis/carma.io/v1alpha1/memoryhistories" => {
                    list("MemoryHistoryList", "carma.io/v1alpha1", vec![])
                }
                "/api/v1/pods" => {
                    pods_listed = Some(uri.to_string());
                    list(
                        "PodList",
                        "v1",
                        vec![carma_pod.clone(), deployment_pod_json(1, &node)],
                    )
                }
                other => panic!("unexpected request {other}"),
            };
            send.send_response(resp);
        }
    };
    tokio::time::timeout(Duration::from_secs(10), served)
        .await
        .expect("the watchers list everything");
    assert!(ext.cluster().is_ready());
    for t in tasks {
        t.abort();
    }
    let pods_listed = pods_listed.expect("pods were listed");
    assert!(
        !pods_listed.contains("Selector"),
        "every pod, no selector: {pods_listed}"
    );
    let ledger = ext.cluster().ledger_snapshot();
    let records: Vec<_> = ledger.records().collect();
    assert_eq!(records.len(), 1, "{records:?}");
    assert_eq!(records[0].pod, "uid-train");
    assert_eq!(records[0].node, node);
    assert_eq!(records[0].gpus, [gpu]);
    assert_eq!(records[0].reserved_mib, 9000);
}
