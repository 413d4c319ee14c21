//! Errors of `carma local`. Each says what is wrong and where; [`LocalError::is_bad_input`] tells
//! the command line which ones are the user's input (exit code 2) rather than the machine's.

use std::path::{Path, PathBuf};

/// Anything `carma local` can fail with.
#[derive(Debug, thiserror::Error)]
pub enum LocalError {
    /// A flag or an input file is not usable.
    #[error("{0}")]
    BadInput(String),
    /// The state directory does not exist (serve creates it; the other commands need it).
    #[error(
        "state directory {} does not exist (start `carma local serve --state-dir {}` first, or check the path)",
        .0.display(), .0.display()
    )]
    MissingStateDir(PathBuf),
    /// Another daemon holds the state directory.
    #[error("state directory {} is already served by another `carma local serve` (lock file {})", .dir.display(), .lock.display())]
    AlreadyServed {
        /// The state directory.
        dir: PathBuf,
        /// Its lock file.
        lock: PathBuf,
    },
    /// The state directory was removed or replaced while the daemon served it.
    #[error("state directory {} was removed or replaced while this daemon served it; stopping (jobs keep running)", .0.display())]
    StateDirReplaced(PathBuf),
    /// A file or directory operation failed.
    #[error("{}: {source}", .path.display())]
    Io {
        /// The file or directory.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// A journal line cannot be read back (other than a torn last line, which is skipped).
    #[error("journal {} line {line}: {message}", .path.display())]
    Journal {
        /// The journal.
        path: PathBuf,
        /// 1-based line.
        line: usize,
        /// What is wrong.
        message: String,
    },
    /// The GPU backend cannot start or sample.
    #[error(transparent)]
    Backend(#[from] carma_gpu::backends::BackendError),
}

impl LocalError {
    /// Bad input, from anything displayable.
    pub fn bad_input(message: impl Into<String>) -> Self {
        LocalError::BadInput(message.into())
    }

    /// An I/O error on `path`.
    pub fn io(path: &Path, source: std::io::Error) -> Self {
        LocalError::Io {
            path: path.to_path_buf(),
            source,
        }
    }

    /// Whether the error is the user's input (the command line exits 2 on it).
    pub fn is_bad_input(&self) -> bool {
        matches!(
            self,
            LocalError::BadInput(_)
                | LocalError::MissingStateDir(_)
                | LocalError::AlreadyServed { .. }
        )
    }
}

/// `Result` with [`LocalError`].
pub type Result<T, E = LocalError> = std::result::Result<T, E>;
