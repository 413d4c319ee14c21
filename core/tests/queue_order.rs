//! The queue's order: a priority from what a task declares, then arrival.

use carma_core::queue_order::insert_position;
use carma_core::{Declared, QueueOrder};

fn declared(minutes: u64, gpus: u32) -> Declared {
    Declared {
        duration_ms: Some(minutes * 60_000),
        gpus,
    }
}

/// Queue `tasks` (in arrival order) by `order`, as the simulator's queue does; their indices.
fn queued(order: QueueOrder, tasks: &[Declared]) -> Vec<usize> {
    let mut q: Vec<(usize, i64)> = Vec::new();
    for (i, d) in tasks.iter().enumerate() {
        let p = order.priority(d);
        let at = insert_position(q.iter().map(|&(_, p)| p), p);
        q.insert(at, (i, p));
    }
    q.into_iter().map(|(i, _)| i).collect()
}

#[test]
fn a_task_declared_short_goes_ahead_of_a_long_one_under_shortest_first() {
    let tasks = [declared(120, 1), declared(5, 1), declared(30, 1)];
    assert_eq!(queued(QueueOrder::ShortestFirst, &tasks), vec![1, 2, 0]);
    assert_eq!(queued(QueueOrder::Arrival, &tasks), vec![0, 1, 2]);
}

#[test]
fn longest_first_ranks_by_gpu_time() {
    // 60 min on 2 GPUs (120 GPU-minutes) before 90 min on 1.
    let tasks = [declared(90, 1), declared(10, 1), declared(60, 2)];
    assert_eq!(queued(QueueOrder::LongestFirst, &tasks), vec![2, 0, 1]);
}

#[test]
fn equal_priorities_keep_arrival_order() {
    let tasks = [
        declared(10, 1),
        declared(10, 1),
        declared(5, 1),
        declared(10, 1),
    ];
    assert_eq!(queued(QueueOrder::ShortestFirst, &tasks), vec![2, 0, 1, 3]);
    assert_eq!(queued(QueueOrder::LongestFirst, &tasks), vec![0, 1, 3, 2]);
}

#[test]
fn an_undeclared_duration_never_moves_a_task_ahead() {
    let none = Declared {
        duration_ms: None,
        gpus: 1,
    };
    for order in [QueueOrder::ShortestFirst, QueueOrder::LongestFirst] {
        assert_eq!(
            queued(order, &[none, declared(600, 4)]),
            vec![1, 0],
            "{order}"
        );
        assert!(order.priority(&none) < order.priority(&declared(1_000_000, 1)));
    }
    assert_eq!(QueueOrder::Arrival.priority(&none), 0);
}

#[test]
fn names_round_trip_and_unknown_names_are_errors() {
    for order in QueueOrder::ALL {
        assert_eq!(order.as_str().parse::<QueueOrder>(), Ok(order));
    }
    assert_eq!(QueueOrder::default(), QueueOrder::Arrival);
    let err = "sjf".parse::<QueueOrder>().unwrap_err().to_string();
    assert!(err.contains("shortest-first"), "{err}");
}

#[test]
fn priorities_fit_kubernetes_for_realistic_durations() {
    // A year on 8 GPUs still fits a 32-bit pod priority.
    let year = declared(365 * 24 * 60, 8);
    assert!(i32::try_from(QueueOrder::LongestFirst.priority(&year)).is_ok());
    assert!(i32::try_from(QueueOrder::ShortestFirst.priority(&year)).is_ok());
}

#[test]
fn short_then_longest_runs_short_tasks_shortest_first_then_long_ones_longest_first() {
    let order: QueueOrder = "short-then-longest:30".parse().unwrap();
    assert_eq!(order, QueueOrder::ALL[3]);
    // 45 min × 1, 20 min, 90 min × 2, 5 min, 60 min × 1
    let tasks = [
        declared(45, 1),
        declared(20, 1),
        declared(90, 2),
        declared(5, 1),
        declared(60, 1),
    ];
    assert_eq!(queued(order, &tasks), vec![3, 1, 2, 4, 0]);
    // A long task that would outrank every short one by its GPU time still ranks below them.
    let huge = declared(365 * 24 * 60, 8);
    assert!(order.priority(&huge) < order.priority(&declared(29, 1)));
    let ten: QueueOrder = "short-then-longest:10".parse().unwrap();
    assert_eq!(queued(ten, &tasks), vec![3, 2, 4, 0, 1]);
    assert_eq!(ten.to_string(), "short-then-longest:10");
    for bad in [
        "short-then-longest:0",
        "short-then-longest:x",
        "shortest-first:10",
    ] {
        assert!(bad.parse::<QueueOrder>().is_err(), "{bad}");
    }
}

#[test]
fn a_long_wait_promotes_a_task_ahead_of_every_declared_priority() {
    let order = QueueOrder::ALL[3];
    let long = declared(60, 1);
    let short = declared(1, 1);
    let hour = Some(3_600_000);
    assert!(order.aged_priority(&long, 0, hour) < order.aged_priority(&short, 0, hour));
    assert!(order.aged_priority(&long, 3_600_000, hour) > order.aged_priority(&short, 0, hour));
    assert_eq!(
        order.aged_priority(&long, u64::MAX, None),
        order.priority(&long)
    );
    assert!(i32::try_from(carma_core::queue_order::PROMOTED).is_ok());
}
