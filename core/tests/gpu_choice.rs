//! `GpuChoice::DeviceOrder`: what a DRA allocator gives a pod inside the node the policy chose —
//! the first GPUs in device order that pass the same rules, idle or not — against the policy's own
//! choice. 40 GiB GPUs, CARMA's thresholds.

use carma_core::{
    Demand, Gpu, GpuChoice, Ledger, Node, PlacementConfig, PlacementRecord, Policy, Reservation,
    place_on_node,
};

const A100: u64 = 40960;
const NOW: u64 = 1_000_000;

/// A GPU with `used` MiB of one settled pod and light activity; idle when `used` is 0.
fn gpu(index: u32, used: u64) -> Gpu {
    let mut g = Gpu::idle(format!("GPU-{index}"), index, A100);
    if used > 0 {
        g.processes = 1;
        g.memory_free_mib = A100 - used;
        g.sm_activity = Some(0.2);
        g.sm_occupancy = Some(0.1);
        g.dram_activity = Some(0.1);
    }
    g
}

fn setup(used: &[u64]) -> (Node, Ledger) {
    let node = Node {
        name: "a".into(),
        gpus: used
            .iter()
            .enumerate()
            .map(|(i, &u)| gpu(i as u32, u))
            .collect(),
    };
    let mut ledger = Ledger::new();
    for g in node.gpus.iter().filter(|g| g.processes > 0) {
        ledger.insert_unchecked(PlacementRecord {
            pod: format!("on-{}", g.uuid),
            node: "a".into(),
            gpus: vec![g.uuid.clone()],
            reserved_mib: A100 - g.memory_free_mib,
            exclusive: false,
            assigned_at: 0,
            visible: true,
            expected_sm_activity: 0.2,
        });
    }
    (node, ledger)
}

fn cfg(choice: GpuChoice) -> PlacementConfig {
    PlacementConfig {
        gpu_choice: choice,
        ..PlacementConfig::default()
    }
}

#[test]
fn device_order_shares_the_first_passing_gpu_where_the_policy_takes_an_idle_one() {
    let (node, ledger) = setup(&[8000, 0, 0]);
    let d = Demand::new(1, Reservation::Mib(6000), Policy::Magm);
    let policy = place_on_node(&node, &ledger, &d, &cfg(GpuChoice::Policy), NOW, 0).unwrap();
    let dra = place_on_node(&node, &ledger, &d, &cfg(GpuChoice::DeviceOrder), NOW, 0).unwrap();
    assert_eq!(
        (policy.indices.as_slice(), policy.exclusive),
        ([1].as_slice(), false)
    );
    assert_eq!(
        dra.indices,
        vec![0],
        "the busy GPU 0 passes and comes first"
    );
    // The node keeps the policy's score: the extender still ranks nodes.
    assert_eq!(dra.score, policy.score);
    assert_eq!(dra.reserved_mib, 6000);
}

#[test]
fn device_order_ignores_the_policys_order_among_busy_gpus() {
    // Best fit prefers the fuller GPU 1; device order takes GPU 0.
    let (node, ledger) = setup(&[4000, 20000]);
    let d = Demand::new(1, Reservation::Mib(6000), Policy::Bf);
    let policy = place_on_node(&node, &ledger, &d, &cfg(GpuChoice::Policy), NOW, 0).unwrap();
    let dra = place_on_node(&node, &ledger, &d, &cfg(GpuChoice::DeviceOrder), NOW, 0).unwrap();
    assert_eq!(policy.indices, vec![1]);
    assert_eq!(dra.indices, vec![0]);
    assert_eq!(dra.score, policy.score);
}

#[test]
fn device_order_keeps_the_rules_and_whole_gpus_stay_on_idle_ones() {
    // GPU 0 has too little memory left: both choices skip it.
    let (node, ledger) = setup(&[38000, 8000, 0]);
    let d = Demand::new(1, Reservation::Mib(6000), Policy::Ff);
    let dra = place_on_node(&node, &ledger, &d, &cfg(GpuChoice::DeviceOrder), NOW, 0).unwrap();
    assert_eq!(dra.indices, vec![1]);
    // A pod without an estimate takes a whole GPU: the first idle one, as both would.
    let whole = Demand::new(1, Reservation::WholeGpu, Policy::Ff);
    let dra = place_on_node(&node, &ledger, &whole, &cfg(GpuChoice::DeviceOrder), NOW, 0).unwrap();
    assert_eq!((dra.indices, dra.exclusive), (vec![2], true));
}

#[test]
fn without_the_telemetry_memory_test_only_booked_capacity_counts() {
    // GPU 0: 8000 MiB booked, but telemetry shows 36000 MiB in use (a pod over its reservation).
    let (mut node, ledger) = setup(&[8000]);
    node.gpus[0].memory_free_mib = A100 - 36000;
    let d = Demand::new(1, Reservation::Mib(6000), Policy::Ff);
    assert!(place_on_node(&node, &ledger, &d, &cfg(GpuChoice::Policy), NOW, 0).is_err());
    let booked_only = PlacementConfig {
        telemetry_memory_test: false,
        ..cfg(GpuChoice::DeviceOrder)
    };
    let p = place_on_node(&node, &ledger, &d, &booked_only, NOW, 0).unwrap();
    assert_eq!(p.indices, vec![0]);
    // Booked capacity still binds: 36000 more MiB do not fit beside the 8000 booked.
    let big = Demand::new(1, Reservation::Mib(36000), Policy::Ff);
    assert!(place_on_node(&node, &ledger, &big, &booked_only, NOW, 0).is_err());
}
