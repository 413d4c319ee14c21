//! Validation of the engine against an independent calculation, and invariants
//! that must hold for every policy, estimator and trace.

use carma_core::{Millis, Policy, Reservation};
use carma_simulator::catalog::{self, CATALOG};
use carma_simulator::{
    EstimatorKind, QueueDiscipline, RunResult, SimConfig, Task, compare, simulate, trace,
};
use proptest::prelude::*;

/// Exclusive scheduling computed by hand, without the engine: tasks in arrival
/// order, strict FIFO, dispatched on the scheduler's 1 s grid as soon as some node
/// has enough free GPUs, on the lowest-numbered such node (the extender's tie
/// rule); GPUs within a node are interchangeable. Returns (first dispatch, last
/// end) in ms.
fn exclusive_by_hand(tasks: &[Task], nodes: usize, gpus_per_node: usize) -> (Millis, Millis) {
    let grid = |t: Millis| t.div_ceil(1000) * 1000;
    let mut free_at = vec![vec![0 as Millis; gpus_per_node]; nodes];
    let mut last_dispatch = 0;
    let mut first = None;
    let mut last_end = 0;
    for t in tasks {
        let n = t.gpus as usize;
        for node in &mut free_at {
            node.sort_unstable();
        }
        // When each node has n GPUs free.
        let ready: Vec<Millis> = free_at.iter().map(|node| node[n - 1]).collect();
        let earliest = *ready.iter().min().expect("a node");
        let dispatch = grid(t.arrival_ms.max(last_dispatch).max(earliest));
        let node = ready
            .iter()
            .position(|r| *r <= dispatch)
            .expect("a node is free");
        let end = dispatch + t.exclusive_ms;
        for f in free_at[node].iter_mut().take(n) {
            *f = end;
        }
        first.get_or_insert(dispatch);
        last_dispatch = dispatch;
        last_end = last_end.max(end);
    }
    (first.unwrap_or(0), last_end)
}

fn check_invariants(run: &RunResult, cfg: &SimConfig, tasks: &[Task]) {
    let s = &run.summary;
    // No policy beats the work bound (when every task finished: failures remove work).
    if let Some(bound) = cfg.makespan_bound_s(tasks)
        && run.tasks.iter().all(|o| o.finished)
    {
        assert!(
            s.makespan_s >= bound - 1e-6,
            "{}: makespan {} s below the work bound {} s",
            s.policy,
            s.makespan_s,
            bound
        );
    }
    // Every task finishes or fails with a reason.
    for o in &run.tasks {
        assert!(
            o.finished != o.failure.is_some(),
            "{}: task {} finished={} failure={:?}",
            s.policy,
            o.id,
            o.finished,
            o.failure
        );
        if let Some(reason) = &o.failure {
            assert!(!reason.trim().is_empty());
        }
        assert!(o.end_s.is_some(), "task {} has no end", o.id);
    }
    assert_eq!(s.finished + s.failed, tasks.len());
    // No GPU is ever over its memory; over-commitment shows up as OOM events.
    for g in &run.gpus {
        for p in &g.points {
            assert!(
                p.mem_used_mib <= g.total_mib,
                "{}: GPU {} at {} ms uses {} of {} MiB",
                s.policy,
                g.index,
                p.t_ms,
                p.mem_used_mib,
                g.total_mib
            );
            assert!((0.0..=1.0).contains(&p.sm_activity));
        }
    }
    let crashed = run
        .attempts
        .iter()
        .filter(|a| a.end == carma_simulator::result::AttemptEnd::OutOfMemory)
        .count();
    if !run.gpus.is_empty() {
        assert_eq!(crashed as u32, s.ooms);
    }
    // Energy is at least the idle power of every GPU over the makespan.
    let gpus = cfg.cluster.total_gpus() as f64;
    let idle_kwh = cfg.power.idle_w * gpus * s.makespan_s / 3.6e6;
    assert!(
        s.energy_kwh + 1e-9 >= idle_kwh,
        "{}: {} kWh < idle {idle_kwh}",
        s.policy,
        s.energy_kwh
    );
    let max_kwh = cfg.power.max_w * gpus * s.makespan_s / 3.6e6;
    assert!(s.energy_kwh <= max_kwh + 1e-9);
    assert!((0.0..=1.0).contains(&s.smact_mean));
    assert!((0.0..=1.0).contains(&s.mem_used_mean));
    // A task's completion time covers at least its exclusive run time.
    for (o, t) in run.tasks.iter().zip(tasks) {
        if o.finished {
            let jct = o.end_s.unwrap() - o.arrival_s;
            assert!(
                jct + 1e-6 >= t.exclusive_ms as f64 / 1000.0,
                "task {} too fast",
                t.id
            );
        }
    }
}

#[test]
fn exclusive_makespan_matches_an_independent_calculation() {
    for (seed, nodes, gpus) in [(1, 1, 4), (7, 1, 4), (3, 1, 8), (5, 3, 2), (9, 4, 4)] {
        // The calculation by hand is CARMA's strict FIFO queue.
        let mut cfg = SimConfig {
            queue: QueueDiscipline::Carma,
            ..SimConfig::default()
        };
        cfg.cluster.nodes = nodes;
        cfg.cluster.gpus_per_node = gpus;
        let trace = trace::generate(&trace::GeneratorConfig {
            tasks: 90,
            seed,
            cluster_gpus: nodes * gpus,
            ..Default::default()
        })
        .unwrap();
        let res = vec![Reservation::WholeGpu; trace.tasks.len()];
        let run = simulate(&trace.tasks, &res, "oracle", Policy::Exclusive, &cfg).unwrap();
        let (first, last) = exclusive_by_hand(&trace.tasks, nodes as usize, gpus as usize);
        assert_eq!(run.start_ms, first, "seed {seed}");
        assert_eq!(run.end_ms, last, "seed {seed}");
        assert!((run.summary.makespan_s - (last - first) as f64 / 1000.0).abs() < 1e-9);
        assert_eq!(run.summary.ooms, 0);
    }
}

#[test]
fn every_policy_and_estimator_keeps_the_invariants() {
    let cfg = SimConfig {
        record_timelines: true,
        ..SimConfig::default()
    };
    let trace = trace::generate(&trace::GeneratorConfig::default()).unwrap();
    for kind in EstimatorKind::ALL {
        let cmp = compare(&trace, kind, &Policy::ALL, &cfg).unwrap();
        assert_eq!(cmp.runs.len(), Policy::ALL.len());
        for run in &cmp.runs {
            check_invariants(run, &cfg, &trace.tasks);
        }
        let base = cmp.baseline().unwrap();
        for run in &cmp.runs {
            assert!(
                run.summary.makespan_s <= base.summary.makespan_s * 1.25,
                "{kind}/{}: collocation should not be much worse than exclusive",
                run.summary.policy
            );
        }
    }
}

#[test]
fn underestimates_crash_and_recover_without_over_committing() {
    // Round robin with no estimate and no gate packs tasks blindly: crashes must
    // happen, be recovered, and never leave a GPU over its memory.
    let cfg = SimConfig {
        record_timelines: true,
        gate: false,
        ..SimConfig::default()
    };
    let big = catalog::by_key("vgg16-b128").unwrap();
    let tasks: Vec<Task> = (0..12)
        .map(|i| Task::from_workload(i, big, i as Millis * 60_000))
        .collect();
    let res = vec![Reservation::Unknown; tasks.len()];
    let run = simulate(&tasks, &res, "none", Policy::Rr, &cfg).unwrap();
    assert!(run.summary.ooms > 0);
    assert!(run.summary.lost_gpu_s > 0.0);
    assert_eq!(run.summary.finished, 12);
    check_invariants(&run, &cfg, &tasks);
}

#[test]
fn a_job_larger_than_the_gpu_fails_with_a_reason() {
    let mut cfg = SimConfig::default();
    cfg.cluster.gpu_memory_mib = 16 * 1024;
    let tasks = vec![Task::from_workload(
        0,
        catalog::by_key("gpt2_large-b8").unwrap(),
        0,
    )];
    let run = simulate(
        &tasks,
        &[Reservation::WholeGpu],
        "oracle",
        Policy::Magm,
        &cfg,
    )
    .unwrap();
    assert_eq!(run.summary.failed, 1);
    let reason = run.tasks[0].failure.as_deref().unwrap();
    assert!(reason.contains("does not fit"), "{reason}");
    check_invariants(&run, &cfg, &tasks);
}

#[test]
fn a_job_wider_than_any_node_fails_instead_of_blocking_the_queue() {
    let mut cfg = SimConfig::default();
    cfg.cluster.gpus_per_node = 1;
    cfg.cluster.nodes = 2;
    let two = catalog::by_key("xlnet_base-b8").unwrap();
    let one = catalog::by_key("resnet50-b32").unwrap();
    let tasks = vec![
        Task::from_workload(0, two, 0),
        Task::from_workload(1, one, 10_000),
    ];
    let res = vec![Reservation::Mib(16_000); 2];
    let run = simulate(&tasks, &res, "recorded", Policy::Ff, &cfg).unwrap();
    assert!(
        run.tasks[0]
            .failure
            .as_deref()
            .unwrap()
            .contains("needs 2 GPUs")
    );
    assert!(run.tasks[1].finished);
}

#[test]
fn the_gate_and_the_warm_up_lock_are_honoured() {
    // Two Transformers (SM activity 0.8 each): with the gate on, the second never
    // joins the first while it runs; with the gate off it does.
    let mut cfg = SimConfig::default();
    cfg.cluster.gpus_per_node = 1;
    cfg.record_timelines = true;
    let bert = catalog::by_key("bert_large-b8").unwrap();
    let tasks = vec![
        Task::from_workload(0, bert, 0),
        Task::from_workload(1, bert, 120_000),
    ];
    let res = vec![Reservation::Mib(13_000); 2];
    let gated = simulate(&tasks, &res, "oracle", Policy::Magm, &cfg).unwrap();
    let first_end = gated.tasks[0].end_s.unwrap();
    assert!(gated.tasks[1].first_start_s.unwrap() >= first_end);
    cfg.gate = false;
    let open = simulate(&tasks, &res, "oracle", Policy::Magm, &cfg).unwrap();
    let start = open.tasks[1].first_start_s.unwrap();
    assert!((120.0..121.5).contains(&start), "{start}");
    // Sharing two saturating jobs slows both (the slowdown model).
    assert!(open.tasks[0].end_s.unwrap() > bert.exclusive_ms() as f64 / 1000.0 + 60.0);
    // A third task arriving right after the second is held by the warm-up lock
    // until the second's memory shows (15 s).
    let tasks3 = vec![
        Task::from_workload(0, bert, 0),
        Task::from_workload(
            1,
            catalog::by_key("resnet18_cifar-b32-e20").unwrap(),
            120_000,
        ),
        Task::from_workload(
            2,
            catalog::by_key("resnet18_cifar-b32-e20").unwrap(),
            121_000,
        ),
    ];
    let res3 = vec![
        Reservation::Mib(13_000),
        Reservation::Mib(1000),
        Reservation::Mib(1000),
    ];
    let run = simulate(&tasks3, &res3, "oracle", Policy::Magm, &cfg).unwrap();
    let s1 = run.tasks[1].first_start_s.unwrap();
    let s2 = run.tasks[2].first_start_s.unwrap();
    assert!(s2 >= s1 + 15.0, "{s1} {s2}");
}

#[test]
fn results_are_deterministic() {
    let cfg = SimConfig::default();
    let trace = trace::generate(&trace::GeneratorConfig {
        seed: 11,
        ..Default::default()
    })
    .unwrap();
    let a = compare(&trace, EstimatorKind::Recorded, &Policy::ALL, &cfg).unwrap();
    let b = compare(&trace, EstimatorKind::Recorded, &Policy::ALL, &cfg).unwrap();
    for (x, y) in a.runs.iter().zip(&b.runs) {
        assert_eq!(x.summary, y.summary);
    }
}

fn arb_tasks() -> impl Strategy<Value = Vec<Task>> {
    prop::collection::vec((0..CATALOG.len(), 0u64..900, 0.05f64..1.0), 1..30).prop_map(|specs| {
        let mut t = 0;
        specs
            .into_iter()
            .enumerate()
            .map(|(i, (w, gap, scale))| {
                t += gap * 1000;
                let mut task = Task::from_workload(i, &CATALOG[w], t);
                task.exclusive_ms = ((task.exclusive_ms as f64 * scale) as Millis).max(1);
                task
            })
            .collect()
    })
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 64, ..ProptestConfig::default() })]

    #[test]
    fn random_traces_keep_the_invariants(
        tasks in arb_tasks(),
        policy in prop::sample::select(Policy::ALL.to_vec()),
        kind in prop::sample::select(vec![EstimatorKind::Oracle, EstimatorKind::Recorded, EstimatorKind::None]),
        gpus in 2u32..6,
        nodes in 1u32..4,
        gate in any::<bool>(),
        queue in prop::sample::select(QueueDiscipline::ALL.to_vec()),
    ) {
        let mut cfg = SimConfig::default();
        cfg.cluster.gpus_per_node = gpus;
        cfg.cluster.nodes = nodes;
        cfg.gate = gate;
        cfg.queue = queue;
        cfg.record_timelines = true;
        let plan = carma_simulator::plan(&tasks, kind, cfg.cluster.gpu_memory_mib).unwrap();
        let run = simulate(&tasks, &plan.reservations, kind.as_str(), policy, &cfg).unwrap();
        check_invariants(&run, &cfg, &tasks);
        prop_assert_eq!(run.summary.failed, 0);
        // Remembering node answers is an optimisation only: identical results.
        let plain = SimConfig { memoize: false, ..cfg.clone() };
        let again = simulate(&tasks, &plan.reservations, kind.as_str(), policy, &plain).unwrap();
        prop_assert_eq!(&run.summary, &again.summary);
        prop_assert_eq!(&run.tasks, &again.tasks);
        // The calculation by hand is CARMA's strict FIFO queue.
        let fifo = SimConfig { queue: QueueDiscipline::Carma, ..cfg.clone() };
        let excl = simulate(&tasks, &plan.reservations, kind.as_str(), Policy::Exclusive, &fifo).unwrap();
        let (first, last) = exclusive_by_hand(&tasks, nodes as usize, gpus as usize);
        prop_assert_eq!((excl.start_ms, excl.end_ms), (first, last));
    }
}

#[test]
fn the_kube_queue_lets_small_tasks_pass_a_blocked_large_one() {
    // 1 node × 2 GPUs, exclusive: a long 1-GPU task runs; a 2-GPU task arrives and cannot start
    // until it ends; a short 1-GPU task arrives after it. CARMA's FIFO queue holds the short task
    // behind the large one; kube-scheduler's lets it use the free GPU at once.
    let w = &CATALOG[0];
    let mut long = Task::from_workload(0, w, 0);
    long.exclusive_ms = 3_600_000;
    let mut large = Task::from_workload(1, w, 10_000);
    large.gpus = 2;
    large.exclusive_ms = 600_000;
    let mut short = Task::from_workload(2, w, 20_000);
    short.exclusive_ms = 60_000;
    let tasks = vec![long, large, short];
    let res = vec![Reservation::WholeGpu; 3];
    let mut starts = Vec::new();
    for queue in [QueueDiscipline::Carma, QueueDiscipline::Kube] {
        let mut cfg = SimConfig {
            queue,
            ..SimConfig::default()
        };
        cfg.cluster.gpus_per_node = 2;
        let run = simulate(&tasks, &res, "oracle", Policy::Exclusive, &cfg).unwrap();
        assert_eq!(run.summary.finished, 3, "{queue:?}");
        starts.push(run.tasks[2].first_start_s.unwrap());
        // The large task still gets both GPUs once the long one ends (no starvation here).
        assert!(run.tasks[1].first_start_s.unwrap() >= 3_600.0, "{queue:?}");
    }
    assert!(
        starts[0] >= 3_600.0 + 600.0,
        "carma: behind the large task: {starts:?}"
    );
    assert!(
        starts[1] < 30.0,
        "kube: at once on the free GPU: {starts:?}"
    );
}

/// Two busy tasks on one GPU: the second runs at full speed until its activity shows (the
/// telemetry lag), outside the GPU's shared capacity. The work bound must leave that lag out.
#[test]
fn the_work_bound_holds_when_a_task_runs_unshared_during_its_telemetry_lag() {
    let w = catalog::by_key("resnet50-b128").unwrap();
    let tasks: Vec<Task> = (0..2)
        .map(|id| {
            let mut t = Task::from_workload(id, w, 0);
            t.exclusive_ms = 1_000_000;
            t
        })
        .collect();
    let cfg = SimConfig {
        cluster: carma_simulator::config::ClusterSpec {
            nodes: 1,
            gpus_per_node: 1,
            gpu_memory_mib: 40_960,
        },
        ..SimConfig::default()
    };
    let reservations = vec![Reservation::Mib(w.peak_mib); 2];
    let bound = cfg.makespan_bound_s(&tasks).unwrap();
    for policy in [Policy::Magm, Policy::Lug, Policy::Pack] {
        let run = simulate(&tasks, &reservations, "oracle", policy, &cfg).unwrap();
        assert!(run.tasks.iter().all(|o| o.finished), "{policy}");
        assert!(
            run.summary.makespan_s >= bound - 1e-6,
            "{policy}: makespan {} s below the bound {bound} s",
            run.summary.makespan_s
        );
    }
}

#[test]
fn learned_peaks_reserve_later_tasks_of_a_profile_from_the_first_ones_peak() {
    // Twice the true peak as the estimate: once the first task has finished, later tasks of the
    // same workload are reserved its peak + max(10 %, 1 GiB) (carma_core::history). (Only first
    // attempts are learned; recovery keeps its own rule — no task crashes here.)
    let w = catalog::by_key("resnet50-b64").unwrap();
    let tasks: Vec<Task> = (0..6)
        .map(|i| Task::from_workload(i, w, i as Millis * 3 * 3_600_000))
        .collect();
    let peak = tasks[0].peak_mib;
    let res = vec![Reservation::Mib(peak * 2); tasks.len()];
    let mut cfg = SimConfig {
        record_timelines: true,
        ..SimConfig::default()
    };
    let plain = simulate(&tasks, &res, "test", Policy::Magm, &cfg).unwrap();
    assert_eq!(plain.summary.learned_reservations, None);
    assert!(plain.attempts.iter().all(|a| a.reserved_mib == peak * 2));

    cfg.learn_peaks = Some(carma_core::HistoryConfig::default());
    let run = simulate(&tasks, &res, "test", Policy::Magm, &cfg).unwrap();
    check_invariants(&run, &cfg, &tasks);
    assert_eq!(run.summary.finished, tasks.len());
    let learned = peak + (peak / 10).max(1024);
    let first = run.attempts.iter().find(|a| a.task == 0).unwrap();
    assert_eq!(
        first.reserved_mib,
        peak * 2,
        "nothing is known before the first run ends"
    );
    let later: Vec<u64> = run
        .attempts
        .iter()
        .filter(|a| a.task > 0)
        .map(|a| a.reserved_mib)
        .collect();
    assert!(
        later.iter().all(|m| *m == learned),
        "{later:?} vs {learned}"
    );
    assert_eq!(run.summary.learned_reservations, Some(tasks.len() - 1));
}
