//! `carma local replay`: submit a CARMA trace script's jobs at its gaps (scaled), as CARMA's own
//! `submit.py` / `sleep N` script would. The script is parsed by the shared trace parser, each
//! task file by [`crate::task_file`]. The daemon runs separately (`serve`), as with CARMA.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use carma_workload::trace::carma::{parse_durations, parse_script};

use crate::error::{LocalError, Result};
use crate::layout::StateDir;
use crate::spec::{JobSpec, new_job_id, now_ms, submit};
use crate::task_file::read_rad;

/// How to replay.
#[derive(Debug, Clone)]
pub struct ReplayOptions {
    /// The trace script.
    pub trace: PathBuf,
    /// Folder of the `.rad` files it names.
    pub workloads: PathBuf,
    /// Multiplier on every gap (0.01 = a hundred times faster; 0 = all at once).
    pub time_scale: f64,
    /// Run this shell command instead of each task's own (e.g. `sleep {seconds}` for a dry run).
    /// Placeholders: `{rad}` the task file's name, `{peak_mib}` its measured peak per GPU,
    /// `{seconds}` its exclusive run time from `durations` times `time_scale`.
    pub command: Option<String>,
    /// CARMA's `rad,exclusive_minutes` CSV (needed for `{seconds}`).
    pub durations: Option<PathBuf>,
    /// Working directory of the jobs.
    pub cwd: PathBuf,
}

/// Submit every task of the trace at its (scaled) time; returns the job ids in order.
pub fn replay(dir: &StateDir, opts: &ReplayOptions) -> Result<Vec<String>> {
    if !opts.time_scale.is_finite() || opts.time_scale < 0.0 {
        return Err(LocalError::bad_input(format!(
            "--time-scale {}: expected a number ≥ 0",
            opts.time_scale
        )));
    }
    let text = std::fs::read_to_string(&opts.trace)
        .map_err(|e| LocalError::bad_input(format!("--trace {}: {e}", opts.trace.display())))?;
    let subs =
        parse_script(&opts.trace, &text).map_err(|e| LocalError::bad_input(e.to_string()))?;
    // Every task file is read before the first submission: a bad one fails the replay up front.
    let tasks = subs
        .iter()
        .map(|s| read_rad(&opts.workloads.join(&s.rad)))
        .collect::<Result<Vec<_>>>()?;
    let durations = match &opts.durations {
        Some(path) => {
            let text = std::fs::read_to_string(path).map_err(|e| {
                LocalError::bad_input(format!("--durations {}: {e}", path.display()))
            })?;
            parse_durations(path, &text).map_err(|e| LocalError::bad_input(e.to_string()))?
        }
        None => Default::default(),
    };
    if opts
        .command
        .as_deref()
        .is_some_and(|c| c.contains("{seconds}"))
        && let Some(missing) = subs.iter().find(|s| !durations.contains_key(&s.rad))
    {
        return Err(LocalError::bad_input(format!(
            "--command uses {{seconds}} but {} has no run time{}",
            missing.rad,
            opts.durations.as_ref().map_or(
                " (give --durations task-durations.csv)".to_string(),
                |d| format!(" in {}", d.display())
            )
        )));
    }
    let start = Instant::now();
    let mut ids = Vec::with_capacity(tasks.len());
    for (sub, task) in subs.iter().zip(tasks) {
        let due = Duration::from_secs_f64(sub.at_ms as f64 / 1000.0 * opts.time_scale);
        if let Some(wait) = due.checked_sub(start.elapsed()) {
            std::thread::sleep(wait);
        }
        let now = now_ms();
        let spec = JobSpec {
            id: new_job_id(now),
            name: task.name.clone(),
            command: shell(&match &opts.command {
                Some(template) => template
                    .replace("{rad}", &task.name)
                    .replace("{peak_mib}", &task.peak_mib.to_string())
                    .replace(
                        "{seconds}",
                        &format!(
                            "{:.3}",
                            durations.get(&sub.rad).copied().unwrap_or(0.0)
                                * 60.0
                                * opts.time_scale
                        ),
                    ),
                None => task.command.clone(),
            }),
            cwd: opts.cwd.clone(),
            gpus: task.gpus,
            reservation: task.reservation,
            reservation_source: "rad-gpumemnet".to_string(),
            policy: None,
            expected_sm_activity: None,
            expected_duration_ms: None,
            submitted_at_ms: now,
        };
        submit(dir, &spec)?;
        tracing::info!(job = %spec.id, task = %task.name, at_s = due.as_secs_f64(), "replayed");
        ids.push(spec.id);
    }
    Ok(ids)
}

/// `sh -c LINE`.
pub fn shell(line: &str) -> Vec<String> {
    vec!["sh".into(), "-c".into(), line.to_string()]
}

/// The default workloads folder: `workloads/` beside the trace.
pub fn default_workloads(trace: &Path) -> PathBuf {
    trace
        .parent()
        .map(|p| p.join("workloads"))
        .unwrap_or_else(|| PathBuf::from("workloads"))
}
