//! The HTTP server: [`router`] (routes, request bodies, metrics per verb), TLS, and serving until
//! shutdown.
//!
//! * `admission` — the admission listener's `/mutate-pods`.
//! * `body` — reading a request body within its size and time limits.
//! * `routes` — the routes and their handlers.
//! * `tls` — HTTPS files, checked and reloaded while serving.

mod admission;
mod body;
mod routes;
mod tls;

use std::future::Future;
use std::io;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum_server::tls_rustls::RustlsConfig;
use thiserror::Error;

pub use admission::{ADMISSION_VERB, admission_router};
pub use body::{BIND_BODY_LIMIT, BODY_LIMIT, BODY_READ_TIMEOUT};
pub use routes::{
    BIND_CONCURRENCY, PLACEMENT_CONCURRENCY, metrics_router, router, router_with_limit,
};
pub use tls::{TLS_RELOAD_INTERVAL, TlsFiles, TlsSettings, install_crypto_provider};

pub use carma_http::IDLE_TIMEOUT;

/// How long in-flight requests may finish after SIGTERM.
pub const SHUTDOWN_GRACE: Duration = Duration::from_secs(10);

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
/// (see [`carma_http::IdleTimeout`]).
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
            let reloader = (!settings.reload_interval.is_zero()).then(|| {
                tokio::spawn(tls::reload_loop(settings.clone(), material, config.clone()))
            });
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

/// Wraps every accepted connection in [`carma_http::IdleTimeout`].
#[derive(Debug, Clone, Copy)]
struct IdleAcceptor(Duration);

impl<I, S> axum_server::accept::Accept<I, S> for IdleAcceptor {
    type Stream = carma_http::IdleTimeout<I>;
    type Service = S;
    type Future = std::future::Ready<io::Result<(carma_http::IdleTimeout<I>, S)>>;

    fn accept(&self, stream: I, service: S) -> Self::Future {
        std::future::ready(Ok((carma_http::IdleTimeout::new(stream, self.0), service)))
    }
}
