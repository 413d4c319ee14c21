//! The traced estimate: a reservation from one training step traced without a GPU.
//!
//! `python -m carma_profile ... --trace` runs forward, loss, backward and an optimizer step
//! on fake tensors and records the peak bytes of live tensors in each phase (parameters,
//! gradients, optimizer state, saved activations, temporaries; each rounded up to the CUDA
//! caching allocator's 512-byte blocks). The profile carries the three peaks as
//! `"traced": {"forwardMiB": N, "backwardMiB": N, "optimizerStepMiB": N}`.
//!
//! A GPU holds more than the live tensors: the CUDA context and kernels, cuBLAS/cuDNN
//! workspaces, and what the caching allocator keeps or cannot reuse. The reservation adds
//! them with constants fitted on CARMA's measured jobs (`docs/traced-estimate.md`):
//!
//! ```text
//! reservation = CONTEXT_MIB + ceil(peak × family factor × (multi-GPU factor if gpus > 1))
//! ```
//!
//! where `peak` is the largest of the three phases.

use serde::{Deserialize, Serialize};

use crate::family::Family;

/// Largest traced phase peak accepted: 2^24 MiB (16 TiB), far beyond any GPU or
/// multi-GPU server's memory; larger figures are a mistake, not a job.
pub const MAX_TRACED_MIB: u64 = 1 << 24;

/// What the GPU holds besides tensors, in MiB: the CUDA context with PyTorch's kernels and
/// the cuBLAS handle. Fitted: the CIFAR-100 jobs, whose traced peaks are tens to hundreds
/// of MiB, measure 554–665 MiB above them on an A100.
pub const CONTEXT_MIB: u64 = 602;

/// The factor on a CNN's traced peak, in thousandths: cuDNN's convolution workspaces and
/// the caching allocator's cached and split blocks grow with the activations. Fitted on
/// ResNet-50, MobileNetV2 and EfficientNet-B0 (ImageNet, batch 32–128) and ResNet-18,
/// EfficientNet-B0 and MobileNetV3-small (CIFAR-100); MLPs use it too (no MLP job was
/// traced; they have no convolution workspace, so it errs high).
pub const CNN_FACTOR_MILLI: u64 = 1_163;

/// The factor on a Transformer's traced peak, in thousandths: 1. The traced BERT jobs
/// measure at or below their traced peak (the trace counts the masked-LM logits in fp32 and
/// the previous step's output alive during the forward pass; the runs may have kept less).
pub const TRANSFORMER_FACTOR_MILLI: u64 = 1_000;

/// The extra factor, in thousandths, for a pod with more than one GPU (the trace is of one
/// GPU's share of the batch): `nn.DataParallel` keeps gradient reductions, the replicas'
/// broadcast parameters and the gathered outputs on GPU 0, and NCCL its buffers. Fitted on
/// XLNet-base and GPT-2 large on 2 GPUs.
pub const MULTI_GPU_FACTOR_MILLI: u64 = 1_730;

/// The three phase peaks of one traced training step, in MiB (rounded up), each the peak
/// of live tensor bytes during that phase with the parameters included. The `traced` key
/// of a model profile.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Traced {
    /// Peak during the forward pass and the loss, 1 to [`MAX_TRACED_MIB`].
    #[serde(rename = "forwardMiB")]
    pub forward_mib: u64,
    /// Peak during the backward pass, 1 to [`MAX_TRACED_MIB`].
    #[serde(rename = "backwardMiB")]
    pub backward_mib: u64,
    /// Peak during the optimizer step (Adam's state appears in the first one), 1 to
    /// [`MAX_TRACED_MIB`].
    #[serde(rename = "optimizerStepMiB")]
    pub optimizer_step_mib: u64,
}

impl Traced {
    /// The largest of the three phase peaks.
    pub fn peak_mib(&self) -> u64 {
        self.forward_mib
            .max(self.backward_mib)
            .max(self.optimizer_step_mib)
    }

    /// Each phase paired with its key in the profile (`traced.forwardMiB`, …).
    pub fn keyed(&self) -> [(&'static str, u64); 3] {
        [
            ("traced.forwardMiB", self.forward_mib),
            ("traced.backwardMiB", self.backward_mib),
            ("traced.optimizerStepMiB", self.optimizer_step_mib),
        ]
    }
}

/// The reservation in MiB, per GPU, for a job whose traced step (one GPU's share of the
/// batch) is `traced`, of model family `family`, run on `gpus` GPUs per pod (0 counts as 1).
///
/// `CONTEXT_MIB + ceil(peak × factor(family) × (MULTI_GPU_FACTOR if gpus > 1))`, with the
/// constants of this module. Never panics: the arithmetic saturates (a validated profile
/// stays far from it).
///
/// ```
/// use carma_estimator::{Family, Traced, traced_reservation_mib};
/// let t = Traced { forward_mib: 19_000, backward_mib: 19_821, optimizer_step_mib: 4_445 };
/// assert_eq!(traced_reservation_mib(&t, Family::Transformer, 1), 602 + 19_821);
/// ```
pub fn traced_reservation_mib(traced: &Traced, family: Family, gpus: u32) -> u64 {
    let factor = match family {
        Family::Transformer => TRANSFORMER_FACTOR_MILLI,
        Family::Cnn | Family::Mlp => CNN_FACTOR_MILLI,
    };
    let multi = if gpus > 1 {
        MULTI_GPU_FACTOR_MILLI
    } else {
        1_000
    };
    let scaled = u128::from(traced.peak_mib()) * u128::from(factor) * u128::from(multi);
    let tensors = scaled.div_ceil(1_000_000);
    CONTEXT_MIB.saturating_add(u64::try_from(tensors).unwrap_or(u64::MAX))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t(f: u64, b: u64, o: u64) -> Traced {
        Traced {
            forward_mib: f,
            backward_mib: b,
            optimizer_step_mib: o,
        }
    }

    #[test]
    fn the_largest_phase_counts_and_the_family_scales_it() {
        let x = t(1_000, 2_000, 500);
        assert_eq!(x.peak_mib(), 2_000);
        assert_eq!(traced_reservation_mib(&x, Family::Transformer, 1), 2_602);
        assert_eq!(traced_reservation_mib(&x, Family::Cnn, 1), 602 + 2_326);
        assert_eq!(traced_reservation_mib(&x, Family::Cnn, 0), 602 + 2_326);
        // 2 GPUs: 2000 × 1.163 × 1.73 = 4023.98 → 4024
        assert_eq!(traced_reservation_mib(&x, Family::Cnn, 2), 602 + 4_024);
    }

    #[test]
    fn huge_figures_saturate() {
        let x = t(u64::MAX, 1, 1);
        assert_eq!(traced_reservation_mib(&x, Family::Cnn, 8), u64::MAX);
    }
}
