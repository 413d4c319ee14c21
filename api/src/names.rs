//! Names shared by every part of carma: the API group and version, the `carma.io/gpu`
//! extended resource and its device IDs, the pod annotations users and the operator write
//! (input) and the extender and device plugin write (output), labels, the environment
//! variables set in training containers, and the scheduler profile and priority class names. The extender, device plugin, operator, chart and
//! users' pod specs all depend on these strings, so renaming one is a breaking change.

/// API group of carma's resources.
pub const GROUP: &str = "carma.io";
/// API version of carma's resources.
pub const VERSION: &str = "v1alpha1";
/// Extended resource: GPUs a container wants to share.
pub const RESOURCE_GPU: &str = "carma.io/gpu";
/// Scheduler profile whose extender is carma.
pub const SCHEDULER_NAME: &str = "carma-scheduler";
/// Priority class of recovery attempts.
pub const PRIORITY_CLASS_RECOVERY: &str = "carma-recovery";
/// Separator between a GPU UUID and the replica number in device IDs.
pub const REPLICA_SEPARATOR: &str = "::";

/// Input: JSON model features for the estimator.
pub const ANNOTATION_MODEL_PROFILE: &str = "carma.io/model-profile";
/// Input: explicit per-GPU memory reservation (Kubernetes quantity).
pub const ANNOTATION_GPU_MEMORY: &str = "carma.io/gpu-memory";
/// Input: placement policy for this pod.
pub const ANNOTATION_POLICY: &str = "carma.io/policy";
/// Input: the SM activity (0..1) the job keeps busy when it runs alone, e.g. measured on an
/// earlier run; overrides the model-class prior that `pack` places by.
pub const ANNOTATION_SM_ACTIVITY: &str = "carma.io/sm-activity";
/// Input: the pod must have its GPUs alone (`"true"`), set by recovery escalation.
pub const ANNOTATION_EXCLUSIVE: &str = "carma.io/exclusive";
/// Output (extender): `{"mib": N, "source": "...", "class": "..."}`.
pub const ANNOTATION_ESTIMATE: &str = "carma.io/estimate";
/// Output (extender): comma-separated GPU UUIDs on the bound node.
pub const ANNOTATION_ASSIGNED_GPUS: &str = "carma.io/assigned-gpus";
/// Output (extender): RFC 3339 time of the assignment.
pub const ANNOTATION_ASSIGNED_AT: &str = "carma.io/assigned-at";
/// Output (extender): node the GPUs belong to.
pub const ANNOTATION_ASSIGNED_NODE: &str = "carma.io/assigned-node";
/// Output (device plugin): `"true"` once Allocate has served the pod.
pub const ANNOTATION_ALLOCATED: &str = "carma.io/allocated";

/// Label: the TrainingTask a pod belongs to.
pub const LABEL_TASK: &str = "carma.io/task";
/// Label: the attempt number (1-based) of a pod.
pub const LABEL_ATTEMPT: &str = "carma.io/attempt";
/// Label: the component that manages an object.
pub const LABEL_MANAGED_BY: &str = "app.kubernetes.io/managed-by";

/// Environment variable: GPU UUIDs visible to the container.
pub const ENV_VISIBLE_DEVICES: &str = "NVIDIA_VISIBLE_DEVICES";
/// Environment variable: carma's assigned GPU UUIDs.
pub const ENV_ASSIGNED_GPUS: &str = "CARMA_ASSIGNED_GPUS";
/// Environment variable: reserved MiB per GPU.
pub const ENV_RESERVED_MIB: &str = "CARMA_RESERVED_MIB";
