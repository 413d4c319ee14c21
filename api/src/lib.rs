//! `carma-api`: the Kubernetes face of carma.
//!
//! * [`names`] — API group, resource, annotation, label and scheduler names.
//! * [`annotations`] — reading and writing the pod annotations the parts share.
//! * [`training_task`] — the `TrainingTask` custom resource.
//! * [`gpu_node`] — the `GpuNode` custom resource the device plugin publishes.
//! * [`memory_history`] — the `MemoryHistory` custom resource: observed peaks per model profile.
//! * [`crds`] — the generated CustomResourceDefinitions.
//! * [`dra`] — the DRA driver's names and taints, and the claim templates that book GPU memory.

pub mod annotations;
pub mod condition;
pub mod crds;
pub mod dra;
pub mod gpu_node;
pub mod memory_history;
pub mod names;
pub mod resources;
pub mod training_task;

pub use annotations::{AnnotationError, Assignment, EstimateAnnotation, PodRequest};
pub use condition::Condition;
pub use gpu_node::{
    CONDITION_OTHER_DEVICE_PLUGIN, EndedPodPeak, GpuNode, GpuNodeSpec, GpuNodeStatus, GpuPodStatus,
    GpuStatus, MemoryEnforcement,
};
pub use memory_history::{MemoryHistory, MemoryHistorySpec, MemoryHistoryStatus, PeakSample};
pub use training_task::{
    AttemptOutcomeKind, AttemptStatus, EstimateStatus, RecoverySpec, TaskPhase, TrainingTask,
    TrainingTaskSpec, TrainingTaskStatus,
};
