//! `pack --pack-hold-for-multi-gpu`: a 2-GPU task that single-GPU tasks keep passing under
//! kube-scheduler's queue starts once the GPUs it needs are kept for it.

use carma_core::{Millis, Policy, Reservation};
use carma_simulator::catalog::CATALOG;
use carma_simulator::{QueueDiscipline, QueueOrdering, SimConfig, Task, simulate_ordered};

fn task(id: usize, gpus: u32, arrival_ms: Millis, exclusive_ms: Millis) -> Task {
    let mut t = Task::from_workload(id, &CATALOG[0], arrival_ms);
    t.gpus = gpus;
    t.exclusive_ms = exclusive_ms;
    t
}

#[test]
fn a_starving_two_gpu_task_starts_once_its_gpus_are_kept() {
    // Two GPUs taken whole: a 2-GPU task arrives behind a 1-GPU one, then a 1-GPU task every
    // 5 minutes, each running 10 minutes, so one GPU is always busy.
    let mut tasks = vec![task(0, 1, 0, 600_000), task(1, 2, 1_000, 1_800_000)];
    for i in 2..60 {
        tasks.push(task(i, 1, (i as u64 - 1) * 300_000, 600_000));
    }
    let res = vec![Reservation::WholeGpu; tasks.len()];
    let mut cfg = SimConfig::default();
    cfg.cluster.gpus_per_node = 2;
    cfg.queue = QueueDiscipline::Kube;
    let start = |policy, hold_for_multi_gpu_ms| {
        let ordering = QueueOrdering {
            hold_for_multi_gpu_ms,
            ..QueueOrdering::default()
        };
        let run = simulate_ordered(&tasks, &res, "t", policy, &cfg, &ordering).unwrap();
        assert_eq!(run.summary.finished, tasks.len());
        run.tasks[1].first_start_s.unwrap()
    };
    let plain = start(Policy::Pack, None);
    let held = start(Policy::Pack, Some(1_800_000));
    assert!(plain > 4.0 * 3600.0, "without the hold: {plain}");
    assert!(held < 3600.0, "held after 30 min: {held}");
    // The option is `pack`'s: other policies ignore it.
    assert_eq!(start(Policy::Ff, Some(1_800_000)), start(Policy::Ff, None));
}
