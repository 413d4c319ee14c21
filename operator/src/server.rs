//! The operator's HTTP endpoints: `/healthz` (the process serves), `/readyz` (it
//! has reached the API server) and `/metrics` (OpenMetrics text).

use std::future::Future;
use std::io;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::task::{Context, Poll};
use std::time::Duration;

use axum::Router;
use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::IntoResponse;
use axum::routing::get;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
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

/// How long a connection may wait for a request (the first, or the next one on
/// a kept-alive connection) before it is closed.
pub const IDLE_TIMEOUT: Duration = Duration::from_secs(30);

/// A listener whose connections are closed when they wait longer than a
/// timeout for a request (see [`IdleTimeout`]).
#[derive(Debug)]
pub struct IdleListener {
    inner: tokio::net::TcpListener,
    timeout: Duration,
}

impl IdleListener {
    /// Wrap `inner`.
    pub fn new(inner: tokio::net::TcpListener, timeout: Duration) -> Self {
        Self { inner, timeout }
    }
}

impl axum::serve::Listener for IdleListener {
    type Io = IdleTimeout<tokio::net::TcpStream>;
    type Addr = std::net::SocketAddr;

    async fn accept(&mut self) -> (Self::Io, Self::Addr) {
        let (io, addr) = axum::serve::Listener::accept(&mut self.inner).await;
        (IdleTimeout::new(io, self.timeout), addr)
    }

    fn local_addr(&self) -> std::io::Result<Self::Addr> {
        self.inner.local_addr()
    }
}

/// A connection that fails with `TimedOut` (and is closed) when it waits longer
/// than its timeout for a request: from when it opens, or from the last bytes
/// written to the next bytes read. A peer that connects and sends nothing, or
/// keeps an idle connection, is let go; time spent handling a request (after
/// reading, before writing) does not count.
#[derive(Debug)]
pub struct IdleTimeout<S> {
    inner: S,
    timeout: Duration,
    /// Bytes were written since the last read (or nothing happened yet).
    awaiting_request: bool,
    deadline: Option<Pin<Box<tokio::time::Sleep>>>,
}

impl<S> IdleTimeout<S> {
    /// Wrap `inner`.
    pub fn new(inner: S, timeout: Duration) -> Self {
        Self {
            inner,
            timeout,
            awaiting_request: true,
            deadline: None,
        }
    }

    /// Bytes were written: the wait for the next request starts now. The
    /// deadline is polled here, with the writer's waker, because the reader
    /// may already be parked on the socket and not poll again until it fires.
    fn wrote(&mut self, cx: &mut Context<'_>) {
        self.awaiting_request = true;
        let at = tokio::time::Instant::now() + self.timeout;
        let deadline = match &mut self.deadline {
            Some(d) => {
                d.as_mut().reset(at);
                d
            }
            None => self.deadline.insert(Box::pin(tokio::time::sleep_until(at))),
        };
        let _ = deadline.as_mut().poll(cx);
    }
}

impl<S: AsyncRead + Unpin> AsyncRead for IdleTimeout<S> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let before = buf.filled().len();
        let this = &mut *self;
        match Pin::new(&mut this.inner).poll_read(cx, buf) {
            Poll::Ready(Ok(())) => {
                if buf.filled().len() > before {
                    this.awaiting_request = false;
                    this.deadline = None;
                }
                Poll::Ready(Ok(()))
            }
            Poll::Pending if this.awaiting_request => {
                let timeout = this.timeout;
                let deadline = this
                    .deadline
                    .get_or_insert_with(|| Box::pin(tokio::time::sleep(timeout)));
                match deadline.as_mut().poll(cx) {
                    Poll::Ready(()) => Poll::Ready(Err(io::Error::new(
                        io::ErrorKind::TimedOut,
                        format!("no request within {timeout:?}"),
                    ))),
                    Poll::Pending => Poll::Pending,
                }
            }
            other => other,
        }
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for IdleTimeout<S> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let this = &mut *self;
        let r = Pin::new(&mut this.inner).poll_write(cx, buf);
        if matches!(r, Poll::Ready(Ok(n)) if n > 0) {
            this.wrote(cx);
        }
        r
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let this = &mut *self;
        let r = Pin::new(&mut this.inner).poll_write_vectored(cx, bufs);
        if matches!(r, Poll::Ready(Ok(n)) if n > 0) {
            this.wrote(cx);
        }
        r
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

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
