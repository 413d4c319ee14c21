//! Table-driven tests of every placement rule and policy, with CARMA's figures:
//! 40 GiB A100s (40960 MiB), 512 MiB telemetry reserve, 2048 MiB margin,
//! gate SMACT ≥ 0.80 and (SMOCC ≥ 0.45 or DRAMA ≥ 0.40), 30 s warm-up.

use carma_core::{
    Demand, Gpu, GpuRejection, Ledger, Node, NodeRejection, PlacementConfig, PlacementRecord,
    Policy, Reservation, place_on_node,
};

const A100: u64 = 40960;

fn gpu(index: u32, free: u64, smact: f64, smocc: f64, drama: f64) -> Gpu {
    Gpu {
        uuid: format!("GPU-{index}"),
        index,
        model: "NVIDIA A100-SXM4-40GB".into(),
        memory_total_mib: A100,
        memory_free_mib: free,
        sm_activity: Some(smact),
        sm_occupancy: Some(smocc),
        dram_activity: Some(drama),
        healthy: true,
        processes: 1,
        max_pods: None,
        gate_rule: carma_core::GateRule::SmactSmoccDrama,
        telemetry_at: None,
    }
}

fn node(gpus: Vec<Gpu>) -> Node {
    Node {
        name: "dgx".into(),
        gpus,
    }
}

/// A ledger with one visible (settled) pod on each listed GPU, reserving `mib`.
fn busy_ledger(gpus: &[u32], mib: u64) -> Ledger {
    let mut l = Ledger::new();
    for &g in gpus {
        l.insert_unchecked(PlacementRecord {
            pod: format!("running-{g}"),
            node: "dgx".into(),
            gpus: vec![format!("GPU-{g}")],
            reserved_mib: mib,
            exclusive: false,
            assigned_at: 0,
            visible: true,
            expected_sm_activity: 0.0,
        });
    }
    l
}

fn demand(mib: u64, policy: Policy) -> Demand {
    Demand::new(1, Reservation::Mib(mib), policy)
}

const NOW: u64 = 1_000_000;

#[test]
fn exclusive_first_takes_idle_gpus_in_index_order() {
    let mut gpus: Vec<Gpu> = (0..4)
        .map(|i| Gpu::idle(format!("GPU-{i}"), i, A100))
        .collect();
    gpus[0].processes = 1;
    let ledger = busy_ledger(&[0], 10_000);
    // CARMA's six (carma's `pack` shares first: tests/pack.rs).
    for policy in Policy::ALL.into_iter().filter(|p| p.is_carmas()) {
        let p = place_on_node(
            &node(gpus.clone()),
            &ledger,
            &demand(8000, policy),
            &PlacementConfig::default(),
            NOW,
            0,
        )
        .unwrap();
        assert_eq!(p.indices, vec![1], "{policy}");
        assert_eq!(p.score, 10, "{policy}");
        assert_eq!(p.exclusive, policy == Policy::Exclusive, "{policy}");
        let booked = if policy == Policy::Exclusive {
            A100
        } else {
            8000
        };
        assert_eq!(
            p.reserved_mib, booked,
            "{policy}: an exclusive pod books the whole GPU"
        );
    }
    let mut two = demand(8000, Policy::Magm);
    two.gpus = 2;
    let p = place_on_node(
        &node(gpus),
        &ledger,
        &two,
        &PlacementConfig::default(),
        NOW,
        0,
    )
    .unwrap();
    assert_eq!(p.indices, vec![1, 2]);
}

#[test]
fn exclusive_policy_never_shares() {
    let gpus: Vec<Gpu> = (0..2).map(|i| gpu(i, 30_000, 0.1, 0.1, 0.1)).collect();
    let ledger = busy_ledger(&[0, 1], 8000);
    let err = place_on_node(
        &node(gpus),
        &ledger,
        &demand(2000, Policy::Exclusive),
        &PlacementConfig::default(),
        NOW,
        0,
    )
    .unwrap_err();
    match &err {
        NodeRejection::NotEnoughGpus {
            mode, rejections, ..
        } => {
            assert_eq!(*mode, "exclusively");
            assert!(
                rejections
                    .iter()
                    .all(|r| matches!(r, GpuRejection::NotIdle { .. }))
            );
        }
        other => panic!("{other:?}"),
    }
    assert!(
        err.to_string().contains("GPU 0 (GPU-0) is not idle"),
        "{err}"
    );
}

/// The memory test: usable = free − 512 − in flight ≥ need + 2048.
#[test]
fn memory_test_table() {
    // (free MiB, in-flight MiB, need MiB, passes)
    let cases = [
        (10_560, 0, 8000, true),      // 10560 − 512 = 10048 ≥ 10048
        (10_559, 0, 8000, false),     // one MiB short
        (20_000, 9_000, 8000, true),  // 20000 − 512 − 9000 = 10488
        (20_000, 9_500, 8000, false), // 9988 < 10048
        (40_960, 0, 38_400, true),    // 40448 ≥ 40448
        (40_960, 0, 38_401, false),
    ];
    let cfg = PlacementConfig {
        warmup_ms: 0,
        honor_reservations: false,
        ..PlacementConfig::default()
    };
    for (free, in_flight, need, passes) in cases {
        let mut ledger = busy_ledger(&[0], 1000);
        if in_flight > 0 {
            ledger.insert_unchecked(PlacementRecord {
                pod: "in-flight".into(),
                node: "dgx".into(),
                gpus: vec!["GPU-0".into()],
                reserved_mib: in_flight,
                exclusive: false,
                assigned_at: 0,
                visible: false,
                expected_sm_activity: 0.0,
            });
        }
        let r = place_on_node(
            &node(vec![gpu(0, free, 0.2, 0.2, 0.2)]),
            &ledger,
            &demand(need, Policy::Ff),
            &cfg,
            NOW,
            0,
        );
        assert_eq!(
            r.is_ok(),
            passes,
            "free {free} in-flight {in_flight} need {need}: {r:?}"
        );
        if let Err(NodeRejection::NotEnoughGpus { rejections, .. }) = r {
            match &rejections[0] {
                GpuRejection::InsufficientMemory {
                    usable_mib,
                    need_mib,
                    margin_mib,
                    ..
                } => {
                    assert_eq!(*usable_mib, free - 512 - in_flight);
                    assert_eq!(*need_mib, need);
                    assert_eq!(*margin_mib, 2048);
                }
                other => panic!("{other:?}"),
            }
        }
    }
}

/// The utilization gate: excluded when SMACT ≥ 0.80 and (SMOCC ≥ 0.45 or DRAMA ≥ 0.40).
#[test]
fn utilization_gate_table() {
    let cases = [
        (0.79, 0.99, 0.99, true),
        (0.80, 0.44, 0.39, true),
        (0.80, 0.45, 0.00, false),
        (0.80, 0.00, 0.40, false),
        (0.95, 0.50, 0.50, false),
        (1.00, 0.10, 0.10, true),
    ];
    for (smact, smocc, drama, passes) in cases {
        let r = place_on_node(
            &node(vec![gpu(0, 30_000, smact, smocc, drama)]),
            &busy_ledger(&[0], 1000),
            &demand(4000, Policy::Lug),
            &PlacementConfig::default(),
            NOW,
            0,
        );
        assert_eq!(r.is_ok(), passes, "{smact} {smocc} {drama}");
        if let Err(e) = r {
            assert_eq!(e.code(), "utilization-gate");
            assert!(e.to_string().contains("SM activity"), "{e}");
        }
    }
}

#[test]
fn round_robin_skips_memory_test_and_gate_and_cycles() {
    let gpus = vec![
        gpu(0, 1_000, 0.99, 0.99, 0.99),
        gpu(1, 1_000, 0.99, 0.99, 0.99),
        gpu(2, 1_000, 0.99, 0.99, 0.99),
    ];
    let ledger = busy_ledger(&[0, 1, 2], 1000);
    let cfg = PlacementConfig::default();
    let picks: Vec<u32> = (0..4)
        .map(|cursor| {
            place_on_node(
                &node(gpus.clone()),
                &ledger,
                &demand(30_000, Policy::Rr),
                &cfg,
                NOW,
                cursor,
            )
            .unwrap()
            .indices[0]
        })
        .collect();
    assert_eq!(picks, vec![0, 1, 2, 0]);
    // What placement did not check, booking must not check either (filter and bind agree).
    let p = place_on_node(
        &node(gpus),
        &ledger,
        &demand(30_000, Policy::Rr),
        &cfg,
        NOW,
        0,
    )
    .unwrap();
    assert!(!p.capacity_checked);
    let shared = place_on_node(
        &node(vec![gpu(0, A100, 0.1, 0.1, 0.1)]),
        &Ledger::new(),
        &demand(1_000, Policy::Magm),
        &cfg,
        NOW,
        0,
    )
    .unwrap();
    assert!(shared.capacity_checked);
}

/// A GPU advertised as R replicas takes at most R pods, whatever the policy (seen against the real
/// kubelet device manager: nine small pods went to a GPU with eight replicas, and kubelet gave the
/// ninth a replica of another GPU).
#[test]
fn a_gpu_takes_no_more_pods_than_its_replicas() {
    let mut full = gpu(0, A100, 0.1, 0.1, 0.1);
    full.max_pods = Some(1);
    let mut roomy = gpu(1, A100, 0.1, 0.1, 0.1);
    roomy.max_pods = Some(2);
    let ledger = busy_ledger(&[0, 1], 100);
    let cfg = PlacementConfig::default();
    for policy in [
        Policy::Ff,
        Policy::Bf,
        Policy::Magm,
        Policy::Lug,
        Policy::Rr,
    ] {
        let p = place_on_node(
            &node(vec![full.clone(), roomy.clone()]),
            &ledger,
            &demand(100, policy),
            &cfg,
            NOW,
            0,
        )
        .unwrap_or_else(|e| panic!("{policy:?}: {e}"));
        assert_eq!(p.indices, vec![1], "{policy:?}");
    }
    let err = place_on_node(
        &node(vec![full]),
        &ledger,
        &demand(100, Policy::Rr),
        &cfg,
        NOW,
        0,
    )
    .unwrap_err();
    assert!(
        err.to_string()
            .contains("all the replicas its device plugin advertises (1)"),
        "{err}"
    );
}

/// Ordering of the sharing policies over the same four GPUs.
#[test]
fn policy_order_table() {
    //            index, free,   smact
    let gpus = vec![
        gpu(0, 20_000, 0.50, 0.1, 0.1),
        gpu(1, 12_000, 0.10, 0.1, 0.1),
        gpu(2, 35_000, 0.70, 0.1, 0.1),
        gpu(3, 16_000, 0.05, 0.1, 0.1),
    ];
    let ledger = busy_ledger(&[0, 1, 2, 3], 1000);
    let cases = [
        (Policy::Ff, vec![0, 1]),
        (Policy::Bf, vec![1, 3]),
        (Policy::Magm, vec![2, 0]),
        (Policy::Lug, vec![3, 1]),
        (Policy::Rr, vec![0, 1]),
    ];
    for (policy, want) in cases {
        let mut d = demand(6000, policy);
        d.gpus = 2;
        let p = place_on_node(
            &node(gpus.clone()),
            &ledger,
            &d,
            &PlacementConfig::default(),
            NOW,
            0,
        )
        .unwrap();
        assert_eq!(p.indices, want, "{policy}");
        assert!(!p.exclusive);
        assert!(
            p.score <= 9,
            "collocation scores stay below the exclusive 10"
        );
    }
}

#[test]
fn scores_follow_each_policy() {
    let ledger = busy_ledger(&[0, 1], 1000);
    let roomy = node(vec![gpu(0, 38_000, 0.1, 0.1, 0.1)]);
    let tight = node(vec![gpu(0, 11_000, 0.7, 0.1, 0.1)]);
    let cfg = PlacementConfig::default();
    let score = |n: &Node, p: Policy| {
        place_on_node(n, &ledger, &demand(8000, p), &cfg, NOW, 0)
            .unwrap()
            .score
    };
    assert!(score(&roomy, Policy::Magm) > score(&tight, Policy::Magm));
    assert!(score(&roomy, Policy::Bf) < score(&tight, Policy::Bf));
    assert!(score(&roomy, Policy::Lug) > score(&tight, Policy::Lug));
}

#[test]
fn multi_gpu_demand_needs_every_gpu_to_pass() {
    let gpus = vec![gpu(0, 30_000, 0.1, 0.1, 0.1), gpu(1, 5_000, 0.1, 0.1, 0.1)];
    let ledger = busy_ledger(&[0, 1], 1000);
    let mut d = demand(8000, Policy::Magm);
    d.gpus = 2;
    let err = place_on_node(
        &node(gpus),
        &ledger,
        &d,
        &PlacementConfig::default(),
        NOW,
        0,
    )
    .unwrap_err();
    match err {
        NodeRejection::NotEnoughGpus {
            wanted,
            passing,
            rejections,
            ..
        } => {
            assert_eq!((wanted, passing), (2, 1));
            assert_eq!(rejections.len(), 1);
            assert_eq!(rejections[0].code(), "insufficient-memory");
        }
        other => panic!("{other:?}"),
    }
}

#[test]
fn too_few_gpus_and_no_gpus() {
    let mut d = demand(1000, Policy::Ff);
    d.gpus = 3;
    let err = place_on_node(
        &node(vec![gpu(0, 40_000, 0.0, 0.0, 0.0)]),
        &Ledger::new(),
        &d,
        &PlacementConfig::default(),
        NOW,
        0,
    )
    .unwrap_err();
    assert_eq!(err.code(), "too-few-gpus");
    let err = place_on_node(
        &node(vec![]),
        &Ledger::new(),
        &d,
        &PlacementConfig::default(),
        NOW,
        0,
    )
    .unwrap_err();
    assert_eq!(err.code(), "no-gpus");
    assert!(err.to_string().contains("dgx"));
}

#[test]
fn warm_up_lock_blocks_until_visible_or_30_s() {
    let gpus = vec![gpu(0, 30_000, 0.1, 0.1, 0.1)];
    let mut ledger = Ledger::new();
    ledger.insert_unchecked(PlacementRecord {
        pod: "fresh".into(),
        node: "dgx".into(),
        gpus: vec!["GPU-0".into()],
        reserved_mib: 4000,
        exclusive: false,
        assigned_at: NOW,
        visible: false,
        expected_sm_activity: 0.0,
    });
    let cfg = PlacementConfig::default();
    let d = demand(4000, Policy::Ff);
    let err = place_on_node(&node(gpus.clone()), &ledger, &d, &cfg, NOW + 29_999, 0).unwrap_err();
    assert_eq!(err.code(), "warm-up-lock");
    assert!(err.to_string().contains("fresh"), "{err}");
    // after 30 s the lock lifts, but the in-flight reservation still counts
    let p = place_on_node(&node(gpus.clone()), &ledger, &d, &cfg, NOW + 30_000, 0).unwrap();
    assert_eq!(p.indices, vec![0]);
    // once the memory is visible, the lock lifts at once
    ledger.confirm("fresh");
    assert!(place_on_node(&node(gpus), &ledger, &d, &cfg, NOW + 1, 0).is_ok());
}

#[test]
fn unhealthy_and_exclusively_held_gpus_are_skipped() {
    let mut sick = gpu(0, 30_000, 0.1, 0.1, 0.1);
    sick.healthy = false;
    let held = gpu(1, 30_000, 0.1, 0.1, 0.1);
    let mut ledger = busy_ledger(&[0], 1000);
    ledger.insert_unchecked(PlacementRecord {
        pod: "owner".into(),
        node: "dgx".into(),
        gpus: vec!["GPU-1".into()],
        reserved_mib: A100,
        exclusive: true,
        assigned_at: 0,
        visible: true,
        expected_sm_activity: 0.0,
    });
    let err = place_on_node(
        &node(vec![sick, held]),
        &ledger,
        &demand(1000, Policy::Ff),
        &PlacementConfig::default(),
        NOW,
        0,
    )
    .unwrap_err();
    let text = err.to_string();
    assert!(text.contains("GPU 0 (GPU-0) is unhealthy"), "{text}");
    assert!(
        text.contains("GPU 1 (GPU-1) is held exclusively by owner"),
        "{text}"
    );
}

#[test]
fn reservations_must_fit_on_paper_too() {
    // telemetry says 30 GB free (the running pods have not peaked yet), but
    // 36000 MiB are already reserved: 8000 more would over-commit the GPU.
    let ledger = busy_ledger(&[0], 36_000);
    let err = place_on_node(
        &node(vec![gpu(0, 30_000, 0.1, 0.1, 0.1)]),
        &ledger,
        &demand(8000, Policy::Magm),
        &PlacementConfig::default(),
        NOW,
        0,
    )
    .unwrap_err();
    assert_eq!(err.code(), "over-reserved");
    let cfg = PlacementConfig {
        honor_reservations: false,
        ..PlacementConfig::default()
    };
    assert!(
        place_on_node(
            &node(vec![gpu(0, 30_000, 0.1, 0.1, 0.1)]),
            &ledger,
            &demand(8000, Policy::Magm),
            &cfg,
            NOW,
            0
        )
        .is_ok()
    );
}

#[test]
fn no_estimate_uses_carma_5120_mib_rule() {
    let ledger = busy_ledger(&[0], 1000);
    let d = Demand::new(1, Reservation::Unknown, Policy::Magm);
    let cfg = PlacementConfig::default();
    assert!(
        place_on_node(
            &node(vec![gpu(0, 5_632, 0.1, 0.1, 0.1)]),
            &ledger,
            &d,
            &cfg,
            NOW,
            0
        )
        .is_ok()
    );
    let err = place_on_node(
        &node(vec![gpu(0, 5_631, 0.1, 0.1, 0.1)]),
        &ledger,
        &d,
        &cfg,
        NOW,
        0,
    )
    .unwrap_err();
    assert_eq!(err.code(), "insufficient-memory");
}

#[test]
fn whole_gpu_reservation_is_exclusive() {
    let ledger = busy_ledger(&[0], 1000);
    let d = Demand::new(1, Reservation::WholeGpu, Policy::Magm);
    let err = place_on_node(
        &node(vec![gpu(0, 39_000, 0.0, 0.0, 0.0)]),
        &ledger,
        &d,
        &PlacementConfig::default(),
        NOW,
        0,
    )
    .unwrap_err();
    assert!(err.to_string().contains("exclusive"), "{err}");
}

#[test]
fn cold_telemetry_allows_only_exclusive_use() {
    let mut g = gpu(0, 30_000, 0.0, 0.0, 0.0);
    g.sm_activity = None;
    let err = place_on_node(
        &node(vec![g]),
        &busy_ledger(&[0], 1000),
        &demand(1000, Policy::Ff),
        &PlacementConfig::default(),
        NOW,
        0,
    )
    .unwrap_err();
    assert_eq!(err.code(), "telemetry-warming-up");
}

#[test]
fn policies_parse_and_print() {
    for p in Policy::ALL {
        assert_eq!(p.as_str().parse::<Policy>().unwrap(), p);
    }
    let err = "fastest".parse::<Policy>().unwrap_err();
    assert!(err.to_string().contains("fastest"));
}

#[test]
fn a_reservation_of_the_whole_gpu_or_more_takes_an_idle_gpu_whole() {
    // 64 GiB asked, 40 GiB GPUs. The extender used to refuse it everywhere (the pod stayed
    // pending) while the simulator ran it on a whole GPU: one rule now, in core.
    let gpus: Vec<Gpu> = (0..2)
        .map(|i| Gpu::idle(format!("GPU-{i}"), i, A100))
        .collect();
    for need in [A100, 65_536] {
        for policy in Policy::ALL {
            let p = place_on_node(
                &node(gpus.clone()),
                &Ledger::new(),
                &demand(need, policy),
                &PlacementConfig::default(),
                NOW,
                0,
            )
            .unwrap_or_else(|e| panic!("{need} MiB, {policy}: {e}"));
            assert!(p.exclusive, "{need} MiB, {policy}");
            assert_eq!(p.reserved_mib, A100, "{need} MiB, {policy}");
        }
    }
    // Never shared: with every GPU busy, each one says why.
    let err = place_on_node(
        &node(gpus),
        &busy_ledger(&[0, 1], 1000),
        &demand(65_536, Policy::Magm),
        &PlacementConfig::default(),
        NOW,
        0,
    )
    .unwrap_err();
    assert_eq!(err.code(), "needs-whole-gpu");
    assert!(err.to_string().contains("only whole"), "{err}");
}

#[test]
fn while_a_recovery_waits_other_pods_take_idle_gpus_only() {
    use carma_core::placement::recovery_first;
    // GPU 0 busy with a sharer, GPU 1 idle.
    let gpus = vec![gpu(0, 30_000, 0.1, 0.1, 0.1), Gpu::idle("GPU-1", 1, A100)];
    let ledger = busy_ledger(&[0], 1000);
    let cfg = PlacementConfig::default();
    let sharer = demand(2000, Policy::Bf);
    // No recovery waiting: best fit shares GPU 0.
    let p = place_on_node(&node(gpus.clone()), &ledger, &sharer, &cfg, NOW, 0).unwrap();
    assert_eq!(p.score, 10, "exclusive first: the idle GPU 1");
    let mut busy = ledger.clone();
    busy.insert_unchecked(PlacementRecord {
        pod: "other".into(),
        node: "dgx".into(),
        gpus: vec!["GPU-1".into()],
        reserved_mib: 1000,
        exclusive: false,
        assigned_at: 0,
        visible: true,
        expected_sm_activity: 0.0,
    });
    assert!(place_on_node(&node(gpus.clone()), &busy, &sharer, &cfg, NOW, 0).is_ok());
    // A recovery waits: the same pod may not collocate, only take idle GPUs.
    let held = recovery_first(sharer.clone(), true, false);
    let err = place_on_node(&node(gpus.clone()), &busy, &held, &cfg, NOW, 0).unwrap_err();
    assert_eq!(err.code(), "recovery-first");
    assert!(err.to_string().contains("carma-recovery"), "{err}");
    let p = place_on_node(&node(gpus.clone()), &ledger, &held, &cfg, NOW, 0).unwrap();
    assert_eq!(p.gpus, ["GPU-1"]);
    // The recovering pod itself may share.
    let rec = recovery_first(sharer, true, true);
    assert!(!rec.idle_only);
    assert!(place_on_node(&node(gpus), &busy, &rec, &cfg, NOW, 0).is_ok());
}
