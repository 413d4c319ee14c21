//! `carma-estimator`: GPU memory estimates for training jobs with GPUMemNet.
//!
//! carma reserves GPU memory for each job it places. This crate turns a
//! description of the job's model — the `carma.io/model-profile` annotation
//! ([`parse_profile`]), a `torchsummary` table ([`parse_torchsummary`]) or an
//! annotated PyTorch module printout ([`parse_printout`]) — into a reservation:
//!
//! * families with a trained model (MLP today) go through a GPUMemNet ensemble
//!   (ONNX, compiled into the binary, run by tract-onnx) that predicts a memory
//!   class; the reservation is the class's upper edge, chosen with a safe-side
//!   rule that prefers the higher class when the model is unsure;
//! * a profile that carries a traced training step (`traced`, from
//!   `carma_profile --trace`) gets the [traced reservation](traced_reservation_mib): the
//!   step's peak of live tensors plus a fitted CUDA context and a fitted multiple of its
//!   largest tensor (cuDNN workspaces, allocator blocks), before any model;
//! * other families (CNN and Transformer until their datasets exist), and profiles
//!   beyond a model's training range, get the [analytic bound](analytic): what a
//!   training step keeps (weights, gradients, optimizer state, saved activations,
//!   CUDA context), calibrated on measured peaks. Read from a table or printout that holds
//!   a module type or an attention or sharing pattern with no measured rule, it counts that
//!   part conservatively and says so: source [`EstimateSource::AnalyticFallback`], and a
//!   [`Caveat`] per unknown pattern in [`Estimate::warnings`].
//!
//! ```
//! use carma_estimator::{Estimator, EstimateSource, parse_profile};
//!
//! let estimator = Estimator::new()?; // loaded once per process, cheap to clone
//! let profile = parse_profile(
//!     r#"{"family":"mlp","batchSize":256,"parameters":2000000,"activations":6000,
//!         "depth":5,"activation":"ReLU","layers":{"linear":5}}"#,
//! )?;
//! let e = estimator.estimate(&profile)?;
//! assert_eq!(e.source, EstimateSource::GpumemnetMlp);
//! assert_eq!(e.mib, 2000);
//! assert_eq!(e.class, "(1000,2000]");
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! The models, their model card and the training pipeline live in
//! `estimator/models/` and `estimator/training/`.

pub mod activity;
pub mod analytic;
mod caveat;
mod estimator;
mod evaluate;
mod family;
pub mod features;
mod fingerprint;
mod layer_reading;
mod limits;
mod model;
mod printout;
mod printout_counts;
mod printout_error;
mod printout_line;
pub mod printout_rules;
pub mod printout_scan;
mod profile;
pub mod reading;
mod torchinfo;
mod torchsummary;
mod traced;

pub use analytic::analytic_upper_bound_mib;
pub use caveat::{
    Caveat, CaveatKind, Caveats, FALLBACK_PERCENT, MAX_CAVEAT_MODULES, MAX_CAVEAT_TEXT,
};
pub use estimator::{
    EMBEDDED_MODELS, Estimate, EstimateError, EstimateSource, Estimator, EstimatorError, ModelParts,
};
pub use evaluate::{
    ClassRecall, EvaluateError, Evaluation, LabelledRow, evaluate, evaluate_csv, read_mlp_csv,
};
pub use layer_reading::{LayerReading, SavedValues};
pub use limits::{
    MAX_ACTIVATIONS, MAX_BATCH_SIZE, MAX_ESTIMATE_MIB, MAX_LAYERS, MAX_PARAMETERS, MAX_SEQ_LENGTH,
};
pub use model::{BATCH_ROWS, ClassSpec, DecisionRule, Model, ModelError, ModelMeta};
pub use printout::{HEAD_DIM, PrintoutError, SCORE_TENSORS, looks_like_printout, parse_printout};
pub use profile::{
    Family, FamilyParseError, Layers, Optimizer, Profile, ProfileError, TORCH_ACTIVATIONS,
    parse_profile,
};
pub use torchinfo::{looks_like_torchinfo, parse_torchinfo};
pub use torchsummary::{
    INPUT_SAVING_PERCENT, SummaryError, UNLISTED_ATTENTION_PARAMS, parse_torchsummary,
};
pub use traced::{
    ALLOCATOR_CNN_LARGEST_FACTOR_MILLI, ALLOCATOR_CONTEXT_MIB, ALLOCATOR_MULTI_GPU_MIB,
    ALLOCATOR_TRANSFORMER_LARGEST_FACTOR_MILLI, CNN_LARGEST_FACTOR_MILLI, CONTEXT_MIB, FLOOR_MIB,
    MAX_TRACED_MIB, MULTI_GPU_MIB, TRANSFORMER_LARGEST_FACTOR_MILLI, Traced,
    traced_reservation_mib,
};
