//! Errors of the operator.

use thiserror::Error;

/// Why a reconcile (or the operator itself) failed.
#[derive(Debug, Error)]
pub enum Error {
    /// A call to the Kubernetes API failed.
    #[error("Kubernetes API: {0}")]
    Kube(#[from] kube::Error),
    /// The object lacks metadata the API server always sets (name, namespace, uid).
    #[error("TrainingTask has no {0}")]
    MissingMetadata(&'static str),
    /// The attempt pod's name is taken by a pod this task does not own.
    #[error("pod {pod} already exists and is not owned by TrainingTask {task}")]
    PodConflict {
        /// The pod name.
        pod: String,
        /// The task.
        task: String,
    },
    /// A claim template of the wanted name exists and cannot stand for the wanted one.
    #[error("ResourceClaimTemplate {namespace}/{name} cannot be used: {}", why.as_str())]
    ClaimTemplate {
        /// Its namespace.
        namespace: String,
        /// Its name.
        name: String,
        /// Why not.
        why: carma_api::dra::template::Unusable,
    },
    /// Encoding a patch or annotation failed.
    #[error("serialization: {0}")]
    Serialization(#[from] serde_json::Error),
    /// The operator's own configuration is unusable.
    #[error("configuration: {0}")]
    Config(String),
    /// Binding the metrics server failed.
    #[error("metrics server on {addr}: {source}")]
    Server {
        /// The address.
        addr: std::net::SocketAddr,
        /// The I/O error.
        source: std::io::Error,
    },
}

impl Error {
    /// A short, stable label for the `kind` of `carma_operator_reconcile_errors_total`.
    pub fn kind(&self) -> &'static str {
        match self {
            Error::Kube(kube::Error::Api(s)) if s.is_not_found() => "not_found",
            Error::Kube(kube::Error::Api(s)) if s.is_conflict() => "conflict",
            Error::Kube(kube::Error::Api(s)) if s.is_forbidden() => "forbidden",
            Error::Kube(kube::Error::Api(s)) if s.is_invalid() => "invalid",
            Error::Kube(kube::Error::Api(_)) => "api",
            Error::Kube(_) => "transport",
            Error::MissingMetadata(_) => "metadata",
            Error::PodConflict { .. } => "pod_conflict",
            Error::ClaimTemplate { .. } => "claim_template",
            Error::Serialization(_) => "serialization",
            Error::Config(_) => "config",
            Error::Server { .. } => "server",
        }
    }
}

/// Result with the operator's [`enum@Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;
