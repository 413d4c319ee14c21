//! Why an evaluation could not run: every module of the crate reports with [`PeaksError`].

use std::path::PathBuf;

/// Why the evaluation could not run.
#[derive(Debug, thiserror::Error)]
pub enum PeaksError {
    /// A directory or file could not be read.
    #[error("cannot read {}: {source}", path.display())]
    Read {
        /// The path.
        path: PathBuf,
        /// The I/O error.
        source: std::io::Error,
    },
    /// A task file line is not what CARMA writes there.
    #[error("{}: 0-based line {line} ({what}) is `{text}`, not a number", path.display())]
    BadRad {
        /// The task file.
        path: PathBuf,
        /// 0-based line.
        line: usize,
        /// What the line holds.
        what: &'static str,
        /// The text found.
        text: String,
    },
    /// A model description could not be parsed or estimated.
    #[error("{}: {message}", path.display())]
    Model {
        /// The file.
        path: PathBuf,
        /// The parser's or estimator's message.
        message: String,
    },
    /// No task file had both a measured peak and a profile.
    #[error("no task file under {} has a measured peak and a catalog entry", .0.display())]
    NoRows(PathBuf),
    /// The traced figures' CSV is malformed.
    #[error("{} line {line}: {message}", path.display())]
    BadTraced {
        /// The CSV.
        path: PathBuf,
        /// 1-based line.
        line: usize,
        /// What is wrong.
        message: String,
    },
}
