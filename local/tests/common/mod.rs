//! Helpers of the integration tests: a daemon in this process on simulated GPUs, real job
//! processes, real files.

#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use carma_core::{Policy, Reservation};
use carma_gpu::SimulatedGpus;
use carma_local::spec::{JobSpec, new_job_id, now_ms, submit};
use carma_local::{BackendChoice, ServeConfig, StateDir};
use serde_json::Value;

/// A fast daemon configuration: 50 ms ticks, 3-sample windows, 300 ms warm-up, no back-off.
pub fn config(dir: &Path, gpus: &str) -> ServeConfig {
    let spec: SimulatedGpus = gpus.parse().expect("GPU spec");
    let mut cfg = ServeConfig::new(dir, BackendChoice::Simulated(spec, Default::default()));
    cfg.interval = Duration::from_millis(50);
    cfg.window = 3;
    cfg.placement.warmup_ms = 300;
    cfg.recovery.backoff_base_ms = 0;
    cfg
}

/// Start `cfg` as a task of this runtime; abort the handle to "kill" the daemon.
pub fn start(cfg: ServeConfig) -> tokio::task::JoinHandle<carma_local::Result<()>> {
    tokio::spawn(carma_local::serve(cfg, std::future::pending()))
}

/// Submit `script` (run by `sh -c`) asking `mib` per GPU (None: whole GPUs).
pub fn submit_sh(
    dir: &Path,
    script: &str,
    mib: Option<u64>,
    gpus: u32,
    policy: Option<Policy>,
) -> String {
    submit_declared(dir, script, mib, gpus, policy, None)
}

/// [`submit_sh`] of a job that declares it runs `expected_duration_ms` alone.
pub fn submit_declared(
    dir: &Path,
    script: &str,
    mib: Option<u64>,
    gpus: u32,
    policy: Option<Policy>,
    expected_duration_ms: Option<u64>,
) -> String {
    std::fs::create_dir_all(dir).unwrap();
    let now = now_ms();
    let spec = JobSpec {
        id: new_job_id(now),
        name: "test".into(),
        command: vec!["sh".into(), "-c".into(), script.into()],
        cwd: dir.to_path_buf(),
        gpus,
        reservation: mib.map_or(Reservation::WholeGpu, Reservation::Mib),
        reservation_source: "override".into(),
        policy,
        expected_sm_activity: None,
        expected_duration_ms,
        submitted_at_ms: now,
    };
    let state = StateDir::create(dir).unwrap();
    submit(&state, &spec).unwrap();
    spec.id
}

/// The status document.
pub fn status(dir: &Path) -> Value {
    carma_local::status::status(&StateDir::existing(dir).unwrap()).unwrap()
}

/// The job `id` in `status`.
pub fn job(status: &Value, id: &str) -> Value {
    status["jobs"]
        .as_array()
        .unwrap()
        .iter()
        .find(|j| j["id"] == id)
        .cloned()
        .unwrap_or(Value::Null)
}

/// Wait until `done(status)` holds, at most `limit`; panics with the last status otherwise.
pub async fn wait_for(dir: &Path, limit: Duration, done: impl Fn(&Value) -> bool) -> Value {
    let start = Instant::now();
    loop {
        let s = status(dir);
        if done(&s) {
            return s;
        }
        if start.elapsed() > limit {
            panic!(
                "timed out; last status: {}",
                serde_json::to_string_pretty(&s).unwrap()
            );
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
}

/// Whether every job in `status` is succeeded or failed.
pub fn all_done(status: &Value) -> bool {
    status["jobs"].as_array().is_some_and(|a| {
        !a.is_empty()
            && a.iter()
                .all(|j| j["state"] == "succeeded" || j["state"] == "failed")
    })
}

/// A shell snippet that appends the job id to `runs` (to count how often each job ran).
pub fn mark_run(runs: &Path) -> String {
    format!("echo \"$CARMA_LOCAL_JOB_ID\" >> {}", runs.display())
}

/// How many times each id appears in `runs`.
pub fn run_counts(runs: &Path) -> std::collections::BTreeMap<String, usize> {
    let mut m = std::collections::BTreeMap::new();
    for l in std::fs::read_to_string(runs).unwrap_or_default().lines() {
        *m.entry(l.to_string()).or_insert(0) += 1;
    }
    m
}

/// A fresh state directory inside a temporary folder.
pub fn state_dir(tmp: &tempfile::TempDir) -> PathBuf {
    tmp.path().join("state")
}
