//! The operator's HTTP endpoints: `/healthz` (the process serves), `/readyz` (it
//! has reached the API server) and `/metrics` (OpenMetrics text), on the router of
//! [`carma_http::health`].

use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use axum::Router;
use carma_http::health::{Check, Endpoints};
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

/// What the operator serves on `/healthz`, `/readyz` and `/metrics`.
#[derive(Debug)]
struct Served {
    metrics: Arc<Metrics>,
    health: Arc<Health>,
}

impl Endpoints for Served {
    fn live(&self) -> Check {
        Ok("ok".into())
    }

    fn ready(&self) -> Check {
        if self.health.is_ready() {
            Ok("ready".into())
        } else {
            Err("not ready: the API server has not been reached yet".into())
        }
    }

    fn metrics(&self) -> std::result::Result<String, std::fmt::Error> {
        Ok(self.metrics.encode())
    }
}

/// The router serving the three endpoints.
pub fn router(metrics: Arc<Metrics>, health: Arc<Health>) -> Router {
    carma_http::health::router(Arc::new(Served { metrics, health }))
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

pub use carma_http::{IDLE_TIMEOUT, IdleListener, IdleTimeout};

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
        let live = get(addr, "/healthz").await;
        assert!(live.starts_with("HTTP/1.1 200"), "{live}");
        assert!(live.ends_with("\r\n\r\nok"), "{live}");
        let ready = get(addr, "/readyz").await;
        assert!(ready.starts_with("HTTP/1.1 503"), "{ready}");
        assert!(
            ready.ends_with("\r\n\r\nnot ready: the API server has not been reached yet"),
            "{ready}"
        );
        health.set_ready(true);
        let ready = get(addr, "/readyz").await;
        assert!(ready.starts_with("HTTP/1.1 200"), "{ready}");
        assert!(ready.ends_with("\r\n\r\nready"), "{ready}");
        let m = get(addr, "/metrics").await;
        assert!(m.starts_with("HTTP/1.1 200"), "{m}");
        assert!(m.contains("application/openmetrics-text"));
        assert!(m.contains("carma_operator_tasks{phase=\"Pending\"} 0"));
        assert!(get(addr, "/nope").await.starts_with("HTTP/1.1 404"));
        tx.send(()).unwrap();
        server.await.unwrap().unwrap();
    }
}
