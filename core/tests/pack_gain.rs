//! `pack`'s options: idle GPUs first (`pack_idle_first`) and the throughput test of a slowdown
//! model (`pack_gain`). 40 GiB A100s, gate cap 0.80; each busy GPU runs one settled pod whose
//! booked activity equals its measured one.

use carma_core::config::{PackGain, SharingModel};
use carma_core::{
    Demand, Gpu, Ledger, Node, PlacementConfig, PlacementRecord, Policy, Reservation, place_on_node,
};

const A100: u64 = 40960;
const NOW: u64 = 1_000_000;

/// GPUs of one node, each running settled pods of the activities given (booked and measured,
/// 8000 MiB each); none: idle.
fn cluster(acts: &[&[f64]]) -> (Node, Ledger) {
    let mut gpus = Vec::new();
    let mut ledger = Ledger::new();
    for (i, pods) in acts.iter().enumerate() {
        let mut g = Gpu::idle(format!("GPU-{i}"), i as u32, A100);
        if !pods.is_empty() {
            let sum: f64 = pods.iter().sum();
            g.processes = pods.len() as u32;
            g.memory_free_mib = A100 - 8000 * pods.len() as u64;
            g.sm_activity = Some(sum);
            g.sm_occupancy = Some(sum * 0.5);
            g.dram_activity = Some(sum * 0.3);
        }
        for (k, a) in pods.iter().enumerate() {
            ledger.insert_unchecked(PlacementRecord {
                pod: format!("pod-{i}-{k}"),
                node: "a".into(),
                gpus: vec![g.uuid.clone()],
                reserved_mib: 8000,
                exclusive: false,
                assigned_at: 0,
                visible: true,
                expected_sm_activity: *a,
            });
        }
        gpus.push(g);
    }
    (
        Node {
            name: "a".into(),
            gpus,
        },
        ledger,
    )
}

fn demand(activity: f64) -> Demand {
    let mut d = Demand::new(1, Reservation::Mib(6000), Policy::Pack);
    d.expected_sm_activity = Some(activity);
    d
}

/// The GPUs `pack` picks for a pod of `activity` on the node with `cfg` (the pod must fit).
fn picks(n: &Node, ledger: &Ledger, activity: f64, cfg: &PlacementConfig) -> Vec<u32> {
    place_on_node(n, ledger, &demand(activity), cfg, NOW, 0)
        .unwrap()
        .indices
}

fn gain(min_gain: f64) -> PlacementConfig {
    PlacementConfig {
        pack_gain: Some(PackGain {
            min_gain,
            model: SharingModel::H100_TIME_SLICING,
        }),
        ..PlacementConfig::default()
    }
}

#[test]
fn idle_first_takes_the_idle_gpu_that_pack_keeps() {
    let (n, ledger) = cluster(&[&[0.5], &[]]);
    // By default 0.5 + 0.25 is complementary (under the 0.8 cap) and goes first.
    assert_eq!(
        picks(&n, &ledger, 0.25, &PlacementConfig::default()),
        vec![0]
    );
    let cfg = PlacementConfig {
        pack_idle_first: true,
        ..PlacementConfig::default()
    };
    let p = place_on_node(&n, &ledger, &demand(0.25), &cfg, NOW, 0).unwrap();
    assert_eq!((p.indices, p.score), (vec![1], 10));
    // Without an idle GPU it still shares the complementary one.
    let (n, ledger) = cluster(&[&[0.5], &[0.7]]);
    assert_eq!(picks(&n, &ledger, 0.25, &cfg), vec![0]);
}

#[test]
fn under_time_slicing_a_costly_pairing_ranks_after_an_idle_gpu() {
    // 0.25 beside 0.5 runs the 0.5 at 0.619: not free, so the idle GPU goes first.
    let (n, ledger) = cluster(&[&[0.5], &[]]);
    assert_eq!(picks(&n, &ledger, 0.25, &gain(0.5)), vec![1]);
    // Two light pods fit in the GPU's time: free, so packed to keep the idle GPU.
    let (n, ledger) = cluster(&[&[0.1], &[]]);
    assert_eq!(picks(&n, &ledger, 0.1, &gain(0.5)), vec![0]);
}

#[test]
fn without_an_idle_gpu_the_highest_gain_is_crowded_and_no_gain_below_the_least() {
    // A 0.25 pod beside two of 0.2 or one of 0.4: the same combined activity (0.65, under the
    // cap), so pack's default takes the GPU with less memory left (the two pods); the time-slicing
    // model predicts a gain of 0.31 there and 0.73 beside the single pod.
    let (n, ledger) = cluster(&[&[0.2, 0.2], &[0.4]]);
    assert_eq!(
        picks(&n, &ledger, 0.25, &PlacementConfig::default()),
        vec![0]
    );
    let g = |before: &[f64]| SharingModel::H100_TIME_SLICING.gain(before, 0.25);
    assert!(
        g(&[0.4]) > 0.7 && g(&[0.2, 0.2]) < 0.35,
        "{} {}",
        g(&[0.4]),
        g(&[0.2, 0.2])
    );
    let p = place_on_node(&n, &ledger, &demand(0.25), &gain(0.2), NOW, 0).unwrap();
    assert_eq!(p.indices, vec![1]);
    assert!(p.score <= 5, "{}", p.score);
    // With a least gain of 0.5 the two-pod GPU is refused.
    let (n, ledger) = cluster(&[&[0.2, 0.2]]);
    assert!(place_on_node(&n, &ledger, &demand(0.25), &gain(0.5), NOW, 0).is_err());
    // Two saturating pods lose throughput together: refused whatever the least gain, until aged.
    let (n, ledger) = cluster(&[&[0.75]]);
    assert!(SharingModel::H100_TIME_SLICING.gain(&[0.75], 0.75) < 0.0);
    let err = place_on_node(&n, &ledger, &demand(0.75), &gain(0.0), NOW, 0).unwrap_err();
    assert!(err.to_string().contains("activity"), "{err}");
    let mut aged = demand(0.75);
    aged.waited_ms = PlacementConfig::default().pack_aging_ms;
    assert!(place_on_node(&n, &ledger, &aged, &gain(0.0), NOW, 0).is_ok());
    // pack's default crowds to 1.3 and would refuse 0.75 + 0.75 too, but takes 0.5 + 0.7 = 1.2,
    // a gain below 0.5 under time-slicing.
    let (n, ledger) = cluster(&[&[0.5]]);
    assert!(
        place_on_node(
            &n,
            &ledger,
            &demand(0.7),
            &PlacementConfig::default(),
            NOW,
            0
        )
        .is_ok()
    );
    assert!(SharingModel::H100_TIME_SLICING.gain(&[0.5], 0.7) < 0.5);
    assert!(place_on_node(&n, &ledger, &demand(0.7), &gain(0.5), NOW, 0).is_err());
}
