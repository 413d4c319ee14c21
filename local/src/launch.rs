//! Launching an attempt as a child process, and finding it again after a daemon restart.
//!
//! Every attempt runs under a small `sh` launcher in a process group of its own:
//!
//! 1. the launcher writes its pid to `jobs/<id>/<n>/pid` (before the job starts);
//! 2. runs the command (no shell parsing of the command: it is passed as arguments);
//! 3. writes the command's exit status to `jobs/<id>/<n>/exit` (atomically) and exits with it.
//!
//! The `exit` file is how the daemon learns the end of every attempt — its own children and
//! those it re-adopts after a restart alike (it cannot `wait` for a process it did not spawn).
//! Its own process group means Ctrl-C on the daemon's terminal does not reach the jobs: jobs
//! outlive a daemon restart by design.

use std::fs::{self, File};
use std::os::unix::process::CommandExt as _;
use std::path::Path;
use std::process::{Child, Command, Stdio};

use crate::error::{LocalError, Result};
use crate::layout::AttemptDir;
use crate::spec::JobSpec;

/// The launcher: `$0` is the attempt folder, `"$@"` the command.
const LAUNCHER: &str = r#"echo $$ > "$0/pid.tmp" && mv -f "$0/pid.tmp" "$0/pid" || exit 125
"$@"
c=$?
echo "$c" > "$0/exit.tmp" && mv -f "$0/exit.tmp" "$0/exit"
exit "$c""#;

/// What the launched process is given besides its command.
#[derive(Debug, Clone)]
pub struct LaunchEnv {
    /// GPU indices, NVML (PCI bus) order.
    pub gpus: Vec<u32>,
    /// MiB booked per GPU.
    pub reserved_mib: u64,
    /// Attempt number.
    pub attempt: u32,
    /// Set `CUDA_MPS_PINNED_DEVICE_MEM_LIMIT` to the reservation on each GPU (MPS must be running).
    pub mps_memory_limit: bool,
}

/// Spawn attempt `env.attempt` of `spec` with its files in `dir`.
///
/// The job sees `CUDA_VISIBLE_DEVICES` (the chosen indices, with `CUDA_DEVICE_ORDER=PCI_BUS_ID`
/// so CUDA numbers GPUs as NVML does), `CARMA_LOCAL_JOB_ID`, `CARMA_LOCAL_ATTEMPT`,
/// `CARMA_LOCAL_RESERVED_MIB` and `CARMA_LOCAL_MEMORY_FILE` (where a job may declare its memory use
/// for the simulated backend).
#[tracing::instrument(skip_all, fields(job = %spec.id, attempt = env.attempt, gpus = ?env.gpus))]
pub fn spawn(spec: &JobSpec, dir: &AttemptDir, env: &LaunchEnv) -> Result<Child> {
    fs::create_dir_all(&dir.0).map_err(|e| LocalError::io(&dir.0, e))?;
    let stdout = File::create(dir.stdout()).map_err(|e| LocalError::io(&dir.stdout(), e))?;
    let stderr = File::create(dir.stderr()).map_err(|e| LocalError::io(&dir.stderr(), e))?;
    let visible = env
        .gpus
        .iter()
        .map(u32::to_string)
        .collect::<Vec<_>>()
        .join(",");
    let mut cmd = Command::new("sh");
    cmd.arg("-c")
        .arg(LAUNCHER)
        .arg(&dir.0)
        .args(&spec.command)
        .current_dir(&spec.cwd)
        .stdin(Stdio::null())
        .stdout(stdout)
        .stderr(stderr)
        .env("CUDA_DEVICE_ORDER", "PCI_BUS_ID")
        .env("CUDA_VISIBLE_DEVICES", &visible)
        .env("CARMA_LOCAL_JOB_ID", &spec.id)
        .env("CARMA_LOCAL_ATTEMPT", env.attempt.to_string())
        .env("CARMA_LOCAL_RESERVED_MIB", env.reserved_mib.to_string())
        .env("CARMA_LOCAL_MEMORY_FILE", dir.memory_mib())
        .process_group(0);
    if env.mps_memory_limit {
        let limits = (0..env.gpus.len())
            .map(|i| format!("{i}={}M", env.reserved_mib))
            .collect::<Vec<_>>()
            .join(",");
        cmd.env("CUDA_MPS_PINNED_DEVICE_MEM_LIMIT", limits);
    }
    let child = cmd.spawn().map_err(|e| {
        LocalError::io(
            &spec.cwd,
            std::io::Error::new(
                e.kind(),
                format!("cannot start the job's launcher (sh): {e}"),
            ),
        )
    })?;
    tracing::info!(pid = child.id(), visible = %visible, "job launched");
    Ok(child)
}

/// The exit status the launcher recorded, once the job has ended.
pub fn exit_status(dir: &AttemptDir) -> Option<i32> {
    fs::read_to_string(dir.exit()).ok()?.trim().parse().ok()
}

/// The launcher's pid, once it has written it.
pub fn launcher_pid(dir: &AttemptDir) -> Option<u32> {
    fs::read_to_string(dir.pid()).ok()?.trim().parse().ok()
}

/// Whether `pid` is alive and is this attempt's launcher (its command line names the attempt
/// folder, so a recycled pid is not mistaken for it). Linux `/proc` only.
pub fn launcher_alive(pid: u32, dir: &AttemptDir) -> bool {
    let Ok(cmdline) = fs::read(format!("/proc/{pid}/cmdline")) else {
        return false;
    };
    let needle = dir.0.as_os_str().as_encoded_bytes();
    cmdline.split(|b| *b == 0).any(|arg| arg == needle) && !is_zombie(pid)
}

fn is_zombie(pid: u32) -> bool {
    fs::read_to_string(format!("/proc/{pid}/stat"))
        .ok()
        .and_then(|s| {
            s.rsplit_once(')')
                .map(|(_, rest)| rest.trim_start().starts_with('Z'))
        })
        .unwrap_or(false)
}

/// The process group of `pid` (Linux `/proc`), used to attribute GPU processes to jobs.
pub fn process_group(pid: u32) -> Option<u32> {
    let stat = fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let (_, rest) = stat.rsplit_once(')')?;
    // Fields after the command: state, ppid, pgrp.
    rest.split_whitespace().nth(2)?.parse().ok()
}

/// The last `max_bytes` of a file (lossy UTF-8); empty when it cannot be read.
pub fn tail(path: &Path, max_bytes: usize) -> String {
    let Ok(bytes) = fs::read(path) else {
        return String::new();
    };
    let start = bytes.len().saturating_sub(max_bytes);
    String::from_utf8_lossy(&bytes[start..]).into_owned()
}

/// The pid of a live launcher whose command line names `dir`, searched in `/proc` (a launcher
/// spawned just before a daemon died may not have written its pid file yet).
pub fn find_launcher(dir: &AttemptDir) -> Option<u32> {
    fs::read_dir("/proc")
        .ok()?
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok())
        .find(|pid| launcher_alive(*pid, dir))
}
