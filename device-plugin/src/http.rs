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
        .fallback(no_route)
        .method_not_allowed_fallback(no_route)
        .with_state(AppState { metrics, health })
}

/// The answer to a request no route takes: 405 for a known path asked with
/// another method, else 404; the text names what was asked and the routes.
async fn no_route(method: axum::http::Method, uri: axum::http::Uri) -> (StatusCode, String) {
    const ROUTES: [&str; 3] = ["/healthz", "/readyz", "/metrics"];
    let path = uri.path();
    let status = if ROUTES.contains(&path) {
        StatusCode::METHOD_NOT_ALLOWED
    } else {
        StatusCode::NOT_FOUND
    };
    let shown: String = path.chars().take(256).collect();
    (
        status,
        format!("no route {method} {shown}; routes: GET /healthz, GET /readyz, GET /metrics\n"),
    )
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

pub use carma_net::{IDLE_TIMEOUT, IdleListener, IdleTimeout};

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    async fn start(idle: Duration) -> std::net::SocketAddr {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let app = router(
            Arc::new(Metrics::new("n1", 0.8)),
            Arc::new(Health::new(Duration::from_secs(1))),
        );
        tokio::spawn(async move {
            axum::serve(IdleListener::new(listener, idle), app)
                .await
                .unwrap();
        });
        addr
    }

    /// Read until the server closes the connection; everything read.
    async fn until_closed(s: &mut tokio::net::TcpStream) -> String {
        let mut out = Vec::new();
        let mut buf = [0u8; 4096];
        loop {
            match tokio::time::timeout(Duration::from_secs(10), s.read(&mut buf)).await {
                Ok(Ok(0)) | Ok(Err(_)) => return String::from_utf8_lossy(&out).into_owned(),
                Ok(Ok(n)) => out.extend_from_slice(&buf[..n]),
                Err(_) => panic!("the connection is still open after 10 s"),
            }
        }
    }

    #[tokio::test]
    async fn a_connection_that_sends_nothing_is_closed() {
        let addr = start(Duration::from_millis(300)).await;
        let start = Instant::now();
        let mut silent = tokio::net::TcpStream::connect(addr).await.unwrap();
        assert_eq!(until_closed(&mut silent).await, "");
        assert!(start.elapsed() < Duration::from_secs(3));
    }

    #[tokio::test]
    async fn unknown_paths_and_methods_are_explained() {
        let addr = start(Duration::from_secs(5)).await;
        for (request, status) in [
            ("GET /nope", "HTTP/1.1 404"),
            ("POST /metrics", "HTTP/1.1 405"),
        ] {
            let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
            s.write_all(format!("{request} HTTP/1.1\r\nHost: x\r\nConnection: close\r\nContent-Length: 0\r\n\r\n").as_bytes())
                .await
                .unwrap();
            let answer = until_closed(&mut s).await;
            assert!(answer.starts_with(status), "{answer}");
            assert!(answer.contains(&format!("no route {request}")), "{answer}");
            assert!(answer.contains("GET /metrics"), "{answer}");
        }
    }
}
