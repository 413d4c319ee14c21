//! `quick_score` (the allocation-free answer from per-GPU summaries) gives exactly
//! `place_on_node`'s score on every node it can place, and no score where it cannot, for every
//! policy, on random GPUs, ledgers, telemetry and times.

use carma_core::placement::{quick_score, summarize};
use carma_core::{
    Demand, GateRule, Gpu, Ledger, Node, PlacementConfig, PlacementRecord, Policy, Reservation,
    place_on_node,
};
use proptest::prelude::*;

#[derive(Debug, Clone)]
struct GpuSpec {
    free: u64,
    processes: u32,
    healthy: bool,
    smact: Option<f64>,
    max_pods: Option<u32>,
    telemetry_at: Option<u64>,
    no_activity: bool,
}

fn gpu_spec() -> impl Strategy<Value = GpuSpec> {
    (
        0u64..=40_960,
        prop::sample::select(vec![0u32, 0, 1, 3]),
        prop::bool::weighted(0.9),
        prop::option::weighted(0.9, 0.0f64..1.0),
        prop::option::weighted(0.3, 1u32..4),
        prop::option::weighted(0.5, 0u64..200_000),
        prop::bool::weighted(0.1),
    )
        .prop_map(
            |(free, processes, healthy, smact, max_pods, telemetry_at, no_activity)| GpuSpec {
                free,
                processes,
                healthy,
                smact,
                max_pods,
                telemetry_at,
                no_activity,
            },
        )
}

#[derive(Debug, Clone)]
struct Booking {
    gpus: Vec<u32>,
    mib: u64,
    exclusive: bool,
    at: u64,
    visible: bool,
    activity: f64,
}

fn booking() -> impl Strategy<Value = Booking> {
    (
        prop::collection::btree_set(0u32..6, 1..3),
        0u64..30_000,
        prop::bool::weighted(0.1),
        0u64..200_000,
        any::<bool>(),
        0u32..=1000,
    )
        .prop_map(|(gpus, mib, exclusive, at, visible, milli)| Booking {
            gpus: gpus.into_iter().collect(),
            mib,
            exclusive,
            at,
            visible,
            activity: f64::from(milli) / 1000.0,
        })
}

fn demand() -> impl Strategy<Value = Demand> {
    let policy = prop::sample::select(Policy::ALL.to_vec());
    let reservation = prop_oneof![
        6 => (0u64..50_000).prop_map(Reservation::Mib),
        1 => Just(Reservation::WholeGpu),
        1 => Just(Reservation::Unknown),
    ];
    (
        1u32..4,
        reservation,
        policy,
        prop::bool::weighted(0.1),
        prop::bool::weighted(0.1),
        prop::option::of(0u32..=1000),
        prop::bool::weighted(0.2),
    )
        .prop_map(
            |(gpus, reservation, policy, exclusive, idle_only, milli, aged)| {
                let mut d = Demand::new(gpus, reservation, policy);
                d.exclusive = exclusive;
                d.idle_only = idle_only;
                d.expected_sm_activity = milli.map(|m| f64::from(m) / 1000.0);
                if aged {
                    d.waited_ms = PlacementConfig::default().pack_aging_ms;
                }
                d
            },
        )
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(2_000))]

    #[test]
    fn quick_score_is_place_on_nodes_score(
        specs in prop::collection::vec(gpu_spec(), 1..7),
        bookings in prop::collection::vec(booking(), 0..6),
        d in demand(),
        now in 0u64..300_000,
        rr_cursor in 0usize..8,
        honor in any::<bool>(),
        max_age in prop::option::of(10_000u64..100_000),
    ) {
        let cfg = PlacementConfig {
            honor_reservations: honor,
            max_telemetry_age_ms: max_age,
            ..PlacementConfig::default()
        };
        // Indices out of order, so that "index order" is tested as well.
        let n = specs.len() as u32;
        let gpus: Vec<Gpu> = specs
            .iter()
            .enumerate()
            .map(|(i, s)| {
                let index = (i as u32 * 5 + 3) % n;
                let mut g = Gpu::idle(format!("GPU-{index}"), index, 40_960);
                g.memory_free_mib = s.free;
                g.processes = s.processes;
                g.healthy = s.healthy;
                g.sm_activity = s.smact;
                g.sm_occupancy = s.smact;
                g.dram_activity = s.smact;
                g.max_pods = s.max_pods;
                g.telemetry_at = s.telemetry_at;
                if s.no_activity {
                    g.gate_rule = GateRule::NoActivity;
                }
                g
            })
            .collect();
        let mut ledger = Ledger::new();
        for (k, b) in bookings.iter().enumerate() {
            let record = PlacementRecord {
                pod: format!("p{k}"),
                node: "n".into(),
                gpus: b.gpus.iter().filter(|i| **i < n).map(|i| format!("GPU-{i}")).collect(),
                reserved_mib: b.mib,
                exclusive: b.exclusive,
                assigned_at: b.at,
                visible: b.visible,
                expected_sm_activity: b.activity,
            };
            if record.gpus.is_empty() {
                continue;
            }
            // Unchecked bookings too: round robin books without the capacity check.
            let _ = ledger.assume(record, |_| None, 0, b.at);
        }
        let node = Node { name: "n".into(), gpus };
        let placed = place_on_node(&node, &ledger, &d, &cfg, now, rr_cursor);
        let quick = quick_score(&summarize(&node.gpus, &ledger, &cfg), &d, &cfg, now, rr_cursor);
        prop_assert_eq!(quick, placed.as_ref().ok().map(|p| p.score), "{:?}", placed);
    }
}
