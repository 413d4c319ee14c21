//! The admission listener's one route, `POST /mutate-pods`: the API server's AdmissionReview for a
//! pod creation, answered by [`BarePodClaims`]. It is served on its own listener
//! (`--admission-listen`) because the API server presents no client certificate, while the verbs'
//! listener may require kube-scheduler's.

use std::sync::Arc;
use std::time::Instant;

use axum::Router;
use axum::extract::{DefaultBodyLimit, State};
use axum::http::{Method, Uri};
use axum::response::{IntoResponse, Json, Response};
use axum::routing::post;
use carma_http::health::no_route;
use k8s_openapi::api::core::v1::Pod;
use kube::core::admission::{AdmissionRequest, AdmissionReview};

use super::body::{BODY_LIMIT, Body, BodyLimit, WireRejection};
use crate::admission::BarePodClaims;
use crate::verbs::Extender;

/// The metrics' verb label of admission requests.
pub const ADMISSION_VERB: &str = "mutate-pods";

const ROUTES: &[(&str, &str)] = &[("POST", "/mutate-pods")];

#[derive(Clone)]
struct Admission {
    ext: Arc<Extender>,
    claims: Arc<BarePodClaims>,
}

#[tracing::instrument(name = "mutate_pods", skip_all)]
async fn mutate_pods(
    State(state): State<Admission>,
    body: Result<Body, WireRejection>,
) -> Response {
    let start = Instant::now();
    let (response, outcome) = answer(&state, body).await;
    state
        .ext
        .metrics()
        .request(ADMISSION_VERB, outcome, start.elapsed().as_secs_f64());
    response
}

async fn answer(state: &Admission, body: Result<Body, WireRejection>) -> (Response, &'static str) {
    let review: AdmissionReview<Pod> = match body.and_then(|b| b.decode()) {
        Ok(r) => r,
        Err(r) => return (r.into_response(), "bad-request"),
    };
    let request: AdmissionRequest<Pod> = match review.try_into() {
        Ok(r) => r,
        Err(_) => {
            let rejection = WireRejection::bad_request(
                "malformed /mutate-pods request: an AdmissionReview without a request",
            );
            return (rejection.into_response(), "bad-request");
        }
    };
    let admitted = state.claims.admit(state.ext.decisions(), &request).await;
    if let Some(source) = &admitted.source {
        state.ext.metrics().reservation(source);
    }
    (
        Json(admitted.response.into_review()).into_response(),
        admitted.outcome.as_str(),
    )
}

/// `POST /mutate-pods` only; bodies over [`BODY_LIMIT`] are refused with HTTP 413 (a review holds
/// one pod, which etcd caps at 1.5 MiB).
pub fn admission_router(ext: Arc<Extender>, claims: Arc<BarePodClaims>) -> Router {
    let unrouted = |method: Method, uri: Uri| async move { no_route(ROUTES, &method, &uri) };
    Router::new()
        .route("/mutate-pods", post(mutate_pods))
        .with_state(Admission { ext, claims })
        .fallback(unrouted)
        .method_not_allowed_fallback(unrouted)
        .layer(DefaultBodyLimit::max(BODY_LIMIT))
        .layer(axum::Extension(BodyLimit(BODY_LIMIT)))
}
