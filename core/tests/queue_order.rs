//! The queue's order: a priority from what a task declares, then arrival.

use carma_core::queue_order::insert_position;
use carma_core::{Declared, QueueOrder};

fn declared(minutes: u64, gpus: u32) -> Declared {
    Declared {
        duration_ms: Some(minutes * 60_000),
        gpus,
    }
}

/// Queue `tasks` (in arrival order) by `priority`, as the simulator's queue does; their indices.
fn queued_by(priority: impl Fn(&Declared) -> i64, tasks: &[Declared]) -> Vec<usize> {
    let mut q: Vec<(usize, i64)> = Vec::new();
    for (i, d) in tasks.iter().enumerate() {
        let p = priority(d);
        let at = insert_position(q.iter().map(|&(_, p)| p), p);
        q.insert(at, (i, p));
    }
    q.into_iter().map(|(i, _)| i).collect()
}

/// Queue `tasks` by `order`'s exact priority.
fn queued(order: QueueOrder, tasks: &[Declared]) -> Vec<usize> {
    queued_by(|d| order.priority(d), tasks)
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

/// Queue `tasks` by the priority classes a cluster applies; their indices.
fn queued_by_class(order: QueueOrder, tasks: &[Declared]) -> Vec<usize> {
    queued_by(|d| order.class_priority(d), tasks)
}

#[test]
fn classes_never_reverse_the_exact_order() {
    // Every pair of declarations the classes order strictly, the exact priority orders the same
    // way: a class ladder only merges neighbours, it never swaps them.
    let durations = [
        0u64, 1, 2, 3, 5, 9, 15, 29, 30, 31, 45, 60, 200, 1_000, 20_000,
    ];
    for order in QueueOrder::ALL {
        let mut ds = Vec::new();
        for &m in &durations {
            for gpus in [1, 2, 4, 8] {
                ds.push(declared(m, gpus));
            }
        }
        ds.push(Declared {
            duration_ms: None,
            gpus: 1,
        });
        for a in &ds {
            for b in &ds {
                let (ca, cb) = (order.class_priority(a), order.class_priority(b));
                if ca > cb {
                    assert!(
                        order.priority(a) > order.priority(b),
                        "{order}: {a:?} above {b:?} by class, not by exact priority"
                    );
                }
            }
        }
    }
}

#[test]
fn short_then_longest_classes_put_short_tasks_first_then_the_most_gpu_time() {
    let order: QueueOrder = "short-then-longest".parse().unwrap();
    // 3 h on 1 GPU, 10 min, undeclared, 2 h on 4 GPUs, 3 min, 40 min on 1 GPU.
    let tasks = [
        declared(180, 1),
        declared(10, 1),
        Declared {
            duration_ms: None,
            gpus: 1,
        },
        declared(120, 4),
        declared(3, 1),
        declared(40, 1),
    ];
    assert_eq!(queued_by_class(order, &tasks), vec![4, 1, 3, 0, 5, 2]);
    let names: Vec<String> = order.classes().into_iter().map(|c| c.name).collect();
    assert_eq!(names.first().unwrap(), "carma-queue-stl30-under-1m");
    assert_eq!(names[5], "carma-queue-stl30-under-30m");
    assert_eq!(names.last().unwrap(), "carma-queue-stl30-from-30-gpu-min");
    assert_eq!(
        order.class(&declared(10, 1)).unwrap().name,
        "carma-queue-stl30-under-16m"
    );
}

#[test]
fn class_ladders_are_valid_priority_classes() {
    for order in QueueOrder::ALL {
        let classes = order.classes();
        if order == QueueOrder::Arrival {
            assert!(classes.is_empty());
            assert_eq!(order.class(&declared(5, 1)), None);
            continue;
        }
        // Distinct values, descending by one, all above pods without a class and below carma's
        // recovery class; names are DNS subdomains and distinct.
        for (i, c) in classes.iter().enumerate() {
            assert_eq!(
                c.value,
                carma_core::QUEUE_CLASS_BASE + (classes.len() - 1 - i) as i32
            );
            assert!(c.value > 0 && c.value < 1_000_000, "{c:?}");
            assert!(c.name.len() <= 253, "{}", c.name);
            assert!(
                c.name
                    .chars()
                    .all(|ch| ch.is_ascii_lowercase() || ch.is_ascii_digit() || ch == '-'),
                "{}",
                c.name
            );
        }
        let mut names: Vec<&str> = classes.iter().map(|c| c.name.as_str()).collect();
        names.sort_unstable();
        names.dedup();
        assert_eq!(names.len(), classes.len(), "{order}: duplicate names");
        // Undeclared tasks get no class; the extremes land in the top and bottom classes.
        let undeclared = Declared {
            duration_ms: None,
            gpus: 1,
        };
        assert_eq!(order.class(&undeclared), None);
        assert!(order.class(&declared(0, 1)).is_some());
        assert!(order.class(&declared(100_000, 8)).is_some());
    }
}

#[test]
fn the_backlog_is_declared_gpu_time_spread_over_the_gpus() {
    use carma_core::queue_order::backlog_ms;
    // 60 min on 2 GPUs and 20 min on 1, plus a task that declares nothing, over 4 GPUs: 35 min.
    let ahead = [(3_600_000, 2), (1_200_000, 1), (0, 1)];
    assert_eq!(backlog_ms(ahead, 4), Some(35 * 60_000));
    assert_eq!(backlog_ms([], 4), Some(0));
    assert_eq!(backlog_ms(ahead, 0), None);
    // Far beyond a year on a million GPUs does not overflow.
    assert_eq!(
        backlog_ms([(u64::MAX, u32::MAX), (u64::MAX, u32::MAX)], 1),
        Some(u64::MAX)
    );
}

#[test]
fn a_task_is_promoted_once_it_outlasts_the_backlog_of_everything_else() {
    use carma_core::queue_order::outlasts_backlog;
    let long = declared(90, 1);
    // Over 4 GPUs its own share of a backlog is a quarter of its duration.
    let backlog = |others_min: u64| (others_min * 60_000) + 90 * 60_000 / 4;
    assert!(!outlasts_backlog(&long, backlog(120), 4, 1.0));
    assert!(outlasts_backlog(&long, backlog(90), 4, 1.0));
    // Alone in a one-GPU cluster it is the whole backlog, and nothing else is left.
    assert!(outlasts_backlog(&long, 90 * 60_000, 1, 1.0));
    // A factor above 1 promotes later (a longer task or a shorter backlog), below 1 sooner.
    assert!(!outlasts_backlog(&long, backlog(60), 4, 2.0));
    assert!(outlasts_backlog(&long, backlog(120), 4, 0.75));
    // Declaring nothing never promotes.
    let undeclared = Declared {
        duration_ms: None,
        gpus: 1,
    };
    assert!(!outlasts_backlog(&undeclared, 0, 4, 1.0));
}
