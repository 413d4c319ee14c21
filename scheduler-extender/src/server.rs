//! The HTTP server: routes, request decoding, metrics per verb, TLS, shutdown.

use std::future::Future;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::Router;
use axum::body::Bytes;
use axum::extract::{DefaultBodyLimit, FromRequest, Request, State};
use axum::http::{StatusCode, header};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Json, Response};
use axum::routing::{get, post};
use axum_server::tls_rustls::RustlsConfig;
use serde::Deserialize;
use thiserror::Error;

use crate::extender::Extender;
use crate::wire::{BadRequest, ExtenderArgs, ExtenderBindingArgs};

/// Largest request body accepted: a `NodeList` of thousands of full node objects
/// (`nodeCacheCapable: false`) is tens of MiB.
pub const BODY_LIMIT: usize = 256 * 1024 * 1024;

/// How long in-flight requests may finish after SIGTERM.
pub const SHUTDOWN_GRACE: Duration = Duration::from_secs(10);

/// Marks a verb's answer with its metric outcome.
#[derive(Debug, Clone, Copy)]
struct Outcome(&'static str);

/// Why a request body was refused: HTTP 400 (or 413 for a body over
/// [`BODY_LIMIT`]) with `{"Error": "..."}` naming the problem.
#[derive(Debug)]
pub struct WireRejection {
    status: StatusCode,
    message: String,
}

impl IntoResponse for WireRejection {
    fn into_response(self) -> Response {
        let mut r = (
            self.status,
            Json(BadRequest {
                error: self.message,
            }),
        )
            .into_response();
        r.extensions_mut().insert(Outcome("bad-request"));
        r
    }
}

/// A request body, read whatever its content type.
#[derive(Debug)]
pub struct Body {
    path: String,
    bytes: Bytes,
}

impl Body {
    /// Decode the body as JSON; the value may borrow from the body.
    pub fn decode<'a, T: Deserialize<'a>>(&'a self) -> Result<T, WireRejection> {
        serde_json::from_slice(&self.bytes).map_err(|e| WireRejection {
            status: StatusCode::BAD_REQUEST,
            message: format!("malformed {} request: {e}", self.path),
        })
    }
}

impl<S: Send + Sync> FromRequest<S> for Body {
    type Rejection = WireRejection;

    async fn from_request(req: Request, state: &S) -> Result<Self, Self::Rejection> {
        let path = req.uri().path().to_string();
        let bytes = Bytes::from_request(req, state)
            .await
            .map_err(|e| WireRejection {
                status: e.status(),
                message: format!("cannot read the {path} request body: {}", e.body_text()),
            })?;
        Ok(Body { path, bytes })
    }
}

fn answer<T: serde::Serialize>(body: T, outcome: &'static str) -> Response {
    let mut r = Json(body).into_response();
    r.extensions_mut().insert(Outcome(outcome));
    r
}

#[tracing::instrument(name = "filter", skip_all)]
async fn filter(State(ext): State<Arc<Extender>>, body: Result<Body, WireRejection>) -> Response {
    let body = match body {
        Ok(b) => b,
        Err(r) => return r.into_response(),
    };
    let args: ExtenderArgs<'_> = match body.decode() {
        Ok(a) => a,
        Err(r) => return r.into_response(),
    };
    let result = ext.filter(&args);
    let outcome = if result.error.is_empty() {
        "success"
    } else {
        "error"
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
    let result = ext.bind(&args).await;
    let outcome = if result.error.is_empty() {
        "success"
    } else {
        "error"
    };
    answer(result, outcome)
}

async fn healthz() -> &'static str {
    "ok\n"
}

async fn readyz(State(ext): State<Arc<Extender>>) -> Response {
    if ext.cluster().is_ready() {
        (StatusCode::OK, "ready\n").into_response()
    } else {
        (
            StatusCode::SERVICE_UNAVAILABLE,
            "cluster caches have not synced yet\n",
        )
            .into_response()
    }
}

async fn metrics(State(ext): State<Arc<Extender>>) -> Response {
    ext.refresh_gauges();
    (
        [(
            header::CONTENT_TYPE,
            "application/openmetrics-text; version=1.0.0; charset=utf-8",
        )],
        ext.metrics().encode(),
    )
        .into_response()
}

/// Counts and times every verb request.
async fn track(State(ext): State<Arc<Extender>>, req: Request, next: Next) -> Response {
    let verb = match req.uri().path().trim_start_matches('/') {
        "filter" => "filter",
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

/// The extender's routes: `POST /filter`, `/prioritize`, `/bind`; `GET /healthz`,
/// `/readyz`, `/metrics`.
pub fn router(ext: Arc<Extender>) -> Router {
    Router::new()
        .route("/filter", post(filter))
        .route("/prioritize", post(prioritize))
        .route("/bind", post(bind))
        .route_layer(middleware::from_fn_with_state(Arc::clone(&ext), track))
        .route("/healthz", get(healthz))
        .route("/readyz", get(readyz))
        .route("/metrics", get(metrics))
        .layer(DefaultBodyLimit::max(BODY_LIMIT))
        .with_state(ext)
}

/// Certificate and key files (PEM) for HTTPS.
#[derive(Debug, Clone)]
pub struct TlsFiles {
    /// Certificate chain.
    pub cert: PathBuf,
    /// Private key.
    pub key: PathBuf,
}

/// Why the server stopped with an error.
#[derive(Debug, Error)]
pub enum ServeError {
    /// The certificate or key cannot be loaded.
    #[error("loading TLS certificate {cert} and key {key}: {source}")]
    Tls {
        /// Certificate file.
        cert: PathBuf,
        /// Key file.
        key: PathBuf,
        /// Cause.
        #[source]
        source: std::io::Error,
    },
    /// Socket errors.
    #[error("serving HTTP: {0}")]
    Io(#[from] std::io::Error),
}

/// Install rustls' ring crypto provider for the process (idempotent).
pub fn install_crypto_provider() {
    // Fails only when a provider is already installed, which is fine.
    let _ = rustls::crypto::ring::default_provider().install_default();
}

/// Serve `router` on `listener` (HTTPS when `tls` is given) until `shutdown`
/// completes, then let in-flight requests finish for up to [`SHUTDOWN_GRACE`].
pub async fn serve(
    listener: std::net::TcpListener,
    router: Router,
    tls: Option<TlsFiles>,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<(), ServeError> {
    listener.set_nonblocking(true)?;
    let handle = axum_server::Handle::new();
    let on_signal = handle.clone();
    tokio::spawn(async move {
        shutdown.await;
        tracing::info!("shutting down");
        on_signal.graceful_shutdown(Some(SHUTDOWN_GRACE));
    });
    let service = router.into_make_service();
    match tls {
        None => {
            axum_server::from_tcp(listener)?
                .handle(handle)
                .serve(service)
                .await?
        }
        Some(files) => {
            install_crypto_provider();
            let config = RustlsConfig::from_pem_file(&files.cert, &files.key)
                .await
                .map_err(|source| ServeError::Tls {
                    cert: files.cert.clone(),
                    key: files.key.clone(),
                    source,
                })?;
            axum_server::from_tcp_rustls(listener, config)?
                .handle(handle)
                .serve(service)
                .await?
        }
    }
    Ok(())
}
