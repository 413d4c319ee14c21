//! The analytic bound: carma's estimate for a family without a trained model, and
//! for profiles beyond the range a model was trained on.
//!
//! It adds up what one training step keeps on the GPU:
//!
//! ```text
//! bytes = state(optimizer) × parameters           weights, gradients, optimizer state
//!       + k(family) × e × activations × (batch + w(family))
//!                                                 layer outputs saved for backward;
//!                                                 w samples' worth of workspace
//!       + e × attention × batch × seqLength²      (when seqLength is given) one score
//!                                                 matrix per attention block
//! MiB   = 1536 + ceil(bytes / 2^20), rounded up to a multiple of 256
//! ```
//!
//! * `state`: 8 B with plain SGD (fp32 weights and gradients), 12 B with momentum
//!   (one buffer), 20 B with Adam (two moments, and one weight-sized temporary that
//!   PyTorch's multi-tensor Adam step allocates). Mixed precision (autocast) keeps
//!   fp32 weights, gradients and state, so it does not change `state`.
//! * `e`: bytes per activation value, 4 (fp32), 2 with mixed precision.
//! * `k`, `w`: per family (table below). `k` is how many bytes per fp32 output the
//!   step keeps (saved tensors, their gradients during backward, and allocator
//!   rounding and fragmentation, which grow with the tensors); `w` covers memory
//!   that does not shrink with the batch (cuDNN workspaces, allocator blocks held
//!   between steps) as a number of extra samples.
//! * 1536 MiB: CUDA context, cuBLAS/cuDNN handles and the caching allocator's
//!   floor. The smallest measured run in GPUMemNet's MLP data uses 1443 MiB (A100,
//!   nvidia-smi); CARMA's MNIST CNN, 1776 MiB with 1.2 M parameters.
//!
//! | family | k | w | calibrated on (no underestimate on any) |
//! |---|---|---|---|
//! | MLP | 1.5 | 0 | the 4,801 runs of GPUMemNet's MLP data |
//! | CNN | 1.25 | 6 | CARMA's 45 CNN task files (v2): ImageNet CNNs, CIFAR-100, MNIST, UNet, Mask R-CNN |
//! | Transformer | 0.85 | 4 | CARMA's 5 Transformer task files (v2): BERT, XLNet, GPT-2 |
//!
//! The constants are the smallest round values that leave no measured peak above
//! the bound with the profiles carma has for those jobs (the simulator's catalog,
//! whose ImageNet and Transformer activation counts are estimates). They are a fit
//! to these data, not a proof: `carma estimate eval --peaks` prints the margins, and
//! the README says how they were chosen. Transformer `k` is below 1 because those
//! profiles count attention tensors that PyTorch frees before backward.
//!
//! A profile carries totals only. Where the job comes as a torchsummary table or a
//! module printout, [`detailed_bound`] reads it layer by layer instead
//! ([`summary_values`](crate::reading::summary_values),
//! [`printout_values`](crate::reading::printout_values)): which outputs are distinct tensors, the largest layer, attention
//! scores by block kind, and Adam's two step temporaries only where they outweigh the
//! freed activations. docs/estimator-evaluation.md has its terms against CARMA's measured peaks.

use crate::family::{Family, Optimizer};
pub use crate::layer_reading::SavedValues;

/// Fixed overhead: CUDA context, library handles, allocator floor (MiB).
pub const CONTEXT_MIB: u64 = 1536;
/// The bound is rounded up to a multiple of this (MiB).
pub const ROUNDING_MIB: u64 = 256;

/// Per-family activation constants of the bound (see the module docs).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ActivationFactors {
    /// Bytes kept per fp32 activation value, as a multiple of 4 B.
    pub copies: f64,
    /// Extra samples' worth of activations that do not shrink with the batch.
    pub workspace_samples: u32,
}

/// The activation constants of `family`.
pub fn activation_factors(family: Family) -> ActivationFactors {
    let (copies, workspace_samples) = match family {
        Family::Mlp => (1.5, 0),
        Family::Cnn => (1.25, 6),
        Family::Transformer => (0.85, 4),
    };
    ActivationFactors {
        copies,
        workspace_samples,
    }
}

/// Bytes of state per trainable parameter with `optimizer`.
pub fn state_bytes_per_parameter(optimizer: Optimizer) -> u64 {
    match optimizer {
        Optimizer::Sgd => 8,
        Optimizer::SgdMomentum => 12,
        Optimizer::Adam => 20,
    }
}

/// Bytes per activation value: 4 (fp32), 2 with mixed precision.
pub fn activation_bytes(mixed_precision: bool) -> u64 {
    if mixed_precision { 2 } else { 4 }
}

const MIB: u128 = 1 << 20;

/// What the bound reads of a training job; a [`Profile`](crate::Profile) converts into it with
/// the annotation's defaults (Adam, fp32) applied.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BoundInputs {
    pub family: Family,
    pub optimizer: Optimizer,
    pub mixed_precision: bool,
    /// Trainable parameters.
    pub parameters: u64,
    /// Output values of one sample's forward pass.
    pub activations: u64,
    pub batch_size: u32,
    /// Tokens per sample; attention scores are counted only when it is given.
    pub seq_length: Option<u32>,
    /// Attention blocks, one score matrix each.
    pub attention_layers: u32,
}

/// The analytic bound of a job's training memory in MiB (see the module docs).
/// Saturates instead of overflowing on absurd inputs.
pub fn analytic_upper_bound_mib(job: impl Into<BoundInputs>) -> u64 {
    let p: BoundInputs = job.into();
    let e = u128::from(activation_bytes(p.mixed_precision));
    let f = activation_factors(p.family);
    let batch = u128::from(p.batch_size);
    let state =
        u128::from(state_bytes_per_parameter(p.optimizer)).saturating_mul(u128::from(p.parameters));
    // k × e × A × (b + w) in integers: k has two decimals, so scale by 100.
    let copies_pct = (f.copies * 100.0).round() as u128;
    let activations = (copies_pct * e)
        .saturating_mul(u128::from(p.activations))
        .saturating_mul(batch + u128::from(f.workspace_samples))
        .div_ceil(100);
    let mut bytes = state.saturating_add(activations);
    if let Some(seq) = p.seq_length {
        let seq = u128::from(seq);
        let scores = e
            .saturating_mul(u128::from(p.attention_layers))
            .saturating_mul(batch)
            .saturating_mul(seq)
            .saturating_mul(seq);
        bytes = bytes.saturating_add(scores);
    }
    let mib = u128::from(CONTEXT_MIB).saturating_add(bytes.div_ceil(MIB));
    let rounded = mib
        .div_ceil(u128::from(ROUNDING_MIB))
        .saturating_mul(u128::from(ROUNDING_MIB));
    u64::try_from(rounded).unwrap_or(u64::MAX)
}

/// The detailed bound's constants, per family (see [`detailed_bound`]).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct DetailedFactors {
    /// Bytes kept per saved fp32 value, as a multiple of 4 B.
    pub copies: f64,
    /// How many largest-layer outputs backward holds beside the saved ones.
    pub largest_outputs: u32,
}

/// The detailed bound's constants of `family`: fitted on the measured jobs that
/// docs/estimator-evaluation.md names, with some models held out.
pub fn detailed_factors(family: Family) -> DetailedFactors {
    let (copies, largest_outputs) = match family {
        // no MLP printouts or tables are measured; the profile bound's factor
        Family::Mlp => (1.5, 0),
        Family::Cnn => (0.8, 8),
        Family::Transformer => (1.0, 0),
    };
    DetailedFactors {
        copies,
        largest_outputs,
    }
}

/// One bound split into what it counts (MiB before rounding, except `total_mib`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub struct BoundTerms {
    /// CUDA context, library handles, allocator floor.
    pub context_mib: u64,
    /// fp32 weights.
    pub weights_mib: u64,
    /// fp32 gradients.
    pub gradients_mib: u64,
    /// Optimizer state (momentum buffer, Adam's two moments).
    pub optimizer_mib: u64,
    /// Activations kept for backward (with the family's factor and workspace).
    pub activations_mib: u64,
    /// Attention scores.
    pub scores_mib: u64,
    /// What the optimizer step allocates beyond its state (Adam's two weight-sized
    /// temporaries). The detailed bound counts it only where it exceeds activations
    /// and scores, which are freed before the step.
    pub step_mib: u64,
    /// What each GPU of a pod beyond the first adds ([`crate::MULTI_GPU_MIB`] each: the traced
    /// estimate's term, fitted on CARMA's 2-GPU jobs).
    pub multi_gpu_mib: u64,
    /// The reservation: the terms' sum rounded up to [`ROUNDING_MIB`].
    pub total_mib: u64,
}

fn mib_ceil(bytes: u128) -> u64 {
    u64::try_from(bytes.div_ceil(MIB)).unwrap_or(u64::MAX)
}

fn rounded(mib: u128) -> u64 {
    let r = mib
        .div_ceil(u128::from(ROUNDING_MIB))
        .saturating_mul(u128::from(ROUNDING_MIB));
    u64::try_from(r).unwrap_or(u64::MAX)
}

/// The bound from a layer-by-layer reading of the model: tighter than
/// [`analytic_upper_bound_mib`], which only sees a profile's totals.
///
/// ```text
/// bytes = 4 B × parameters × (weights + gradients + state buffers)
///       + max(c(family) × e × batch × (saved + l(family) × largest) + e × batch × scores,
///             8 B × parameters with Adam)
/// MiB   = 1536 + ceil(bytes / 2^20), rounded up to a multiple of 256
/// ```
///
/// Activations are freed before the optimizer step, so Adam's two weight-sized
/// temporaries are counted only where they are larger than the activations. `c` and `l` are
/// [`detailed_factors`]; `e` is [`activation_bytes`]. One GPU; [`detailed_bound_for`] adds
/// what more GPUs hold.
pub fn detailed_bound(job: impl Into<BoundInputs>, values: &SavedValues) -> BoundTerms {
    detailed_bound_for(job, values, 1)
}

/// [`detailed_bound`] per GPU of a pod with `gpus` GPUs (0 counts as 1), for a job read at
/// its per-GPU batch: each GPU beyond the first adds [`crate::MULTI_GPU_MIB`], what CARMA's
/// 2-GPU jobs hold beyond one GPU's share of the step (`docs/traced-estimate.md`).
pub fn detailed_bound_for(
    job: impl Into<BoundInputs>,
    values: &SavedValues,
    gpus: u32,
) -> BoundTerms {
    let p: BoundInputs = job.into();
    let e = u128::from(activation_bytes(p.mixed_precision));
    let f = detailed_factors(p.family);
    let batch = u128::from(p.batch_size);
    let params = u128::from(p.parameters);
    let weights = 4u128.saturating_mul(params);
    let buffers: u128 = match p.optimizer {
        Optimizer::Sgd => 0,
        Optimizer::SgdMomentum => 4,
        Optimizer::Adam => 8,
    };
    // PyTorch's multi-tensor Adam holds up to two weight-sized temporaries at once in its
    // step (the weight-decayed gradient copy and the sqrt(exp_avg_sq) denominator). GPT-2 XL
    // at batch 2 peaks there: 23.3 B per parameter above the context, reported by GPUMemNet's
    // authors, against 16 B of weights, gradients and moments.
    let step = match p.optimizer {
        Optimizer::Adam => weights.saturating_mul(2),
        _ => 0,
    };
    let per_sample = values
        .saved
        .saturating_add(u128::from(f.largest_outputs).saturating_mul(values.largest));
    let copies_pct = (f.copies * 100.0).round() as u128;
    let per_sample_bytes = e
        .saturating_mul(per_sample)
        .saturating_add(4u128.saturating_mul(values.kept_fp32));
    let activations = copies_pct
        .saturating_mul(per_sample_bytes)
        .saturating_mul(batch)
        .div_ceil(100);
    let scores = e.saturating_mul(values.scores).saturating_mul(batch);
    let transient = activations.saturating_add(scores);
    let step_extra = step.saturating_sub(transient);
    let (w, g, o) = (
        mib_ceil(weights),
        mib_ceil(weights),
        mib_ceil(buffers.saturating_mul(params)),
    );
    let (a, s, x) = (
        mib_ceil(activations),
        mib_ceil(scores),
        mib_ceil(step_extra),
    );
    let m = u64::from(gpus.max(1) - 1).saturating_mul(crate::MULTI_GPU_MIB);
    let sum = [w, g, o, a, s, x, m]
        .iter()
        .fold(u128::from(CONTEXT_MIB), |acc, v| {
            acc.saturating_add(u128::from(*v))
        });
    BoundTerms {
        context_mib: CONTEXT_MIB,
        weights_mib: w,
        gradients_mib: g,
        optimizer_mib: o,
        activations_mib: a,
        scores_mib: s,
        step_mib: x,
        multi_gpu_mib: m,
        total_mib: rounded(sum),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn profile(family: Family, parameters: u64, activations: u64, batch_size: u32) -> BoundInputs {
        BoundInputs {
            family,
            optimizer: Optimizer::Adam,
            mixed_precision: false,
            parameters,
            activations,
            batch_size,
            seq_length: None,
            attention_layers: 0,
        }
    }

    #[test]
    fn tiny_model_is_context_only() {
        assert_eq!(
            analytic_upper_bound_mib(profile(Family::Cnn, 1, 1, 1)),
            1792
        );
    }

    #[test]
    fn resnet50_batch_128_by_hand() {
        // 25,557,032 params × 20 B = 487.5 MiB; 37.56 M activations × 1.25 × 4 B
        // × (128 + 6) = 23,997 MiB; + 1536 = 26,021 → 26,112.
        let mib = analytic_upper_bound_mib(profile(Family::Cnn, 25_557_032, 37_560_000, 128));
        assert_eq!(mib, 26_112);
    }

    #[test]
    fn optimizer_and_precision_shrink_the_bound() {
        let mut p = profile(Family::Transformer, 200_000_000, 50_000_000, 8);
        let adam = analytic_upper_bound_mib(p);
        p.optimizer = Optimizer::SgdMomentum;
        let momentum = analytic_upper_bound_mib(p);
        p.optimizer = Optimizer::Sgd;
        let sgd = analytic_upper_bound_mib(p);
        // 200 M parameters: 4 B each (763 MiB) between the optimizers, ± rounding
        assert!(adam > momentum && momentum > sgd, "{adam} {momentum} {sgd}");
        assert!((512..=1024).contains(&(momentum - sgd)), "{momentum} {sgd}");
        p.mixed_precision = true;
        let half = analytic_upper_bound_mib(p);
        // activations 0.85 × 4 B × 50 M × 12 = 1,946 MiB, halved
        assert!((800..=1300).contains(&(sgd - half)), "{sgd} {half}");
    }

    #[test]
    fn saturates_instead_of_overflowing() {
        let mut p = profile(Family::Transformer, u64::MAX, u64::MAX, u32::MAX);
        p.seq_length = Some(u32::MAX);
        p.attention_layers = u32::MAX;
        assert_eq!(analytic_upper_bound_mib(p), u64::MAX);
    }

    #[test]
    fn detailed_bound_by_hand() {
        // 10 M parameters with Adam: weights, gradients 38.2 MiB each, moments 76.3 MiB;
        // CNN: 0.8 × 4 B × (1 M saved + 8 × 100 k largest) × 32 = 175.8 MiB
        let values = SavedValues {
            saved: 1_000_000,
            largest: 100_000,
            ..SavedValues::default()
        };
        let t = detailed_bound(profile(Family::Cnn, 10_000_000, 1, 32), &values);
        assert_eq!(
            (
                t.weights_mib,
                t.gradients_mib,
                t.optimizer_mib,
                t.activations_mib
            ),
            (39, 39, 77, 176)
        );
        // Adam's two temporaries (76 MiB) are smaller than the activations they replace
        assert_eq!(t.step_mib, 0);
        assert_eq!(t.total_mib, 2048); // 1536 + 331 → 1867, rounded up
        // a large model and a tiny batch: the step's temporaries count beyond them
        // (2 × 4 B × 100 M − 5.76 MB of activations = 757.4 MiB)
        let t = detailed_bound(profile(Family::Cnn, 100_000_000, 1, 1), &values);
        assert_eq!(t.step_mib, 758);
        // scores are kept once per value, at e bytes
        let mut p = profile(Family::Transformer, 1, 1, 2);
        p.mixed_precision = true;
        let scores = SavedValues {
            scores: 1 << 20,
            ..SavedValues::default()
        };
        assert_eq!(detailed_bound(p, &scores).scores_mib, 4);
        // under mixed precision 16-bit values count 2 B and fp32-kept ones 4 B:
        // 1 Mi of each at batch 2 = 4 + 8 MiB
        let mixed = SavedValues {
            saved: 1 << 20,
            kept_fp32: 1 << 20,
            ..SavedValues::default()
        };
        assert_eq!(detailed_bound(p, &mixed).activations_mib, 12);
        p.mixed_precision = false;
        assert_eq!(detailed_bound(p, &mixed).activations_mib, 16);
        // each GPU beyond the first adds the multi-GPU term
        let one = detailed_bound(profile(Family::Cnn, 10_000_000, 1, 32), &values);
        let two = detailed_bound_for(profile(Family::Cnn, 10_000_000, 1, 32), &values, 2);
        assert_eq!(
            (one.multi_gpu_mib, two.multi_gpu_mib),
            (0, crate::MULTI_GPU_MIB)
        );
        assert_eq!(two.total_mib, 2048 + 4864); // 1867 + 4848 = 6715 → 6912
        // SGD keeps no state buffer and allocates no temporary
        let mut p = profile(Family::Cnn, 100_000_000, 1, 1);
        p.optimizer = Optimizer::Sgd;
        let t = detailed_bound(p, &values);
        assert_eq!((t.optimizer_mib, t.step_mib), (0, 0));
    }

    #[test]
    fn detailed_bound_saturates() {
        let values = SavedValues {
            saved: u128::MAX,
            largest: u128::MAX,
            scores: u128::MAX,
            kept_fp32: u128::MAX,
        };
        let t = detailed_bound(profile(Family::Cnn, u64::MAX, 1, u32::MAX), &values);
        assert_eq!(t.total_mib, u64::MAX);
        let t = detailed_bound_for(profile(Family::Cnn, 1, 1, 1), &values, u32::MAX);
        assert_eq!(t.total_mib, u64::MAX);
    }

    #[test]
    fn attention_scores_count_when_seq_length_given() {
        let mut p = profile(Family::Transformer, 1_000_000, 1_000_000, 8);
        let without = analytic_upper_bound_mib(p);
        p.attention_layers = 12;
        p.seq_length = Some(2048);
        // 4 B × 12 × 8 × 2048² = 1,536 MiB
        assert!(analytic_upper_bound_mib(p) >= without + 1536);
    }
}
