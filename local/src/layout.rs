//! The state directory: every file `carma local` keeps, and the helpers that write them safely.
//!
//! ```text
//! DIR/
//!   lock                  held (flock) by the serving daemon; holds its pid
//!   journal.jsonl         append-only event journal, fsync'd after every line: the truth
//!   spool/<id>.json       submissions not yet taken by the daemon (written aside, then renamed)
//!   gpus.json             the daemon's latest GPU view, for `status` (replaced atomically)
//!   telemetry.jsonl       one line per sample: per-GPU measurements, for `report` (not fsync'd)
//!   jobs/<id>/<n>/        attempt n of job id: stdout, stderr, pid, exit, memory_mib
//! ```

use std::fs::{self, File, OpenOptions};
use std::io::Write as _;
use std::path::{Path, PathBuf};

use crate::error::{LocalError, Result};

/// Paths inside one state directory.
#[derive(Debug, Clone)]
pub struct StateDir {
    root: PathBuf,
}

impl StateDir {
    /// An existing state directory; an error naming it when it does not exist.
    ///
    /// The path is made absolute: job launchers run in the job's own working directory and name
    /// their attempt folder by this path, and a daemon restarted from elsewhere must find them.
    pub fn existing(root: impl Into<PathBuf>) -> Result<Self> {
        let root = root.into();
        if !root.is_dir() {
            return Err(LocalError::MissingStateDir(root));
        }
        let root = fs::canonicalize(&root).map_err(|e| LocalError::io(&root, e))?;
        Ok(Self { root })
    }

    /// The state directory, created with its spool and jobs folders when missing.
    pub fn create(root: impl Into<PathBuf>) -> Result<Self> {
        let root = root.into();
        fs::create_dir_all(&root).map_err(|e| LocalError::io(&root, e))?;
        let dir = Self::existing(root)?;
        for d in [dir.spool(), dir.jobs()] {
            fs::create_dir_all(&d).map_err(|e| LocalError::io(&d, e))?;
        }
        Ok(dir)
    }

    /// The directory itself.
    pub fn root(&self) -> &Path {
        &self.root
    }

    /// The daemon's lock file.
    pub fn lock(&self) -> PathBuf {
        self.root.join("lock")
    }

    /// The event journal.
    pub fn journal(&self) -> PathBuf {
        self.root.join("journal.jsonl")
    }

    /// Submissions waiting to be taken.
    pub fn spool(&self) -> PathBuf {
        self.root.join("spool")
    }

    /// The latest GPU view.
    pub fn gpus(&self) -> PathBuf {
        self.root.join("gpus.json")
    }

    /// Per-sample GPU measurements.
    pub fn telemetry(&self) -> PathBuf {
        self.root.join("telemetry.jsonl")
    }

    /// Per-job folders.
    pub fn jobs(&self) -> PathBuf {
        self.root.join("jobs")
    }

    /// The folder of attempt `attempt` (1-based) of job `id`.
    pub fn attempt(&self, id: &str, attempt: u32) -> AttemptDir {
        AttemptDir(self.jobs().join(id).join(attempt.to_string()))
    }
}

/// The files of one attempt.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AttemptDir(pub PathBuf);

impl AttemptDir {
    /// The job's standard output.
    pub fn stdout(&self) -> PathBuf {
        self.0.join("stdout")
    }
    /// The job's standard error.
    pub fn stderr(&self) -> PathBuf {
        self.0.join("stderr")
    }
    /// The launcher shell's pid, written by the shell itself before the job starts.
    pub fn pid(&self) -> PathBuf {
        self.0.join("pid")
    }
    /// The job's exit status, written by the launcher shell when the job ends.
    pub fn exit(&self) -> PathBuf {
        self.0.join("exit")
    }
    /// Memory the job declares it uses, in MiB (read by the simulated backend only).
    pub fn memory_mib(&self) -> PathBuf {
        self.0.join("memory_mib")
    }
}

/// Write `bytes` to `path` atomically: a temporary file beside it, fsync'd, then renamed.
pub fn write_atomic(path: &Path, bytes: &[u8]) -> Result<()> {
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let tmp = path.with_file_name(format!(".{name}.tmp"));
    let mut f = File::create(&tmp).map_err(|e| LocalError::io(&tmp, e))?;
    f.write_all(bytes).map_err(|e| LocalError::io(&tmp, e))?;
    f.sync_all().map_err(|e| LocalError::io(&tmp, e))?;
    fs::rename(&tmp, path).map_err(|e| LocalError::io(path, e))
}

/// Append one line to `path` (created when missing); fsync'd when `durable`.
pub fn append_line(path: &Path, line: &str, durable: bool) -> Result<()> {
    let mut f = OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)
        .map_err(|e| LocalError::io(path, e))?;
    let mut buf = String::with_capacity(line.len() + 1);
    buf.push_str(line);
    buf.push('\n');
    f.write_all(buf.as_bytes())
        .map_err(|e| LocalError::io(path, e))?;
    if durable {
        f.sync_data().map_err(|e| LocalError::io(path, e))?;
    }
    Ok(())
}

/// Whether `held` (the daemon's open lock file) is still the file at `dir`'s lock path: removing or
/// replacing the state directory under a running daemon would let a second daemon lock a new file
/// and serve the same paths.
pub fn lock_still_held(dir: &StateDir, held: &File) -> bool {
    use std::os::unix::fs::MetadataExt as _;
    match (fs::metadata(dir.lock()), held.metadata()) {
        (Ok(on_disk), Ok(ours)) => on_disk.dev() == ours.dev() && on_disk.ino() == ours.ino(),
        _ => false,
    }
}

/// Take the daemon's lock on `dir`: an error when another daemon holds it. The lock lasts as long
/// as the returned file is open (the kernel drops it when the process dies, however it dies).
pub fn lock(dir: &StateDir) -> Result<File> {
    let path = dir.lock();
    let mut f = OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(&path)
        .map_err(|e| LocalError::io(&path, e))?;
    match f.try_lock() {
        Ok(()) => {}
        Err(fs::TryLockError::WouldBlock) => {
            return Err(LocalError::AlreadyServed {
                dir: dir.root().to_path_buf(),
                lock: path,
            });
        }
        Err(fs::TryLockError::Error(e)) => return Err(LocalError::io(&path, e)),
    }
    f.set_len(0).map_err(|e| LocalError::io(&path, e))?;
    writeln!(f, "{}", std::process::id()).map_err(|e| LocalError::io(&path, e))?;
    Ok(f)
}
