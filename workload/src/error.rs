//! Errors of the simulator: bad input names the file and line.

use std::path::PathBuf;

use thiserror::Error;

/// Everything that can stop a simulation before it runs.
#[derive(Debug, Error)]
pub enum SimError {
    /// A file could not be read.
    #[error("cannot read {path}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// What the OS said.
        #[source]
        source: std::io::Error,
    },
    /// A line of an input file is malformed.
    #[error("{path}:{line}: {message}")]
    Parse {
        /// The file.
        path: PathBuf,
        /// 1-based line number.
        line: usize,
        /// What is wrong with it.
        message: String,
    },
    /// A file is consistent on its own but something it needs is missing.
    #[error("{path}: {message}")]
    Input {
        /// The file.
        path: PathBuf,
        /// What is missing or inconsistent.
        message: String,
    },
    /// A configuration value is out of range.
    #[error("invalid configuration: {0}")]
    Config(String),
    /// The memory estimator could not be loaded.
    #[error("memory estimator: {0}")]
    Estimator(String),
}

impl SimError {
    /// A [`SimError::Parse`] for `path` at 1-based `line`.
    pub fn parse(path: impl Into<PathBuf>, line: usize, message: impl Into<String>) -> Self {
        SimError::Parse {
            path: path.into(),
            line,
            message: message.into(),
        }
    }
}
