//! `carma-scheduler-extender`: the kube-scheduler HTTP extender of carma.
//!
//! kube-scheduler (profile `carma-scheduler`) calls it to **filter** nodes that
//! can take a pod on enough GPUs, **prioritize** them by the pod's placement
//! policy, and **bind** the pod: choose the GPUs, write the output annotations,
//! create the Binding. Placement rules live in `carma-core`; memory estimates
//! come from `carma-estimator`; this crate adapts them to HTTP and Kubernetes.
//!
//! A request goes [`server`] → [`verbs`], which asks [`pod_decision`] what the pod
//! needs and [`node_verdicts`] whether each node can take it, on the [`cluster`] view.
//!
//! * [`wire`] — the extender's JSON, exactly as kube-scheduler speaks it.
//! * [`server`] — axum routes, request bodies, TLS and graceful shutdown.
//! * [`verbs`] — [`Extender`]: the three verbs, filter, prioritize and bind.
//! * [`pod_decision`] — per pod: GPU count, reservation per GPU and policy, cached by UID.
//! * [`node_verdicts`] — per node and demand: passes with a score or fails with a
//!   reason, from `carma-core`, reused while nothing it depends on changed.
//! * [`cluster`] — GPU nodes, telemetry and the ledger of placements.
//! * [`handoff`] — one kubelet admission at a time per node, for bind.
//! * [`history`] — reservations learned from `MemoryHistory` records.
//! * [`recovery_queue`] — recovery attempts waiting for GPUs (recovery first).
//! * [`watched_pod`] — the pods of the pod watch, decoded to the fields the extender reads.
//! * [`admission`] — bare pods on the DRA path: `carma.io/gpu` replaced by a sized claim.
//! * [`backend`] — the I/O side: [`kube_backend`] (watchers, Binding,
//!   Events) or [`snapshot`] (a static `List`, binds recorded instead of written).
//! * [`metrics`] — Prometheus metrics.
//! * [`clip`] — request-derived text cut short for logs, Events and answers.
//! * `synthetic` (feature `test-fixtures`; kept in `fixtures/`, outside `src/`) — generated
//!   clusters and pods for tests, benchmarks and examples.

pub mod admission;
pub mod backend;
pub mod clip;
pub mod cluster;
pub mod handoff;
pub mod history;
pub mod kube_backend;
pub mod metrics;
pub mod node_verdicts;
pub mod pod_decision;
pub mod recovery_queue;
pub mod server;
pub mod snapshot;
#[cfg(any(test, feature = "test-fixtures"))]
#[path = "../fixtures/synthetic.rs"]
pub mod synthetic;
pub mod verbs;
pub mod watched_pod;
pub mod wire;

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;

use carma_core::{HistoryConfig, PlacementConfig, Policy};
use carma_estimator::{Estimator, EstimatorError};
use thiserror::Error;

pub use backend::{BindTarget, ClusterBackend, PodWarning};
pub use cluster::ClusterState;
pub use pod_decision::{Decision, DecisionError, Decisions};
pub use server::{
    TlsFiles, TlsSettings, metrics_router, router, router_with_limit, serve, serve_with,
    serve_with_timeout,
};
pub use snapshot::{Snapshot, SnapshotBackend};
pub use verbs::Extender;

/// How to run the extender.
#[derive(Debug, Clone)]
pub struct Options {
    /// Address to listen on.
    pub listen: SocketAddr,
    /// A second, plain-HTTP address serving only `/healthz`, `/readyz` and
    /// `/metrics` (for probes and Prometheus when `listen` requires client
    /// certificates). `None`: those routes are only on `listen`.
    pub metrics_listen: Option<SocketAddr>,
    /// Serve from this snapshot instead of the API server (dry run).
    pub cluster_snapshot: Option<PathBuf>,
    /// Policy of pods without a `carma.io/policy` annotation.
    pub policy: Policy,
    /// HTTPS certificate and key, and the CAs of required client certificates.
    pub tls: Option<TlsSettings>,
    /// Placement thresholds.
    pub placement: PlacementConfig,
    /// Reservations learned from `MemoryHistory` records.
    pub history: HistoryConfig,
    /// Largest request body accepted; larger ones get HTTP 413
    /// ([`server::BODY_LIMIT`] by default).
    pub max_body_bytes: usize,
    /// How long a connection may wait for a request before it is closed
    /// ([`server::IDLE_TIMEOUT`] by default), on every listener.
    pub idle_timeout: std::time::Duration,
    /// Serve the bare-pod admission webhook ([`admission`]).
    pub admission: Option<AdmissionOptions>,
}

/// The admission webhook's listener and the claims it makes.
#[derive(Debug, Clone)]
pub struct AdmissionOptions {
    /// Address of the HTTPS listener serving only `/mutate-pods`, with `Options::tls`'s serving
    /// certificate and no client certificate asked for (the API server presents none).
    pub listen: SocketAddr,
    /// The DeviceClass the claims name.
    pub device_class: String,
}

/// Why the extender could not start or stopped.
#[derive(Debug, Error)]
pub enum RunError {
    /// The compiled-in estimator models failed to load.
    #[error("loading the GPU memory estimator: {0}")]
    Estimator(#[from] EstimatorError),
    /// The snapshot file is unusable.
    #[error(transparent)]
    Snapshot(#[from] snapshot::SnapshotError),
    /// No Kubernetes client could be configured.
    #[error("connecting to Kubernetes (in-cluster config or KUBECONFIG): {0}")]
    Kube(#[from] kube::Error),
    /// The address cannot be bound.
    #[error("listening on {addr}: {source}")]
    Listen {
        /// Address.
        addr: SocketAddr,
        /// Cause.
        #[source]
        source: std::io::Error,
    },
    /// Serving failed.
    #[error(transparent)]
    Serve(#[from] server::ServeError),
    /// The admission webhook was asked for where it cannot be served.
    #[error("--admission-listen: {0}")]
    Admission(&'static str),
}

impl RunError {
    /// Whether the error is the user's input (exit code 2) rather than the environment.
    pub fn is_bad_input(&self) -> bool {
        matches!(
            self,
            RunError::Snapshot(_)
                | RunError::Admission(_)
                | RunError::Serve(server::ServeError::Tls { .. })
                | RunError::Serve(server::ServeError::ClientCa { .. })
        )
    }
}

/// An extender over a snapshot: caches filled and synced, binds recorded.
pub fn snapshot_extender(
    snapshot: &Snapshot,
    policy: Policy,
    placement: PlacementConfig,
    history: HistoryConfig,
) -> Result<Arc<Extender>, EstimatorError> {
    let cluster = Arc::new(ClusterState::new());
    let decisions = Decisions::new(Estimator::new()?, policy).with_history(history);
    snapshot.apply(&cluster);
    snapshot.apply_history(decisions.history());
    Ok(Arc::new(Extender::new(
        cluster,
        decisions,
        Arc::new(SnapshotBackend::new(snapshot)),
        placement,
    )))
}

/// Run the extender until `shutdown` completes (the CLI passes SIGTERM / Ctrl-C).
pub async fn run(
    opts: Options,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> Result<(), RunError> {
    let mut watchers = Vec::new();
    let mut claims = None;
    if opts.admission.is_some() {
        if opts.cluster_snapshot.is_some() {
            return Err(RunError::Admission(
                "admission makes claim templates in a cluster; it cannot serve a --cluster-snapshot",
            ));
        }
        if opts.tls.is_none() {
            return Err(RunError::Admission(
                "the API server calls admission webhooks over HTTPS only: give --tls-cert and --tls-key",
            ));
        }
    }
    let ext = match &opts.cluster_snapshot {
        Some(path) => {
            let snapshot = Snapshot::load(path)?;
            tracing::info!(
                file = %path.display(),
                nodes = snapshot.nodes.len(),
                gpu_nodes = snapshot.gpu_nodes.len(),
                pods = snapshot.pods.len(),
                "serving a cluster snapshot (dry run: binds are recorded, not written)"
            );
            snapshot_extender(&snapshot, opts.policy, opts.placement.clone(), opts.history)?
        }
        None => {
            let client = kube::Client::try_default().await?;
            let ext = Arc::new(Extender::new(
                Arc::new(ClusterState::new()),
                Decisions::new(Estimator::new()?, opts.policy).with_history(opts.history),
                Arc::new(kube_backend::KubeBackend::new(client.clone())),
                opts.placement.clone(),
            ));
            claims = opts.admission.as_ref().map(|a| {
                Arc::new(admission::BarePodClaims::new(
                    a.device_class.clone(),
                    Arc::new(admission::KubeTemplates::new(client.clone())),
                ))
            });
            watchers = kube_backend::spawn_watchers(client, Arc::clone(&ext));
            ext
        }
    };
    let listener = std::net::TcpListener::bind(opts.listen).map_err(|source| RunError::Listen {
        addr: opts.listen,
        source,
    })?;
    let metrics_listener = match opts.metrics_listen {
        Some(addr) => Some(
            std::net::TcpListener::bind(addr)
                .map_err(|source| RunError::Listen { addr, source })?,
        ),
        None => None,
    };
    let admission_listener = match &opts.admission {
        Some(a) => {
            Some(
                std::net::TcpListener::bind(a.listen).map_err(|source| RunError::Listen {
                    addr: a.listen,
                    source,
                })?,
            )
        }
        None => None,
    };
    tracing::info!(
        listen = %opts.listen,
        metrics_listen = ?opts.metrics_listen,
        admission_listen = ?opts.admission.as_ref().map(|a| a.listen),
        https = opts.tls.is_some(),
        client_certificates = opts.tls.as_ref().is_some_and(|t| t.client_ca.is_some()),
        policy = %opts.policy,
        "carma scheduler extender serving"
    );
    let shutdown = futures::FutureExt::shared(shutdown);
    let metrics_server = metrics_listener.map(|l| {
        tokio::spawn(serve_with_timeout(
            l,
            metrics_router(Arc::clone(&ext)),
            None,
            opts.idle_timeout,
            shutdown.clone(),
        ))
    });
    // The API server presents no client certificate: the admission listener serves the same
    // certificate without asking for one.
    let admission_server = admission_listener.zip(claims).map(|(l, claims)| {
        let tls = opts.tls.clone().map(|t| TlsSettings {
            client_ca: None,
            ..t
        });
        tokio::spawn(serve_with_timeout(
            l,
            server::admission_router(Arc::clone(&ext), claims),
            tls,
            opts.idle_timeout,
            shutdown.clone(),
        ))
    });
    let result = serve_with_timeout(
        listener,
        router_with_limit(ext, opts.max_body_bytes),
        opts.tls.clone(),
        opts.idle_timeout,
        shutdown,
    )
    .await;
    for w in watchers {
        w.abort();
    }
    // The shared shutdown has fired (or the main server failed): the other listeners stop with it.
    for (server, what) in [
        (metrics_server, "the metrics listener failed"),
        (admission_server, "the admission listener failed"),
    ] {
        let Some(server) = server else { continue };
        if result.is_err() {
            server.abort();
        } else if let Ok(Err(e)) = server.await {
            tracing::warn!(error = %e, "{what}");
        }
    }
    result?;
    Ok(())
}
