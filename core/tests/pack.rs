//! `pack`, carma's own policy: complementary packing by expected SM activity, idle GPUs kept for
//! pods that cannot share, crowding up to full activity last, aging. CARMA's figures: 40 GiB
//! A100s, gate cap 0.80.

use carma_core::placement::pack::IDLE_SCORE;
use carma_core::{
    Demand, Gpu, Ledger, Node, NodeRejection, PlacementConfig, PlacementRecord, Policy,
    Reservation, place_on_node,
};

const A100: u64 = 40960;
const NOW: u64 = 1_000_000;

/// A GPU running one settled pod (8000 MiB used), with measured activity `smact`;
/// with `smact == None` it is idle.
fn gpu(index: u32, smact: Option<f64>) -> Gpu {
    let mut g = Gpu::idle(format!("GPU-{index}"), index, A100);
    if let Some(a) = smact {
        g.processes = 1;
        g.memory_free_mib = A100 - 8000;
        g.sm_activity = Some(a);
        g.sm_occupancy = Some(a * 0.5);
        g.dram_activity = Some(a * 0.3);
    }
    g
}

fn node(name: &str, gpus: Vec<Gpu>) -> Node {
    Node {
        name: name.into(),
        gpus,
    }
}

/// One settled pod on each busy GPU of `node`, booked with `booked` expected activity.
fn ledger_for(nodes: &[&Node], booked: f64) -> Ledger {
    let mut l = Ledger::new();
    for n in nodes {
        for g in n.gpus.iter().filter(|g| g.processes > 0) {
            l.insert_unchecked(PlacementRecord {
                pod: format!("{}-{}", n.name, g.uuid),
                node: n.name.clone(),
                gpus: vec![g.uuid.clone()],
                reserved_mib: 8000,
                exclusive: false,
                assigned_at: 0,
                visible: true,
                expected_sm_activity: booked,
            });
        }
    }
    l
}

fn demand(activity: Option<f64>) -> Demand {
    let mut d = Demand::new(1, Reservation::Mib(6000), Policy::Pack);
    d.expected_sm_activity = activity;
    d
}

#[test]
fn a_light_pod_packs_onto_the_tightest_complementary_gpu_and_keeps_the_idle_one() {
    let n = node(
        "a",
        vec![gpu(0, Some(0.2)), gpu(1, None), gpu(2, Some(0.5))],
    );
    let ledger = ledger_for(&[&n], 0.0);
    let cfg = PlacementConfig::default();
    let p = place_on_node(&n, &ledger, &demand(Some(0.25)), &cfg, NOW, 0).unwrap();
    assert_eq!(
        p.indices,
        vec![2],
        "0.5 + 0.25 is the tightest fit under 0.8"
    );
    assert_eq!(p.score, 10);
    assert!(!p.exclusive);
    assert_eq!(p.expected_sm_activity, 0.25);
    // Every CARMA policy takes the idle GPU first.
    for policy in Policy::ALL.into_iter().filter(|p| p.is_carmas()) {
        let mut d = demand(Some(0.25));
        d.policy = policy;
        let q = place_on_node(&n, &ledger, &d, &cfg, NOW, 0).unwrap();
        assert_eq!((q.indices, q.score), (vec![1], 10), "{policy}");
    }
}

#[test]
fn a_heavy_or_unknown_pod_takes_an_idle_gpu_rather_than_crowd_one() {
    let n = node(
        "a",
        vec![gpu(0, Some(0.2)), gpu(1, None), gpu(2, Some(0.5))],
    );
    let ledger = ledger_for(&[&n], 0.0);
    let cfg = PlacementConfig::default();
    for activity in [Some(0.7), None] {
        let p = place_on_node(&n, &ledger, &demand(activity), &cfg, NOW, 0).unwrap();
        assert_eq!((p.indices, p.score), (vec![1], IDLE_SCORE), "{activity:?}");
        assert_eq!(p.expected_sm_activity, activity.unwrap_or(1.0));
    }
}

#[test]
fn without_an_idle_gpu_a_pod_crowds_the_least_loaded_gpu_up_to_the_limit_and_no_further() {
    let cfg = limit(1.0);
    // 0.25 + 0.7 = 0.95: past the cap but within the limit; 0.6 + 0.7 would be 1.3.
    let n = node("a", vec![gpu(0, Some(0.6)), gpu(1, Some(0.25))]);
    let ledger = ledger_for(&[&n], 0.0);
    let p = place_on_node(&n, &ledger, &demand(Some(0.7)), &cfg, NOW, 0).unwrap();
    assert_eq!(p.indices, vec![1]);
    assert!(p.score < IDLE_SCORE, "score {}", p.score);
    // Both GPUs too loaded: the pod waits, and each GPU says why.
    let n = node("a", vec![gpu(0, Some(0.6)), gpu(1, Some(0.4))]);
    let ledger = ledger_for(&[&n], 0.0);
    let err = place_on_node(&n, &ledger, &demand(Some(0.7)), &cfg, NOW, 0).unwrap_err();
    let NodeRejection::NotEnoughGpus { rejections, .. } = &err else {
        panic!("{err}")
    };
    assert_eq!(rejections.len(), 2);
    assert!(
        rejections.iter().all(|r| r.code() == "activity-cap"),
        "{err}"
    );
    assert!(err.to_string().contains("would pass 1.00"), "{err}");
    // Every CARMA policy places it (the gate reads telemetry alone).
    let mut magm = demand(Some(0.7));
    magm.policy = Policy::Magm;
    assert!(place_on_node(&n, &ledger, &magm, &cfg, NOW, 0).is_ok());
    // A pod that has waited `pack_aging_ms` crowds the least loaded GPU.
    let mut aged = demand(Some(0.7));
    aged.waited_ms = cfg.pack_aging_ms;
    let p = place_on_node(&n, &ledger, &aged, &cfg, NOW, 0).unwrap();
    assert_eq!(p.indices, vec![1]);
    aged.waited_ms -= 1;
    assert!(place_on_node(&n, &ledger, &aged, &cfg, NOW, 0).is_err());
}

#[test]
fn a_higher_crowding_limit_lets_a_pod_crowd_further() {
    // 0.4 + 0.7 = 1.1: refused under a limit of 1.0, placed under 1.2, on the least loaded GPU;
    // 0.6 + 0.7 = 1.3 stays refused.
    let n = node("a", vec![gpu(0, Some(0.6)), gpu(1, Some(0.4))]);
    let ledger = ledger_for(&[&n], 0.0);
    assert!(place_on_node(&n, &ledger, &demand(Some(0.7)), &limit(1.0), NOW, 0).is_err());
    let cfg = limit(1.2);
    let p = place_on_node(&n, &ledger, &demand(Some(0.7)), &cfg, NOW, 0).unwrap();
    assert_eq!(p.indices, vec![1]);
    let busy = node("a", vec![gpu(0, Some(0.6))]);
    let ledger = ledger_for(&[&busy], 0.0);
    let err = place_on_node(&busy, &ledger, &demand(Some(0.7)), &cfg, NOW, 0).unwrap_err();
    assert!(err.to_string().contains("would pass 1.20"), "{err}");
}

#[test]
fn by_default_a_busy_gpu_is_crowded_up_to_1_3() {
    // 0.6 + 0.7 = 1.3 is the default limit itself; 0.75 + 0.7 = 1.45 is past it.
    let n = node("a", vec![gpu(0, Some(0.75)), gpu(1, Some(0.6))]);
    let ledger = ledger_for(&[&n], 0.0);
    let cfg = PlacementConfig::default();
    let p = place_on_node(&n, &ledger, &demand(Some(0.7)), &cfg, NOW, 0).unwrap();
    assert_eq!(p.indices, vec![1]);
    let busy = node("a", vec![gpu(0, Some(0.75))]);
    let ledger = ledger_for(&[&busy], 0.0);
    let err = place_on_node(&busy, &ledger, &demand(Some(0.7)), &cfg, NOW, 0).unwrap_err();
    assert!(err.to_string().contains("would pass 1.30"), "{err}");
}

/// The default configuration with `pack`'s crowding limit at `limit`.
fn limit(limit: f64) -> PlacementConfig {
    PlacementConfig {
        pack_crowding_limit: limit,
        ..PlacementConfig::default()
    }
}

#[test]
fn booked_activity_counts_while_telemetry_lags_behind() {
    // Telemetry still shows 0.1, but the pod there was booked at 0.6: 0.6 + 0.3 is over the cap.
    let n = node("a", vec![gpu(0, Some(0.1)), gpu(1, None)]);
    assert!(0.6 + 0.3 > PlacementConfig::default().sm_activity_cap);
    let cfg = PlacementConfig::default();
    let lagging = ledger_for(&[&n], 0.6);
    let p = place_on_node(&n, &lagging, &demand(Some(0.3)), &cfg, NOW, 0).unwrap();
    assert_eq!(p.indices, vec![1]);
    // Telemetry wins when it shows more than was booked.
    let under = ledger_for(&[&n], 0.0);
    let busy = node("a", vec![gpu(0, Some(0.7)), gpu(1, None)]);
    let p = place_on_node(&busy, &under, &demand(Some(0.3)), &cfg, NOW, 0).unwrap();
    assert_eq!(p.indices, vec![1]);
    // And with both low, it packs.
    let p = place_on_node(&n, &under, &demand(Some(0.3)), &cfg, NOW, 0).unwrap();
    assert_eq!(p.indices, vec![0]);
}

#[test]
fn a_node_with_a_complementary_gpu_outscores_an_idle_node() {
    let mut idle_node = node("idle", vec![gpu(0, None), gpu(1, None)]);
    for g in &mut idle_node.gpus {
        g.uuid = format!("GPU-idle-{}", g.index);
    }
    let busy_node = node("busy", vec![gpu(0, Some(0.3)), gpu(1, Some(0.9))]);
    let ledger = ledger_for(&[&idle_node, &busy_node], 0.0);
    let cfg = PlacementConfig::default();
    let d = demand(Some(0.2));
    let on_idle = place_on_node(&idle_node, &ledger, &d, &cfg, NOW, 0).unwrap();
    let on_busy = place_on_node(&busy_node, &ledger, &d, &cfg, NOW, 0).unwrap();
    assert_eq!(on_idle.score, IDLE_SCORE);
    assert_eq!(on_busy.indices, vec![0]);
    assert!(on_busy.score > on_idle.score);
}

#[test]
fn pods_that_must_not_share_and_recovery_first_keep_exclusive_first() {
    let n = node("a", vec![gpu(0, Some(0.2)), gpu(1, None)]);
    let ledger = ledger_for(&[&n], 0.0);
    let cfg = PlacementConfig::default();
    let mut exclusive = demand(Some(0.1));
    exclusive.exclusive = true;
    let p = place_on_node(&n, &ledger, &exclusive, &cfg, NOW, 0).unwrap();
    assert_eq!((p.indices, p.score, p.exclusive), (vec![1], 10, true));
    let mut idle_only = demand(Some(0.1));
    idle_only.idle_only = true;
    let p = place_on_node(&n, &ledger, &idle_only, &cfg, NOW, 0).unwrap();
    assert_eq!((p.indices, p.score), (vec![1], 10));
    let mut whole = demand(Some(0.1));
    whole.reservation = Reservation::Mib(A100);
    let p = place_on_node(&n, &ledger, &whole, &cfg, NOW, 0).unwrap();
    assert_eq!((p.indices, p.exclusive), (vec![1], true));
}

#[test]
fn idle_gpus_are_taken_when_telemetry_is_too_stale_to_share() {
    let mut n = node("a", vec![gpu(0, Some(0.2)), gpu(1, None)]);
    for g in &mut n.gpus {
        g.telemetry_at = Some(0);
    }
    let ledger = ledger_for(&[&n], 0.0);
    let p = place_on_node(
        &n,
        &ledger,
        &demand(Some(0.1)),
        &PlacementConfig::default(),
        NOW,
        0,
    )
    .unwrap();
    assert_eq!((p.indices, p.score), (vec![1], IDLE_SCORE));
}

#[test]
fn the_ledger_books_and_releases_expected_activity_without_drift() {
    let mut l = Ledger::new();
    for i in 0..300 {
        l.insert_unchecked(PlacementRecord {
            pod: format!("p{i}"),
            node: "a".into(),
            gpus: vec!["GPU-0".into()],
            reserved_mib: 1,
            exclusive: false,
            assigned_at: 0,
            visible: true,
            expected_sm_activity: 0.1 + f64::from(i % 7) * 0.013,
        });
    }
    assert!(l.expected_sm_activity("GPU-0") > 30.0);
    for i in 0..300 {
        l.release(&format!("p{i}"));
    }
    assert_eq!(l.expected_sm_activity("GPU-0"), 0.0);
}

#[test]
fn an_idle_gpu_whose_window_is_still_filling_beats_crowding_a_busy_one() {
    // GPU 1 is idle but its telemetry window has not filled (no activity figure): the gate cannot
    // judge sharing it, but it is idle, so pack takes it before crowding GPU 0 (0.6 + 0.3 > 0.8).
    let mut n = node("a", vec![gpu(0, Some(0.6)), gpu(1, None)]);
    n.gpus[1].sm_activity = None;
    let ledger = ledger_for(&[&n], 0.0);
    let p = place_on_node(
        &n,
        &ledger,
        &demand(Some(0.3)),
        &PlacementConfig::default(),
        NOW,
        0,
    )
    .unwrap();
    assert_eq!((p.indices, p.score), (vec![1], IDLE_SCORE));
}
