//! A torchsummary or torchinfo table, or a module printout, read layer by layer: its profile, what
//! the detailed bound ([`crate::analytic::detailed_bound`]) counts of it ([`SavedValues`]), and
//! what it had no measured rule for. This module sits above the parsers and the bound and
//! dispatches to the parser of the input's kind.

use crate::caveat::Caveat;
use crate::family::Family;
use crate::layer_reading::SavedValues;
use crate::printout::{self, PrintoutError};
use crate::profile::Profile;
use crate::torchinfo;
use crate::torchsummary::{self, SummaryError};

/// A torchsummary table (or, with `torchinfo`, a torchinfo table) read at `batch_size`:
/// its profile and what [`detailed_bound`](crate::analytic::detailed_bound) counts of it.
///
/// Saved values: every row's output, activation-function rows at half weight (an
/// in-place ReLU shares its input's storage, one that is not in place keeps a tensor
/// of its own), and the largest row. Containers' rows count in full: a block's output
/// is sometimes its last layer's tensor, sometimes a new one (a concatenation, an
/// out-of-place residual sum). In a torchsummary table, a batch-norm row whose shape differs
/// from the row before it reads a tensor no row shows (DenseNet's concatenation of earlier
/// feature maps), which it saves: that input counts once more.
pub fn summary_values(
    text: &str,
    family: Family,
    batch_size: u32,
    torchinfo: bool,
) -> Result<(Profile, SavedValues), SummaryError> {
    if torchinfo {
        torchinfo::parse_torchinfo_values(text, family, batch_size)
    } else {
        torchsummary::parse_torchsummary_values(text, family, batch_size)
    }
}

/// A module printout read at `batch_size` and `seq_len` tokens: its profile and what
/// [`detailed_bound`](crate::analytic::detailed_bound) counts of it (the printout parser's docs say what: module
/// outputs, the projections an attention block holds as bare parameters, and the
/// score tensors of each attention block by its kind, once per head). What it had no rule for
/// is counted conservatively; [`printout_reading`] says what that was.
pub fn printout_values(
    text: &str,
    family: Family,
    batch_size: u32,
    seq_len: u32,
) -> Result<(Profile, SavedValues), PrintoutError> {
    printout::parse_printout_values(text, family, batch_size, seq_len)
}

/// A table or printout read layer by layer: its profile, what [`detailed_bound`](crate::analytic::detailed_bound) counts of it,
/// and what it had no measured rule for (counted conservatively in `values`; see
/// [`crate::Caveat`]).
#[derive(Debug, Clone, PartialEq)]
pub struct Reading {
    /// The job's profile (without its `layerReading`).
    pub profile: Profile,
    /// What the detailed bound counts.
    pub values: SavedValues,
    /// What had no rule; empty when every module and pattern had one.
    pub caveats: Vec<Caveat>,
}

/// [`summary_values`] with its caveats: an attention row that may keep score tensors no row
/// shows makes every value count [`crate::FALLBACK_PERCENT`] %.
pub fn summary_reading(
    text: &str,
    family: Family,
    batch_size: u32,
    torchinfo: bool,
) -> Result<Reading, SummaryError> {
    let (profile, values, caveats) = if torchinfo {
        torchinfo::parse_torchinfo_reading(text, family, batch_size)?
    } else {
        torchsummary::parse_torchsummary_reading(text, family, batch_size)?
    };
    Ok(Reading {
        profile,
        values,
        caveats: caveats.into_vec(),
    })
}

/// [`printout_values`] with its caveats ([`crate::printout_rules`]). A shared layer group
/// (ALBERT's) runs `shared_runs` times — the model's `num_hidden_layers` — when given, else
/// [`crate::printout_rules::ASSUMED_SHARED_RUNS`] times with a caveat.
pub fn printout_reading(
    text: &str,
    family: Family,
    batch_size: u32,
    seq_len: u32,
    shared_runs: Option<u32>,
) -> Result<Reading, PrintoutError> {
    let (profile, values, caveats) =
        printout::parse_printout_reading(text, family, batch_size, seq_len, shared_runs)?;
    Ok(Reading {
        profile,
        values,
        caveats: caveats.into_vec(),
    })
}
