//! A table's or printout's layer-by-layer reading, carried in a model profile so that the
//! cluster reserves from it (`layerReading` in a `carma.io/model-profile` annotation or a
//! TrainingTask's `modelProfile`; `carma estimate --summary … --emit-profile` writes it), and the
//! values it holds as the parsers make them and the bound reads them ([`SavedValues`]). Both the
//! parsers and the bound import these types; this module imports neither.

use serde::{Deserialize, Serialize};

use crate::limits::MAX_ACTIVATIONS;

/// What a layer-by-layer reading of a torchsummary table or a module printout says a
/// training step keeps, per sample, in 4-byte values. Only the parsers build it (see
/// [`summary_values`](crate::reading::summary_values),
/// [`printout_values`](crate::reading::printout_values));
/// [`detailed_bound`](crate::analytic::detailed_bound) turns it into a reservation.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SavedValues {
    /// Values kept for backward, weighted by how many distinct tensors each layer's
    /// output makes (see [`summary_values`](crate::reading::summary_values) and
    /// [`printout_values`](crate::reading::printout_values)).
    pub saved: u128,
    /// The largest single layer output. Backward holds a gradient of this size next to
    /// the saved tensors, and cuDNN's workspaces grow with it.
    pub largest: u128,
    /// Attention score values (heads × seqLength² per block, times the score tensors
    /// an attention block of that kind keeps).
    pub scores: u128,
    /// Values kept in fp32 even under mixed precision, beside `saved`: CUDA autocast runs
    /// norms, softmax, losses and `pow` in fp32, and a sum of a 16-bit and an fp32 tensor
    /// (a residual connection) is fp32. Module printouts only; a table's rows are all in
    /// `saved`.
    pub kept_fp32: u128,
}

/// What [`crate::analytic::detailed_bound`] counts of a model, per sample: the values of
/// [`SavedValues`], as whole numbers a JSON document holds exactly.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct LayerReading {
    /// Values kept for backward at the activations' precision ([`SavedValues::saved`]).
    pub saved_values: u64,
    /// Values kept in fp32 even under mixed precision ([`SavedValues::kept_fp32`]).
    #[serde(default)]
    pub kept_fp32_values: u64,
    /// The largest single layer output ([`SavedValues::largest`]).
    pub largest_values: u64,
    /// Attention score values ([`SavedValues::scores`]).
    #[serde(default)]
    pub score_values: u64,
}

impl LayerReading {
    /// Its keys and values, for validation (each at most [`MAX_ACTIVATIONS`]).
    pub fn keyed(&self) -> [(&'static str, u64); 4] {
        [
            ("layerReading.savedValues", self.saved_values),
            ("layerReading.keptFp32Values", self.kept_fp32_values),
            ("layerReading.largestValues", self.largest_values),
            ("layerReading.scoreValues", self.score_values),
        ]
    }

    /// The largest value any key may hold.
    pub const MAX_VALUES: u64 = MAX_ACTIVATIONS;

    /// The values the detailed bound reads.
    pub fn values(&self) -> SavedValues {
        SavedValues {
            saved: self.saved_values.into(),
            kept_fp32: self.kept_fp32_values.into(),
            largest: self.largest_values.into(),
            scores: self.score_values.into(),
        }
    }
}

impl From<&SavedValues> for LayerReading {
    /// Saturates at `u64::MAX`; validation then refuses the profile by name.
    fn from(v: &SavedValues) -> Self {
        let n = |x: u128| u64::try_from(x).unwrap_or(u64::MAX);
        LayerReading {
            saved_values: n(v.saved),
            kept_fp32_values: n(v.kept_fp32),
            largest_values: n(v.largest),
            score_values: n(v.scores),
        }
    }
}
