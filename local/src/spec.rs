//! What a job is (its [`JobSpec`]) and how `submit` hands one to the daemon: a JSON file written
//! into the state directory's spool under a temporary name and renamed into place, so the daemon
//! never reads half a submission. The daemon journals the job before it removes the spool file, so
//! a submission survives a daemon that dies at any moment.

use std::fs;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU32, Ordering};

use carma_core::{Policy, Reservation};
use serde::{Deserialize, Serialize};

use crate::Millis;
use crate::error::{LocalError, Result};
use crate::layout::{StateDir, write_atomic};

/// One job as submitted.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct JobSpec {
    /// Job id (unique in the state directory; sorts in submission order).
    pub id: String,
    /// Display name (the `.rad` file or the command's first word).
    pub name: String,
    /// Program and arguments, run without a shell.
    pub command: Vec<String>,
    /// Working directory.
    pub cwd: PathBuf,
    /// GPUs, all on this machine.
    pub gpus: u32,
    /// Memory per GPU for the first attempt.
    pub reservation: Reservation,
    /// Where the reservation comes from (`override`, `gpumemnet-mlp`, `rad-gpumemnet`, `none`, …).
    pub reservation_source: String,
    /// Placement policy; `None`: the daemon's.
    pub policy: Option<Policy>,
    /// Expected SM activity alone (0..1), read only by the `pack` policy: `--sm-activity`, or
    /// carma-estimator's model-class prior for a `--profile`/`--summary` job; `None`: unknown
    /// (pack then counts the job as filling its GPU).
    #[serde(default)]
    pub expected_sm_activity: Option<f64>,
    /// How long the job runs with its GPUs to itself, as submitted (`--expected-duration`): the
    /// daemon's queue order ranks by it; `None`: not declared (behind every job that declares
    /// one, under an order other than arrival).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub expected_duration_ms: Option<Millis>,
    /// When it was submitted (milliseconds since the Unix epoch).
    pub submitted_at_ms: Millis,
}

/// The wall clock in milliseconds since the Unix epoch.
pub fn now_ms() -> Millis {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as Millis)
}

/// A fresh job id: submission time, submitter pid and a per-process counter, so ids are unique
/// without coordination and sort by submission time.
pub fn new_job_id(now: Millis) -> String {
    static COUNTER: AtomicU32 = AtomicU32::new(0);
    let n = COUNTER.fetch_add(1, Ordering::Relaxed);
    format!("j{now:013}-{}-{n:06}", std::process::id())
}

/// Hand `spec` to the daemon of `dir` (written into its spool; the daemon need not run).
pub fn submit(dir: &StateDir, spec: &JobSpec) -> Result<()> {
    if spec.command.is_empty() {
        return Err(LocalError::bad_input(
            "no command given (put it after `--`)",
        ));
    }
    if spec.gpus == 0 {
        return Err(LocalError::bad_input("--gpus must be at least 1"));
    }
    let spool = dir.spool();
    fs::create_dir_all(&spool).map_err(|e| LocalError::io(&spool, e))?;
    let json = serde_json::to_vec_pretty(spec)
        .map_err(|e| LocalError::bad_input(format!("cannot encode job {}: {e}", spec.id)))?;
    write_atomic(&spool.join(format!("{}.json", spec.id)), &json)
}

/// Submissions in the spool, oldest first, with their files. A file that cannot be read as a job
/// is reported and skipped (left in place for a person to look at, renamed `*.bad`).
pub fn read_spool(dir: &StateDir) -> Result<Vec<(JobSpec, PathBuf)>> {
    let spool = dir.spool();
    let entries = match fs::read_dir(&spool) {
        Ok(e) => e,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(LocalError::io(&spool, e)),
    };
    let mut out = Vec::new();
    for entry in entries.flatten() {
        let path = entry.path();
        if path.extension().and_then(|e| e.to_str()) != Some("json") {
            continue;
        }
        let parsed = fs::read(&path)
            .map_err(|e| e.to_string())
            .and_then(|b| serde_json::from_slice::<JobSpec>(&b).map_err(|e| e.to_string()));
        match parsed {
            Ok(spec) => out.push((spec, path)),
            Err(e) => {
                tracing::warn!(file = %path.display(), error = %e, "unreadable submission: renamed *.bad");
                let _ = fs::rename(&path, path.with_extension("bad"));
            }
        }
    }
    out.sort_by(|a, b| (a.0.submitted_at_ms, &a.0.id).cmp(&(b.0.submitted_at_ms, &b.0.id)));
    Ok(out)
}
