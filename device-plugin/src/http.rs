//! `/healthz`, `/readyz` and `/metrics` (axum).

use std::future::Future;
use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use axum::Router;
use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::IntoResponse;
use axum::routing::get;
use parking_lot::Mutex;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

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
