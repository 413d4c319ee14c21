//! The analytic upper bound: carma's estimate for a family without a trained model,
//! and for profiles beyond the range a model was trained on.
//!
//! fp32 training with Adam:
//!
//! ```text
//! bytes = 24 B × parameters                      weights 4 + gradients 4 + Adam m, v 8
//!                                                + 8 for optimizer-step temporaries
//!                                                  and allocator rounding
//!       + 4 B × 2 × activations × batch          every layer output kept for backward,
//!                                                  plus its gradient
//!       + 4 B × 2 × attention × batch × seqLength²   (when seqLength is given) one
//!                                                  score matrix and its softmax per
//!                                                  attention block, single-head
//! MiB   = 1536 + ceil(bytes / 2^20)              CUDA context, cuBLAS/cuDNN handles and
//!                                                  the allocator's floor
//! ```
//!
//! rounded up to a multiple of 256 MiB. The constants are calibrated to be an upper
//! bound of every one of the 4,801 runs in GPUMemNet's MLP data (A100 40 GB,
//! nvidia-smi peak; the smallest run there uses 1443 MiB) — checked by the test
//! `analytic_bound_covers_every_measured_run`. For CNNs and Transformers it is a
//! documented assumption, not a measured bound: cuDNN workspaces and
//! multi-head attention scores can exceed it.

use crate::profile::Profile;

/// Fixed overhead: CUDA context, library handles, allocator floor (MiB).
pub const CONTEXT_MIB: u64 = 1536;
/// Bytes per trainable parameter (weights, gradients, 2 Adam states, temporaries).
pub const BYTES_PER_PARAMETER: u64 = 24;
/// Bytes per activation value (fp32).
pub const BYTES_PER_ACTIVATION: u64 = 4;
/// Copies of each activation during backward (the saved output and its gradient).
pub const ACTIVATION_FACTOR: u64 = 2;
/// The bound is rounded up to a multiple of this (MiB).
pub const ROUNDING_MIB: u64 = 256;

const MIB: u128 = 1 << 20;

/// The analytic upper bound of `p`'s training memory in MiB (see the module docs).
/// Saturates instead of overflowing on absurd inputs.
pub fn analytic_upper_bound_mib(p: &Profile) -> u64 {
    let batch = u128::from(p.batch_size);
    let act = u128::from(BYTES_PER_ACTIVATION);
    let mut bytes = u128::from(BYTES_PER_PARAMETER)
        .saturating_mul(u128::from(p.parameters))
        .saturating_add(
            (act * u128::from(ACTIVATION_FACTOR))
                .saturating_mul(u128::from(p.activations))
                .saturating_mul(batch),
        );
    if let Some(seq) = p.seq_length {
        let seq = u128::from(seq);
        let scores = (act * 2)
            .saturating_mul(u128::from(p.layers.attention))
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
    use crate::profile::{Family, Layers};

    fn profile(parameters: u64, activations: u64, batch_size: u32) -> Profile {
        Profile {
            family: Family::Cnn,
            batch_size,
            parameters,
            activations,
            depth: Some(1),
            activation: None,
            layers: Layers::default(),
            seq_length: None,
        }
    }

    #[test]
    fn tiny_model_is_context_only() {
        assert_eq!(analytic_upper_bound_mib(&profile(1, 1, 1)), 1792);
    }

    #[test]
    fn resnet50_like() {
        // 25.6 M params, ~23 M activations per sample at 224², batch 32
        let mib = analytic_upper_bound_mib(&profile(25_600_000, 23_000_000, 32));
        // 24*25.6e6 = 586 MiB; 8*23e6*32 = 5615 MiB; + 1536
        assert!((7700..=8000).contains(&mib), "{mib}");
        assert_eq!(mib % ROUNDING_MIB, 0);
    }

    #[test]
    fn saturates_instead_of_overflowing() {
        let mut p = profile(u64::MAX, u64::MAX, u32::MAX);
        p.seq_length = Some(u32::MAX);
        p.layers.attention = u32::MAX;
        assert_eq!(analytic_upper_bound_mib(&p), u64::MAX);
    }

    #[test]
    fn attention_scores_count_when_seq_length_given() {
        let mut p = profile(1_000_000, 1_000_000, 8);
        let without = analytic_upper_bound_mib(&p);
        p.layers.attention = 12;
        p.seq_length = Some(2048);
        assert!(analytic_upper_bound_mib(&p) > without + 3000);
    }
}
