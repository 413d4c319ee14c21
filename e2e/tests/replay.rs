//! The simulator's figures describe what a cluster would do only if the simulator decides as the
//! extender does. This test replays random pod sequences on random clusters through both — the
//! simulator's node choice (`carma_simulator::engine::choose`) on core's view, and the extender's
//! filter → prioritize → (kube-scheduler: highest score, first on ties) → bind — and asserts the
//! same node and the same GPUs for every pod.

use carma_api::names::{
    ANNOTATION_EXCLUSIVE, ANNOTATION_GPU_MEMORY, ANNOTATION_POLICY, ANNOTATION_SM_ACTIVITY,
};
use carma_core::{Demand, Ledger, PlacementConfig, PlacementRecord, Policy, Reservation};
use carma_scheduler_extender::Snapshot;
use carma_scheduler_extender::snapshot_extender;
use carma_scheduler_extender::synthetic::{self, gpu, gpu_node, pod_json};
use carma_simulator::engine::choose::choose_node;
use serde_json::{Value, json};

/// A tiny deterministic generator (no extra dependency).
struct Lcg(u64);

impl Lcg {
    fn next(&mut self, n: u64) -> u64 {
        self.0 = self
            .0
            .wrapping_mul(6_364_136_223_846_793_005)
            .wrapping_add(1_442_695_040_888_963_407);
        (self.0 >> 33) % n.max(1)
    }
}

const POLICIES: [Policy; 6] = [
    Policy::Ff,
    Policy::Bf,
    Policy::Magm,
    Policy::Lug,
    Policy::Rr,
    Policy::Pack,
];

fn cluster(rng: &mut Lcg) -> Snapshot {
    let mut s = Snapshot::default();
    let nodes = 2 + rng.next(4) as usize;
    for i in 0..nodes {
        let name = synthetic::node_name(i);
        let count = 1 + rng.next(4) as usize;
        s.nodes
            .push(serde_json::from_value(synthetic::node_json(&name, count)).unwrap());
        let gpus = (0..count)
            .map(|j| {
                let busy = rng.next(3) > 0;
                let free = if busy {
                    2_000 + rng.next(38_000)
                } else {
                    synthetic::GPU_MIB
                };
                let sm = if busy {
                    rng.next(100) as f64 / 100.0
                } else {
                    0.0
                };
                gpu(
                    &synthetic::gpu_uuid(i, j),
                    j as u32,
                    free,
                    sm,
                    u32::from(busy),
                )
            })
            .collect();
        s.gpu_nodes.push(gpu_node(&name, gpus));
    }
    s
}

fn call<T: serde::Serialize>(answer: T) -> Value {
    serde_json::to_value(answer).unwrap()
}

#[tokio::test]
async fn the_simulator_decides_as_the_extender_does() {
    let mut rng = Lcg(0x5eed);
    let mut compared = 0;
    for round in 0..80 {
        let snap = cluster(&mut rng);
        let policy = POLICIES[rng.next(POLICIES.len() as u64) as usize];
        // Warm-up locks run on the extender's wall clock and the simulator's virtual one: off here,
        // they have their own tests on both sides.
        let cfg = PlacementConfig {
            warmup_ms: 0,
            ..PlacementConfig::default()
        };
        let ext = snapshot_extender(&snap, policy, cfg.clone(), Default::default()).unwrap();
        let names: Vec<String> = snap
            .nodes
            .iter()
            .map(|n| n.metadata.name.clone().unwrap())
            .collect();
        let nodes: Vec<carma_core::Node> = snap.gpu_nodes.iter().map(|g| g.to_core()).collect();
        let mut ledger = Ledger::new();
        let mut cursors = vec![0usize; nodes.len()];
        for k in 0..12 {
            let gpus = 1 + u32::from(rng.next(4) == 0);
            let mib = 1_000 + rng.next(30_000);
            let exclusive = rng.next(8) == 0;
            // Expected SM activity (what `pack` places by); a quarter of the pods leave it unknown.
            let activity = (rng.next(4) > 0).then(|| rng.next(1001) as f64 / 1000.0);
            let uid = format!("uid-{round}-{k}");
            let mut ann = vec![
                (ANNOTATION_GPU_MEMORY, format!("{mib}Mi")),
                (ANNOTATION_POLICY, policy.as_str().to_string()),
            ];
            if let Some(a) = activity {
                ann.push((ANNOTATION_SM_ACTIVITY, a.to_string()));
            }
            if exclusive {
                ann.push((ANNOTATION_EXCLUSIVE, "true".to_string()));
            }
            let ann: Vec<(&str, &str)> = ann.iter().map(|(k, v)| (*k, v.as_str())).collect();
            let mut pod = pod_json("ml", &format!("p-{round}-{k}"), &uid, gpus, &ann);
            // `pack` lets a pod that has waited `pack_aging_ms` since its creation crowd a GPU:
            // half the pods were created just now, half long ago (the synthetic pod's time).
            let aged = rng.next(2) == 0;
            if !aged {
                pod["metadata"]["creationTimestamp"] = json!(chrono::Utc::now().to_rfc3339());
            }

            // The extender, driven as kube-scheduler drives it.
            let args = serde_json::to_vec(&json!({"Pod": pod, "Nodes": null, "NodeNames": names}))
                .unwrap();
            let filter = call(ext.filter(&serde_json::from_slice(&args).unwrap()));
            let passed: Vec<String> = filter["NodeNames"]
                .as_array()
                .map(|a| a.iter().map(|n| n.as_str().unwrap().to_string()).collect())
                .unwrap_or_default();
            let mut by_extender: Option<(String, Vec<String>)> = None;
            if !passed.is_empty() {
                let args =
                    serde_json::to_vec(&json!({"Pod": pod, "Nodes": null, "NodeNames": passed}))
                        .unwrap();
                let scores = call(ext.prioritize(&serde_json::from_slice(&args).unwrap()));
                let mut best: Option<(&str, i64)> = None;
                for h in scores.as_array().unwrap() {
                    let (host, score) = (h["Host"].as_str().unwrap(), h["Score"].as_i64().unwrap());
                    if best.is_none_or(|(_, b)| score > b) {
                        best = Some((host, score));
                    }
                }
                let node = best.unwrap().0.to_string();
                let body = json!({"PodName": pod["metadata"]["name"], "PodNamespace": "ml",
                                  "PodUID": uid, "Node": node});
                let body = serde_json::to_vec(&body).unwrap();
                let bind = call(ext.bind(&serde_json::from_slice(&body).unwrap()).await);
                assert_eq!(bind["Error"], "", "round {round} pod {k}: {bind}");
                let gpus: Vec<String> = bind["Decision"]["GPUs"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .map(|g| g.as_str().unwrap().to_string())
                    .collect();
                by_extender = Some((node, gpus));
            }

            // The simulator's decision on the same state.
            let demand = Demand {
                exclusive,
                expected_sm_activity: activity,
                waited_ms: if aged { cfg.pack_aging_ms } else { 0 },
                ..Demand::new(gpus, Reservation::Mib(mib), policy)
            };
            let by_simulator =
                choose_node(&nodes, &ledger, &demand, &cfg, 0, &cursors).map(|(i, p)| {
                    if let Some(next) = p.next_rr_cursor() {
                        cursors[i] = next;
                    }
                    ledger.insert_unchecked(PlacementRecord {
                        pod: uid.clone(),
                        node: p.node.clone(),
                        gpus: p.gpus.clone(),
                        reserved_mib: p.reserved_mib,
                        exclusive: p.exclusive,
                        assigned_at: 0,
                        visible: false,
                        expected_sm_activity: p.expected_sm_activity,
                    });
                    (p.node, p.gpus)
                });
            assert_eq!(
                by_extender, by_simulator,
                "round {round} pod {k}: {policy}, {gpus} GPU(s) × {mib} MiB, exclusive {exclusive}"
            );
            compared += 1;
        }
    }
    assert_eq!(compared, 960);
}
