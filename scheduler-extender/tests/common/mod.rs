//! Helpers shared by the integration tests.
#![allow(dead_code)]

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::body::Body;
use carma_core::{PlacementConfig, Policy};
use carma_estimator::Estimator;
use carma_scheduler_extender::backend::BackendError;
use carma_scheduler_extender::{
    BindTarget, ClusterBackend, ClusterState, Decisions, Extender, PodWarning, Snapshot,
};
use futures::future::BoxFuture;
use http::{Request, StatusCode};
use http_body_util::BodyExt;
use k8s_openapi::api::core::v1::Pod;
use parking_lot::Mutex;
use serde_json::{Value, json};
use tower::ServiceExt;

/// Path of the example snapshot.
pub fn fixture_path() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/cluster-snapshot.yaml")
}

/// The example snapshot.
pub fn fixture() -> Snapshot {
    Snapshot::load(&fixture_path()).expect("fixture snapshot loads")
}

/// One recorded bind: the pod and node, and the annotations written.
pub type BindRecord = (BindTarget, Option<BTreeMap<String, String>>);

/// A backend that records what the extender would write.
#[derive(Debug, Default)]
pub struct Recorder {
    pub pods: Mutex<Vec<Pod>>,
    pub binds: Mutex<Vec<BindRecord>>,
    pub warnings: Mutex<Vec<PodWarning>>,
    /// Delay of each bind write (lets concurrent binds interleave).
    pub delay: Option<Duration>,
    /// Behave as a cluster backend rather than a dry run: binds then take their node's turn and
    /// hold it until the pod is admitted (`crate::handoff`).
    pub live: bool,
}

impl ClusterBackend for Recorder {
    fn dry_run(&self) -> bool {
        !self.live
    }

    fn get_pod<'a>(
        &'a self,
        namespace: &'a str,
        name: &'a str,
    ) -> BoxFuture<'a, Result<Option<Pod>, BackendError>> {
        let pod = self
            .pods
            .lock()
            .iter()
            .find(|p| {
                p.metadata.namespace.as_deref() == Some(namespace)
                    && p.metadata.name.as_deref() == Some(name)
            })
            .cloned();
        Box::pin(async move { Ok(pod) })
    }

    fn bind<'a>(
        &'a self,
        target: &'a BindTarget,
        annotations: Option<&'a BTreeMap<String, String>>,
    ) -> BoxFuture<'a, Result<(), BackendError>> {
        Box::pin(async move {
            if let Some(d) = self.delay {
                tokio::time::sleep(d).await;
            }
            self.binds
                .lock()
                .push((target.clone(), annotations.cloned()));
            Ok(())
        })
    }

    fn warn_pod(&self, warning: PodWarning) {
        self.warnings.lock().push(warning);
    }
}

/// An extender over `snapshot` with a recording backend.
pub fn extender_with(
    snapshot: &Snapshot,
    policy: Policy,
    cfg: PlacementConfig,
    recorder: Arc<Recorder>,
) -> Arc<Extender> {
    let cluster = Arc::new(ClusterState::new());
    snapshot.apply(&cluster);
    recorder.pods.lock().extend(snapshot.pods.iter().cloned());
    Arc::new(Extender::new(
        cluster,
        Decisions::new(Estimator::new().unwrap(), policy),
        recorder,
        cfg,
    ))
}

/// The fixture's extender (magm) and its recorder.
pub fn fixture_extender() -> (Arc<Extender>, Arc<Recorder>) {
    let rec = Arc::new(Recorder::default());
    let ext = extender_with(
        &fixture(),
        Policy::Magm,
        PlacementConfig::default(),
        rec.clone(),
    );
    (ext, rec)
}

/// POST `body` to `path` on the in-process router; status and JSON answer.
pub async fn post(router: &Router, path: &str, body: &Value) -> (StatusCode, Value) {
    post_raw(router, path, serde_json::to_vec(body).unwrap()).await
}

/// POST raw bytes.
pub async fn post_raw(router: &Router, path: &str, body: Vec<u8>) -> (StatusCode, Value) {
    let req = Request::post(path)
        .header("content-type", "application/json")
        .body(Body::from(body))
        .unwrap();
    let resp = router.clone().oneshot(req).await.unwrap();
    let status = resp.status();
    let bytes = resp.into_body().collect().await.unwrap().to_bytes();
    let value = serde_json::from_slice(&bytes)
        .unwrap_or_else(|_| Value::String(String::from_utf8_lossy(&bytes).into_owned()));
    (status, value)
}

/// GET `path`; status and text.
pub async fn get(router: &Router, path: &str) -> (StatusCode, String) {
    let resp = router
        .clone()
        .oneshot(Request::get(path).body(Body::empty()).unwrap())
        .await
        .unwrap();
    let status = resp.status();
    let bytes = resp.into_body().collect().await.unwrap().to_bytes();
    (status, String::from_utf8_lossy(&bytes).into_owned())
}

/// The pod with `name` from the fixture, as JSON (as kube-scheduler would send it).
pub fn fixture_pod(name: &str) -> Value {
    let pod = fixture()
        .pods
        .into_iter()
        .find(|p| p.metadata.name.as_deref() == Some(name))
        .expect("pod in fixture");
    serde_json::to_value(pod).unwrap()
}

/// kube-scheduler's filter/prioritize body with `nodeCacheCapable: true`.
pub fn args_names(pod: &Value, nodes: &[&str]) -> Value {
    json!({ "Pod": pod, "Nodes": null, "NodeNames": nodes })
}

/// kube-scheduler's filter/prioritize body with `nodeCacheCapable: false`.
pub fn args_nodes(pod: &Value, nodes: &[&str]) -> Value {
    let items: Vec<Value> = nodes
        .iter()
        .map(|n| carma_scheduler_extender::synthetic::node_json(n, 4))
        .collect();
    json!({ "Pod": pod, "Nodes": { "metadata": {}, "items": items }, "NodeNames": null })
}

/// kube-scheduler's bind body.
pub fn bind_args(pod: &Value, node: &str) -> Value {
    json!({
        "PodName": pod["metadata"]["name"],
        "PodNamespace": pod["metadata"]["namespace"],
        "PodUID": pod["metadata"]["uid"],
        "Node": node,
    })
}

/// Names of the passing nodes in a filter answer (either mode).
pub fn passing(result: &Value) -> Vec<String> {
    if let Some(names) = result["NodeNames"].as_array() {
        return names
            .iter()
            .map(|n| n.as_str().unwrap().to_string())
            .collect();
    }
    result["Nodes"]["items"]
        .as_array()
        .map(|items| {
            items
                .iter()
                .map(|n| n["metadata"]["name"].as_str().unwrap().to_string())
                .collect()
        })
        .unwrap_or_default()
}
