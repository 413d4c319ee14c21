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

use crate::family::{Family, Optimizer};

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
    fn attention_scores_count_when_seq_length_given() {
        let mut p = profile(Family::Transformer, 1_000_000, 1_000_000, 8);
        let without = analytic_upper_bound_mib(p);
        p.attention_layers = 12;
        p.seq_length = Some(2048);
        // 4 B × 12 × 8 × 2048² = 1,536 MiB
        assert!(analytic_upper_bound_mib(p) >= without + 1536);
    }
}
