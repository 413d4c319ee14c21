//! The event journal: one JSON object per line, appended and fsync'd before the daemon acts on it.
//!
//! Replaying the journal from the start rebuilds every job (see [`crate::jobs::JobTable`]). Order
//! of writes around a launch: `Launching` is made durable *before* the process is spawned, so a
//! daemon that dies at any point either finds the attempt in the journal (and its folder tells
//! whether the process ran) or never started it. A line cut short by a crash can only be the
//! last one; it is skipped with a warning.

use std::fs;
use std::path::PathBuf;

use carma_core::{AttemptOutcome, RecoveryDecision, Reservation};
use serde::{Deserialize, Serialize};

use crate::Millis;
use crate::error::{LocalError, Result};
use crate::layout::append_line;
use crate::spec::JobSpec;

/// What telemetry saw of one attempt.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct AttemptUsage {
    /// Highest GPU memory attributed to the job on any of its GPUs, MiB.
    pub peak_mib: Option<u64>,
    /// Mean SM activity of its GPUs while it ran (0..1; shared with whatever else ran there).
    pub sm_activity_mean: Option<f64>,
    /// GPU energy attributed to it, joules: each sample's energy increase of a GPU split evenly
    /// among the jobs on that GPU.
    pub energy_j: Option<f64>,
    /// Samples taken while it ran.
    pub samples: u32,
}

/// One journal line.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "event", rename_all = "camelCase")]
pub enum Event {
    /// A job was taken from the spool.
    Submitted {
        /// The job.
        job: JobSpec,
        /// When the daemon took it.
        at_ms: Millis,
    },
    /// An attempt is about to be spawned on these GPUs.
    Launching {
        /// Job id.
        id: String,
        /// 1-based attempt number.
        attempt: u32,
        /// GPU indices (what `CUDA_VISIBLE_DEVICES` gets).
        gpus: Vec<u32>,
        /// Their UUIDs.
        uuids: Vec<String>,
        /// MiB booked per GPU.
        reserved_mib: u64,
        /// The reservation the attempt asked for.
        reservation: Reservation,
        /// Whether it has its GPUs alone.
        exclusive: bool,
        /// When.
        at_ms: Millis,
    },
    /// The attempt's process runs (or was re-adopted after a daemon restart).
    Started {
        /// Job id.
        id: String,
        /// Attempt.
        attempt: u32,
        /// The launcher shell's pid (the job's process group).
        pid: u32,
        /// When.
        at_ms: Millis,
    },
    /// The attempt ended.
    Ended {
        /// Job id.
        id: String,
        /// Attempt.
        attempt: u32,
        /// How, in carma-core's terms.
        outcome: AttemptOutcome,
        /// The exit code, when the process was seen to exit.
        exit_code: Option<i32>,
        /// Why, for people.
        reason: String,
        /// What telemetry saw.
        usage: AttemptUsage,
        /// When.
        at_ms: Millis,
    },
    /// carma-core's `decide_next` after an attempt ended.
    Decided {
        /// Job id.
        id: String,
        /// The decision.
        decision: RecoveryDecision,
        /// When.
        at_ms: Millis,
    },
}

/// The journal file of one state directory.
#[derive(Debug, Clone)]
pub struct Journal {
    path: PathBuf,
}

impl Journal {
    /// The journal at `path`.
    pub fn new(path: PathBuf) -> Self {
        Self { path }
    }

    /// Append `event` and fsync it.
    pub fn append(&self, event: &Event) -> Result<()> {
        let line = serde_json::to_string(event).map_err(|e| LocalError::Journal {
            path: self.path.clone(),
            line: 0,
            message: format!("cannot encode event: {e}"),
        })?;
        append_line(&self.path, &line, true)
    }

    /// Cut a torn last line (a crash in the middle of an append) so that the next append starts
    /// on a line of its own. The daemon calls this once, under its lock, before appending.
    pub fn repair(&self) -> Result<()> {
        let text = match fs::read(&self.path) {
            Ok(t) => t,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
            Err(e) => return Err(LocalError::io(&self.path, e)),
        };
        if text.is_empty() || text.ends_with(b"\n") {
            return Ok(());
        }
        let keep = text.iter().rposition(|b| *b == b'\n').map_or(0, |i| i + 1);
        tracing::warn!(journal = %self.path.display(), bytes = text.len() - keep, "cutting a torn last line");
        let f = fs::OpenOptions::new()
            .write(true)
            .open(&self.path)
            .map_err(|e| LocalError::io(&self.path, e))?;
        f.set_len(keep as u64)
            .and_then(|()| f.sync_all())
            .map_err(|e| LocalError::io(&self.path, e))
    }

    /// Every event, oldest first. A torn last line is skipped; a bad line elsewhere is an error.
    pub fn read(&self) -> Result<Vec<Event>> {
        let text = match fs::read_to_string(&self.path) {
            Ok(t) => t,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
            Err(e) => return Err(LocalError::io(&self.path, e)),
        };
        let lines: Vec<&str> = text.lines().collect();
        let mut out = Vec::with_capacity(lines.len());
        for (i, line) in lines.iter().enumerate() {
            if line.trim().is_empty() {
                continue;
            }
            match serde_json::from_str::<Event>(line) {
                Ok(e) => out.push(e),
                Err(e) if i + 1 == lines.len() && !text.ends_with('\n') => {
                    tracing::warn!(journal = %self.path.display(), error = %e, "skipping a torn last line");
                }
                Err(e) => {
                    return Err(LocalError::Journal {
                        path: self.path.clone(),
                        line: i + 1,
                        message: e.to_string(),
                    });
                }
            }
        }
        Ok(out)
    }
}
