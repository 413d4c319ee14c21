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

/// Only `GET /healthz`, `/readyz` and `/metrics`: the routes of the separate
/// plain-HTTP listener (`--metrics-listen`), for kubelet probes and Prometheus
/// when the main listener requires client certificates.
pub fn metrics_router(ext: Arc<Extender>) -> Router {
    Router::new()
        .route("/healthz", get(healthz))
        .route("/readyz", get(readyz))
        .route("/metrics", get(metrics))
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
        let chain = CertificateDer::pem_slice_iter(&m.cert)
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| tls_err(invalid(format!("unreadable certificate PEM: {e}"))))?;
        if chain.is_empty() {
            return Err(tls_err(invalid(
                "the certificate file holds no CERTIFICATE block".into(),
            )));
        }
        let key = PrivateKeyDer::from_pem_slice(&m.key)
            .map_err(|e| tls_err(invalid(format!("no usable private key: {e}"))))?;

        let provider = Arc::new(rustls::crypto::ring::default_provider());
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
            let served = axum_server::from_tcp_rustls(listener, config)?
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
