//! What a node agent knows of one pod bound to its node: read from the Pod once, then used by
//! the telemetry (which pod's memory is on which GPU), the simulated backend's synthetic pods and
//! the device plugin's Allocate. Reading it from a `k8s-openapi` Pod takes the `kube` feature.

use carma_api::{AnnotationError, Assignment};

/// What a node agent needs to know about one pod bound to this node.
#[derive(Debug, Clone, PartialEq)]
pub struct PodInfo {
    /// Namespace.
    pub namespace: String,
    /// Name.
    pub name: String,
    /// UID.
    pub uid: String,
    /// `spec.nodeName`.
    pub node_name: Option<String>,
    /// `spec.schedulerName` (`default-scheduler` when unset).
    pub scheduler_name: String,
    /// `status.phase`.
    pub phase: Option<String>,
    /// Whether the pod is being deleted.
    pub terminating: bool,
    /// Sum of the containers' `carma.io/gpu` requests (limits, else requests).
    pub gpu_request: u32,
    /// `carma.io/gpu` of each container that asks for any, in the order kubelet admits them (one
    /// Allocate each): init containers first, then app containers, each in spec order.
    pub gpu_containers: Vec<u32>,
    /// How many of `gpu_containers` are init containers.
    pub gpu_init_containers: usize,
    /// The extender's assignment, `Ok(None)` when the pod carries none.
    pub assignment: Result<Option<Assignment>, AnnotationError>,
    /// `carma.io/task` label, when set.
    pub task: Option<String>,
    /// Whether this is a synthetic pod of the simulated backend (namespace `simulated`).
    pub simulated: bool,
}

impl PodInfo {
    /// Read the fields carma needs from a pod.
    #[cfg(feature = "kube")]
    pub fn from_pod(pod: &k8s_openapi::api::core::v1::Pod) -> Self {
        use std::collections::BTreeMap;

        use carma_api::names::LABEL_TASK;

        let meta = &pod.metadata;
        let empty = BTreeMap::new();
        let annotations = meta.annotations.as_ref().unwrap_or(&empty);
        let spec = pod.spec.as_ref();
        // A malformed count is the extender's to reject; here it asks for nothing.
        let gpus_of = |c: &k8s_openapi::api::core::v1::Container| {
            carma_api::resources::container_gpus(c).unwrap_or(0)
        };
        let init: Vec<u32> = spec
            .map(|s| s.init_containers.iter().flatten().map(gpus_of).collect())
            .unwrap_or_default();
        let app: Vec<u32> = spec
            .map(|s| s.containers.iter().map(gpus_of).collect())
            .unwrap_or_default();
        let gpu_request = app.iter().fold(0u32, |a, b| a.saturating_add(*b));
        let gpu_init_containers = init.iter().filter(|n| **n > 0).count();
        let gpu_containers: Vec<u32> = init.into_iter().chain(app).filter(|n| *n > 0).collect();
        Self {
            namespace: meta.namespace.clone().unwrap_or_default(),
            name: meta.name.clone().unwrap_or_default(),
            uid: meta.uid.clone().unwrap_or_default(),
            node_name: spec.and_then(|s| s.node_name.clone()),
            scheduler_name: spec
                .and_then(|s| s.scheduler_name.clone())
                .unwrap_or_else(|| "default-scheduler".to_string()),
            phase: pod.status.as_ref().and_then(|s| s.phase.clone()),
            terminating: meta.deletion_timestamp.is_some(),
            gpu_request,
            gpu_containers,
            gpu_init_containers,
            assignment: Assignment::from_annotations(annotations),
            task: meta
                .labels
                .as_ref()
                .and_then(|l| l.get(LABEL_TASK).cloned()),
            simulated: false,
        }
    }

    /// `namespace/name`.
    pub fn key(&self) -> String {
        format!("{}/{}", self.namespace, self.name)
    }

    /// Whether the pod has ended (its GPUs are free again).
    pub fn finished(&self) -> bool {
        matches!(self.phase.as_deref(), Some("Succeeded") | Some("Failed"))
    }

    /// The assignment, when the pod has a well-formed one.
    pub fn assignment(&self) -> Option<&Assignment> {
        self.assignment.as_ref().ok().and_then(Option::as_ref)
    }

    /// Whether the pod holds (or is about to hold) GPUs of this node: assigned and not finished.
    pub fn occupies_gpus(&self) -> bool {
        !self.finished() && self.assignment().is_some()
    }
}
