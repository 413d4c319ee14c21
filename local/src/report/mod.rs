//! `carma local report`: a finished (or running) local run in the simulator's terms — one
//! `carma_workload::RunResult` inside a `Comparison` — so that the simulator's own table, JSON and
//! HTML writers print it, and a simulated and a measured run compare line by line.
//!
//! Accounting follows the simulator's (CARMA's): makespan from the first dispatch to the last end;
//! a job's completion time from submission to its end; its waiting time the sum over attempts of
//! queue entry to dispatch; SM activity, memory use and energy averaged over all GPUs and the
//! makespan, from `telemetry.jsonl`. The completion and wait figures come from the simulator's own
//! function ([`JobTimes::of`]); where the simulator divides a wait by the task's exclusive run time
//! (starvation), a local run has no exclusive time and uses the job's own final run time.

mod render;
mod samples;

use std::collections::BTreeMap;

use carma_core::{Policy, Reservation};
use carma_workload::config::QueueDiscipline;
use carma_workload::result::{
    AttemptEnd, AttemptLog, GpuTimeline, JobTimes, RunResult, Summary, TaskOutcome,
};
use carma_workload::{Comparison, EstimatorKind, ReservationPlan, SimConfig, Trace};

use crate::error::Result;
use crate::jobs::{Job, JobState, JobTable};
use crate::journal::Journal;
use crate::layout::StateDir;
use crate::spec::now_ms;
pub use samples::GpuTotals;
use samples::Samples;

/// A local run as the simulator's report writers take it.
#[derive(Debug, Clone)]
pub struct Report {
    /// The run, as a one-policy comparison.
    pub comparison: Comparison,
    /// The jobs (the HTML report's trace; tasks are not needed by the writers).
    pub trace: Trace,
    /// The backend that sampled the GPUs (`nvml`, `dcgm`, `simulated`; `unknown` without samples).
    pub backend: String,
    /// Per-job detail (as in `status`).
    pub jobs: Vec<serde_json::Value>,
    /// Per-GPU totals over the makespan.
    pub gpus: Vec<GpuTotals>,
}

/// Build the report of the run in `dir`.
pub fn report(dir: &StateDir) -> Result<Report> {
    let table = JobTable::from_events(&Journal::new(dir.journal()).read()?);
    let samples = Samples::read(&dir.telemetry())?;
    let view: serde_json::Value = std::fs::read(dir.gpus())
        .ok()
        .and_then(|b| serde_json::from_slice(&b).ok())
        .unwrap_or_default();
    let policy: Policy = view["policy"]
        .as_str()
        .and_then(|p| p.parse().ok())
        .unwrap_or(Policy::DEFAULT);
    let backend = view["backend"].as_str().unwrap_or("unknown").to_string();
    let jobs = table.jobs();
    let t0 = jobs
        .iter()
        .map(|j| j.spec.submitted_at_ms)
        .min()
        .unwrap_or(0);
    let now = now_ms();
    let rel = |t: u64| t.saturating_sub(t0);
    let secs = |t: u64| rel(t) as f64 / 1000.0;

    let mut outcomes = Vec::with_capacity(jobs.len());
    let mut attempts = Vec::new();
    let mut final_run_s = Vec::with_capacity(jobs.len());
    let mut lost_gpu_s = 0.0;
    for (i, job) in jobs.iter().enumerate() {
        let mut wait_s = 0.0;
        let mut run_s = 0.0;
        let mut last_run = 0.0;
        for a in &job.attempts {
            let end_ms = a.end.as_ref().map_or(now, |e| e.at_ms);
            let dur = end_ms.saturating_sub(a.launched_at_ms) as f64 / 1000.0;
            wait_s += a.launched_at_ms.saturating_sub(a.queued_at_ms) as f64 / 1000.0;
            run_s += dur;
            last_run = dur;
            if a.ended_in_oom() {
                lost_gpu_s += dur * a.gpus.len() as f64;
            }
            attempts.push(AttemptLog {
                task: i,
                name: job.spec.name.clone(),
                attempt: a.number,
                gpus: a.gpus.iter().map(|g| *g as usize).collect(),
                start_ms: rel(a.launched_at_ms),
                end_ms: rel(end_ms),
                end: if a.ended_in_oom() {
                    AttemptEnd::OutOfMemory
                } else {
                    AttemptEnd::Finished
                },
                reserved_mib: a.reserved_mib,
                peak_mib: a.end.as_ref().and_then(|e| e.usage.peak_mib).unwrap_or(0),
                exclusive: a.exclusive,
            });
        }
        final_run_s.push(last_run);
        outcomes.push(outcome(i, job, wait_s, run_s, &secs));
    }

    let starts: Vec<u64> = jobs
        .iter()
        .filter_map(|j| j.attempts.first())
        .map(|a| a.launched_at_ms)
        .collect();
    let ends: Vec<u64> = jobs
        .iter()
        .filter_map(|j| j.attempts.last()?.end.as_ref().map(|e| e.at_ms))
        .collect();
    let first_dispatch = starts.iter().copied().min();
    let last_end = ends.iter().copied().max();
    let makespan_s = match (first_dispatch, last_end) {
        (Some(s), Some(e)) if e > s => (e - s) as f64 / 1000.0,
        _ => 0.0,
    };
    let window = (first_dispatch.unwrap_or(0), last_end.unwrap_or(now));
    let averages = samples.averages(window.0, window.1);
    let gpu_counts: Vec<u32> = jobs.iter().map(|j| j.spec.gpus).collect();
    let times = JobTimes::of(&outcomes, &gpu_counts, &final_run_s);
    let summary = Summary {
        policy,
        estimator: sources(&jobs),
        makespan_s,
        mean_jct_s: times.mean_jct_s,
        p95_jct_s: times.p95_jct_s,
        mean_wait_s: times.mean_wait_s,
        ooms: outcomes.iter().map(|o| o.ooms).sum(),
        lost_gpu_s,
        smact_mean: averages.sm_activity,
        mem_used_mean: averages.memory_used,
        energy_kwh: averages.energy_j / 3.6e6,
        finished: outcomes.iter().filter(|o| o.finished).count(),
        failed: jobs.iter().filter(|j| j.state == JobState::Failed).count(),
        learned_reservations: None,
        tasks: jobs.len(),
        worst_wait: times.worst_wait,
    };
    let gpus: Vec<GpuTimeline> = samples.timelines(t0);
    let mut config = SimConfig::default();
    config.cluster.nodes = 1;
    config.cluster.gpus_per_node = gpus.len().max(1) as u32;
    config.cluster.gpu_memory_mib = gpus.iter().map(|g| g.total_mib).max().unwrap_or(0);
    config.queue = QueueDiscipline::Carma;
    config.record_timelines = true;
    let run = RunResult {
        summary,
        tasks: outcomes,
        attempts,
        gpus,
        start_ms: first_dispatch.map_or(0, rel),
        end_ms: last_end.map_or(0, rel),
        events: 0,
        ticks: samples.len() as u64,
    };
    let description = format!(
        "carma local run in {} ({} jobs, GPU telemetry: {backend})",
        dir.root().display(),
        jobs.len()
    );
    Ok(Report {
        comparison: Comparison {
            trace: description.clone(),
            tasks: jobs.len(),
            exclusive_gpu_s: 0.0,
            makespan_bound_s: None,
            config,
            plan: plan(&jobs),
            runs: vec![run],
        },
        trace: Trace {
            tasks: Vec::new(),
            description,
        },
        backend,
        jobs: jobs.iter().map(|j| crate::status::job_json(j)).collect(),
        gpus: samples.per_gpu(window.0, window.1),
    })
}

fn outcome(i: usize, job: &Job, wait_s: f64, run_s: f64, secs: &dyn Fn(u64) -> f64) -> TaskOutcome {
    let done = matches!(job.state, JobState::Succeeded | JobState::Failed);
    TaskOutcome {
        id: i,
        name: job.spec.name.clone(),
        arrival_s: secs(job.spec.submitted_at_ms),
        first_start_s: job.attempts.first().map(|a| secs(a.launched_at_ms)),
        end_s: done
            .then(|| job.attempts.last()?.end.as_ref().map(|e| secs(e.at_ms)))
            .flatten(),
        finished: job.state == JobState::Succeeded,
        failure: (job.state == JobState::Failed)
            .then(|| job.exit_reason.clone().unwrap_or_default()),
        attempts: job.attempts.len() as u32,
        ooms: job.ooms() as u32,
        wait_s,
        run_s,
    }
}

/// Reservation sources, e.g. `override ×3, gpumemnet-mlp ×1`.
fn sources(jobs: &[&Job]) -> String {
    let mut by: BTreeMap<&str, usize> = BTreeMap::new();
    for j in jobs {
        *by.entry(j.spec.reservation_source.as_str()).or_default() += 1;
    }
    by.iter()
        .map(|(s, n)| format!("{s} ×{n}"))
        .collect::<Vec<_>>()
        .join(", ")
}

fn plan(jobs: &[&Job]) -> ReservationPlan {
    let mut by: BTreeMap<String, usize> = BTreeMap::new();
    for j in jobs {
        *by.entry(j.spec.reservation_source.clone()).or_default() += 1;
    }
    ReservationPlan {
        kind: if by.keys().any(|k| k.starts_with("gpumemnet")) {
            EstimatorKind::Gpumemnet
        } else {
            EstimatorKind::Recorded
        },
        reservations: jobs.iter().map(|j| j.spec.reservation).collect(),
        fallbacks: 0,
        underestimates: jobs.iter().filter(|j| j.ooms() > 0).count(),
        whole_gpu: jobs
            .iter()
            .filter(|j| j.spec.reservation == Reservation::WholeGpu)
            .count(),
        sources: by.into_iter().collect(),
    }
}
