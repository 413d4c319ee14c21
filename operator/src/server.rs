//! The operator's HTTP endpoints: `/healthz` (the process serves), `/readyz` (it
//! has reached the API server) and `/metrics` (OpenMetrics text).

use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use axum::Router;
use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::IntoResponse;
use axum::routing::get;
use tokio::net::TcpListener;

use crate::error::{Error, Result};
use crate::metrics::Metrics;

/// Readiness shared between the parts of the operator.
#[derive(Debug, Default)]
pub struct Health {
    ready: AtomicBool,
}

impl Health {
    /// Mark the operator ready (it talked to the API server).
    pub fn set_ready(&self, ready: bool) {
        self.ready.store(ready, Ordering::Relaxed);
    }

    /// Whether `/readyz` answers 200.
    pub fn is_ready(&self) -> bool {
        self.ready.load(Ordering::Relaxed)
    }
}

#[derive(Debug, Clone)]
struct AppState {
    metrics: Arc<Metrics>,
    health: Arc<Health>,
}

/// The router serving the three endpoints.
pub fn router(metrics: Arc<Metrics>, health: Arc<Health>) -> Router {
    Router::new()
        .route("/healthz", get(|| async { "ok" }))
        .route("/readyz", get(readyz))
        .route("/metrics", get(metrics_text))
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

async fn readyz(State(s): State<AppState>) -> impl IntoResponse {
    if s.health.is_ready() {
        (StatusCode::OK, "ready")
    } else {
        (
            StatusCode::SERVICE_UNAVAILABLE,
            "not ready: the API server has not been reached yet",
        )
    }
}

async fn metrics_text(State(s): State<AppState>) -> impl IntoResponse {
    (
        [(
            header::CONTENT_TYPE,
            "application/openmetrics-text; version=1.0.0; charset=utf-8",
        )],
        s.metrics.encode(),
    )
}

/// Bind the metrics address (errors surface before anything else starts).
pub async fn bind(addr: SocketAddr) -> Result<TcpListener> {
    TcpListener::bind(addr)
        .await
        .map_err(|source| Error::Server { addr, source })
}

/// Serve until `shutdown` completes, closing connections idle for [`IDLE_TIMEOUT`].
pub async fn serve(
    listener: TcpListener,
    metrics: Arc<Metrics>,
    health: Arc<Health>,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<()> {
    serve_with_timeout(listener, metrics, health, IDLE_TIMEOUT, shutdown).await
}

/// [`serve`], closing connections that wait `idle_timeout` for a request.
pub async fn serve_with_timeout(
    listener: TcpListener,
    metrics: Arc<Metrics>,
    health: Arc<Health>,
    idle_timeout: Duration,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<()> {
    let addr = listener
        .local_addr()
        .unwrap_or_else(|_| SocketAddr::from(([0, 0, 0, 0], 0)));
    axum::serve(
        IdleListener::new(listener, idle_timeout),
        router(metrics, health),
    )
    .with_graceful_shutdown(shutdown)
    .await
    .map_err(|source| Error::Server { addr, source })
}

pub use carma_net::{IDLE_TIMEOUT, IdleListener, IdleTimeout};

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    async fn get(addr: SocketAddr, path: &str) -> String {
        let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
        s.write_all(
            format!("GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n").as_bytes(),
        )
        .await
        .unwrap();
        let mut out = String::new();
        s.read_to_string(&mut out).await.unwrap();
        out
    }

    #[tokio::test]
    async fn endpoints() {
        let listener = bind("127.0.0.1:0".parse().unwrap()).await.unwrap();
        let addr = listener.local_addr().unwrap();
        let health = Arc::new(Health::default());
        let (tx, rx) = tokio::sync::oneshot::channel::<()>();
        let server = tokio::spawn(serve(
            listener,
            Arc::new(Metrics::new()),
            health.clone(),
            async move {
                let _ = rx.await;
            },
        ));
        assert!(get(addr, "/healthz").await.starts_with("HTTP/1.1 200"));
        assert!(get(addr, "/readyz").await.starts_with("HTTP/1.1 503"));
        health.set_ready(true);
        assert!(get(addr, "/readyz").await.starts_with("HTTP/1.1 200"));
        let m = get(addr, "/metrics").await;
        assert!(m.starts_with("HTTP/1.1 200"), "{m}");
        assert!(m.contains("application/openmetrics-text"));
        assert!(m.contains("carma_operator_tasks{phase=\"Pending\"} 0"));
        assert!(get(addr, "/nope").await.starts_with("HTTP/1.1 404"));
        tx.send(()).unwrap();
        server.await.unwrap().unwrap();
    }
}
