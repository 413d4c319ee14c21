//! `/healthz`, `/readyz` and `/metrics` (axum).

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use axum::Router;
use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::IntoResponse;
use axum::routing::get;
use parking_lot::Mutex;

use crate::metrics::{CONTENT_TYPE, Metrics};

/// Liveness and readiness facts, updated by the parts of the plugin.
#[derive(Debug)]
pub struct Health {
    started: Instant,
    stale_after: Duration,
    last_sample: Mutex<Option<Instant>>,
    serving: AtomicBool,
    registered: AtomicBool,
}

impl Health {
    /// Health of a plugin sampling every `interval`.
    pub fn new(interval: Duration) -> Self {
        Self {
            started: Instant::now(),
            stale_after: (interval * 10).max(Duration::from_secs(30)),
            last_sample: Mutex::new(None),
            serving: AtomicBool::new(false),
            registered: AtomicBool::new(false),
        }
    }

    /// The telemetry loop took a sample.
    pub fn sampled(&self) {
        *self.last_sample.lock() = Some(Instant::now());
    }

    /// The gRPC server is (not) serving on the plugin socket.
    pub fn set_serving(&self, on: bool) {
        self.serving.store(on, Ordering::Relaxed);
    }

    /// The plugin is (not) registered with kubelet.
    pub fn set_registered(&self, on: bool) {
        self.registered.store(on, Ordering::Relaxed);
    }

    /// Whether kubelet has accepted the registration.
    pub fn registered(&self) -> bool {
        self.registered.load(Ordering::Relaxed)
    }

    /// Live: the telemetry loop is not stuck.
    pub fn live(&self) -> Result<String, String> {
        match *self.last_sample.lock() {
            Some(t) if t.elapsed() <= self.stale_after => Ok("ok".into()),
            Some(t) => Err(format!("no telemetry sample for {:?}", t.elapsed())),
            None if self.started.elapsed() <= self.stale_after * 2 => Ok("starting".into()),
            None => Err("no telemetry sample since start".into()),
        }
    }

    /// Ready: serving kubelet's API and at least one sample taken.
    pub fn ready(&self) -> Result<String, String> {
        let serving = self.serving.load(Ordering::Relaxed);
        let sampled = self.last_sample.lock().is_some();
        let registered = self.registered();
        let text = format!("serving={serving} sampled={sampled} registered={registered}");
        if serving && sampled {
            Ok(text)
        } else {
            Err(text)
        }
    }
}

#[derive(Debug, Clone)]
struct AppState {
    metrics: Arc<Metrics>,
    health: Arc<Health>,
}

/// The HTTP router.
pub fn router(metrics: Arc<Metrics>, health: Arc<Health>) -> Router {
    Router::new()
        .route("/healthz", get(healthz))
        .route("/readyz", get(readyz))
        .route("/metrics", get(metrics_handler))
        .with_state(AppState { metrics, health })
}

fn answer(r: Result<String, String>) -> (StatusCode, String) {
    match r {
        Ok(t) => (StatusCode::OK, t + "\n"),
        Err(t) => (StatusCode::SERVICE_UNAVAILABLE, t + "\n"),
    }
}

async fn healthz(State(s): State<AppState>) -> impl IntoResponse {
    answer(s.health.live())
}

async fn readyz(State(s): State<AppState>) -> impl IntoResponse {
    answer(s.health.ready())
}

async fn metrics_handler(State(s): State<AppState>) -> axum::response::Response {
    match s.metrics.encode() {
        Ok(body) => ([(header::CONTENT_TYPE, CONTENT_TYPE)], body).into_response(),
        Err(_) => (
            StatusCode::INTERNAL_SERVER_ERROR,
            "metrics encoding failed\n",
        )
            .into_response(),
    }
}
