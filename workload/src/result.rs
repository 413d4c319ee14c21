//! What a run produces: the summary the table and JSON show, per-task outcomes,
//! and (on request) per-GPU timelines for the HTML report.

use carma_core::{Millis, Policy};
use serde::Serialize;

/// The headline figures of one policy on one trace.
///
/// Accounting follows CARMA: the makespan runs from the first dispatch to the
/// last end; a task's completion time (JCT) runs from submission to its end,
/// failed attempts and recovery back-off included; its waiting time is the sum,
/// over attempts, of the time from entering a queue to being dispatched.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Summary {
    /// Placement policy.
    pub policy: Policy,
    /// Reservation source, e.g. `gpumemnet`.
    pub estimator: String,
    /// First dispatch to last end, seconds.
    pub makespan_s: f64,
    /// Mean completion time of finished tasks, seconds.
    pub mean_jct_s: f64,
    /// 95th percentile completion time (linear interpolation), seconds.
    pub p95_jct_s: f64,
    /// Mean waiting time of tasks that started, seconds.
    pub mean_wait_s: f64,
    /// Out-of-memory crashes.
    pub ooms: u32,
    /// GPU time spent in attempts that crashed, GPU-seconds.
    pub lost_gpu_s: f64,
    /// Time- and GPU-averaged reported SM activity (0..1) over the makespan.
    pub smact_mean: f64,
    /// Time- and GPU-averaged fraction of GPU memory in use (0..1).
    pub mem_used_mean: f64,
    /// GPU energy over the makespan, kWh.
    pub energy_kwh: f64,
    /// Tasks that finished.
    pub finished: usize,
    /// Tasks that failed (each has a reason in its outcome).
    pub failed: usize,
    /// Tasks in the trace.
    pub tasks: usize,
    /// `--learn-peaks`: tasks whose first attempt was reserved from learned peaks.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub learned_reservations: Option<usize>,
    /// Starvation: per task size (GPUs asked for), the longest wait relative to the task's own
    /// exclusive run time.
    pub worst_wait: Vec<WorstWait>,
}

/// The task of one size that waited longest, relative to its own exclusive run time.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct WorstWait {
    /// GPUs per task.
    pub gpus: u32,
    /// Tasks of this size that started.
    pub tasks: usize,
    /// Its waiting time over its exclusive run time.
    pub wait_over_run: f64,
    /// Its waiting time, seconds.
    pub wait_s: f64,
    /// The task.
    pub task: String,
}

/// The completion-time and waiting-time figures of a [`Summary`], computed from per-task outcomes
/// the same way for a simulated run and for a `carma local` run.
#[derive(Debug, Clone, PartialEq)]
pub struct JobTimes {
    /// Mean completion time (submission to end) of finished tasks, seconds.
    pub mean_jct_s: f64,
    /// 95th percentile completion time of finished tasks, seconds.
    pub p95_jct_s: f64,
    /// Mean waiting time of tasks that started, seconds.
    pub mean_wait_s: f64,
    /// Per task size, the task that waited longest relative to its run time.
    pub worst_wait: Vec<WorstWait>,
}

impl JobTimes {
    /// The figures of `outcomes`; `gpus[i]` is the GPU count of `outcomes[i]` and `run_s[i]` the
    /// run time its wait is measured against for starvation (the simulator: the task's exclusive
    /// run time; `carma local`: the job's final attempt's measured run time).
    pub fn of(outcomes: &[TaskOutcome], gpus: &[u32], run_s: &[f64]) -> Self {
        let jcts: Vec<f64> = outcomes
            .iter()
            .filter(|o| o.finished)
            .filter_map(|o| o.end_s.map(|e| e - o.arrival_s))
            .collect();
        let waits: Vec<f64> = outcomes
            .iter()
            .filter(|o| o.first_start_s.is_some())
            .map(|o| o.wait_s)
            .collect();
        Self {
            mean_jct_s: mean(&jcts),
            p95_jct_s: percentile(&jcts, 0.95),
            mean_wait_s: mean(&waits),
            worst_wait: worst_waits(outcomes, gpus, run_s),
        }
    }
}

/// [`WorstWait`] per task size, smallest first, of the tasks that started; `gpus[i]` and
/// `run_s[i]` describe `outcomes[i]`.
fn worst_waits(outcomes: &[TaskOutcome], gpus: &[u32], run_s: &[f64]) -> Vec<WorstWait> {
    let mut by_size: std::collections::BTreeMap<u32, WorstWait> = Default::default();
    for ((o, &g), &run) in outcomes.iter().zip(gpus).zip(run_s) {
        if o.first_start_s.is_none() {
            continue;
        }
        let ratio = if run > 0.0 { o.wait_s / run } else { 0.0 };
        let w = by_size.entry(g).or_insert_with(|| WorstWait {
            gpus: g,
            tasks: 0,
            wait_over_run: f64::NEG_INFINITY,
            wait_s: 0.0,
            task: String::new(),
        });
        w.tasks += 1;
        if ratio > w.wait_over_run {
            (w.wait_over_run, w.wait_s, w.task) = (ratio, o.wait_s, o.name.clone());
        }
    }
    by_size.into_values().collect()
}

/// How one task ended.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct TaskOutcome {
    /// Task id (position in the trace).
    pub id: usize,
    /// Task name.
    pub name: String,
    /// Submission, seconds.
    pub arrival_s: f64,
    /// First dispatch, seconds.
    pub first_start_s: Option<f64>,
    /// End (finish or final failure), seconds.
    pub end_s: Option<f64>,
    /// Whether it finished successfully.
    pub finished: bool,
    /// Why it failed, when it did.
    pub failure: Option<String>,
    /// Attempts started.
    pub attempts: u32,
    /// Out-of-memory crashes.
    pub ooms: u32,
    /// Waiting time, seconds.
    pub wait_s: f64,
    /// Time on GPUs over all attempts, seconds.
    pub run_s: f64,
}

/// How an attempt ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub enum AttemptEnd {
    /// Ran to completion.
    Finished,
    /// Crashed out of GPU memory.
    OutOfMemory,
}

/// One attempt of a task on one or more GPUs.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct AttemptLog {
    /// Task id.
    pub task: usize,
    /// Task name.
    pub name: String,
    /// 1-based attempt number.
    pub attempt: u32,
    /// Flat GPU indices (node-major).
    pub gpus: Vec<usize>,
    /// Dispatch.
    pub start_ms: Millis,
    /// End.
    pub end_ms: Millis,
    /// How it ended.
    pub end: AttemptEnd,
    /// MiB reserved per GPU.
    pub reserved_mib: u64,
    /// True peak per GPU.
    pub peak_mib: u64,
    /// Whether it held its GPUs exclusively.
    pub exclusive: bool,
}

/// The state of one GPU from a moment on.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct GpuPoint {
    /// When this state began.
    pub t_ms: Millis,
    /// Memory really in use (summed true peaks of visible tasks), MiB.
    pub mem_used_mib: u64,
    /// Memory reserved by the ledger, MiB.
    pub reserved_mib: u64,
    /// Reported SM activity (0..1).
    pub sm_activity: f64,
    /// Tasks placed on the GPU.
    pub tasks: u32,
}

/// The history of one GPU.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct GpuTimeline {
    /// Node name.
    pub node: String,
    /// Index on its node.
    pub index: u32,
    /// Memory, MiB.
    pub total_mib: u64,
    /// State changes, oldest first.
    pub points: Vec<GpuPoint>,
}

/// Everything one policy produced on one trace.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct RunResult {
    /// Headline figures.
    pub summary: Summary,
    /// One outcome per task, in trace order.
    pub tasks: Vec<TaskOutcome>,
    /// Attempts (only when timelines were recorded).
    pub attempts: Vec<AttemptLog>,
    /// Per-GPU timelines (only when recorded).
    pub gpus: Vec<GpuTimeline>,
    /// Time of the first dispatch.
    pub start_ms: Millis,
    /// Time of the last end.
    pub end_ms: Millis,
    /// Events processed.
    pub events: u64,
    /// Scheduler ticks run.
    pub ticks: u64,
}

/// Percentile with linear interpolation between closest ranks; 0 for no data.
pub fn percentile(values: &[f64], q: f64) -> f64 {
    if values.is_empty() {
        return 0.0;
    }
    let mut v = values.to_vec();
    v.sort_by(f64::total_cmp);
    let rank = q.clamp(0.0, 1.0) * (v.len() - 1) as f64;
    let lo = rank.floor() as usize;
    let hi = rank.ceil() as usize;
    v[lo] + (v[hi] - v[lo]) * (rank - lo as f64)
}

/// Mean; 0 for no data.
pub fn mean(values: &[f64]) -> f64 {
    if values.is_empty() {
        0.0
    } else {
        values.iter().sum::<f64>() / values.len() as f64
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percentile_interpolates() {
        assert_eq!(percentile(&[], 0.95), 0.0);
        assert_eq!(percentile(&[3.0], 0.95), 3.0);
        let v: Vec<f64> = (1..=11).map(f64::from).collect();
        assert!((percentile(&v, 0.95) - 10.5).abs() < 1e-12);
        assert_eq!(mean(&[1.0, 2.0, 6.0]), 3.0);
    }

    fn outcome(
        name: &str,
        arrival_s: f64,
        start_s: Option<f64>,
        end_s: Option<f64>,
    ) -> TaskOutcome {
        TaskOutcome {
            id: 0,
            name: name.into(),
            arrival_s,
            first_start_s: start_s,
            end_s,
            finished: end_s.is_some(),
            failure: None,
            attempts: u32::from(start_s.is_some()),
            ooms: 0,
            wait_s: start_s.map_or(0.0, |s| s - arrival_s),
            run_s: 0.0,
        }
    }

    #[test]
    fn job_times_take_jcts_of_finished_tasks_and_waits_of_started_ones() {
        let outcomes = [
            outcome("a", 0.0, Some(0.0), Some(10.0)),
            outcome("b", 5.0, Some(9.0), Some(25.0)),
            outcome("c", 6.0, Some(8.0), None),
            outcome("d", 7.0, None, None),
        ];
        let t = JobTimes::of(&outcomes, &[1, 1, 2, 2], &[10.0, 2.0, 4.0, 1.0]);
        assert_eq!(t.mean_jct_s, 15.0);
        assert!((t.p95_jct_s - 19.5).abs() < 1e-12);
        assert_eq!(t.mean_wait_s, 2.0);
        let worst: Vec<(u32, usize, &str, f64)> = t
            .worst_wait
            .iter()
            .map(|w| (w.gpus, w.tasks, w.task.as_str(), w.wait_over_run))
            .collect();
        assert_eq!(worst, [(1, 2, "b", 2.0), (2, 1, "c", 0.5)]);
    }
}
