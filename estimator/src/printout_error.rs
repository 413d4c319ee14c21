//! Why a module printout was rejected ([`crate::printout`]).

use crate::profile::{Family, ProfileError};

/// Why a module printout was rejected.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PrintoutError {
    /// Empty input.
    #[error("module printout is empty")]
    Empty,
    /// A line could not be read.
    #[error("module printout line {line}: {reason}: `{text}`")]
    BadLine {
        /// 1-based line number.
        line: usize,
        /// The line, trimmed (at most 120 characters).
        text: String,
        /// What is wrong.
        reason: String,
    },
    /// The input ended with modules still open.
    #[error("module printout ends inside `{module}` (opened on line {line}): it was cut")]
    Unclosed {
        /// The innermost open module's type.
        module: String,
        /// Where it was opened.
        line: usize,
    },
    /// A module's count is below its children's by more than one shared module's count.
    #[error(
        "module printout line {line}: `{module}` has {count} params but its children have {children}"
    )]
    ParamMismatch {
        /// 1-based line of the module's count.
        line: usize,
        /// The module's type.
        module: String,
        /// Its count.
        count: u64,
        /// The sum of its children's counts.
        children: u128,
    },
    /// Only the transformer family is read from printouts.
    #[error(
        "module printouts are read for the transformer family only (got `{0}`); use a torchsummary table"
    )]
    WrongFamily(Family),
    /// No attention or layer-norm module: not a transformer.
    #[error("module printout has no attention or LayerNorm module; it is not a transformer")]
    NotTransformer,
    /// Batch size or sequence length out of range.
    #[error("{what} {value} is out of range: 1 to {max}")]
    OutOfRange {
        /// `batch size` or `sequence length`.
        what: &'static str,
        /// The value given.
        value: u32,
        /// The largest allowed.
        max: u32,
    },
    /// The derived profile is unusable (e.g. zero parameters).
    #[error("module printout yields an invalid profile: {0}")]
    Profile(#[from] ProfileError),
}
