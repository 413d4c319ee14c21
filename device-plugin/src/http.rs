//! The plugin's liveness and readiness ([`Health`]) and what it serves on `/healthz`, `/readyz` and
//! `/metrics` (the router is [`carma_http::health`]'s).

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use axum::Router;
use carma_http::health::{Check, Endpoints};
use parking_lot::Mutex;

use crate::metrics::Metrics;

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

/// What the plugin serves on `/healthz`, `/readyz` and `/metrics`.
#[derive(Debug)]
struct Served {
    metrics: Arc<Metrics>,
    health: Arc<Health>,
}

/// The plugin's texts end in a newline.
fn line(r: Result<String, String>) -> Check {
    r.map(|t| (t + "\n").into()).map_err(|t| (t + "\n").into())
}

impl Endpoints for Served {
    fn live(&self) -> Check {
        line(self.health.live())
    }

    fn ready(&self) -> Check {
        line(self.health.ready())
    }

    fn metrics(&self) -> Result<String, std::fmt::Error> {
        self.metrics.encode()
    }
}

/// The HTTP router.
pub fn router(metrics: Arc<Metrics>, health: Arc<Health>) -> Router {
    carma_http::health::router(Arc::new(Served { metrics, health }))
}

pub use carma_http::{IDLE_TIMEOUT, IdleListener, IdleTimeout};

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

    /// Status and body of `GET path`.
    async fn get(app: Router, path: &str) -> (u16, String) {
        use tower::ServiceExt;
        let request = axum::http::Request::get(path)
            .body(axum::body::Body::empty())
            .unwrap();
        let response = app.oneshot(request).await.unwrap();
        let status = response.status().as_u16();
        let body = axum::body::to_bytes(response.into_body(), 1 << 20)
            .await
            .unwrap();
        (status, String::from_utf8(body.to_vec()).unwrap())
    }

    #[tokio::test]
    async fn checks_answer_the_health_facts_line_by_line() {
        let health = Arc::new(Health::new(Duration::from_secs(1)));
        let app = router(Arc::new(Metrics::new("n1", 0.8)), health.clone());
        assert_eq!(
            get(app.clone(), "/healthz").await,
            (200, "starting\n".into())
        );
        assert_eq!(
            get(app.clone(), "/readyz").await,
            (503, "serving=false sampled=false registered=false\n".into())
        );
        health.sampled();
        health.set_serving(true);
        assert_eq!(get(app.clone(), "/healthz").await, (200, "ok\n".into()));
        assert_eq!(
            get(app.clone(), "/readyz").await,
            (200, "serving=true sampled=true registered=false\n".into())
        );
        let (status, body) = get(app, "/metrics").await;
        assert_eq!(status, 200);
        assert!(body.ends_with("# EOF\n"), "{body}");
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
        for (request, status, text) in [
            ("GET /nope", "HTTP/1.1 404", "no route GET /nope; routes: "),
            (
                "POST /metrics",
                "HTTP/1.1 405",
                "method POST is not allowed on /metrics; use GET (routes: ",
            ),
        ] {
            let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
            s.write_all(format!("{request} HTTP/1.1\r\nHost: x\r\nConnection: close\r\nContent-Length: 0\r\n\r\n").as_bytes())
                .await
                .unwrap();
            let answer = until_closed(&mut s).await;
            assert!(answer.starts_with(status), "{answer}");
            assert!(answer.contains(text), "{answer}");
            assert_eq!(
                answer.to_ascii_lowercase().contains("\r\nallow: get\r\n"),
                status.ends_with("405"),
                "{answer}"
            );
            assert!(answer.contains("GET /metrics"), "{answer}");
        }
    }
}
