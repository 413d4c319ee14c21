//! Property tests: placements never over-commit a GPU, and the in-flight ledger
//! never double-books under any interleaving of assume / confirm / expire / release.

use std::collections::BTreeMap;

use carma_core::{
    Demand, Gpu, Ledger, LedgerError, Node, PlacementConfig, PlacementRecord, Policy, Reservation,
    place_on_node,
};
use proptest::prelude::*;

const GPUS: u32 = 4;
const TOTAL: u64 = 40960;

#[derive(Debug, Clone)]
enum Op {
    Place {
        mib: u64,
        gpus: u32,
        policy: Policy,
        exclusive: bool,
    },
    Confirm(usize),
    Release(usize),
    Advance(u64),
}

fn op() -> impl Strategy<Value = Op> {
    let policy = prop::sample::select(vec![
        Policy::Exclusive,
        Policy::Ff,
        Policy::Bf,
        Policy::Magm,
        Policy::Lug,
    ]);
    prop_oneof![
        4 => (500u64..30_000, 1u32..=2, policy, prop::bool::weighted(0.1))
            .prop_map(|(mib, gpus, policy, exclusive)| Op::Place { mib, gpus, policy, exclusive }),
        2 => (0usize..64).prop_map(Op::Confirm),
        2 => (0usize..64).prop_map(Op::Release),
        2 => (0u64..40_000).prop_map(Op::Advance),
    ]
}

/// Telemetry consistent with the ledger: visible pods use what they reserved;
/// activity is low so the gate never hides a memory bug.
fn node_view(ledger: &Ledger, used_outside: &BTreeMap<u32, u64>) -> Node {
    let gpus = (0..GPUS)
        .map(|i| {
            let uuid = format!("GPU-{i}");
            let visible: u64 = ledger
                .on_gpu(&uuid)
                .iter()
                .filter(|r| r.visible)
                .map(|r| r.reserved_mib)
                .sum();
            let outside = used_outside.get(&i).copied().unwrap_or(0);
            let mut g = Gpu::idle(uuid, i, TOTAL);
            g.memory_free_mib = TOTAL.saturating_sub(visible + outside);
            g.processes = ledger.pods_on(&g.uuid) as u32;
            g.sm_activity = Some(0.3);
            g
        })
        .collect();
    Node {
        name: "n".into(),
        gpus,
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    /// Whatever sequence of placements, confirmations, releases and time steps,
    /// every placement `place_on_node` proposes is accepted by the ledger's
    /// capacity check, and no GPU's reservations ever exceed its memory.
    #[test]
    fn placements_never_over_commit(ops in prop::collection::vec(op(), 1..80), outside in prop::collection::btree_map(0u32..GPUS, 0u64..8000, 0..2)) {
        let cfg = PlacementConfig::default();
        let mut ledger = Ledger::new();
        let mut now = 0u64;
        let mut next = 0usize;
        for op in ops {
            match op {
                Op::Place { mib, gpus, policy, exclusive } => {
                    let mut demand = Demand::new(gpus, Reservation::Mib(mib), policy);
                    demand.exclusive = exclusive;
                    let node = node_view(&ledger, &outside);
                    if let Ok(p) = place_on_node(&node, &ledger, &demand, &cfg, now, next) {
                        let record = PlacementRecord {
                            pod: format!("p{next}"),
                            node: "n".into(),
                            gpus: p.gpus.clone(),
                            reserved_mib: p.reserved_mib,
                            exclusive: p.exclusive,
                            assigned_at: now,
                            visible: false,
                            expected_sm_activity: 0.0,
                        };
                        let booked = ledger.assume(record, |_| Some(TOTAL), cfg.warmup_ms, now);
                        prop_assert!(booked.is_ok(), "core proposed a placement the ledger refuses: {booked:?} for {p:?}");
                    }
                    next += 1;
                }
                Op::Confirm(i) => { ledger.confirm(&format!("p{i}")); }
                Op::Release(i) => { ledger.release(&format!("p{i}")); }
                Op::Advance(ms) => now += ms,
            }
            for g in 0..GPUS {
                let uuid = format!("GPU-{g}");
                prop_assert!(ledger.reserved_mib(&uuid) <= TOTAL, "GPU {g} over-committed: {}", ledger.reserved_mib(&uuid));
                let holders = ledger.on_gpu(&uuid);
                if holders.iter().any(|r| r.exclusive) {
                    prop_assert_eq!(holders.len(), 1, "exclusive GPU {} shared", g);
                }
            }
        }
    }
}

#[derive(Debug, Clone)]
enum LedgerOp {
    Assume {
        pod: usize,
        gpus: Vec<u32>,
        mib: u64,
        exclusive: bool,
    },
    Confirm(usize),
    Release(usize),
    Advance(u64),
}

fn ledger_op() -> impl Strategy<Value = LedgerOp> {
    prop_oneof![
        4 => (0usize..16, prop::collection::btree_set(0u32..GPUS, 1..=2), 1u64..45_000, prop::bool::weighted(0.15))
            .prop_map(|(pod, gpus, mib, exclusive)| LedgerOp::Assume { pod, gpus: gpus.into_iter().collect(), mib, exclusive }),
        2 => (0usize..16).prop_map(LedgerOp::Confirm),
        2 => (0usize..16).prop_map(LedgerOp::Release),
        2 => (0u64..40_000).prop_map(LedgerOp::Advance),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    /// The ledger against a plain reference model: same bookings, never more than
    /// capacity, never two holders on an exclusive GPU, never a second booking
    /// during a warm-up lock, and a refused booking changes nothing.
    #[test]
    fn ledger_never_double_books(ops in prop::collection::vec(ledger_op(), 1..120)) {
        let warmup = 30_000;
        let mut ledger = Ledger::new();
        let mut model: BTreeMap<String, PlacementRecord> = BTreeMap::new();
        let mut now = 0u64;
        for op in ops {
            match op {
                LedgerOp::Assume { pod, gpus, mib, exclusive } => {
                    let record = PlacementRecord {
                        pod: format!("p{pod}"),
                        node: "n".into(),
                        gpus: gpus.iter().map(|g| format!("GPU-{g}")).collect(),
                        reserved_mib: mib,
                        exclusive,
                        assigned_at: now,
                        visible: false,
                        expected_sm_activity: 0.0,
                    };
                    // what the reference model says
                    let on = |g: &String| model.values().filter(|r| r.gpus.contains(g)).collect::<Vec<_>>();
                    let allowed = !model.contains_key(&record.pod)
                        && record.gpus.iter().all(|g| {
                            let holders = on(g);
                            let booked: u64 = holders.iter().map(|r| r.reserved_mib).sum();
                            let held_exclusively = holders.iter().any(|r| r.exclusive);
                            let would_share_exclusive = exclusive && !holders.is_empty();
                            let warming = holders.iter().any(|r| !r.visible && now < r.assigned_at + warmup);
                            let fits = booked + mib <= TOTAL;
                            fits && !(held_exclusively || would_share_exclusive || warming)
                        });
                    let before: Vec<PlacementRecord> = ledger.records().cloned().collect();
                    let result = ledger.assume(record.clone(), |_| Some(TOTAL), warmup, now);
                    prop_assert_eq!(result.is_ok(), allowed, "ledger and model disagree: {:?}", result);
                    if result.is_ok() {
                        model.insert(record.pod.clone(), record);
                    } else {
                        let after: Vec<PlacementRecord> = ledger.records().cloned().collect();
                        prop_assert_eq!(before, after, "a refused booking changed the ledger");
                        prop_assert!(!matches!(result, Err(LedgerError::NoGpu(_))));
                    }
                }
                LedgerOp::Confirm(i) => {
                    let pod = format!("p{i}");
                    prop_assert_eq!(ledger.confirm(&pod), model.contains_key(&pod));
                    if let Some(r) = model.get_mut(&pod) { r.visible = true; }
                }
                LedgerOp::Release(i) => {
                    let pod = format!("p{i}");
                    prop_assert_eq!(ledger.release(&pod).is_some(), model.remove(&pod).is_some());
                }
                LedgerOp::Advance(ms) => now += ms,
            }
            for g in 0..GPUS {
                let uuid = format!("GPU-{g}");
                let want: u64 = model.values().filter(|r| r.gpus.contains(&uuid)).map(|r| r.reserved_mib).sum();
                let in_flight: u64 = model.values().filter(|r| r.gpus.contains(&uuid) && !r.visible).map(|r| r.reserved_mib).sum();
                prop_assert_eq!(ledger.reserved_mib(&uuid), want);
                prop_assert_eq!(ledger.in_flight_mib(&uuid), in_flight);
                prop_assert!(want <= TOTAL);
            }
            prop_assert_eq!(ledger.len(), model.len());
        }
    }
}
