//! The `TrainingTask` custom resource: a training job carma runs, watches and
//! recovers from out-of-memory crashes.

use std::borrow::Cow;

use k8s_openapi::api::core::v1::PodTemplateSpec;
use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use carma_core::{Policy, RecoveryConfig};

/// A deep-learning training job that carma places on shared GPUs and reruns with a
/// larger memory reservation when it crashes out of GPU memory.
// Each `printcolumn(...)` repeats the keys `name`, `type_`, …; clippy reads them as duplicates.
#[allow(clippy::duplicated_attributes)]
#[derive(CustomResource, Deserialize, Serialize, Clone, Debug, PartialEq, JsonSchema)]
#[kube(
    group = "carma.io",
    version = "v1alpha1",
    kind = "TrainingTask",
    namespaced,
    status = "TrainingTaskStatus",
    shortname = "tt",
    category = "carma",
    doc = "A training job that carma places on shared GPUs and recovers from out-of-memory crashes.",
    printcolumn(
        name = "Phase",
        type_ = "string",
        json_path = ".status.phase",
        description = "Lifecycle phase"
    ),
    printcolumn(
        name = "GPUs",
        type_ = "integer",
        json_path = ".spec.gpus",
        description = "GPUs per attempt"
    ),
    printcolumn(
        name = "Reserved-MiB",
        type_ = "integer",
        json_path = ".status.reservedMiB",
        description = "Per-GPU reservation of the current attempt"
    ),
    printcolumn(
        name = "Source",
        type_ = "string",
        json_path = ".status.estimate.source",
        description = "Where the reservation came from"
    ),
    printcolumn(
        name = "Attempts",
        type_ = "integer",
        json_path = ".status.attemptCount",
        description = "Attempts so far"
    ),
    printcolumn(
        name = "Node",
        type_ = "string",
        json_path = ".status.node",
        description = "Node of the current attempt"
    ),
    printcolumn(
        name = "Age",
        type_ = "date",
        json_path = ".metadata.creationTimestamp"
    )
)]
#[serde(rename_all = "camelCase")]
pub struct TrainingTaskSpec {
    /// Number of GPUs each attempt needs, all on one node.
    #[serde(default = "one")]
    #[schemars(range(min = 1, max = 16))]
    pub gpus: u32,
    /// Pod template of an attempt. carma sets the scheduler, the carma.io/gpu request on the first container, the annotations and the owner reference.
    #[schemars(schema_with = "pod_template_schema")]
    pub template: PodTemplateSpec,
    /// Model description for the GPUMemNet estimator, written to the pod as the carma.io/model-profile annotation.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub model_profile: Option<ModelProfile>,
    /// Explicit per-GPU memory reservation (Kubernetes quantity, e.g. 12Gi); overrides the estimate for the first attempt.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(regex(pattern = r"^[0-9]+(\.[0-9]+)?(Ki|Mi|Gi|Ti|k|M|G|T)?$"))]
    pub gpu_memory: Option<String>,
    /// Placement policy; the extender's default when unset.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(with = "Option<PolicyName>")]
    pub policy: Option<Policy>,
    /// Run every attempt on GPUs of its own.
    #[serde(default)]
    pub exclusive: bool,
    /// How crashed attempts are retried.
    #[serde(default)]
    pub recovery: RecoverySpec,
    /// How long the task runs with its GPUs to itself, in seconds, as its user expects. Under the operator's queue order (the chart's queueOrder) the attempt pods get the matching carma-queue-* priority class, so that kube-scheduler tries them before tasks that declare nothing and, under short-then-longest, short tasks before long ones. Once an attempt has run longer than this, the task's later attempts get no such class (and a Warning Event says so). Unset keeps the pod's priority.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 31_536_000))]
    pub expected_duration_seconds: Option<u64>,
}

fn one() -> u32 {
    1
}

fn pod_template_schema(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
    schemars::json_schema!({
        "type": "object",
        "description": "A core/v1 PodTemplateSpec (metadata and spec).",
        "x-kubernetes-preserve-unknown-fields": true,
    })
}

/// Model features for GPUMemNet (the carma.io/model-profile annotation schema). The ranges are the
/// estimator's (`carma_estimator::MAX_*`; `cli/tests/crds.rs` holds the two equal), so the API server
/// refuses what the estimator would.
#[derive(Deserialize, Serialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ModelProfile {
    /// Model family: mlp, cnn or transformer.
    pub family: ModelFamily,
    /// Training batch size.
    #[schemars(range(min = 1, max = 1048576))]
    pub batch_size: u64,
    /// Total trainable parameters.
    #[schemars(range(max = 1000000000000u64))]
    pub parameters: u64,
    /// Activations per sample (sum of layer output sizes).
    #[schemars(range(max = 1000000000000u64))]
    pub activations: u64,
    /// Depth (layers counted per the family's rule).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(max = 100000))]
    pub depth: Option<u64>,
    /// Activation function name, e.g. ReLU, GELU.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub activation: Option<String>,
    /// Layer counts by type.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub layers: Option<LayerCounts>,
    /// Sequence length, for transformers.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 1048576))]
    pub seq_length: Option<u64>,
    /// Optimizer, for the state it keeps per parameter (default: adam, which keeps the most).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub optimizer: Option<TrainingOptimizer>,
    /// Whether training runs in mixed precision (activations in 16-bit; default false).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mixed_precision: Option<bool>,
    /// Peaks of one training step traced without a GPU (`python -m carma_profile ... --trace`),
    /// for one GPU's share of the batch; when given, the reservation is made from them.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub traced: Option<TracedStep>,
    /// A torchsummary table's or module printout's layer-by-layer reading (`carma estimate
    /// --summary … --emit-profile`), for one GPU's share of the batch; where the analytic bound
    /// is used, it is read from this instead of from the totals.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub layer_reading: Option<LayerReadingValues>,
}

/// Values per sample that the layer-by-layer bound counts. The range is the estimator's
/// (`carma_estimator::LayerReading::MAX_VALUES`).
#[derive(Deserialize, Serialize, Clone, Copy, Debug, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct LayerReadingValues {
    /// Values kept for backward at the activations' precision.
    #[schemars(range(max = 1000000000000u64))]
    pub saved_values: u64,
    /// Values kept in fp32 even under mixed precision (norms, residual sums, losses).
    #[serde(default)]
    #[schemars(range(max = 1000000000000u64))]
    pub kept_fp32_values: u64,
    /// The largest single layer output.
    #[schemars(range(max = 1000000000000u64))]
    pub largest_values: u64,
    /// Attention score values.
    #[serde(default)]
    #[schemars(range(max = 1000000000000u64))]
    pub score_values: u64,
}

/// Peak MiB of live tensors (parameters included) in each phase of a traced training step, the
/// largest single tensor and the caching allocator's replayed segments. The range is the estimator's (`carma_estimator::MAX_TRACED_MIB`).
#[derive(Deserialize, Serialize, Clone, Copy, Debug, PartialEq, Eq, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct TracedStep {
    /// Peak during the forward pass and the loss.
    #[serde(rename = "forwardMiB")]
    #[schemars(range(min = 1, max = 16777216))]
    pub forward_mib: u64,
    /// Peak during the backward pass.
    #[serde(rename = "backwardMiB")]
    #[schemars(range(min = 1, max = 16777216))]
    pub backward_mib: u64,
    /// Peak during the optimizer step.
    #[serde(rename = "optimizerStepMiB")]
    #[schemars(range(min = 1, max = 16777216))]
    pub optimizer_step_mib: u64,
    /// The largest single tensor created during forward or backward (cuDNN workspaces and
    /// cached allocator blocks grow with it); absent in older traces, when the largest phase
    /// peak stands in for it.
    #[serde(
        rename = "largestTensorMiB",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    #[schemars(range(min = 1, max = 16777216))]
    pub largest_tensor_mib: Option<u64>,
    /// The segments PyTorch's caching allocator holds after the step, replayed from its
    /// allocations and frees (at least the largest phase peak); when given, the reservation is
    /// made from it instead of the largest phase peak.
    #[serde(
        rename = "reservedMiB",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    #[schemars(range(min = 1, max = 16777216))]
    pub reserved_mib: Option<u64>,
}

/// Optimizer of a profile, as the estimator names it.
#[derive(Deserialize, Serialize, Clone, Copy, Debug, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub enum TrainingOptimizer {
    /// Plain SGD.
    Sgd,
    /// SGD with momentum or Nesterov.
    SgdMomentum,
    /// Adam or AdamW.
    Adam,
}

/// Model family of a profile.
#[derive(Deserialize, Serialize, Clone, Copy, Debug, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum ModelFamily {
    /// Multi-layer perceptron.
    Mlp,
    /// Convolutional network.
    Cnn,
    /// Transformer.
    Transformer,
}

/// Layer counts by type.
#[derive(Deserialize, Serialize, Clone, Debug, PartialEq, Default, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct LayerCounts {
    /// Linear layers.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(max = 100000))]
    pub linear: Option<u64>,
    /// Conv2d layers.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(max = 100000))]
    pub conv2d: Option<u64>,
    /// Batch-norm layers.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(max = 100000))]
    pub batch_norm: Option<u64>,
    /// Dropout layers.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(max = 100000))]
    pub dropout: Option<u64>,
    /// LayerNorm layers.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(max = 100000))]
    pub layer_norm: Option<u64>,
    /// Attention projection layers.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(max = 100000))]
    pub attention: Option<u64>,
    /// Adaptive average pooling layers.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(max = 100000))]
    pub adaptive_avg_pool: Option<u64>,
}

/// The schema of `carma_core::Policy`: its names as it serializes them, so the API server
/// accepts exactly the policies core has (core carries no schemars).
struct PolicyName;

impl JsonSchema for PolicyName {
    fn schema_name() -> Cow<'static, str> {
        "PlacementPolicy".into()
    }

    // One variant per name, as schemars derives a documented enum; the CRD lists them as an
    // `enum` of strings.
    fn json_schema(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
        let variants: Vec<serde_json::Value> = Policy::ALL
            .iter()
            .map(|p| serde_json::json!({"type": "string", "const": p}))
            .collect();
        schemars::json_schema!({
            "description": "Placement policy names.",
            "oneOf": variants,
        })
    }
}

/// Recovery settings; unset fields take carma's defaults.
#[derive(Deserialize, Serialize, Clone, Debug, PartialEq, Default, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct RecoverySpec {
    /// Attempts in all, the first included (default 5).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 50))]
    pub max_attempts: Option<u32>,
    /// After this many out-of-memory crashes the next attempt runs on exclusive GPUs (default 2).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub exclusive_after_ooms: Option<u32>,
    /// MiB added to an observed peak when growing the reservation (default 1024).
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        rename = "headroomMiB"
    )]
    pub headroom_mib: Option<u64>,
    /// Retries after failures that are not out-of-memory crashes (default 0).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub retries_on_failure: Option<u32>,
    /// First backoff before a retry in seconds, doubled per attempt (default 10).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub backoff_seconds: Option<u64>,
}

impl RecoverySpec {
    /// The core recovery configuration: these settings over `defaults`.
    pub fn to_config(&self, defaults: &RecoveryConfig) -> RecoveryConfig {
        let mut cfg = defaults.clone();
        if let Some(v) = self.max_attempts {
            cfg.max_attempts = v;
        }
        if let Some(v) = self.exclusive_after_ooms {
            cfg.exclusive_after_ooms = v;
        }
        if let Some(v) = self.headroom_mib {
            cfg.headroom_mib = v;
        }
        if let Some(v) = self.retries_on_failure {
            cfg.retries_on_failure = v;
        }
        if let Some(v) = self.backoff_seconds {
            cfg.backoff_base_ms = v.saturating_mul(1000);
        }
        cfg
    }
}

/// Observed state of a TrainingTask.
#[derive(Deserialize, Serialize, Clone, Debug, PartialEq, Default, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct TrainingTaskStatus {
    /// Lifecycle phase.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub phase: Option<TaskPhase>,
    /// Number of attempts created so far.
    #[serde(default)]
    pub attempt_count: u32,
    /// Every attempt, oldest first.
    #[serde(default)]
    pub attempts: Vec<AttemptStatus>,
    /// Reservation of the current attempt and where it came from.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub estimate: Option<EstimateStatus>,
    /// Per-GPU reservation of the current attempt in MiB.
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        rename = "reservedMiB"
    )]
    pub reserved_mib: Option<u64>,
    /// Node of the current attempt.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node: Option<String>,
    /// When the next attempt may be created (RFC 3339), while backing off.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub next_attempt_at: Option<String>,
    /// Human-readable summary of the last transition.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
    /// Generation of the spec last acted on.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
    /// Conditions (Scheduled, Running, Recovering, Succeeded, Failed).
    #[serde(default)]
    pub conditions: Vec<TaskCondition>,
}

/// Lifecycle phase of a TrainingTask.
#[derive(Deserialize, Serialize, Clone, Copy, Debug, PartialEq, Eq, JsonSchema)]
pub enum TaskPhase {
    /// Waiting for its first attempt to run.
    Pending,
    /// An attempt is running.
    Running,
    /// An attempt crashed; the next one is being prepared or waits to be scheduled.
    Recovering,
    /// An attempt succeeded.
    Succeeded,
    /// No attempt succeeded within the limits.
    Failed,
}

impl TaskPhase {
    /// The phase name.
    pub fn as_str(self) -> &'static str {
        match self {
            TaskPhase::Pending => "Pending",
            TaskPhase::Running => "Running",
            TaskPhase::Recovering => "Recovering",
            TaskPhase::Succeeded => "Succeeded",
            TaskPhase::Failed => "Failed",
        }
    }
}

/// One attempt of a TrainingTask.
#[derive(Deserialize, Serialize, Clone, Debug, PartialEq, Default, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct AttemptStatus {
    /// Attempt number, from 1.
    pub index: u32,
    /// Pod of the attempt.
    pub pod: String,
    /// Node it ran on.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node: Option<String>,
    /// GPU UUIDs it was assigned.
    #[serde(default)]
    pub gpus: Vec<String>,
    /// Per-GPU reservation in MiB (absent when it asked for whole GPUs).
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        rename = "reservedMiB"
    )]
    pub reserved_mib: Option<u64>,
    /// Whether it ran on GPUs of its own.
    #[serde(default)]
    pub exclusive: bool,
    /// How it ended; absent while it runs.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub outcome: Option<AttemptOutcomeKind>,
    /// Why it ended that way.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// Peak GPU memory seen by telemetry, in MiB.
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        rename = "observedPeakMiB"
    )]
    pub observed_peak_mib: Option<u64>,
    /// When the attempt was created (RFC 3339).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub started_at: Option<String>,
    /// When it ended (RFC 3339).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub finished_at: Option<String>,
    /// For an attempt that ran out of GPU memory: whether the crash is recorded in its model
    /// profile's MemoryHistory (so later tasks of the model are not reserved at the size that
    /// crashed). `false` after a failed write; the operator retries it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub history_recorded: Option<bool>,
    /// Whether it ran longer than `spec.expectedDurationSeconds`; once one has, the task's later
    /// attempts get no queue priority class.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub exceeded_expected_duration: Option<bool>,
}

/// How an attempt ended.
#[derive(Deserialize, Serialize, Clone, Copy, Debug, PartialEq, Eq, JsonSchema)]
pub enum AttemptOutcomeKind {
    /// Exited 0.
    Succeeded,
    /// Crashed out of GPU memory.
    GpuOutOfMemory,
    /// Failed for another reason.
    Failed,
    /// Evicted or preempted.
    Evicted,
    /// Killed by the kernel for host memory (Kubernetes' `OOMKilled`): the container
    /// exceeded its memory limit or the node ran short. Not a GPU out-of-memory crash:
    /// the GPU reservation stays as it was, and it is retried like any other failure
    /// (`spec.recovery.retriesOnFailure`); raise the pod's memory limit.
    #[serde(rename = "HostOOMKilled")]
    HostOomKilled,
}

/// Reservation of the current attempt.
#[derive(Deserialize, Serialize, Clone, Debug, PartialEq, Default, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct EstimateStatus {
    /// Reserved MiB per GPU (absent for whole GPUs).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mib: Option<u64>,
    /// Where it came from: override, estimator (traced, gpumemnet-…, analytic-upper-bound), history (earlier runs of the same model profile), recovery, whole-gpu.
    pub source: String,
    /// Estimator class label, when one applies.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub class: Option<String>,
}

/// A condition of a TrainingTask, in the Kubernetes style.
#[derive(Deserialize, Serialize, Clone, Debug, PartialEq, Default, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct TaskCondition {
    /// Condition type: Scheduled, Running, Recovering, Succeeded or Failed.
    #[serde(rename = "type")]
    pub type_: String,
    /// True, False or Unknown.
    pub status: String,
    /// Machine-readable reason in CamelCase.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// Human-readable message.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
    /// When the status last changed (RFC 3339).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_transition_time: Option<String>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_crd_accepts_exactly_cores_policies() {
        use kube::CustomResourceExt;
        let crd = serde_json::to_value(TrainingTask::crd()).unwrap();
        let schema = &crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"];
        let policy = &schema["properties"]["spec"]["properties"]["policy"];
        let names: Vec<&str> = Policy::ALL.iter().map(|p| p.as_str()).collect();
        assert_eq!(policy["enum"], serde_json::json!(names));
        assert_eq!(policy["nullable"], true);
        for p in Policy::ALL {
            let spec: Option<Policy> =
                serde_json::from_value(serde_json::json!(p.as_str())).unwrap();
            assert_eq!(spec, Some(p));
        }
    }
}
