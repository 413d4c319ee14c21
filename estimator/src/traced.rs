//! The traced estimate: a reservation from one training step traced without a GPU.
//!
//! `python -m carma_profile ... --trace` runs forward, loss, backward and an optimizer step
//! on fake tensors and records the peak bytes of live tensors in each phase (parameters,
//! gradients, optimizer state, saved activations, temporaries; each rounded up to the CUDA
//! caching allocator's 512-byte blocks). The profile carries the three peaks as
//! `"traced": {"forwardMiB": N, "backwardMiB": N, "optimizerStepMiB": N}`.
//!
//! `largestTensorMiB` is the largest single tensor an operator created during forward or
//! backward (an activation, its gradient, a weight's gradient).
//!
//! A GPU holds more than the live tensors: the CUDA context and kernels, cuBLAS/cuDNN
//! workspaces, and what the caching allocator keeps or cannot reuse. cuDNN sizes a
//! convolution's workspace by the tensors it convolves, and the allocator keeps those
//! blocks after they are freed, so that part grows with the largest tensor rather than with
//! the sum. The reservation adds both with constants fitted on CARMA's measured jobs
//! (`docs/traced-estimate.md`, which also gives each job's leave-one-architecture-out
//! figure):
//!
//! ```text
//! reservation = max(FLOOR_MIB,
//!                   CONTEXT_MIB + ceil(peak + b(family) × largest) + (gpus − 1) × MULTI_GPU_MIB)
//! ```
//!
//! where `peak` is the largest of the three phases, counted once (the trace is a floor of
//! what the GPU holds), and `b` is [`CNN_LARGEST_FACTOR_MILLI`] for CNNs and MLPs,
//! [`TRANSFORMER_LARGEST_FACTOR_MILLI`] for Transformers.
//!
//! Traces that carry `reservedMiB` (carma_profile replays the step's allocations through a
//! model of PyTorch's caching allocator, `carma_profile/allocator.py`) are reserved from the
//! allocator's segments instead: what the allocator keeps and cannot reuse is then part of
//! the figure rather than of a fitted term, and the constants are smaller:
//!
//! ```text
//! reservation = max(FLOOR_MIB,
//!                   ALLOCATOR_CONTEXT_MIB + reserved + ceil(a(family) × largest)
//!                   + (gpus − 1) × ALLOCATOR_MULTI_GPU_MIB)
//! ```

use serde::{Deserialize, Serialize};

use crate::family::Family;

/// Largest traced figure accepted: 2^24 MiB (16 TiB), far beyond any GPU or
/// multi-GPU server's memory; larger figures are a mistake, not a job.
pub const MAX_TRACED_MIB: u64 = 1 << 24;

/// What the GPU holds besides tensors, in MiB, for a job of ordinary size: the CUDA
/// context with PyTorch's kernels, the cuBLAS and cuDNN handles. Fitted jointly with
/// [`CNN_LARGEST_FACTOR_MILLI`] (the pair with the least mean over-reservation that
/// underestimates no traced job; the CIFAR-100 jobs measure 554–665 MiB above their traced
/// peaks, ResNet-50 at batch 128 about 1,000 MiB above its peak and workspace term).
pub const CONTEXT_MIB: u64 = 750;

/// The least reservation, in MiB: CARMA's MNIST job (1.2 M parameters, a 35 MiB traced
/// step) measured 1,776 MiB in the same environment as jobs that measure 590 MiB. Nothing
/// in its task file or its trace says what holds the rest (the script's data handling,
/// libraries it loads, eager kernel loading), and GPUMemNet's smallest MLP run holds
/// 1,443 MiB too: a job this small cannot be told apart from it, so every job reserves at
/// least this much.
pub const FLOOR_MIB: u64 = 1_776;

/// Multiples of the largest tensor a CNN (or MLP) job holds beyond its traced peak, in
/// thousandths: cuDNN workspaces and the allocator's cached blocks. Set by VGG-16 at batch
/// 128 (its 1,568 MiB 64 × 224 × 224 activations; 21,864 MiB measured for an 11,075 MiB
/// trace); Inception-v3 needs nearly as much. MLPs have no convolution workspace: it errs
/// high for them (no MLP job was traced).
pub const CNN_LARGEST_FACTOR_MILLI: u64 = 6_750;

/// The same for Transformers: 0. The traced BERT jobs measure at or below their traced
/// peak plus [`CONTEXT_MIB`] (the trace counts the masked-LM logits in fp32 and the
/// previous step's output alive during the forward pass; the runs may have kept less).
pub const TRANSFORMER_LARGEST_FACTOR_MILLI: u64 = 0;

/// What each GPU of a pod beyond the first adds, in MiB, to the reservation of every GPU
/// (the trace is of one GPU's share of the batch). Set by XLNet-large on 2 GPUs: CARMA's three
/// 2-GPU jobs hold 3,474 (XLNet-base), 4,556 (GPT-2 large) and 4,848 MiB (XLNet-large) beyond
/// [`CONTEXT_MIB`] and their traced peak, a near-constant excess where their traced peaks differ
/// 4.6-fold. What `nn.DataParallel` adds on GPU 0 that scales with the model (the reduced
/// gradients beside the replica's, the gathered outputs) lies within the traced peak or far
/// below this for XLNet-base (446 MiB of weights), so the term is additive: a factor on the
/// peak (1.7, the previous form) set by XLNet-base over-reserved GPT-2 large by 11.3 GiB, and
/// held out XLNet-base it missed by 1.7 GiB. Counted once per extra GPU: more replicas
/// gather more outputs and reductions on GPU 0 (no pod with more than 2 GPUs was measured).
pub const MULTI_GPU_MIB: u64 = 4_848;

/// The CUDA context, in MiB, beside the replayed allocator's segments: measured, not fitted.
/// On an H100 (driver 580, CUDA 13.0, torch 2.11) a training process held 742 to 762 MiB
/// beyond what its caching allocator had reserved (NVML's per-process figure less
/// `torch.cuda.memory_reserved`; docs/h100-measurements.md); rounded up to 10 MiB. CARMA's
/// A100 jobs hold less (an older CUDA): the term over-reserves them by a few hundred MiB.
pub const ALLOCATOR_CONTEXT_MIB: u64 = 770;

/// Multiples of the largest tensor a CNN (or MLP) holds beyond the replayed segments, in
/// thousandths: cuDNN's convolution workspaces, which the trace cannot see. Set by CARMA's
/// VGG-16 jobs on A100s; on the H100 the same jobs need less.
pub const ALLOCATOR_CNN_LARGEST_FACTOR_MILLI: u64 = 3_280;

/// The same for Transformers. Set by BERT-large at batch 8 on the H100, which measures
/// 514 MiB beyond [`ALLOCATOR_CONTEXT_MIB`] and its replayed segments (its largest tensor
/// is 477 MiB); what it holds there is not traced (cuBLAS workspaces are one candidate;
/// `python -m carma_profile.device_breakdown` on a GPU shows it). It was 0.34 while the trace
/// counted a tied LM head twice (weight, gradient and Adam state of 477 MiB).
pub const ALLOCATOR_TRANSFORMER_LARGEST_FACTOR_MILLI: u64 = 1_080;

/// [`MULTI_GPU_MIB`] refitted beside the replayed segments (CARMA's 2-GPU jobs); set by
/// XLNet-large.
pub const ALLOCATOR_MULTI_GPU_MIB: u64 = 6_385;

/// The three phase peaks of one traced training step, in MiB (rounded up), each the peak
/// of live tensor bytes during that phase with the parameters included, and the largest
/// single tensor. The `traced` key of a model profile.
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
    /// The largest single tensor an operator created during forward or backward, 1 to
    /// [`MAX_TRACED_MIB`]. Optional: traces written before it was recorded lack it, and the
    /// reservation then counts the largest phase peak in its place (no tensor is larger than
    /// the peak it is part of), which is safe but loose for CNNs: trace again.
    #[serde(
        rename = "largestTensorMiB",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    pub largest_tensor_mib: Option<u64>,
    /// The segments PyTorch's caching allocator holds after the traced step, replayed from
    /// its allocations and frees by `carma_profile` (at least the largest phase peak, at most
    /// [`MAX_TRACED_MIB`]). Optional: traces written before it was recorded lack it, and
    /// the reservation then uses the live-tensor form.
    #[serde(
        rename = "reservedMiB",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    pub reserved_mib: Option<u64>,
}

impl Traced {
    /// The largest of the three phase peaks.
    pub fn peak_mib(&self) -> u64 {
        self.forward_mib
            .max(self.backward_mib)
            .max(self.optimizer_step_mib)
    }

    /// The largest tensor, or the largest phase peak when the trace did not record it.
    pub fn largest_or_peak_mib(&self) -> u64 {
        self.largest_tensor_mib.unwrap_or_else(|| self.peak_mib())
    }

    /// Each figure present paired with its key in the profile (`traced.forwardMiB`, …).
    pub fn keyed(&self) -> Vec<(&'static str, u64)> {
        let mut keyed = vec![
            ("traced.forwardMiB", self.forward_mib),
            ("traced.backwardMiB", self.backward_mib),
            ("traced.optimizerStepMiB", self.optimizer_step_mib),
        ];
        if let Some(l) = self.largest_tensor_mib {
            keyed.push(("traced.largestTensorMiB", l));
        }
        if let Some(r) = self.reserved_mib {
            keyed.push(("traced.reservedMiB", r));
        }
        keyed
    }
}

/// The reservation in MiB, per GPU, for a job whose traced step (one GPU's share of the
/// batch) is `traced`, of model family `family`, run on `gpus` GPUs per pod (0 counts as 1).
///
/// With `reservedMiB`: `max(FLOOR_MIB, ALLOCATOR_CONTEXT_MIB + reserved +
/// ceil(a(family) × largest) + (gpus − 1) × ALLOCATOR_MULTI_GPU_MIB)`; without it:
/// `max(FLOOR_MIB, CONTEXT_MIB + ceil(peak + b(family) × largest) + (gpus − 1) ×
/// MULTI_GPU_MIB)`. Never panics: the arithmetic saturates (a validated profile stays far
/// from it).
///
/// ```
/// use carma_estimator::{Family, Traced, traced_reservation_mib};
/// let mut t = Traced { forward_mib: 19_000, backward_mib: 19_821, optimizer_step_mib: 4_445,
///                      largest_tensor_mib: Some(1_908), reserved_mib: None };
/// assert_eq!(traced_reservation_mib(&t, Family::Transformer, 1), 750 + 19_821);
/// t.reserved_mib = Some(20_900);
/// // 1.08 × the 1,908 MiB largest tensor, rounded up
/// assert_eq!(traced_reservation_mib(&t, Family::Transformer, 1), 770 + 20_900 + 2_061);
/// ```
pub fn traced_reservation_mib(traced: &Traced, family: Family, gpus: u32) -> u64 {
    let transformer = family == Family::Transformer;
    let (context, base, largest_factor, per_gpu) = match traced.reserved_mib {
        Some(reserved) => (
            ALLOCATOR_CONTEXT_MIB,
            reserved,
            if transformer {
                ALLOCATOR_TRANSFORMER_LARGEST_FACTOR_MILLI
            } else {
                ALLOCATOR_CNN_LARGEST_FACTOR_MILLI
            },
            ALLOCATOR_MULTI_GPU_MIB,
        ),
        None => (
            CONTEXT_MIB,
            traced.peak_mib(),
            if transformer {
                TRANSFORMER_LARGEST_FACTOR_MILLI
            } else {
                CNN_LARGEST_FACTOR_MILLI
            },
            MULTI_GPU_MIB,
        ),
    };
    let extra_gpus = u128::from(gpus.max(1) - 1);
    let milli = u128::from(base).saturating_mul(1_000).saturating_add(
        u128::from(traced.largest_or_peak_mib()).saturating_mul(u128::from(largest_factor)),
    );
    let tensors = milli
        .div_ceil(1_000)
        .saturating_add(extra_gpus.saturating_mul(u128::from(per_gpu)));
    context
        .saturating_add(u64::try_from(tensors).unwrap_or(u64::MAX))
        .max(FLOOR_MIB)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t(f: u64, b: u64, o: u64, l: Option<u64>) -> Traced {
        Traced {
            forward_mib: f,
            backward_mib: b,
            optimizer_step_mib: o,
            largest_tensor_mib: l,
            reserved_mib: None,
        }
    }

    #[test]
    fn replayed_segments_replace_the_peak_and_their_own_constants_apply() {
        let x = Traced {
            reserved_mib: Some(22_000),
            ..t(10_000, 20_000, 5_000, Some(1_000))
        };
        // 22000 + 1.08 × 1000
        assert_eq!(
            traced_reservation_mib(&x, Family::Transformer, 1),
            770 + 23_080
        );
        // 22000 + 3.28 × 1000
        assert_eq!(traced_reservation_mib(&x, Family::Cnn, 1), 770 + 25_280);
        assert_eq!(
            traced_reservation_mib(&x, Family::Cnn, 3),
            770 + 25_280 + 2 * 6_385
        );
        let tiny = Traced {
            reserved_mib: Some(40),
            ..t(27, 35, 23, Some(5))
        };
        assert_eq!(traced_reservation_mib(&tiny, Family::Cnn, 1), FLOOR_MIB);
        assert_eq!(x.keyed().last(), Some(&("traced.reservedMiB", 22_000)));
    }

    #[test]
    fn the_largest_phase_and_tensor_count_and_the_family_scales_the_tensor() {
        let x = t(10_000, 20_000, 5_000, Some(1_000));
        assert_eq!(x.peak_mib(), 20_000);
        assert_eq!(traced_reservation_mib(&x, Family::Transformer, 1), 20_750);
        // 20000 + 6.75 × 1000
        assert_eq!(traced_reservation_mib(&x, Family::Cnn, 1), 750 + 26_750);
        assert_eq!(traced_reservation_mib(&x, Family::Cnn, 0), 750 + 26_750);
        assert_eq!(traced_reservation_mib(&x, Family::Mlp, 1), 750 + 26_750);
        // each GPU beyond the first adds MULTI_GPU_MIB, whatever the peak
        assert_eq!(
            traced_reservation_mib(&x, Family::Cnn, 2),
            750 + 26_750 + 4_848
        );
        assert_eq!(
            traced_reservation_mib(&x, Family::Transformer, 4),
            750 + 20_000 + 3 * 4_848
        );
        let small = t(100, 200, 50, Some(10));
        assert_eq!(
            traced_reservation_mib(&small, Family::Transformer, 2),
            750 + 200 + 4_848
        );
    }

    #[test]
    fn small_jobs_reserve_the_floor_and_a_missing_largest_tensor_is_the_peak() {
        let tiny = t(27, 35, 23, Some(5));
        assert_eq!(traced_reservation_mib(&tiny, Family::Cnn, 1), FLOOR_MIB);
        let old = t(1_000, 2_000, 500, None);
        assert_eq!(old.largest_or_peak_mib(), 2_000);
        assert_eq!(
            traced_reservation_mib(&old, Family::Cnn, 1),
            750 + 2_000 + 13_500
        );
        assert_eq!(traced_reservation_mib(&old, Family::Transformer, 1), 2_750);
        assert_eq!(old.keyed().len(), 3);
        assert_eq!(tiny.keyed()[3], ("traced.largestTensorMiB", 5));
    }

    #[test]
    fn huge_figures_saturate() {
        let x = t(u64::MAX, 1, 1, Some(u64::MAX));
        assert_eq!(traced_reservation_mib(&x, Family::Cnn, 8), u64::MAX);
    }
}
