//! The recovery decision table.

use carma_core::recovery::grown_reservation;
use carma_core::{
    AttemptOutcome, AttemptRecord, RecoveryConfig, RecoveryDecision, Reservation, decide_next,
};

fn oom(mib: u64, peak: Option<u64>) -> AttemptRecord {
    AttemptRecord {
        outcome: AttemptOutcome::GpuOutOfMemory {
            observed_peak_mib: peak,
        },
        reservation: Reservation::Mib(mib),
        exclusive: false,
    }
}

fn failed() -> AttemptRecord {
    AttemptRecord {
        outcome: AttemptOutcome::Failed {
            reason: "exit code 1".into(),
        },
        reservation: Reservation::Mib(8000),
        exclusive: false,
    }
}

fn evicted() -> AttemptRecord {
    AttemptRecord {
        outcome: AttemptOutcome::Evicted {
            reason: "node drained".into(),
        },
        reservation: Reservation::Mib(8000),
        exclusive: false,
    }
}

#[test]
fn success_is_done() {
    let h = [AttemptRecord {
        outcome: AttemptOutcome::Succeeded,
        reservation: Reservation::Mib(8000),
        exclusive: false,
    }];
    assert_eq!(
        decide_next(&h, Some(40960), &RecoveryConfig::default()),
        RecoveryDecision::Done
    );
}

#[test]
fn first_oom_grows_to_next_class_edge() {
    let d = decide_next(&[oom(8000, None)], Some(40960), &RecoveryConfig::default());
    match d {
        RecoveryDecision::Retry {
            reservation,
            exclusive,
            recovery_priority,
            backoff_ms,
            ..
        } => {
            assert_eq!(reservation, Reservation::Mib(16000));
            assert!(!exclusive);
            assert!(recovery_priority);
            assert_eq!(backoff_ms, 10_000);
        }
        other => panic!("{other:?}"),
    }
}

#[test]
fn observed_peak_plus_headroom_wins_when_larger() {
    // BERT_base bs32: GPUMemNet said 8000, the real peak is 19828 MiB.
    let d = decide_next(
        &[oom(8000, Some(19_828))],
        Some(40960),
        &RecoveryConfig::default(),
    );
    match d {
        RecoveryDecision::Retry { reservation, .. } => {
            assert_eq!(reservation, Reservation::Mib(20_852))
        }
        other => panic!("{other:?}"),
    }
}

#[test]
fn grown_reservation_table() {
    let cfg = RecoveryConfig::default();
    let cases = [
        (Reservation::Mib(2000), None, 8000),
        (Reservation::Mib(8000), None, 16000),
        (Reservation::Mib(12000), Some(9000), 16000),
        (Reservation::Mib(40000), None, 50000),
        (Reservation::Mib(50000), None, 100000),
        (Reservation::Unknown, None, 8000),
        (Reservation::Unknown, Some(30000), 31024),
    ];
    for (failed, peak, want) in cases {
        assert_eq!(
            grown_reservation(failed, peak, &cfg),
            want,
            "{failed:?} {peak:?}"
        );
    }
}

#[test]
fn second_oom_escalates_to_exclusive() {
    let d = decide_next(
        &[oom(8000, None), oom(16000, None)],
        Some(40960),
        &RecoveryConfig::default(),
    );
    match d {
        RecoveryDecision::Retry {
            reservation,
            exclusive,
            backoff_ms,
            ..
        } => {
            assert_eq!(reservation, Reservation::WholeGpu);
            assert!(exclusive);
            assert_eq!(backoff_ms, 20_000);
        }
        other => panic!("{other:?}"),
    }
}

#[test]
fn reservation_beyond_the_gpu_goes_exclusive() {
    let d = decide_next(&[oom(40000, None)], Some(40960), &RecoveryConfig::default());
    assert!(
        matches!(
            d,
            RecoveryDecision::Retry {
                exclusive: true,
                reservation: Reservation::WholeGpu,
                ..
            }
        ),
        "{d:?}"
    );
}

#[test]
fn oom_while_exclusive_gives_up() {
    let h = [AttemptRecord {
        outcome: AttemptOutcome::GpuOutOfMemory {
            observed_peak_mib: None,
        },
        reservation: Reservation::WholeGpu,
        exclusive: true,
    }];
    let d = decide_next(&h, Some(40960), &RecoveryConfig::default());
    match d {
        RecoveryDecision::GiveUp { reason } => assert!(reason.contains("does not fit"), "{reason}"),
        other => panic!("{other:?}"),
    }
}

#[test]
fn attempts_are_bounded() {
    let cfg = RecoveryConfig {
        max_attempts: 2,
        exclusive_after_ooms: 5,
        ..RecoveryConfig::default()
    };
    let d = decide_next(&[oom(8000, None), oom(16000, None)], Some(40960), &cfg);
    match d {
        RecoveryDecision::GiveUp { reason } => {
            assert!(reason.contains("2 attempt(s) used of 2"), "{reason}")
        }
        other => panic!("{other:?}"),
    }
}

#[test]
fn other_failures_retry_only_when_configured() {
    let d = decide_next(&[failed()], None, &RecoveryConfig::default());
    assert!(matches!(d, RecoveryDecision::GiveUp { .. }), "{d:?}");
    let cfg = RecoveryConfig {
        retries_on_failure: 1,
        ..RecoveryConfig::default()
    };
    let d = decide_next(&[failed()], None, &cfg);
    assert!(
        matches!(
            d,
            RecoveryDecision::Retry {
                recovery_priority: false,
                reservation: Reservation::Mib(8000),
                ..
            }
        ),
        "{d:?}"
    );
    let d = decide_next(&[failed(), failed()], None, &cfg);
    assert!(matches!(d, RecoveryDecision::GiveUp { .. }), "{d:?}");
}

#[test]
fn evictions_do_not_count_as_attempts() {
    let cfg = RecoveryConfig {
        max_attempts: 1,
        max_evictions: 2,
        ..RecoveryConfig::default()
    };
    let d = decide_next(&[evicted(), evicted()], None, &cfg);
    assert!(
        matches!(
            d,
            RecoveryDecision::Retry {
                recovery_priority: false,
                ..
            }
        ),
        "{d:?}"
    );
    let d = decide_next(&[evicted(), evicted(), evicted()], None, &cfg);
    assert!(matches!(d, RecoveryDecision::GiveUp { .. }), "{d:?}");
}

#[test]
fn backoff_doubles_up_to_the_ceiling() {
    let cfg = RecoveryConfig {
        retries_on_failure: 20,
        max_attempts: 30,
        backoff_max_ms: 60_000,
        ..RecoveryConfig::default()
    };
    let mut history = Vec::new();
    let mut seen = Vec::new();
    for _ in 0..5 {
        history.push(failed());
        if let RecoveryDecision::Retry { backoff_ms, .. } = decide_next(&history, None, &cfg) {
            seen.push(backoff_ms);
        }
    }
    assert_eq!(seen, vec![10_000, 20_000, 40_000, 60_000, 60_000]);
}

#[test]
fn empty_history_is_not_a_decision() {
    assert!(matches!(
        decide_next(&[], None, &RecoveryConfig::default()),
        RecoveryDecision::GiveUp { .. }
    ));
}
