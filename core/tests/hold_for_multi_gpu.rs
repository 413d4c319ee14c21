//! `pack`'s room for a starving multi-GPU pod: once a pod needing several GPUs has waited long
//! enough, the GPUs it could use next are kept from every other pod until it is placed.

use carma_core::placement::hold::{hold_for, starving, without_held};
use carma_core::{Demand, Gpu, Ledger, Node, PlacementRecord, Policy, Reservation, place_on_node};

const A100: u64 = 40960;
const NOW: u64 = 10_000_000;
const HOUR_MS: u64 = 3_600_000;

/// A node of four A100s; GPUs in `busy` run one settled pod filling the GPU.
fn node_and_ledger(busy: &[u32]) -> (Node, Ledger) {
    let mut ledger = Ledger::new();
    let gpus = (0..4)
        .map(|i| {
            let mut g = Gpu::idle(format!("GPU-{i}"), i, A100);
            if busy.contains(&i) {
                g.processes = 1;
                g.memory_free_mib = 1000;
                g.sm_activity = Some(0.9);
                g.sm_occupancy = Some(0.5);
                g.dram_activity = Some(0.3);
                ledger.insert_unchecked(PlacementRecord {
                    pod: format!("running-{i}"),
                    node: "n0".into(),
                    gpus: vec![g.uuid.clone()],
                    reserved_mib: 39000,
                    exclusive: false,
                    assigned_at: 0,
                    visible: true,
                    expected_sm_activity: 0.9,
                });
            }
            g
        })
        .collect();
    (
        Node {
            name: "n0".into(),
            gpus,
        },
        ledger,
    )
}

fn small() -> Demand {
    let mut d = Demand::new(1, Reservation::Mib(6000), Policy::Pack);
    d.expected_sm_activity = Some(0.5);
    d
}

#[test]
fn a_small_pod_is_refused_the_gpus_a_long_waiting_two_gpu_pod_needs() {
    // GPUs 0 and 1 run full pods; 2 and 3 are idle. A 2-GPU pod has waited 2 h; the hold is 1 h.
    let (node, ledger) = node_and_ledger(&[0, 1]);
    let nodes = [node];
    // Queue: a 1-GPU pod that waited longer, the 2-GPU pod, another 2-GPU pod waiting less.
    let waiting = [(1, 5 * HOUR_MS), (2, 2 * HOUR_MS), (2, HOUR_MS / 2)];
    let holder = starving(waiting, HOUR_MS).expect("the 2-GPU pod has waited past the hold");
    assert_eq!(holder, 1);
    let hold = hold_for(&nodes, &ledger, 2).expect("the node has 4 GPUs");
    assert_eq!(hold.node, 0);
    assert_eq!(hold.gpus, ["GPU-2", "GPU-3"], "the idle GPUs are kept");

    // Without the hold the small pod takes an idle GPU (the busy ones are full) ...
    let free = place_on_node(&nodes[0], &ledger, &small(), &Default::default(), NOW, 0)
        .expect("an idle GPU is free");
    assert!(free.gpus.iter().any(|g| hold.gpus.contains(g)));
    // ... with it, it is refused both of them, and the 2-GPU pod still gets them.
    let view = without_held(&nodes[0], &hold);
    assert!(place_on_node(&view, &ledger, &small(), &Default::default(), NOW, 0).is_err());
    let two = Demand::new(2, Reservation::Mib(20000), Policy::Pack);
    let placed = place_on_node(&nodes[0], &ledger, &two, &Default::default(), NOW, 0)
        .expect("the held GPUs fit the 2-GPU pod");
    assert_eq!(placed.gpus, ["GPU-2", "GPU-3"]);
}

#[test]
fn no_hold_before_the_wait_or_for_single_gpu_pods() {
    assert_eq!(
        starving([(2, HOUR_MS - 1), (1, 9 * HOUR_MS)], HOUR_MS),
        None
    );
    assert_eq!(starving([(2, HOUR_MS), (4, 3 * HOUR_MS)], HOUR_MS), Some(1));
}

#[test]
fn the_hold_keeps_the_idle_gpus_of_the_node_closest_to_free() {
    // One idle GPU (3): it alone is kept; the busy ones go on taking pods that share them.
    let (node, ledger) = node_and_ledger(&[0, 1, 2]);
    let hold = hold_for(std::slice::from_ref(&node), &ledger, 2).unwrap();
    assert_eq!(hold.gpus, ["GPU-3"]);
    let view = without_held(&node, &hold);
    assert_eq!(view.gpus.len(), 3);
    // No idle GPU: nothing is kept.
    let (full, full_ledger) = node_and_ledger(&[0, 1, 2, 3]);
    assert_eq!(hold_for(&[full], &full_ledger, 2), None);
    // A node with more idle GPUs is chosen over the first.
    let (other, other_ledger) = node_and_ledger(&[0]);
    let mut both = other_ledger;
    for r in ledger.records() {
        both.insert_unchecked(PlacementRecord {
            pod: format!("{}-a", r.pod),
            gpus: r.gpus.iter().map(|g| format!("{g}-a")).collect(),
            node: "a".into(),
            ..r.clone()
        });
    }
    let renamed = Node {
        name: "a".into(),
        gpus: node
            .gpus
            .iter()
            .map(|g| Gpu {
                uuid: format!("{}-a", g.uuid),
                ..g.clone()
            })
            .collect(),
    };
    let hold = hold_for(&[renamed, other], &both, 2).unwrap();
    assert_eq!(hold.node, 1);
    assert_eq!(hold.gpus, ["GPU-1", "GPU-2"]);
    // Too few GPUs anywhere: no hold.
    assert_eq!(hold_for(&[node], &ledger, 5), None);
}
