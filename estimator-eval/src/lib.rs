//! `carma-estimator-eval`: the research tooling behind `carma estimate eval --peaks`, kept out of
//! the estimator that the cluster runs.
//!
//! It sets carma's reservations beside the peaks that CARMA measured (its v2 task files, with the
//! profiles of the simulator's workload catalog and the tables and printouts of the same models),
//! beside the legacy bound and GPUMemNet's recorded estimates, and the traced reservation beside
//! the peaks carma measured itself on a GPU:
//!
//! * [`peaks`] reads the task files, tables and printouts into one row per job;
//! * [`measured`] pairs carma's GPU measurements with the traced figures of the same jobs;
//! * [`report`] tallies both per family and source ([`tally`]) and renders the text table.
//!
//! The evaluation of the shipped GPUMemNet model on a CSV in GPUMemNet's schema (`carma estimate
//! eval --dataset`) is [`carma_estimator::evaluate`]: the estimator's own tests use it.
//!
//! The modules import one another in one direction only: [`error`] and [`tally`] below
//! [`measured`], below [`peaks`], below [`report`].

pub mod error;
pub mod measured;
pub mod peaks;
pub mod report;
pub mod tally;

use std::path::{Path, PathBuf};

use carma_estimator::Estimator;

pub use error::PeaksError;
pub use measured::evaluate_measured;
pub use peaks::{
    DEFAULT_PRINTOUTS, DEFAULT_SUMMARIES, DEFAULT_WORKLOADS, REPO_PRINTOUTS, REPO_SUMMARIES,
    REPO_TRACED,
};
pub use report::{PeaksReport, render_table};

/// The rows of [`peaks::peak_rows`], tallied ([`report::report`]); `measured` is left empty
/// (see [`evaluate_measured`]).
pub fn evaluate_peaks(
    estimator: &Estimator,
    workloads: &Path,
    summaries: &[PathBuf],
    printouts: &[PathBuf],
    traced: &Path,
) -> Result<PeaksReport, PeaksError> {
    let (rows, skipped) = peaks::peak_rows(estimator, workloads, summaries, printouts, traced)?;
    Ok(report::report(rows, skipped))
}
