//! `spec.modelProfile` of a `TrainingTask`: the `carma.io/model-profile` annotation's schema,
//! with the estimator's ranges, its layer-by-layer reading, traced step and caveats.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

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
    /// What the table's or printout's reading had no measured rule for and counted
    /// conservatively (`carma estimate --summary … --emit-profile` writes them beside
    /// `layerReading`). Where that count sets the reservation, its source is `analytic-fallback`
    /// and `status.estimate.warnings` and an `EstimateIsFallback` Event say these.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 3))]
    pub caveats: Option<Vec<ProfileCaveat>>,
}

/// One pattern a reading had no measured rule for (the estimator's caveat), at most one per kind.
#[derive(Deserialize, Serialize, Clone, Debug, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ProfileCaveat {
    /// What kind of pattern.
    pub kind: CaveatKind,
    /// The module types it concerns, e.g. T5Attention (the estimator takes 1 to 64 of at most 256
    /// bytes each).
    #[schemars(length(min = 1, max = 64))]
    pub modules: Vec<String>,
    /// What the bound counted instead, in words (at most 256 bytes).
    #[schemars(length(max = 256))]
    pub counted: String,
}

/// The kind of pattern a reading had no measured rule for.
#[derive(Deserialize, Serialize, Clone, Copy, Debug, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "kebab-case")]
pub enum CaveatKind {
    /// An attention block of a type no rule covers, counted with its score tensors.
    UnknownAttention,
    /// A layer group shown once that runs several times (ALBERT's), run count not given.
    SharedLayers,
    /// A module the reader cannot size, every activation value counted half as much again.
    UnknownModule,
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
