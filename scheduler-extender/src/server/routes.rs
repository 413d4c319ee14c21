//! The routes: the verbs (`filter`, `prioritize`, `bind`, and `choose`, which is `filter` answering
//! only the node carma would bind to), each counted and timed, and health, readiness and metrics (the
//! router of [`carma_http::health`], merged in, or alone on the plain-HTTP listener); a request that
//! no route takes gets [`carma_http::health::no_route`] with the routes served.

use std::convert::Infallible;
use std::sync::Arc;
use std::time::Instant;

use axum::Router;
use axum::extract::{DefaultBodyLimit, Request, State};
use axum::http::{Method, Uri};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Json, Response};
use axum::routing::post;
use carma_http::health::{self, Check, Endpoints, no_route};
use tower::limit::GlobalConcurrencyLimitLayer;
use tracing::Instrument;

use super::body::{BIND_BODY_LIMIT, BODY_LIMIT, Body, BodyLimit, Outcome, WireRejection};
use crate::clip::{LOGGED_INPUT_LIMIT, clip};
use crate::verbs::Extender;
use crate::wire::{ExtenderArgs, ExtenderBindingArgs, ExtenderBindingResult, ExtenderFilterResult};

/// `/filter`, `/choose` and `/prioritize` requests handled at once (body read, decoded and judged); more wait
/// their turn. Each may hold a body of up to [`BODY_LIMIT`] while it is read (for at most
/// [`BODY_READ_TIMEOUT`](super::BODY_READ_TIMEOUT)); decoding and judging run on the runtime's
/// workers, one request each at a time. kube-scheduler calls these verbs from its one scheduling
/// loop; eight turns leave room for retries and a second profile while a few stalled callers cannot
/// hold every turn (docs/hostile-input.md).
pub const PLACEMENT_CONCURRENCY: usize = 8;

/// `/bind` requests handled at once; more wait their turn. kube-scheduler binds from goroutines,
/// many at a time. A bind whose caller hung up runs on to its end without a turn (see `bind`).
pub const BIND_CONCURRENCY: usize = 128;

/// Cut every reason longer than [`LOGGED_INPUT_LIMIT`]: a reason quoting a pod's
/// annotation is shared by every candidate node, and 5,000 copies of a 256 KiB
/// annotation would make a 1.3 GB answer. Nodes sharing a reason keep sharing it.
fn clip_reasons(map: &mut crate::wire::ReasonMap<'_>) {
    let mut last: Option<(Arc<str>, Arc<str>)> = None;
    for (_, reason) in &mut map.0 {
        if reason.len() <= LOGGED_INPUT_LIMIT {
            continue;
        }
        let clipped = match &last {
            Some((from, to)) if Arc::ptr_eq(from, reason) => Arc::clone(to),
            _ => {
                let to: Arc<str> = Arc::from(clip(reason).as_ref());
                last = Some((Arc::clone(reason), Arc::clone(&to)));
                to
            }
        };
        *reason = clipped;
    }
}

/// Cuts a verb's error text for the answer and names the outcome the metrics count it under.
fn clip_error(error: &mut String) -> &'static str {
    if let std::borrow::Cow::Owned(e) = clip(error) {
        *error = e;
    }
    if error.is_empty() { "success" } else { "error" }
}

fn answer<T: serde::Serialize>(body: T, outcome: &'static str) -> Response {
    let mut r = Json(body).into_response();
    r.extensions_mut().insert(Outcome(outcome));
    r
}

#[tracing::instrument(name = "filter", skip_all)]
async fn filter(State(ext): State<Arc<Extender>>, body: Result<Body, WireRejection>) -> Response {
    filter_like(body, |args| ext.filter(args))
}

/// `filter` answering only the node carma would bind the pod to ([`Extender::choose`]).
#[tracing::instrument(name = "choose", skip_all)]
async fn choose(State(ext): State<Arc<Extender>>, body: Result<Body, WireRejection>) -> Response {
    filter_like(body, |args| ext.choose(args))
}

/// Decode a filter-shaped request, run `verb` on it and answer with its reasons and error clipped.
fn filter_like(
    body: Result<Body, WireRejection>,
    verb: impl for<'a, 'b> FnOnce(&'a ExtenderArgs<'b>) -> ExtenderFilterResult<'a>,
) -> Response {
    let body = match body {
        Ok(b) => b,
        Err(r) => return r.into_response(),
    };
    let args: ExtenderArgs<'_> = match body.decode() {
        Ok(a) => a,
        Err(r) => return r.into_response(),
    };
    let mut result = verb(&args);
    clip_reasons(&mut result.failed_nodes);
    clip_reasons(&mut result.failed_and_unresolvable_nodes);
    let outcome = match clip_error(&mut result.error) {
        "error" if result.retry => "retry",
        outcome => outcome,
    };
    answer(result, outcome)
}

#[tracing::instrument(name = "prioritize", skip_all)]
async fn prioritize(
    State(ext): State<Arc<Extender>>,
    body: Result<Body, WireRejection>,
) -> Response {
    let body = match body {
        Ok(b) => b,
        Err(r) => return r.into_response(),
    };
    match body.decode::<ExtenderArgs<'_>>() {
        Ok(args) => answer(ext.prioritize(&args), "success"),
        Err(r) => r.into_response(),
    }
}

#[tracing::instrument(name = "bind", skip_all)]
async fn bind(State(ext): State<Arc<Extender>>, body: Result<Body, WireRejection>) -> Response {
    let args: ExtenderBindingArgs = match body.and_then(|b| b.decode()) {
        Ok(a) => a,
        Err(r) => return r.into_response(),
    };
    // kube-scheduler hangs up on a bind after its `httpTimeout`, which drops this handler. Once
    // the GPUs are booked the bind must end on its own, written or released: a bind cut off
    // between the booking and the write would leave GPUs reserved for a pod that is never bound
    // and refuse every retry of it. So it runs on a task of its own; its answer is dropped when
    // nobody waits for it any more.
    let task =
        tokio::spawn(async move { ext.bind(&args).await }.instrument(tracing::Span::current()));
    let mut result = match task.await {
        Ok(r) => r,
        Err(e) => ExtenderBindingResult {
            error: format!("the bind stopped before it ended: {e}"),
            decision: None,
        },
    };
    let outcome = clip_error(&mut result.error);
    answer(result, outcome)
}

/// What the extender serves on `/healthz`, `/readyz` and `/metrics`, on both of its routers.
struct Served(Arc<Extender>);

impl Endpoints for Served {
    fn live(&self) -> Check {
        Ok("ok\n".into())
    }

    fn ready(&self) -> Check {
        if self.0.cluster().is_ready() {
            Ok("ready\n".into())
        } else {
            Err("cluster caches have not synced yet\n".into())
        }
    }

    /// [`Metrics::encode`](crate::metrics::Metrics::encode) writes into a `String`, which cannot
    /// fail, so this is never an error.
    fn metrics(&self) -> Result<String, std::fmt::Error> {
        self.0.refresh_gauges();
        Ok(self.0.metrics().encode())
    }
}

/// Counts and times every verb request.
async fn track(State(ext): State<Arc<Extender>>, req: Request, next: Next) -> Response {
    let verb = match req.uri().path().trim_start_matches('/') {
        "filter" => "filter",
        "choose" => "choose",
        "prioritize" => "prioritize",
        "bind" => "bind",
        _ => return next.run(req).await,
    };
    let start = Instant::now();
    let resp = next.run(req).await;
    let outcome = resp.extensions().get::<Outcome>().map_or("error", |o| o.0);
    ext.metrics()
        .request(verb, outcome, start.elapsed().as_secs_f64());
    resp
}

/// The routes of [`router`]: the verbs, then [`health::ROUTES`].
const ROUTES: &[(&str, &str)] = &[
    ("POST", "/filter"),
    ("POST", "/choose"),
    ("POST", "/prioritize"),
    ("POST", "/bind"),
    ("GET", "/healthz"),
    ("GET", "/readyz"),
    ("GET", "/metrics"),
];

/// The extender's routes: `POST /filter`, `/choose`, `/prioritize`, `/bind`; `GET /healthz`,
/// `/readyz`, `/metrics`. Bodies over [`BODY_LIMIT`] are refused.
pub fn router(ext: Arc<Extender>) -> Router {
    router_with_limit(ext, BODY_LIMIT)
}

/// [`router`] refusing bodies over `max_body_bytes` with HTTP 413.
pub fn router_with_limit(ext: Arc<Extender>, max_body_bytes: usize) -> Router {
    let unrouted = |method: Method, uri: Uri| async move { no_route(ROUTES, &method, &uri) };
    let health = health::routes(Arc::new(Served(Arc::clone(&ext))));
    let placement = GlobalConcurrencyLimitLayer::new(PLACEMENT_CONCURRENCY);
    let bind_limit = max_body_bytes.min(BIND_BODY_LIMIT);
    Router::new()
        .route("/filter", post(filter).layer(placement.clone()))
        .route("/choose", post(choose).layer(placement.clone()))
        .route("/prioritize", post(prioritize).layer(placement))
        .route(
            "/bind",
            post(bind).layer::<_, Infallible>(
                tower::ServiceBuilder::new()
                    .layer(axum::Extension(BodyLimit(bind_limit)))
                    .layer(DefaultBodyLimit::max(bind_limit))
                    .layer(GlobalConcurrencyLimitLayer::new(BIND_CONCURRENCY)),
            ),
        )
        .route_layer(middleware::from_fn_with_state(Arc::clone(&ext), track))
        .with_state(ext)
        .merge(health)
        .fallback(unrouted)
        .method_not_allowed_fallback(unrouted)
        .layer(DefaultBodyLimit::max(max_body_bytes))
        .layer(axum::Extension(BodyLimit(max_body_bytes)))
}

/// Only `GET /healthz`, `/readyz` and `/metrics` ([`carma_http::health::router`], answered as on
/// [`router`]): the routes of the separate plain-HTTP listener (`--metrics-listen`), for kubelet
/// probes and Prometheus when the main listener requires client certificates.
pub fn metrics_router(ext: Arc<Extender>) -> Router {
    health::router(Arc::new(Served(ext)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_route_list_ends_with_the_health_routes() {
        assert_eq!(&ROUTES[4..], health::ROUTES);
    }
}
