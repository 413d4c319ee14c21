//! The API calls of the live backend, scripted with tower-test: bind creates one
//! Binding that carries the pod's annotations; a failed Binding releases the
//! booking; a malformed pod gets an Event.

mod common;

use std::sync::Arc;

use carma_api::names::{ANNOTATION_ASSIGNED_GPUS, ANNOTATION_ASSIGNED_NODE, ANNOTATION_ESTIMATE};
use carma_core::{PlacementConfig, Policy};
use carma_estimator::Estimator;
use carma_scheduler_extender::kube_backend::KubeBackend;
use carma_scheduler_extender::wire::{ExtenderArgs, ExtenderBindingArgs};
use carma_scheduler_extender::{ClusterState, Decisions, Extender};
use common::*;
use http::{Method, Request, Response, StatusCode};
use http_body_util::BodyExt;
use kube::client::Body;
use serde_json::{Value, json};
use tower_test::mock::{self, Handle};

type ApiHandle = Handle<Request<Body>, Response<Body>>;

fn live_extender() -> (Arc<Extender>, ApiHandle) {
    let (service, handle) = mock::pair::<Request<Body>, Response<Body>>();
    let client = kube::Client::new(service, "default");
    let cluster = Arc::new(ClusterState::new());
    fixture().apply(&cluster);
    let ext = Arc::new(Extender::new(
        cluster,
        Decisions::new(Estimator::new().unwrap(), Policy::Magm),
        Arc::new(KubeBackend::new(client)),
        PlacementConfig::default(),
    ));
    (ext, handle)
}

async fn body_json(req: Request<Body>) -> (Request<()>, Value) {
    let (parts, body) = req.into_parts();
    let bytes = body.collect().await.unwrap().to_bytes();
    (
        Request::from_parts(parts, ()),
        serde_json::from_slice(&bytes).unwrap(),
    )
}

fn respond(status: StatusCode, body: &Value) -> Response<Body> {
    Response::builder()
        .status(status)
        .header("content-type", "application/json")
        .body(Body::from(serde_json::to_vec(body).unwrap()))
        .unwrap()
}

fn status_body(code: u16, reason: &str, message: &str) -> Value {
    json!({ "kind": "Status", "apiVersion": "v1", "metadata": {},
            "status": if code < 300 { "Success" } else { "Failure" },
            "reason": reason, "message": message, "code": code })
}

fn bind_args_for(pod: &Value, node: &str) -> ExtenderBindingArgs {
    serde_json::from_value(bind_args(pod, node)).unwrap()
}

fn filter_text(pod: &Value, nodes: &[&str]) -> String {
    args_names(pod, nodes).to_string()
}

fn filter_args(text: &str) -> ExtenderArgs<'_> {
    serde_json::from_str(text).unwrap()
}

#[tokio::test]
async fn bind_writes_node_and_annotations_in_one_binding() {
    let (ext, mut api) = live_extender();
    let pod = fixture_pod("pending-override");
    let text = filter_text(&pod, &["gpu-node-b"]);
    let args = filter_args(&text);
    let filtered = ext.filter(&args);
    assert_eq!(filtered.node_names, Some(vec!["gpu-node-b".into()]));

    let script = tokio::spawn(async move {
        // The first and only write: the Binding, annotations included (no PATCH before it).
        let (req, send) = api.next_request().await.expect("a POST of the Binding");
        let (req, binding) = body_json(req).await;
        assert_eq!(req.method(), Method::POST);
        assert_eq!(
            req.uri().path(),
            "/api/v1/namespaces/ml/pods/pending-override/binding"
        );
        assert_eq!(binding["kind"], "Binding");
        assert_eq!(binding["metadata"]["name"], "pending-override");
        assert_eq!(
            binding["metadata"]["uid"],
            "aaaaaaaa-0000-4000-8000-000000000001"
        );
        assert_eq!(
            binding["target"],
            json!({ "apiVersion": "v1", "kind": "Node", "name": "gpu-node-b" })
        );
        let ann = &binding["metadata"]["annotations"];
        assert_eq!(
            ann[ANNOTATION_ASSIGNED_GPUS],
            "GPU-0b000000-0000-4000-8000-000000000003"
        );
        assert_eq!(ann[ANNOTATION_ASSIGNED_NODE], "gpu-node-b");
        assert_eq!(
            serde_json::from_str::<Value>(ann[ANNOTATION_ESTIMATE].as_str().unwrap()).unwrap(),
            json!({ "mib": 10240, "source": "override" })
        );
        // The API server answers a Binding with a Status.
        send.send_response(respond(StatusCode::CREATED, &status_body(201, "", "")));
        api
    });

    let result = ext.bind(&bind_args_for(&pod, "gpu-node-b")).await;
    let mut api = script.await.unwrap();
    assert_eq!(result.error, "");
    let next =
        tokio::time::timeout(std::time::Duration::from_millis(200), api.next_request()).await;
    assert!(
        next.is_err(),
        "one write per bind: unexpected request after the Binding"
    );
    let decision = result.decision.unwrap();
    assert!(!decision.dry_run);
    assert_eq!(
        decision.gpus,
        vec!["GPU-0b000000-0000-4000-8000-000000000003"]
    );
    let record = ext
        .cluster()
        .ledger_snapshot()
        .get("aaaaaaaa-0000-4000-8000-000000000001")
        .cloned()
        .unwrap();
    assert!(!record.visible);
    assert!(
        ext.metrics()
            .encode()
            .contains(r#"carma_extender_binds_total{result="bound"} 1"#)
    );
}

#[tokio::test]
async fn a_lost_binding_race_releases_the_booking_and_counts_as_a_conflict() {
    let (ext, mut api) = live_extender();
    let pod = fixture_pod("pending-override");
    ext.filter(&filter_args(&filter_text(&pod, &["gpu-node-a"])));
    let script = tokio::spawn(async move {
        let (req, send) = api.next_request().await.unwrap();
        assert!(req.uri().path().ends_with("/binding"));
        send.send_response(respond(
            StatusCode::CONFLICT,
            &status_body(
                409,
                "Conflict",
                "pod pending-override is already assigned to node \"gpu-node-b\"",
            ),
        ));
    });
    let result = ext.bind(&bind_args_for(&pod, "gpu-node-a")).await;
    script.await.unwrap();
    assert!(
        result
            .error
            .contains("binding pod ml/pending-override to node gpu-node-a"),
        "{}",
        result.error
    );
    assert!(
        result.error.contains("already assigned"),
        "{}",
        result.error
    );
    assert!(
        ext.cluster()
            .ledger_snapshot()
            .get("aaaaaaaa-0000-4000-8000-000000000001")
            .is_none()
    );
    assert!(
        ext.metrics()
            .encode()
            .contains(r#"carma_extender_binds_total{result="conflict"} 1"#),
        "another binder got there first: a conflict, not an error"
    );
}

#[tokio::test]
async fn a_refused_binding_releases_the_booking_as_an_error() {
    let (ext, mut api) = live_extender();
    let pod = fixture_pod("pending-override");
    ext.filter(&filter_args(&filter_text(&pod, &["gpu-node-a"])));
    let script = tokio::spawn(async move {
        let (req, send) = api.next_request().await.unwrap();
        assert!(req.uri().path().ends_with("/binding"));
        send.send_response(respond(
            StatusCode::UNPROCESSABLE_ENTITY,
            &status_body(422, "Invalid", "metadata.annotations: Invalid value"),
        ));
        api
    });
    let result = ext.bind(&bind_args_for(&pod, "gpu-node-a")).await;
    let mut api = script.await.unwrap();
    assert!(
        result
            .error
            .contains("binding pod ml/pending-override to node gpu-node-a"),
        "{}",
        result.error
    );
    // Nothing follows a refused Binding.
    let next =
        tokio::time::timeout(std::time::Duration::from_millis(200), api.next_request()).await;
    assert!(next.is_err(), "unexpected request after a refused Binding");
    assert!(
        ext.cluster()
            .ledger_snapshot()
            .get("aaaaaaaa-0000-4000-8000-000000000001")
            .is_none()
    ); // An invalid write is an error, not a lost race.
    assert!(
        ext.metrics()
            .encode()
            .contains(r#"carma_extender_binds_total{result="error"} 1"#)
    );
}

#[tokio::test]
async fn bind_without_a_filter_reads_the_pod_first() {
    let (ext, mut api) = live_extender();
    let pod = fixture_pod("pending-two-gpus");
    let pod_for_api = pod.clone();
    let script = tokio::spawn(async move {
        let (req, send) = api.next_request().await.unwrap();
        assert_eq!(req.method(), Method::GET);
        assert_eq!(
            req.uri().path(),
            "/api/v1/namespaces/ml/pods/pending-two-gpus"
        );
        send.send_response(respond(StatusCode::OK, &pod_for_api));
        let (req, send) = api.next_request().await.unwrap();
        assert!(req.uri().path().ends_with("/pods/pending-two-gpus/binding"));
        send.send_response(respond(StatusCode::CREATED, &status_body(201, "", "")));
    });
    let result = ext.bind(&bind_args_for(&pod, "gpu-node-a")).await;
    script.await.unwrap();
    assert_eq!(result.error, "");
    assert_eq!(result.decision.unwrap().gpus.len(), 2);
}

#[tokio::test]
async fn malformed_annotation_posts_a_warning_event() {
    let (ext, mut api) = live_extender();
    let pod = fixture_pod("pending-bad-annotation");
    let text = filter_text(&pod, &["gpu-node-a", "gpu-node-b"]);
    let args = filter_args(&text);
    let result = ext.filter(&args);
    assert_eq!(result.failed_and_unresolvable_nodes.len(), 2);
    let (req, send) = api.next_request().await.expect("an Event");
    let (req, event) = body_json(req).await;
    assert_eq!(req.method(), Method::POST);
    assert_eq!(
        req.uri().path(),
        "/apis/events.k8s.io/v1/namespaces/ml/events"
    );
    assert_eq!(event["reason"], "InvalidCarmaAnnotation");
    assert_eq!(event["type"], "Warning");
    assert_eq!(event["reportingController"], "carma-scheduler-extender");
    assert_eq!(event["regarding"]["kind"], "Pod");
    assert_eq!(event["regarding"]["name"], "pending-bad-annotation");
    assert_eq!(
        event["regarding"]["uid"],
        "aaaaaaaa-0000-4000-8000-000000000004"
    );
    assert!(
        event["note"]
            .as_str()
            .unwrap()
            .contains("carma.io/gpu-memory"),
        "{event}"
    );
    send.send_response(respond(StatusCode::CREATED, &event));
}
