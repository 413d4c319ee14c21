//! What the extender writes, and where it reads pods it has not seen: the
//! Kubernetes API ([`crate::kube_backend::KubeBackend`]) or a dry run over a
//! snapshot ([`crate::snapshot::SnapshotBackend`]).

use std::collections::BTreeMap;

use futures::future::BoxFuture;
use k8s_openapi::api::core::v1::Pod;
use thiserror::Error;

/// The pod a bind is about.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BindTarget {
    /// Namespace.
    pub namespace: String,
    /// Name.
    pub name: String,
    /// UID (a precondition of both writes).
    pub uid: String,
    /// Node chosen by kube-scheduler.
    pub node: String,
}

/// A pod carma warns about (an Event in a cluster, a log line in a dry run).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PodWarning {
    /// Namespace.
    pub namespace: String,
    /// Name.
    pub name: String,
    /// UID.
    pub uid: String,
    /// Event reason, e.g. `InvalidCarmaAnnotation`.
    pub reason: &'static str,
    /// Human message naming what to fix.
    pub note: String,
}

/// Why a write or read against the cluster failed.
#[derive(Debug, Error)]
pub enum BackendError {
    /// Creating the Binding failed: nothing was written (the API server sets the pod's node and
    /// merges the Binding's annotations into the pod in one update, or does neither).
    #[error("binding pod {pod} to node {node}: {source}")]
    Binding {
        /// `namespace/name`.
        pod: String,
        /// Node.
        node: String,
        /// The API error.
        #[source]
        source: kube::Error,
    },
    /// Reading the pod failed.
    #[error("reading pod {pod}: {source}")]
    Get {
        /// `namespace/name`.
        pod: String,
        /// The API error.
        #[source]
        source: kube::Error,
    },
}

impl BackendError {
    /// Whether the pod lost a race rather than the write failing: it is gone or was replaced
    /// (404; the UID precondition of the Binding), or another binder got there first
    /// (409). kube-scheduler retries such a pod like any conflict.
    pub fn lost_race(&self) -> bool {
        let source = match self {
            BackendError::Binding { source, .. } | BackendError::Get { source, .. } => source,
        };
        matches!(source, kube::Error::Api(status) if status.code == 404 || status.code == 409)
    }
}

/// The I/O side of the extender.
pub trait ClusterBackend: Send + Sync + std::fmt::Debug {
    /// `true` when nothing is written to a cluster (snapshot mode).
    fn dry_run(&self) -> bool;

    /// The pod, for a bind whose filter this process did not see (e.g. after a
    /// restart). `None` when it does not exist.
    fn get_pod<'a>(
        &'a self,
        namespace: &'a str,
        name: &'a str,
    ) -> BoxFuture<'a, Result<Option<Pod>, BackendError>>;

    /// Create the Binding, carrying the output `annotations` (when given): one write, which sets
    /// the pod's node and its annotations together.
    fn bind<'a>(
        &'a self,
        target: &'a BindTarget,
        annotations: Option<&'a BTreeMap<String, String>>,
    ) -> BoxFuture<'a, Result<(), BackendError>>;

    /// Tell the pod's owner that carma cannot schedule it. Must not block:
    /// filter calls it on its hot path.
    fn warn_pod(&self, warning: PodWarning);
}
