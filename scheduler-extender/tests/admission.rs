//! The bare-pod admission webhook: what it does to each kind of pod, and its HTTP answers.

mod common;

use std::sync::Arc;

use carma_core::Policy;
use carma_estimator::Estimator;
use carma_scheduler_extender::admission::{
    AdmissionOutcome as Outcome, BarePodClaims, LABEL_MADE_BY, TemplateError, TemplateStore,
};
use carma_scheduler_extender::server::admission_router;
use carma_scheduler_extender::synthetic::BENCH_PROFILE;
use carma_scheduler_extender::{Decisions, Extender, metrics_router};
use common::*;
use futures::future::BoxFuture;
use http::StatusCode;
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::resource::v1::ResourceClaimTemplate;
use kube::core::admission::{AdmissionRequest, AdmissionReview};
use parking_lot::Mutex;
use serde_json::{Value, json};

/// Records the templates it is asked for; fails when told to.
#[derive(Debug, Default)]
struct Store {
    made: Mutex<Vec<ResourceClaimTemplate>>,
    fail: bool,
}

impl TemplateStore for Store {
    fn ensure<'a>(
        &'a self,
        template: &'a ResourceClaimTemplate,
    ) -> BoxFuture<'a, Result<(), TemplateError>> {
        Box::pin(async move {
            if self.fail {
                return Err(TemplateError::Unusable(
                    carma_api::dra::template::Unusable::NotCarmas,
                ));
            }
            self.made.lock().push(template.clone());
            Ok(())
        })
    }
}

fn pod(annotations: Value, gpus: Option<&str>) -> Value {
    let resources = match gpus {
        Some(g) => {
            json!({"limits": {"carma.io/gpu": g, "cpu": "1"}, "requests": {"carma.io/gpu": g}})
        }
        None => json!({"limits": {"cpu": "1"}}),
    };
    json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"generateName": "train-", "namespace": "ml", "annotations": annotations},
        "spec": {"schedulerName": "default-scheduler", "containers": [
            {"name": "sidecar", "image": "busybox"},
            {"name": "train", "image": "pytorch", "resources": resources}
        ]}
    })
}

fn review(pod: &Value, operation: &str, dry_run: bool) -> Value {
    json!({
        "apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
        "request": {
            "uid": "req-1",
            "kind": {"group": "", "version": "v1", "kind": "Pod"},
            "resource": {"group": "", "version": "v1", "resource": "pods"},
            "namespace": "ml", "operation": operation, "userInfo": {"username": "alice"},
            "object": pod, "dryRun": dry_run
        }
    })
}

fn decisions() -> Decisions {
    Decisions::new(Estimator::new().unwrap(), Policy::DEFAULT)
}

async fn admit(store: Arc<Store>, review: &Value) -> (Value, Outcome) {
    let claims = BarePodClaims::new("carma-gpu", store);
    let review: AdmissionReview<Pod> = serde_json::from_value(review.clone()).unwrap();
    let request: AdmissionRequest<Pod> = review.try_into().unwrap();
    let admitted = claims.admit(&decisions(), &request).await;
    (
        serde_json::to_value(admitted.response).unwrap(),
        admitted.outcome,
    )
}

/// The pod with the answer's JSON patch applied.
fn patched(pod: &Value, answer: &Value) -> Value {
    assert_eq!(answer["allowed"], true, "{answer}");
    assert_eq!(answer["patchType"], "JSONPatch");
    let bytes: Vec<u8> = serde_json::from_value(answer["patch"].clone()).unwrap();
    let patch: json_patch::Patch = serde_json::from_slice(&bytes).unwrap();
    let mut out = pod.clone();
    json_patch::patch(&mut out, &patch).unwrap();
    out
}

fn template_name(pod: &Value) -> String {
    let claims = pod["spec"]["resourceClaims"].as_array().unwrap();
    assert_eq!(claims.len(), 1);
    assert_eq!(claims[0]["name"], "carma-gpu");
    claims[0]["resourceClaimTemplateName"]
        .as_str()
        .unwrap()
        .to_string()
}

#[tokio::test]
async fn a_sized_pod_takes_a_claim_of_its_size_instead_of_carma_gpu() {
    let store = Arc::new(Store::default());
    let pod = pod(json!({"carma.io/gpu-memory": "12Gi"}), Some("2"));
    let (answer, outcome) = admit(store.clone(), &review(&pod, "CREATE", false)).await;
    assert_eq!(outcome, Outcome::Claimed);
    let out = patched(&pod, &answer);
    let name = template_name(&out);
    assert!(name.starts_with("carma-gpu-g2-m12288-"), "{name}");
    let train = &out["spec"]["containers"][1]["resources"];
    assert!(train["limits"].get("carma.io/gpu").is_none(), "{train}");
    assert!(train["requests"].get("carma.io/gpu").is_none(), "{train}");
    assert_eq!(train["limits"]["cpu"], "1");
    assert_eq!(train["claims"], json!([{"name": "carma-gpu"}]));
    assert!(out["spec"]["containers"][0].get("resources").is_none());
    let estimate: Value = serde_json::from_str(
        out["metadata"]["annotations"]["carma.io/estimate"]
            .as_str()
            .unwrap(),
    )
    .unwrap();
    assert_eq!(estimate, json!({"mib": 12288, "source": "override"}));

    let made = store.made.lock();
    assert_eq!(made.len(), 1);
    let t = serde_json::to_value(&made[0]).unwrap();
    assert_eq!(t["metadata"]["name"], name.as_str());
    assert_eq!(t["metadata"]["namespace"], "ml");
    assert_eq!(t["metadata"]["labels"][LABEL_MADE_BY], "admission");
    assert_eq!(
        t["metadata"]["labels"]["app.kubernetes.io/managed-by"],
        "carma"
    );
    let req = &t["spec"]["spec"]["devices"]["requests"][0]["exactly"];
    assert_eq!(req["deviceClassName"], "carma-gpu");
    assert_eq!(req["count"], 2);
    assert_eq!(req["capacity"]["requests"]["memory"], "12288Mi");
    let warning = answer["warnings"][0].as_str().unwrap();
    assert!(
        warning.contains(&name) && warning.contains("12288 MiB"),
        "{warning}"
    );
}

#[tokio::test]
async fn a_model_profile_is_estimated_as_the_extender_would() {
    let store = Arc::new(Store::default());
    let pod = pod(json!({"carma.io/model-profile": BENCH_PROFILE}), Some("1"));
    let (answer, outcome) = admit(store.clone(), &review(&pod, "CREATE", false)).await;
    assert_eq!(outcome, Outcome::Claimed);
    let out = patched(&pod, &answer);
    let estimate: Value = serde_json::from_str(
        out["metadata"]["annotations"]["carma.io/estimate"]
            .as_str()
            .unwrap(),
    )
    .unwrap();
    // The same decision the extender makes at bind on the device-plugin path.
    let k8s: Pod = serde_json::from_value(pod.clone()).unwrap();
    let decision = decisions().compute(&k8s).unwrap();
    let carma_core::Reservation::Mib(mib) = decision.demand.reservation else {
        panic!("no estimate: {decision:?}");
    };
    assert_eq!(estimate["mib"], mib);
    assert_eq!(estimate["source"], decision.source.as_str());
    assert!(template_name(&out).starts_with(&format!("carma-gpu-g1-m{mib}-")));
}

#[tokio::test]
async fn an_exclusive_or_unsized_pod_takes_whole_gpus() {
    for annotations in [
        json!({"carma.io/exclusive": "true", "carma.io/gpu-memory": "8Gi"}),
        json!({}),
    ] {
        let store = Arc::new(Store::default());
        let pod = pod(annotations.clone(), Some("1"));
        let (answer, _) = admit(store.clone(), &review(&pod, "CREATE", false)).await;
        let out = patched(&pod, &answer);
        assert!(
            template_name(&out).starts_with("carma-gpu-g1-whole-"),
            "{annotations}"
        );
        assert_eq!(out["metadata"]["annotations"]["carma.io/exclusive"], "true");
        let t = serde_json::to_value(&store.made.lock()[0]).unwrap();
        let req = &t["spec"]["spec"]["devices"]["requests"][0]["exactly"];
        assert!(req.get("capacity").is_none());
        assert!(!req["tolerations"].as_array().unwrap().is_empty());
    }
}

#[tokio::test]
async fn pods_without_carma_gpu_updates_and_bound_pods_are_left_alone() {
    let gpu_pod = pod(json!({}), Some("1"));
    let mut bound = gpu_pod.clone();
    bound["spec"]["nodeName"] = json!("node-1");
    for (review, what) in [
        (review(&pod(json!({}), None), "CREATE", false), "no GPU"),
        (review(&gpu_pod, "UPDATE", false), "an update"),
        (review(&bound, "CREATE", false), "bound at creation"),
    ] {
        let store = Arc::new(Store::default());
        let (answer, outcome) = admit(store.clone(), &review).await;
        assert_eq!(outcome, Outcome::Unchanged, "{what}");
        assert_eq!(answer["allowed"], true, "{what}");
        assert!(answer.get("patch").is_none(), "{what}: {answer}");
        assert!(store.made.lock().is_empty(), "{what}");
    }
}

#[tokio::test]
async fn what_carma_cannot_judge_is_refused_with_the_reason_and_nothing_made() {
    let mut claimed = pod(json!({}), Some("1"));
    claimed["spec"]["resourceClaims"] =
        json!([{"name": "carma-gpu", "resourceClaimTemplateName": "mine"}]);
    for (pod, names) in [
        (
            pod(json!({"carma.io/gpu-memory": "lots"}), Some("1")),
            "carma.io/gpu-memory",
        ),
        (
            pod(json!({"carma.io/model-profile": "{not json"}), Some("1")),
            "carma.io/model-profile",
        ),
        (pod(json!({}), Some("one")), "carma.io/gpu"),
        (claimed, "\"carma-gpu\""),
    ] {
        let store = Arc::new(Store::default());
        let (answer, outcome) = admit(store.clone(), &review(&pod, "CREATE", false)).await;
        assert_eq!(outcome, Outcome::Refused);
        assert_eq!(answer["allowed"], false);
        let message = answer["status"]["message"].as_str().unwrap();
        assert!(message.contains(names), "{message} does not name {names}");
        assert!(store.made.lock().is_empty());
    }
}

#[tokio::test]
async fn a_template_that_cannot_be_provided_refuses_the_pod() {
    let store = Arc::new(Store {
        fail: true,
        ..Store::default()
    });
    let pod = pod(json!({"carma.io/gpu-memory": "4Gi"}), Some("1"));
    let (answer, outcome) = admit(store, &review(&pod, "CREATE", false)).await;
    assert_eq!(outcome, Outcome::Refused);
    let message = answer["status"]["message"].as_str().unwrap();
    assert!(
        message.contains("ResourceClaimTemplate ml/carma-gpu-g1-m4096-")
            && message.contains("managed-by"),
        "{message}"
    );
}

#[tokio::test]
async fn a_dry_run_is_answered_without_making_a_template() {
    let store = Arc::new(Store::default());
    let pod = pod(json!({"carma.io/gpu-memory": "4Gi"}), Some("1"));
    let (answer, outcome) = admit(store.clone(), &review(&pod, "CREATE", true)).await;
    assert_eq!(outcome, Outcome::Claimed);
    assert!(template_name(&patched(&pod, &answer)).starts_with("carma-gpu-g1-m4096-"));
    assert!(store.made.lock().is_empty());
}

fn router(store: Arc<Store>) -> (axum::Router, Arc<Extender>) {
    let (ext, _): (Arc<Extender>, _) = fixture_extender();
    let r = admission_router(
        Arc::clone(&ext),
        Arc::new(BarePodClaims::new("carma-gpu", store)),
    );
    (r, ext)
}

#[tokio::test]
async fn the_route_answers_a_review_with_the_requests_uid() {
    let (r, ext) = router(Arc::new(Store::default()));
    let pod = pod(json!({"carma.io/gpu-memory": "4Gi"}), Some("1"));
    let (status, body) = post(&r, "/mutate-pods", &review(&pod, "CREATE", false)).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(body["apiVersion"], "admission.k8s.io/v1");
    assert_eq!(body["kind"], "AdmissionReview");
    assert_eq!(body["response"]["uid"], "req-1");
    assert!(template_name(&patched(&pod, &body["response"])).starts_with("carma-gpu-g1-m4096-"));
    // Counted as a request of its own verb, and as a reservation by where its size came from.
    let (_, metrics) = get(&metrics_router(ext), "/metrics").await;
    assert!(
        metrics
            .contains(r#"carma_extender_requests_total{verb="mutate-pods",outcome="claimed"} 1"#),
        "{metrics}"
    );
    assert!(
        metrics.contains(r#"carma_extender_reservations_total{source="override"} 1"#),
        "{metrics}"
    );
}

#[tokio::test]
async fn malformed_reviews_get_400_and_other_paths_404() {
    let (r, _) = router(Arc::new(Store::default()));
    let (status, body) = post_raw(&r, "/mutate-pods", b"{not json".to_vec()).await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    assert!(
        body["Error"].as_str().unwrap().contains("/mutate-pods"),
        "{body}"
    );
    let (status, body) = post(
        &r,
        "/mutate-pods",
        &json!({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview"}),
    )
    .await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{body}");
    assert!(
        body["Error"]
            .as_str()
            .unwrap()
            .contains("without a request"),
        "{body}"
    );
    let (status, _) = post(&r, "/filter", &json!({})).await;
    assert_eq!(status, StatusCode::NOT_FOUND);
}
