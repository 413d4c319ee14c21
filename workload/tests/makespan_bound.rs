//! `SimConfig::makespan_bound_s` against hand calculations, and against the bound it replaced:
//! all the work over the cluster from the first arrival, or a task's arrival offset plus its
//! exclusive time less one scheduling step. (The simulator's tests hold runs above it.)

use carma_core::Millis;
use carma_workload::model::Activity;
use carma_workload::{SimConfig, Task, catalog};

const HOUR_MS: Millis = 3_600_000;

/// A one-GPU task of SM activity `sm` arriving at `arrival_ms` that runs `exclusive_ms` alone.
fn task(id: usize, arrival_ms: Millis, exclusive_ms: Millis, sm: f64) -> Task {
    let mut t = Task::from_workload(id, catalog::by_key("bert_large-b8").unwrap(), arrival_ms);
    t.gpus = 1;
    t.exclusive_ms = exclusive_ms;
    t.activity = Activity {
        sm_activity: sm,
        sm_occupancy: sm / 2.0,
        dram_activity: sm / 2.0,
    };
    t
}

/// The bound before release times were taken into account.
fn old_bound(cfg: &SimConfig, tasks: &[Task]) -> f64 {
    let activity = |t: &Task| t.activity.scaled(cfg.activity_scale).sm_activity;
    let rate = tasks
        .iter()
        .map(activity)
        .fold(cfg.slowdown.threshold, f64::max);
    let work: f64 = tasks
        .iter()
        .map(|t| {
            let shown_ms = t.exclusive_ms.saturating_sub(cfg.telemetry.lag_ms);
            activity(t) * shown_ms as f64 / 1000.0 * f64::from(t.gpus)
        })
        .sum();
    let gpus = f64::from(cfg.cluster.total_gpus());
    let first = tasks.iter().map(|t| t.arrival_ms).min().unwrap();
    let tail = tasks
        .iter()
        .map(|t| t.arrival_ms - first + t.exclusive_ms)
        .max()
        .unwrap()
        .saturating_sub(cfg.telemetry.interval_ms) as f64
        / 1000.0;
    (work / (gpus * rate)).max(tail)
}

fn close(a: f64, b: f64) -> bool {
    (a - b).abs() < 1e-9 * a.abs().max(1.0)
}

#[test]
fn late_arrivals_that_carry_most_work_raise_the_bound_above_the_old_one() {
    // 1 node × 4 GPUs, θ = 0.8, lag 15 s. One 1 h task at 0, then eight 2 h ones at 10 h, each
    // of activity 0.8: the eight cannot start before 10 h, so their work, 8 × 0.8 × (7,200 − 15)
    // = 45,984 SM-activity-seconds over 4 × 0.8 per second, is done after 10 h + 15 s.
    let cfg = SimConfig::default();
    let mut tasks = vec![task(0, 0, HOUR_MS, 0.8)];
    tasks.extend((1..=8).map(|id| task(id, 10 * HOUR_MS, 2 * HOUR_MS, 0.8)));
    let new = cfg.makespan_bound_s(&tasks).unwrap();
    let old = old_bound(&cfg, &tasks);
    assert!(close(new, 36_000.0 + 15.0 + 45_984.0 / 3.2), "{new}");
    // The old one: 10 h + 2 h − 1 s for a late task, above all the work from 0 (15,266 s).
    assert!(close(old, 43_199.0), "{old}");
    assert!(new > old + 7_000.0, "new {new} s, old {old} s");
}

#[test]
fn with_every_task_released_at_once_it_is_the_old_work_term_plus_the_lag() {
    // Eight 1 h tasks of activity 0.8 at 0 on 1 × 4: the work term binds. Nothing shows during
    // the first lag, so the new bound adds it; without a lag the two agree.
    let tasks: Vec<Task> = (0..8).map(|id| task(id, 0, HOUR_MS, 0.8)).collect();
    let cfg = SimConfig::default();
    let (new, old) = (
        cfg.makespan_bound_s(&tasks).unwrap(),
        old_bound(&cfg, &tasks),
    );
    assert!(close(old, 8.0 * 0.8 * 3_585.0 / 3.2), "{old}");
    assert!(close(new, old + 15.0), "new {new} s, old {old} s");

    let mut cfg = SimConfig::default();
    cfg.telemetry.lag_ms = 0;
    let (new, old) = (
        cfg.makespan_bound_s(&tasks).unwrap(),
        old_bound(&cfg, &tasks),
    );
    assert!(close(old, 7_200.0), "{old}");
    assert!(close(new, old), "new {new} s, old {old} s");
}

#[test]
fn a_light_task_alone_cannot_use_the_whole_gpu_until_the_next_arrives() {
    // 1 × 1 GPU, no lag. A task of activity 0.2 alone does 0.2 of work per second, not θ = 0.8:
    // 20 in the first 100 s; from 100 s, with a 0.8 task beside it, the GPU does 0.8 per second,
    // so the remaining 980 take 1,225 s more. (The simulator's tests see a run end exactly then.)
    let mut cfg = SimConfig::default();
    cfg.cluster.gpus_per_node = 1;
    cfg.telemetry.lag_ms = 0;
    let tasks = [task(0, 0, 1_000_000, 0.2), task(1, 100_000, 1_000_000, 0.8)];
    let new = cfg.makespan_bound_s(&tasks).unwrap();
    assert!(close(new, 1_325.0), "{new}");
    assert!(close(old_bound(&cfg, &tasks), 1_250.0));
}

#[test]
fn a_task_alone_counts_from_the_tick_it_can_start_at() {
    // The first task arrives at 0.5 s and starts at the 1 s tick; the second arrives at 2.2 s,
    // starts at 3 s or later and runs 10 s: the run ends 12 s or more after its first start.
    let cfg = SimConfig::default();
    let tasks = [task(0, 500, 5_000, 0.5), task(1, 2_200, 10_000, 0.5)];
    let new = cfg.makespan_bound_s(&tasks).unwrap();
    assert!(close(new, 12.0), "{new}");
    assert!(close(old_bound(&cfg, &tasks), 10.7));
}

#[test]
fn no_bound_where_sharing_creates_throughput_or_nothing_fits() {
    let tasks = [task(0, 0, HOUR_MS, 0.8)];
    let mut cfg = SimConfig::default();
    cfg.slowdown.exponent = 0.5;
    assert_eq!(cfg.makespan_bound_s(&tasks), None);
    let mut cfg = SimConfig::default();
    cfg.cluster.gpus_per_node = 1;
    let mut wide = task(0, 0, HOUR_MS, 0.8);
    wide.gpus = 2;
    assert_eq!(cfg.makespan_bound_s(&[wide]), None);
    assert_eq!(cfg.makespan_bound_s(&[]), None);
}

#[test]
fn a_threshold_below_the_models_floor_is_read_as_the_model_reads_it() {
    // The slowdown model floors θ at 10⁻⁶, so under θ = 10⁻¹² two 1 h tasks of activity 10⁻⁹
    // share a GPU at full speed and may end together after 1 h; a GPU capped at θ = 10⁻¹², or
    // at their activity, would claim 2 h.
    let mut cfg = SimConfig::default();
    cfg.cluster.gpus_per_node = 1;
    cfg.telemetry.lag_ms = 0;
    cfg.slowdown.threshold = 1e-12;
    let tasks = [task(0, 0, HOUR_MS, 1e-9), task(1, 0, HOUR_MS, 1e-9)];
    let bound = cfg.makespan_bound_s(&tasks).unwrap();
    assert!(close(bound, 3_600.0), "{bound}");
}

#[test]
fn memory_held_binds_where_tasks_are_light_but_large() {
    // 1 × 1 GPU of 40 GiB, lag 15 s. Two tasks at 0 of activity 0.1 that each hold 30 GiB for
    // 1,000 s: their SM-activity work takes 2 × 0.1 × 985 / 0.8 = 246 s, but 30 + 30 GiB do not
    // fit on one GPU, and they hold 2 × 30,720 MiB × 985 s, which 40,960 MiB take 1,477.5 s to
    // hold, after the first lag.
    let mut cfg = SimConfig::default();
    cfg.cluster.gpus_per_node = 1;
    let mut tasks = [task(0, 0, 1_000_000, 0.1), task(1, 0, 1_000_000, 0.1)];
    for t in &mut tasks {
        t.peak_mib = 30 * 1024;
    }
    let bound = cfg.makespan_bound_s(&tasks).unwrap();
    assert!(
        close(bound, 15.0 + 2.0 * 30_720.0 * 985.0 / 40_960.0),
        "{bound}"
    );
    // At 10 GiB each they fit together, and a task alone (1,000 s) binds again.
    for t in &mut tasks {
        t.peak_mib = 10 * 1024;
    }
    assert!(close(cfg.makespan_bound_s(&tasks).unwrap(), 1_000.0));
}
