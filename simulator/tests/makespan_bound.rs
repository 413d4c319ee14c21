//! `SimConfig::makespan_bound_s` against the engine: no run in which every task finishes beats it,
//! whatever the policy, queue, reservations (crashes included) or models (either slowdown form),
//! and a run built to keep the GPU saturated meets it exactly.

use carma_core::{Millis, Policy, Reservation};
use carma_simulator::catalog::CATALOG;
use carma_simulator::model::Activity;
use carma_simulator::model::slowdown::TimeSlicing;
use carma_simulator::{QueueDiscipline, SimConfig, Task, simulate};
use proptest::prelude::*;

/// A task of catalog workload `w` with the given shape.
fn task(id: usize, w: usize, arrival_ms: Millis, exclusive_ms: Millis, gpus: u32, sm: f64) -> Task {
    let mut t = Task::from_workload(id, &CATALOG[w % CATALOG.len()], arrival_ms);
    t.gpus = gpus;
    t.exclusive_ms = exclusive_ms;
    t.activity = Activity {
        sm_activity: sm,
        sm_occupancy: sm * 0.5,
        dram_activity: sm * 0.4,
    };
    t
}

/// One task before its cluster is known: (workload, gap after the previous arrival in ms,
/// exclusive ms, peak as a fraction of a GPU's memory, GPUs as a fraction of a node, SM activity,
/// reservation kind).
type Spec = (usize, Millis, Millis, f64, f64, f64, u8);

fn specs() -> impl Strategy<Value = Vec<Spec>> {
    prop::collection::vec(
        (
            0..CATALOG.len(),
            prop_oneof![Just(0), 0..600_000u64],
            prop_oneof![1..30_000u64, 30_000..3_600_000u64],
            0.02..0.95f64,
            0.0..1.0f64,
            prop_oneof![Just(0.0), 0.0..1.0f64, Just(1.0)],
            0..5u8,
        ),
        1..12,
    )
}

/// The tasks in arrival order and each one's first reservation: its peak, half of it (it
/// crashes out of memory and recovers), twice it, the whole GPU, or unknown.
fn build(specs: &[Spec], gpus_per_node: u32, gpu_mib: u64) -> (Vec<Task>, Vec<Reservation>) {
    let mut at = 0;
    specs
        .iter()
        .enumerate()
        .map(|(id, &(w, gap, run, peak, width, sm, kind))| {
            at += gap;
            let gpus = 1 + (width * f64::from(gpus_per_node)) as u32 % gpus_per_node;
            let mut t = task(id, w, at, run, gpus, sm);
            let peak = (peak * gpu_mib as f64) as u64;
            t.peak_mib = peak;
            let r = match kind {
                0 => Reservation::Mib(peak),
                1 => Reservation::Mib(peak / 2),
                2 => Reservation::Mib(peak * 2),
                3 => Reservation::WholeGpu,
                _ => Reservation::Unknown,
            };
            (t, r)
        })
        .unzip()
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 512, ..ProptestConfig::default() })]

    #[test]
    fn no_run_in_which_every_task_finishes_beats_the_bound(
        specs in specs(),
        nodes in 1u32..=3,
        gpus_per_node in 1u32..=4,
        gpu_memory_gib in prop::sample::select(vec![16u64, 40]),
        exponent in prop::sample::select(vec![1.0, 2.0]),
        threshold in prop::sample::select(vec![0.8, 0.5, 1.0]),
        slicing in prop::option::of((
            prop::sample::select(vec![0.7, 0.5, 1.0]),
            prop::sample::select(vec![0.77, 1.0, 0.3]),
            prop::sample::select(vec![0.93, 1.0, 0.6]),
        )),
        lag_ms in prop::sample::select(vec![0u64, 15_000, 4_321]),
        interval_ms in prop::sample::select(vec![1_000u64, 700, 2_000]),
        activity_scale in prop::sample::select(vec![1.0, 2.0]),
        policy in prop::sample::select(Policy::ALL.to_vec()),
        queue in prop::sample::select(QueueDiscipline::ALL.to_vec()),
        (gate, learn_peaks) in (any::<bool>(), any::<bool>()),
    ) {
        let mut cfg = SimConfig::default();
        cfg.cluster.nodes = nodes;
        cfg.cluster.gpus_per_node = gpus_per_node;
        cfg.cluster.gpu_memory_mib = gpu_memory_gib * 1024;
        cfg.slowdown.exponent = exponent;
        cfg.slowdown.threshold = threshold;
        cfg.slowdown.time_slicing = slicing.map(|(full_activity, exponent, efficiency)| TimeSlicing {
            full_activity,
            exponent,
            efficiency,
        });
        cfg.telemetry.lag_ms = lag_ms;
        cfg.telemetry.interval_ms = interval_ms;
        cfg.activity_scale = activity_scale;
        cfg.queue = queue;
        cfg.gate = gate;
        cfg.learn_peaks = learn_peaks.then(carma_core::HistoryConfig::default);
        let (tasks, reservations) = build(&specs, gpus_per_node, cfg.cluster.gpu_memory_mib);
        let run = simulate(&tasks, &reservations, "test", policy, &cfg).unwrap();
        let bound = cfg.makespan_bound_s(&tasks).unwrap();
        if run.tasks.iter().all(|o| o.finished) {
            prop_assert!(
                run.summary.makespan_s >= bound - 1e-6,
                "{policy} {queue:?}: makespan {} s below the bound {bound} s",
                run.summary.makespan_s
            );
            // What the bound's origin rests on: the first task is dispatched at the first tick.
            let tick = tasks[0].arrival_ms.div_ceil(interval_ms) * interval_ms;
            prop_assert_eq!(run.start_ms, tick);
        }
    }
}

#[test]
fn a_run_that_keeps_the_gpu_saturated_ends_exactly_at_the_bound() {
    // 1 × 1 GPU, θ = 0.8, γ = 1, no lag: a 0.2 task alone for 100 s, then beside a 0.8 task
    // (summed activity 1.0, each at 0.8 of its speed) until it ends at 1,225 s; the 0.8 task
    // alone to 1,325 s. The GPU does all the work it can, and the bound is 1,325 s.
    let mut cfg = SimConfig::default();
    cfg.cluster.gpus_per_node = 1;
    cfg.telemetry.lag_ms = 0;
    let tasks = [
        task(0, 0, 0, 1_000_000, 1, 0.2),
        task(1, 0, 100_000, 1_000_000, 1, 0.8),
    ];
    let reservations = [
        Reservation::Mib(tasks[0].peak_mib),
        Reservation::Mib(tasks[1].peak_mib),
    ];
    let bound = cfg.makespan_bound_s(&tasks).unwrap();
    assert!((bound - 1_325.0).abs() < 1e-9, "{bound}");
    for policy in [Policy::Ff, Policy::Bf, Policy::Magm, Policy::Lug] {
        let run = simulate(&tasks, &reservations, "oracle", policy, &cfg).unwrap();
        assert!(run.tasks.iter().all(|o| o.finished), "{policy}");
        assert!(
            (run.summary.makespan_s - bound).abs() < 1e-3,
            "{policy}: makespan {} s, bound {bound} s",
            run.summary.makespan_s
        );
    }
}

#[test]
fn the_bound_holds_below_the_slowdown_models_floor_on_the_threshold() {
    // θ = 10⁻¹² is read by the model as 10⁻⁶: two tasks of activity 10⁻⁹ share one GPU at full
    // speed and the run takes about as long as one of them.
    let mut cfg = SimConfig::default();
    cfg.cluster.gpus_per_node = 1;
    cfg.slowdown.threshold = 1e-12;
    let tasks = [
        task(0, 0, 0, 3_600_000, 1, 1e-9),
        task(1, 0, 0, 3_600_000, 1, 1e-9),
    ];
    let reservations = [Reservation::Mib(tasks[0].peak_mib); 2];
    let bound = cfg.makespan_bound_s(&tasks).unwrap();
    for policy in [Policy::Ff, Policy::Magm] {
        let run = simulate(&tasks, &reservations, "oracle", policy, &cfg).unwrap();
        assert!(run.tasks.iter().all(|o| o.finished), "{policy}");
        assert!(run.summary.makespan_s < 3_700.0, "{policy}: shared");
        assert!(
            run.summary.makespan_s >= bound - 1e-6,
            "{policy}: {bound} s"
        );
    }
}
