//! `carma-api`: the Kubernetes face of carma.
//!
//! * [`names`] — API group, resource, annotation, label and scheduler names.
//! * [`annotations`] — reading and writing the pod annotations the parts share.
//! * [`training_task`] — the `TrainingTask` custom resource.
//! * [`gpu_node`] — the `GpuNode` custom resource the device plugin publishes.
//! * [`memory_history`] — the `MemoryHistory` custom resource: observed peaks per model profile.
//! * [`crds`] — the generated CustomResourceDefinitions.
//! * [`dra`] — the DRA driver's names and taints, and the claim templates that book GPU memory.
//!
//! Without the `kube` feature (on by default) only the names, the annotations and the `GpuNode`
//! spec and status types are built, with no kube-rs or `k8s-openapi`.

pub mod annotations;
pub mod condition;
#[cfg(feature = "kube")]
pub mod crds;
#[cfg(feature = "kube")]
pub mod dra;
pub mod gpu_node;
#[cfg(feature = "kube")]
pub mod memory_history;
pub mod names;
#[cfg(feature = "kube")]
pub mod resources;
#[cfg(feature = "kube")]
pub mod training_task;

pub use annotations::{AnnotationError, Assignment, EstimateAnnotation, PodRequest};
pub use condition::Condition;
#[cfg(feature = "kube")]
pub use gpu_node::GpuNode;
pub use gpu_node::{
    CONDITION_OTHER_DEVICE_PLUGIN, EndedPodPeak, GpuNodeSpec, GpuNodeStatus, GpuPodStatus,
    GpuStatus, MemoryEnforcement,
};
#[cfg(feature = "kube")]
pub use memory_history::{MemoryHistory, MemoryHistorySpec, MemoryHistoryStatus, PeakSample};
#[cfg(feature = "kube")]
pub use training_task::{
    AttemptOutcomeKind, AttemptStatus, EstimateStatus, RecoverySpec, TaskPhase, TrainingTask,
    TrainingTaskSpec, TrainingTaskStatus,
};
