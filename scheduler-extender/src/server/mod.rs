//! The HTTP server: routes, request decoding, metrics per verb, TLS, shutdown.

use std::convert::Infallible;
use std::future::Future;
use std::io;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::Router;
use axum::body::Bytes;
use axum::extract::{DefaultBodyLimit, FromRequest, Request, State};
use axum::http::{Method, StatusCode, Uri, header};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Json, Response};
use axum::routing::{get, post};
use axum_server::tls_rustls::RustlsConfig;
use serde::Deserialize;
use thiserror::Error;
use tower::limit::GlobalConcurrencyLimitLayer;

use crate::extender::Extender;
use crate::wire::{BadRequest, ExtenderArgs, ExtenderBindingArgs};

/// Largest request body accepted by default (`--max-request-bytes`). The chart
/// sets `nodeCacheCapable: true`, so a request is one Pod (etcd keeps objects
/// under 1.5 MiB) and the candidate node names (5,000 nodes: ~100 KB). The
/// worst body of this size that decodes keeps the extender's peak memory well
/// under the chart's 256Mi limit (docs/hostile-input.md). A scheduler that sends full
/// Node objects (`nodeCacheCapable: false`) needs a larger limit and more memory.
pub const BODY_LIMIT: usize = 4 * 1024 * 1024;

pub use carma_net::IDLE_TIMEOUT;

/// `/filter` and `/prioritize` requests handled at once (body read, decoded and judged); more wait
/// their turn. Each may hold a body of up to [`BODY_LIMIT`] while it is read (for at most
/// [`BODY_READ_TIMEOUT`]); decoding and judging run on the runtime's workers, one request each at a
/// time. kube-scheduler calls these verbs from its one scheduling loop; eight turns leave room for
/// retries and a second profile while a few stalled callers cannot hold every turn
/// (docs/hostile-input.md).
pub const PLACEMENT_CONCURRENCY: usize = 8;

/// How long a request body may take to arrive once its handler runs; then HTTP 408. It bounds how
/// long a caller that stalls mid-body holds one of the turns above.
pub const BODY_READ_TIMEOUT: Duration = Duration::from_secs(10);

/// `/bind` requests handled at once; more wait their turn. kube-scheduler binds from goroutines,
/// many at a time.
pub const BIND_CONCURRENCY: usize = 128;

/// Largest `/bind` body: four names of at most 253 bytes and a UID fit in well under 1 KiB.
pub const BIND_BODY_LIMIT: usize = 64 * 1024;

/// Longest request-derived text written into a log line, an Event or an error
/// answer; longer text is cut by [`clip`].
pub const LOGGED_INPUT_LIMIT: usize = 512;

/// `text` cut to at most [`LOGGED_INPUT_LIMIT`] bytes (on a character
/// boundary), followed by `… (N bytes)` naming the full length when cut.
pub fn clip(text: &str) -> std::borrow::Cow<'_, str> {
    if text.len() <= LOGGED_INPUT_LIMIT {
        return std::borrow::Cow::Borrowed(text);
    }
    let mut end = LOGGED_INPUT_LIMIT;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    std::borrow::Cow::Owned(format!("{}… ({} bytes)", &text[..end], text.len()))
}

/// How long in-flight requests may finish after SIGTERM.
pub const SHUTDOWN_GRACE: Duration = Duration::from_secs(10);

/// Marks a verb's answer with its metric outcome.
#[derive(Debug, Clone, Copy)]
struct Outcome(&'static str);

/// Why a request body was refused: HTTP 400 (or 413 for a body over the
/// limit, [`BODY_LIMIT`] by default) with `{"Error": "..."}` naming the problem.
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
        // serde's messages quote the offending value, which may be megabytes.
        serde_json::from_slice(&self.bytes).map_err(|e| WireRejection {
            status: StatusCode::BAD_REQUEST,
            message: format!("malformed {} request: {}", self.path, clip(&e.to_string())),
        })
    }
}

impl<S: Send + Sync> FromRequest<S> for Body {
    type Rejection = WireRejection;

    async fn from_request(req: Request, state: &S) -> Result<Self, Self::Rejection> {
        let path = req.uri().path().to_string();
        let limit = req.extensions().get::<BodyLimit>().map(|l| l.0);
        let read = tokio::time::timeout(BODY_READ_TIMEOUT, Bytes::from_request(req, state));
        let Ok(read) = read.await else {
            return Err(WireRejection {
                status: StatusCode::REQUEST_TIMEOUT,
                message: format!(
                    "the {path} request body did not arrive within {} s",
                    BODY_READ_TIMEOUT.as_secs()
                ),
            });
        };
        let bytes = read.map_err(|e| WireRejection {
            status: e.status(),
            message: match (e.status(), limit) {
                (StatusCode::PAYLOAD_TOO_LARGE, Some(limit)) if path == "/bind" => format!(
                    "the /bind request body is larger than {limit} bytes, the limit for binds \
                     (a bind names a pod, its namespace, its UID and a node)"
                ),
                (StatusCode::PAYLOAD_TOO_LARGE, Some(limit)) => format!(
                    "the {path} request body is larger than the extender's limit of {limit} \
                     bytes (--max-request-bytes)"
                ),
                _ => format!("cannot read the {path} request body: {}", e.body_text()),
            },
        })?;
        Ok(Body { path, bytes })
    }
}

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
    let mut result = ext.filter(&args);
    clip_reasons(&mut result.failed_nodes);
    clip_reasons(&mut result.failed_and_unresolvable_nodes);
    if let std::borrow::Cow::Owned(e) = clip(&result.error) {
        result.error = e;
    }
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
    let mut result = ext.bind(&args).await;
    if let std::borrow::Cow::Owned(e) = clip(&result.error) {
        result.error = e;
    }
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

/// The body limit in force, for the 413 answer's message.
#[derive(Debug, Clone, Copy)]
struct BodyLimit(usize);

/// The routes of [`router`].
const ROUTES: &[(&str, &str)] = &[
    ("POST", "/filter"),
    ("POST", "/prioritize"),
    ("POST", "/bind"),
    ("GET", "/healthz"),
    ("GET", "/readyz"),
    ("GET", "/metrics"),
];

/// The routes of [`metrics_router`].
const METRICS_ROUTES: &[(&str, &str)] = ROUTES.split_at(3).1;

/// The answer to a request no route takes: 405 (with `Allow`) for a known path
/// asked with another method, else 404; the text names what was asked and the
/// routes served.
fn no_route(
    routes: &'static [(&'static str, &'static str)],
    method: &Method,
    uri: &Uri,
) -> Response {
    let path = uri.path();
    let list = routes
        .iter()
        .map(|(m, p)| format!("{m} {p}"))
        .collect::<Vec<_>>()
        .join(", ");
    match routes.iter().find(|(_, p)| *p == path) {
        Some((allowed, _)) => (
            StatusCode::METHOD_NOT_ALLOWED,
            [(header::ALLOW, *allowed)],
            format!("method {method} is not allowed on {path}; use {allowed} (routes: {list})\n"),
        )
            .into_response(),
        None => (
            StatusCode::NOT_FOUND,
            format!("no route {method} {}; routes: {list}\n", clip(path)),
        )
            .into_response(),
    }
}

/// The extender's routes: `POST /filter`, `/prioritize`, `/bind`; `GET /healthz`,
/// `/readyz`, `/metrics`. Bodies over [`BODY_LIMIT`] are refused.
pub fn router(ext: Arc<Extender>) -> Router {
    router_with_limit(ext, BODY_LIMIT)
}

/// [`router`] refusing bodies over `max_body_bytes` with HTTP 413.
pub fn router_with_limit(ext: Arc<Extender>, max_body_bytes: usize) -> Router {
    let unrouted = |method: Method, uri: Uri| async move { no_route(ROUTES, &method, &uri) };
    let placement = GlobalConcurrencyLimitLayer::new(PLACEMENT_CONCURRENCY);
    let bind_limit = max_body_bytes.min(BIND_BODY_LIMIT);
    Router::new()
        .route("/filter", post(filter).layer(placement.clone()))
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
        .route("/healthz", get(healthz))
        .route("/readyz", get(readyz))
        .route("/metrics", get(metrics))
        .fallback(unrouted)
        .method_not_allowed_fallback(unrouted)
        .layer(DefaultBodyLimit::max(max_body_bytes))
        .layer(axum::Extension(BodyLimit(max_body_bytes)))
        .with_state(ext)
}

/// Only `GET /healthz`, `/readyz` and `/metrics`: the routes of the separate
/// plain-HTTP listener (`--metrics-listen`), for kubelet probes and Prometheus
/// when the main listener requires client certificates.
pub fn metrics_router(ext: Arc<Extender>) -> Router {
    let unrouted =
        |method: Method, uri: Uri| async move { no_route(METRICS_ROUTES, &method, &uri) };
    Router::new()
        .route("/healthz", get(healthz))
        .route("/readyz", get(readyz))
        .route("/metrics", get(metrics))
        .fallback(unrouted)
        .method_not_allowed_fallback(unrouted)
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

/// How often [`serve_with`] re-reads the TLS files by default.
pub const TLS_RELOAD_INTERVAL: Duration = Duration::from_secs(30);

/// HTTPS settings: the server's certificate and, optionally, the CAs whose
/// client certificates the server requires.
#[derive(Debug, Clone)]
pub struct TlsSettings {
    /// The server's certificate chain and key.
    pub files: TlsFiles,
    /// PEM bundle of CA certificates. When set, every connection must present a
    /// client certificate that chains to one of them (mutual TLS); a client
    /// without one, or with one from another CA, fails the handshake. `None`:
    /// any client may connect.
    pub client_ca: Option<PathBuf>,
    /// How often the files are read again; a changed certificate, key or CA
    /// bundle applies to new connections without a restart (cert-manager and
    /// the kubelet replace mounted Secrets in place). Zero: never.
    pub reload_interval: Duration,
}

impl From<TlsFiles> for TlsSettings {
    fn from(files: TlsFiles) -> Self {
        TlsSettings {
            files,
            client_ca: None,
            reload_interval: TLS_RELOAD_INTERVAL,
        }
    }
}

/// The bytes of the TLS files, as last read.
#[derive(Debug, PartialEq, Eq)]
struct TlsMaterial {
    cert: Vec<u8>,
    key: Vec<u8>,
    client_ca: Option<Vec<u8>>,
}

impl TlsSettings {
    /// Read the files.
    fn read(&self) -> Result<TlsMaterial, ServeError> {
        let tls_err = |source| ServeError::Tls {
            cert: self.files.cert.clone(),
            key: self.files.key.clone(),
            source,
        };
        let cert = std::fs::read(&self.files.cert).map_err(tls_err)?;
        let key = std::fs::read(&self.files.key).map_err(tls_err)?;
        let client_ca = match &self.client_ca {
            Some(path) => Some(std::fs::read(path).map_err(|source| ServeError::ClientCa {
                path: path.clone(),
                source,
            })?),
            None => None,
        };
        Ok(TlsMaterial {
            cert,
            key,
            client_ca,
        })
    }

    /// Build the rustls configuration from what [`TlsSettings::read`] returned.
    fn build(&self, m: &TlsMaterial) -> Result<rustls::ServerConfig, ServeError> {
        use rustls::pki_types::pem::PemObject;
        use rustls::pki_types::{CertificateDer, PrivateKeyDer};

        let invalid = |what: String| std::io::Error::new(std::io::ErrorKind::InvalidData, what);
        let tls_err = |source| ServeError::Tls {
            cert: self.files.cert.clone(),
            key: self.files.key.clone(),
            source,
        };
        let cert_path = self.files.cert.display();
        let key_path = self.files.key.display();
        let chain = CertificateDer::pem_slice_iter(&m.cert)
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| {
                tls_err(invalid(format!(
                    "certificate file {cert_path}: unreadable PEM: {e}"
                )))
            })?;
        if chain.is_empty() {
            return Err(tls_err(invalid(format!(
                "certificate file {cert_path}: {}",
                pem_contents(&m.cert, "CERTIFICATE")
            ))));
        }
        let key = PrivateKeyDer::from_pem_slice(&m.key).map_err(|e| {
            let what = match e {
                rustls::pki_types::pem::Error::NoItemsFound => pem_contents(&m.key, "PRIVATE KEY"),
                e => format!("unreadable PEM: {e}"),
            };
            tls_err(invalid(format!("key file {key_path}: {what}")))
        })?;
        // Checked here so that the error names the file at fault; rustls'
        // own messages ("peer sent no certificates", "keys are inconsistent")
        // name neither.
        let provider = rustls::crypto::ring::default_provider();
        let signing_key = provider
            .key_provider
            .load_private_key(key.clone_key())
            .map_err(|e| {
                tls_err(invalid(format!(
                    "key file {key_path}: unusable private key: {e}"
                )))
            })?;
        match rustls::sign::CertifiedKey::new(chain.clone(), signing_key).keys_match() {
            Ok(()) | Err(rustls::Error::InconsistentKeys(rustls::InconsistentKeys::Unknown)) => {}
            Err(rustls::Error::InconsistentKeys(_)) => {
                return Err(tls_err(invalid(format!(
                    "the private key in {key_path} does not match the first certificate in \
                     {cert_path}"
                ))));
            }
            Err(e) => {
                return Err(tls_err(invalid(format!(
                    "certificate file {cert_path}: the first certificate is not valid: {e}"
                ))));
            }
        }

        let provider = Arc::new(provider);
        let builder = rustls::ServerConfig::builder_with_provider(Arc::clone(&provider))
            .with_safe_default_protocol_versions()
            .map_err(|e| tls_err(invalid(e.to_string())))?;
        let builder = match (&self.client_ca, &m.client_ca) {
            (Some(path), Some(pem)) => {
                let ca_err = |what: String| ServeError::ClientCa {
                    path: path.clone(),
                    source: invalid(what),
                };
                let mut roots = rustls::RootCertStore::empty();
                for cert in CertificateDer::pem_slice_iter(pem) {
                    let cert = cert.map_err(|e| ca_err(format!("unreadable PEM: {e}")))?;
                    roots
                        .add(cert)
                        .map_err(|e| ca_err(format!("not a CA certificate: {e}")))?;
                }
                if roots.is_empty() {
                    return Err(ca_err("the file holds no CERTIFICATE block".into()));
                }
                let verifier = rustls::server::WebPkiClientVerifier::builder_with_provider(
                    Arc::new(roots),
                    provider,
                )
                .build()
                .map_err(|e| ca_err(e.to_string()))?;
                builder.with_client_cert_verifier(verifier)
            }
            _ => builder.with_no_client_auth(),
        };
        let mut config = builder
            .with_single_cert(chain, key)
            .map_err(|e| tls_err(invalid(e.to_string())))?;
        config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
        Ok(config)
    }

    /// Read the files and build the rustls configuration.
    pub fn load(&self) -> Result<rustls::ServerConfig, ServeError> {
        self.build(&self.read()?)
    }
}

/// What a PEM file that lacks the `wanted` block holds instead, for an error
/// message: not PEM at all, nothing, or blocks of other kinds.
fn pem_contents(pem: &[u8], wanted: &str) -> String {
    let text = String::from_utf8_lossy(pem);
    let labels: Vec<&str> = text
        .lines()
        .filter_map(|l| l.trim().strip_prefix("-----BEGIN ")?.strip_suffix("-----"))
        .collect();
    if text.trim().is_empty() {
        "the file is empty".into()
    } else if labels.is_empty() {
        format!("not PEM (no \"-----BEGIN {wanted}-----\" line)")
    } else {
        format!(
            "holds no {wanted} block (found: {})",
            clip(&labels.join(", "))
        )
    }
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
    /// The CA bundle for client certificates cannot be loaded.
    #[error("loading the client CA bundle {path}: {source}")]
    ClientCa {
        /// CA bundle file.
        path: PathBuf,
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
/// Client certificates are not asked for; see [`serve_with`].
pub async fn serve(
    listener: std::net::TcpListener,
    router: Router,
    tls: Option<TlsFiles>,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<(), ServeError> {
    serve_with(listener, router, tls.map(TlsSettings::from), shutdown).await
}

/// [`serve`] with full HTTPS settings: client-certificate verification and
/// reloading of the files while serving.
pub async fn serve_with(
    listener: std::net::TcpListener,
    router: Router,
    tls: Option<TlsSettings>,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<(), ServeError> {
    serve_with_timeout(listener, router, tls, IDLE_TIMEOUT, shutdown).await
}

/// [`serve_with`], closing connections that wait `idle_timeout` for a request
/// (see [`carma_net::IdleTimeout`]).
pub async fn serve_with_timeout(
    listener: std::net::TcpListener,
    router: Router,
    tls: Option<TlsSettings>,
    idle_timeout: Duration,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<(), ServeError> {
    listener.set_nonblocking(true)?;
    let idle = IdleAcceptor(idle_timeout);
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
                .acceptor(idle)
                .handle(handle)
                .serve(service)
                .await?
        }
        Some(settings) => {
            install_crypto_provider();
            let material = settings.read()?;
            let config = RustlsConfig::from_config(Arc::new(settings.build(&material)?));
            tracing::info!(
                cert = %settings.files.cert.display(),
                client_ca = ?settings.client_ca,
                "HTTPS{}",
                if settings.client_ca.is_some() {
                    " with required client certificates"
                } else {
                    ""
                }
            );
            let reloader = (!settings.reload_interval.is_zero())
                .then(|| tokio::spawn(reload_loop(settings.clone(), material, config.clone())));
            let served = axum_server::from_tcp(listener)?
                .acceptor(axum_server::tls_rustls::RustlsAcceptor::new(config).acceptor(idle))
                .handle(handle)
                .serve(service)
                .await;
            if let Some(r) = reloader {
                r.abort();
            }
            served?
        }
    }
    Ok(())
}

/// Wraps every accepted connection in [`carma_net::IdleTimeout`].
#[derive(Debug, Clone, Copy)]
struct IdleAcceptor(Duration);

impl<I, S> axum_server::accept::Accept<I, S> for IdleAcceptor {
    type Stream = carma_net::IdleTimeout<I>;
    type Service = S;
    type Future = std::future::Ready<io::Result<(carma_net::IdleTimeout<I>, S)>>;

    fn accept(&self, stream: I, service: S) -> Self::Future {
        std::future::ready(Ok((carma_net::IdleTimeout::new(stream, self.0), service)))
    }
}

/// Every `reload_interval`, read the TLS files again and swap in a new
/// configuration when their contents changed. A configuration that does not
/// build (a half-written file, a key that does not match) is reported and the
/// previous one kept.
async fn reload_loop(settings: TlsSettings, mut current: TlsMaterial, config: RustlsConfig) {
    let mut tick = tokio::time::interval(settings.reload_interval);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    tick.tick().await;
    let mut last_error = None;
    loop {
        tick.tick().await;
        let next = settings.read().and_then(|m| {
            if m == current {
                Ok(None)
            } else {
                settings.build(&m).map(|c| Some((m, c)))
            }
        });
        match next {
            Ok(None) => last_error = None,
            Ok(Some((m, c))) => {
                config.reload_from_config(Arc::new(c));
                current = m;
                last_error = None;
                tracing::info!(
                    cert = %settings.files.cert.display(),
                    "reloaded the TLS certificate, key and client CA bundle"
                );
            }
            Err(e) => {
                let text = e.to_string();
                if last_error.as_ref() != Some(&text) {
                    tracing::warn!(error = %text, "TLS files changed but cannot be used; keeping the previous ones");
                    last_error = Some(text);
                }
            }
        }
    }
}
