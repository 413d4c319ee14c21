//! After a restart the ledger is rebuilt from the pods' assignment annotations,
//! so nothing is double-booked.

mod common;

use std::collections::HashMap;
use std::sync::Arc;

use carma_api::names::{ANNOTATION_GPU_MEMORY, ANNOTATION_SM_ACTIVITY};
use carma_core::{PlacementConfig, Policy};
use carma_scheduler_extender::snapshot::Snapshot;
use carma_scheduler_extender::synthetic::pod_json;
use carma_scheduler_extender::{ClusterState, router};
use common::*;
use k8s_openapi::api::core::v1::Pod;

const A: &str = "gpu-node-a";
const B: &str = "gpu-node-b";

/// The pods as the API server holds them after the recorded binds.
fn bound_pods(rec: &Recorder, pending: &[Pod]) -> Vec<Pod> {
    rec.binds
        .lock()
        .iter()
        .map(|(target, ann)| {
            let mut pod = pending
                .iter()
                .find(|p| p.metadata.name.as_deref() == Some(target.name.as_str()))
                .unwrap()
                .clone();
            pod.metadata
                .annotations
                .get_or_insert_with(Default::default)
                .extend(ann.clone().unwrap());
            pod.spec.as_mut().unwrap().node_name = Some(target.node.clone());
            pod
        })
        .collect()
}

fn reserved_per_gpu(ledger: &carma_core::Ledger) -> HashMap<String, u64> {
    let mut m = HashMap::new();
    for r in ledger.records() {
        for g in &r.gpus {
            *m.entry(g.clone()).or_default() += r.reserved_mib;
        }
    }
    m
}

#[tokio::test]
async fn ledger_is_rebuilt_from_annotations_and_nothing_is_double_booked() {
    // Before the restart: bind three pods (on idle GPUs and by collocation).
    let (ext, rec) = fixture_extender();
    let r = router(ext.clone());
    // p3 says its expected SM activity; p1 and p2 leave it unknown (booked as 1).
    let pending: Vec<Pod> = [("p1", None), ("p2", None), ("p3", Some("0.4"))]
        .iter()
        .map(|(n, activity)| {
            let mut ann = vec![(ANNOTATION_GPU_MEMORY, "10Gi")];
            ann.extend(activity.map(|a| (ANNOTATION_SM_ACTIVITY, a)));
            serde_json::from_value(pod_json("ml", n, &format!("uid-{n}"), 1, &ann)).unwrap()
        })
        .collect();
    for (pod, node) in pending.iter().zip([A, A, B]) {
        let v = serde_json::to_value(pod).unwrap();
        post(&r, "/filter", &args_names(&v, &[A, B])).await;
        let (_, out) = post(&r, "/bind", &bind_args(&v, node)).await;
        assert_eq!(out["Error"], "", "{out}");
    }
    let before = ext.cluster().ledger_snapshot();
    assert_eq!(
        before.len(),
        4 + 3,
        "four pods from the snapshot, three new"
    );

    // Restart: a fresh state from the cluster as it now is (the telemetry does
    // not show the new pods yet). Pods first, then GpuNodes, as watchers may deliver.
    let snap = fixture();
    let mut after = Snapshot {
        pods: snap.pods.clone(),
        ..Snapshot::default()
    };
    after.pods.extend(bound_pods(&rec, &pending));
    let cluster = ClusterState::new();
    for p in &after.pods {
        cluster.apply_pod(p);
    }
    for n in &snap.nodes {
        cluster.apply_node(n.metadata.name.as_deref().unwrap());
    }
    for g in &snap.gpu_nodes {
        cluster.apply_gpu_node(g);
    }
    let rebuilt = cluster.ledger_snapshot();
    assert_eq!(rebuilt.len(), before.len());
    for r in before.records() {
        let back = rebuilt
            .get(&r.pod)
            .unwrap_or_else(|| panic!("{} lost", r.pod));
        assert_eq!(
            (&back.node, &back.gpus, back.reserved_mib),
            (&r.node, &r.gpus, r.reserved_mib)
        );
        assert_eq!(back.visible, r.visible, "{}", r.pod);
        // Assignment times survive to the millisecond, so the warm-up lock does too.
        assert_eq!(back.assigned_at, r.assigned_at, "{}", r.pod);
        // So does the SM activity `pack` booked with the pod.
        assert_eq!(
            back.expected_sm_activity, r.expected_sm_activity,
            "{}",
            r.pod
        );
    }
    assert_eq!(rebuilt.get("uid-p3").unwrap().expected_sm_activity, 0.4);
    assert_eq!(rebuilt.get("uid-p1").unwrap().expected_sm_activity, 1.0);
    assert_eq!(
        cluster.in_flight(),
        4,
        "three new pods and mlp-sweep-7 are in flight"
    );
    assert!(
        rebuilt
            .get("55555555-5555-4555-8555-555555555555")
            .is_none(),
        "finished pod holds nothing"
    );

    // The restarted extender refuses what the old one would have refused.
    let rec2 = Arc::new(Recorder::default());
    let all = Snapshot {
        nodes: snap.nodes.clone(),
        gpu_nodes: snap.gpu_nodes.clone(),
        pods: after.pods.clone(),
        ..Snapshot::default()
    };
    let ext2 = extender_with(&all, Policy::Magm, PlacementConfig::default(), rec2);
    let r2 = router(ext2.clone());
    let probe = pod_json(
        "ml",
        "probe",
        "uid-probe",
        1,
        &[(ANNOTATION_GPU_MEMORY, "10Gi")],
    );
    let (_, old) = post(&r, "/filter", &args_names(&probe, &[A, B])).await;
    let (_, new) = post(&r2, "/filter", &args_names(&probe, &[A, B])).await;
    assert_eq!(passing(&old), passing(&new));
    assert_eq!(old["FailedNodes"], new["FailedNodes"]);

    // Fill every GPU the restarted extender will give out; never over capacity.
    for i in 0..16 {
        let p = pod_json(
            "ml",
            &format!("q{i}"),
            &format!("uid-q{i}"),
            1,
            &[(ANNOTATION_GPU_MEMORY, "10Gi")],
        );
        post(&r2, "/filter", &args_names(&p, &[A, B])).await;
        for node in [A, B] {
            let (_, out) = post(&r2, "/bind", &bind_args(&p, node)).await;
            if out["Error"] == "" {
                break;
            }
        }
    }
    let ledger = ext2.cluster().ledger_snapshot();
    for (gpu, mib) in reserved_per_gpu(&ledger) {
        assert!(mib <= 40_960, "{gpu} over-booked: {mib} MiB");
    }
    // Every GPU that received a pod before the restart took no second pod (warm-up lock).
    let now = carma_scheduler_extender::cluster::now_ms();
    let locked: Vec<_> = before
        .records()
        .filter(|r| r.in_warmup(30_000, now))
        .collect();
    assert_eq!(locked.len(), 3, "the three pods bound a moment ago");
    for r in locked {
        for g in &r.gpus {
            assert_eq!(ledger.pods_on(g), 1, "{g} shared during its warm-up lock");
        }
    }
}

#[tokio::test]
async fn telemetry_confirms_in_flight_pods_whatever_the_order() {
    let snap = fixture();
    let mut gpu_nodes = snap.gpu_nodes.clone();
    // Telemetry now shows mlp-sweep-7 on gpu-node-b GPU 0.
    let b = gpu_nodes
        .iter_mut()
        .find(|g| g.metadata.name.as_deref() == Some(B))
        .unwrap();
    b.status.as_mut().unwrap().gpus[0].pods[0].observed_mib = Some(1500);
    let uid = "77777777-7777-4777-8777-777777777777";

    // GpuNodes first, then pods.
    let c1 = ClusterState::new();
    gpu_nodes.iter().for_each(|g| c1.apply_gpu_node(g));
    snap.pods.iter().for_each(|p| {
        c1.apply_pod(p);
    });
    assert!(c1.ledger_snapshot().get(uid).unwrap().visible);

    // Pods first, then the original telemetry (in flight), then the update.
    let c2 = ClusterState::new();
    snap.pods.iter().for_each(|p| {
        c2.apply_pod(p);
    });
    snap.gpu_nodes.iter().for_each(|g| c2.apply_gpu_node(g));
    assert!(!c2.ledger_snapshot().get(uid).unwrap().visible);
    assert_eq!(c2.in_flight(), 1);
    gpu_nodes.iter().for_each(|g| c2.apply_gpu_node(g));
    assert!(c2.ledger_snapshot().get(uid).unwrap().visible);
    assert_eq!(c2.in_flight(), 0);

    // The pod finishes: its GPU is free of it.
    let mut done = snap
        .pods
        .iter()
        .find(|p| p.metadata.uid.as_deref() == Some(uid))
        .unwrap()
        .clone();
    done.status.as_mut().unwrap().phase = Some("Succeeded".into());
    assert!(c2.apply_pod(&done));
    assert!(c2.ledger_snapshot().get(uid).is_none());
    // Deleting a pod releases it too.
    let held = "33333333-3333-4333-8333-333333333333";
    assert!(c2.release_pod(held));
    assert!(c2.ledger_snapshot().get(held).is_none());
}

#[tokio::test]
async fn relist_drops_pods_that_vanished_but_keeps_binds_in_progress() {
    let (ext, _) = fixture_extender();
    let snap = fixture();
    let mut uids: std::collections::HashSet<String> = snap
        .pods
        .iter()
        .filter_map(|p| p.metadata.uid.clone())
        .collect();
    uids.remove("33333333-3333-4333-8333-333333333333");
    ext.retain_pods(&uids);
    let ledger = ext.cluster().ledger_snapshot();
    assert!(ledger.get("33333333-3333-4333-8333-333333333333").is_none());
    assert!(ledger.get("99999999-9999-4999-8999-999999999999").is_some());
    // An unbound pod with stale annotations books nothing (a failed bind).
    let mut stale = pod_json("ml", "stale", "uid-stale", 1, &[]);
    stale["metadata"]["annotations"] =
        fixture_pod("mlp-sweep-7")["metadata"]["annotations"].clone();
    let stale: Pod = serde_json::from_value(stale).unwrap();
    assert!(!ext.cluster().apply_pod(&stale));
}

/// A pod bound before a restart (or before this replica was elected) and not yet admitted keeps its
/// node closed to the next carma pod: the awaited pods are rebuilt from the pod watch, and the
/// kubelet's `startTime` (set only after admission) opens the node again.
#[tokio::test]
async fn a_restarted_extender_awaits_the_admission_of_pods_bound_before_it() {
    let snap = fixture();
    let pending_bound = snap
        .pods
        .iter()
        .find(|p| p.metadata.name.as_deref() == Some("mlp-sweep-7"))
        .expect("the fixture's pod bound to gpu-node-b, not yet admitted")
        .clone();
    let empty = Snapshot {
        nodes: snap.nodes.clone(),
        gpu_nodes: snap.gpu_nodes.clone(),
        ..Snapshot::default()
    };

    // A dry run binds nothing, so it awaits nothing.
    let dry = extender_with(
        &empty,
        Policy::Magm,
        PlacementConfig::default(),
        Arc::new(Recorder::default()),
    );
    dry.observe_pod(&pending_bound);
    assert!(dry.cluster().handoff().admitting().is_empty());

    let live = extender_with(
        &empty,
        Policy::Magm,
        PlacementConfig::default(),
        Arc::new(Recorder {
            live: true,
            ..Recorder::default()
        }),
    );
    live.observe_pod(&pending_bound);
    assert_eq!(
        live.cluster().handoff().admitting(),
        [B.to_string()].into(),
        "gpu-node-b still has to admit mlp-sweep-7"
    );

    let mut started = pending_bound.clone();
    started.status.as_mut().unwrap().start_time =
        Some(serde_json::from_value(serde_json::json!("2026-01-05T10:00:00Z")).unwrap());
    live.observe_pod(&started);
    assert!(live.cluster().handoff().admitting().is_empty());
}
