//! Many binds at once never double-book a GPU; the losers get an `Error`.

mod common;

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use carma_api::names::ANNOTATION_GPU_MEMORY;
use carma_core::{PlacementConfig, Policy};
use carma_scheduler_extender::router;
use carma_scheduler_extender::synthetic::{self, GPU_MIB, pod_json};
use common::*;
use serde_json::Value;

async fn storm(
    cfg: PlacementConfig,
    pods: usize,
    mib: &str,
) -> (usize, Arc<carma_scheduler_extender::Extender>) {
    // 2 nodes × 4 idle GPUs.
    let mut snap = synthetic::cluster(2, 4);
    for g in &mut snap.gpu_nodes {
        for gpu in &mut g.status.as_mut().unwrap().gpus {
            gpu.processes = 0;
            gpu.memory_free_mib = GPU_MIB - 400;
            gpu.sm_activity = Some(0.1);
        }
    }
    let rec = Arc::new(Recorder {
        delay: Some(Duration::from_millis(3)),
        ..Recorder::default()
    });
    let ext = extender_with(&snap, Policy::Magm, cfg, rec.clone());
    let r = router(ext.clone());
    let nodes = [synthetic::node_name(0), synthetic::node_name(1)];
    let node_refs: Vec<&str> = nodes.iter().map(String::as_str).collect();
    let mut bodies = Vec::new();
    for i in 0..pods {
        let pod = pod_json(
            "ml",
            &format!("p{i}"),
            &format!("uid-{i}"),
            1,
            &[(ANNOTATION_GPU_MEMORY, mib)],
        );
        post(&r, "/filter", &args_names(&pod, &node_refs)).await;
        bodies.push(bind_args(&pod, node_refs[i % 2]));
    }
    let tasks: Vec<_> = bodies
        .into_iter()
        .map(|b| {
            let r = r.clone();
            tokio::spawn(async move { post(&r, "/bind", &b).await.1 })
        })
        .collect();
    let mut ok = 0;
    for t in tasks {
        let out: Value = t.await.unwrap();
        let err = out["Error"].as_str().unwrap();
        if err.is_empty() {
            ok += 1;
        } else {
            assert!(
                err.contains("no longer fits")
                    || err.contains("warm-up")
                    || err.contains("exceeds"),
                "{err}"
            );
        }
    }
    assert_eq!(rec.binds.lock().len(), ok, "one write per successful bind");
    (ok, ext)
}

fn check_no_overbooking(ext: &carma_scheduler_extender::Extender) -> HashMap<String, u64> {
    let ledger = ext.cluster().ledger_snapshot();
    let mut per_gpu: HashMap<String, u64> = HashMap::new();
    for r in ledger.records() {
        for g in &r.gpus {
            *per_gpu.entry(g.clone()).or_default() += r.reserved_mib;
        }
    }
    for (gpu, mib) in &per_gpu {
        assert!(
            *mib <= GPU_MIB,
            "{gpu}: {mib} MiB reserved on a {GPU_MIB} MiB GPU"
        );
    }
    per_gpu
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_binds_respect_the_warm_up_lock() {
    let (ok, ext) = storm(PlacementConfig::default(), 64, "6Gi").await;
    // Eight GPUs, each takes one pod until its memory shows in telemetry.
    assert_eq!(ok, 8);
    let per_gpu = check_no_overbooking(&ext);
    assert_eq!(per_gpu.len(), 8);
    assert!(per_gpu.values().all(|m| *m == 6144));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_binds_never_exceed_gpu_memory() {
    // Without the warm-up lock only the memory rules and the ledger's capacity
    // check stand between the racing binds and an over-committed GPU.
    let cfg = PlacementConfig {
        warmup_ms: 0,
        ..PlacementConfig::default()
    };
    let (ok, ext) = storm(cfg, 120, "7Gi").await;
    let per_gpu = check_no_overbooking(&ext);
    // usable = 40560 − 512 − in-flight must stay ≥ 7168 + 2048 for each new pod:
    // 40048 − 4 × 7168 = 11376 admits a fifth, 40048 − 5 × 7168 = 4208 no sixth.
    assert!(per_gpu.values().all(|m| *m == 5 * 7168), "{per_gpu:?}");
    assert_eq!(ok, 40, "{per_gpu:?}");
    let (_, metrics) = get(&router(ext.clone()), "/metrics").await;
    assert!(
        metrics.contains(r#"carma_extender_binds_total{result="recorded"} 40"#),
        "{metrics}"
    );
    assert!(
        metrics.contains(r#"carma_extender_binds_total{result="conflict"} 80"#),
        "{metrics}"
    );
    assert!(
        metrics.contains("carma_extender_placements_in_flight 40"),
        "{metrics}"
    );
}

/// kube-scheduler gives up on a bind after its `httpTimeout` (5 s by default) and closes the
/// connection, which drops the request's handler. A bind dropped after booking the GPUs and before
/// its write ended used to leave the booking behind with nothing bound: every retry of that pod
/// was refused ("already has a placement") and the GPUs stayed reserved for a pod that never ran.
/// The bind must end on its own: written and booked, or released.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bind_the_caller_gives_up_on_still_ends_written_or_released() {
    let snap = synthetic::cluster(1, 4);
    let rec = Arc::new(Recorder {
        delay: Some(Duration::from_millis(300)),
        ..Recorder::default()
    });
    let ext = extender_with(&snap, Policy::Magm, PlacementConfig::default(), rec.clone());
    let r = router(ext.clone());
    let node = synthetic::node_name(0);
    let pod = pod_json(
        "ml",
        "late",
        "uid-late",
        1,
        &[(ANNOTATION_GPU_MEMORY, "6Gi")],
    );
    post(&r, "/filter", &args_names(&pod, &[node.as_str()])).await;

    // The caller hangs up while the write is in flight.
    let gave_up = tokio::time::timeout(
        Duration::from_millis(50),
        post(&r, "/bind", &bind_args(&pod, &node)),
    )
    .await;
    assert!(
        gave_up.is_err(),
        "the bind answered before the caller gave up"
    );
    // The write takes 300 ms; a loaded machine gets up to 10 s before the verdict.
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while rec.binds.lock().is_empty() && std::time::Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }

    let written = rec.binds.lock().len();
    let booked = usize::from(ext.cluster().ledger_snapshot().get("uid-late").is_some());
    assert_eq!(
        (written, booked),
        (1, 1),
        "the abandoned bind must finish its write and keep its booking (written {written}, booked {booked})"
    );
}

/// A node still admitting the carma pod bound to it before would hold the next bind to it until
/// that admission ends: prioritize ranks it below every node that can take the pod now, so a burst
/// of pods spreads over the best nodes instead of queueing behind one kubelet.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_still_admitting_ranks_below_the_nodes_free_now() {
    let snap = synthetic::cluster(2, 4);
    let rec = Arc::new(Recorder::default());
    let ext = extender_with(&snap, Policy::Magm, PlacementConfig::default(), rec);
    let r = router(ext.clone());
    let (a, b) = (synthetic::node_name(0), synthetic::node_name(1));
    let pod = pod_json(
        "ml",
        "next",
        "uid-next",
        1,
        &[(ANNOTATION_GPU_MEMORY, "6Gi")],
    );
    let body = args_names(&pod, &[a.as_str(), b.as_str()]);
    let scores = |out: &Value| -> HashMap<String, i64> {
        out.as_array()
            .unwrap()
            .iter()
            .map(|h| {
                (
                    h["Host"].as_str().unwrap().to_string(),
                    h["Score"].as_i64().unwrap(),
                )
            })
            .collect()
    };

    let idle = scores(&post(&r, "/prioritize", &body).await.1);
    assert_eq!(
        idle[&a], idle[&b],
        "two identical idle nodes score alike: {idle:?}"
    );
    assert!(idle[&a] > 1, "{idle:?}");

    // A bind holds node a's turn (binding, or waiting for the kubelet to admit its pod).
    let turn = ext.cluster().handoff().turn(&a).await.expect("a free node");
    let busy = scores(&post(&r, "/prioritize", &body).await.1);
    assert_eq!(busy[&b], idle[&b], "{busy:?}");
    assert_eq!(
        busy[&a], 1,
        "the admitting node ranks lowest among those that fit: {busy:?}"
    );

    drop(turn);
    let free = scores(&post(&r, "/prioritize", &body).await.1);
    assert_eq!(free, idle);
}

/// A bind answers kube-scheduler as soon as the Binding is written; the node stays closed to carma
/// pods until the kubelet admits the pod, so the next bind to that node still waits for the admission.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bind_answers_before_admission_and_the_node_waits_for_it() {
    let snap = synthetic::cluster(1, 4);
    let rec = Arc::new(Recorder {
        live: true,
        ..Recorder::default()
    });
    let ext = extender_with(&snap, Policy::Magm, PlacementConfig::default(), rec.clone());
    let r = router(ext.clone());
    let node = synthetic::node_name(0);
    let first = pod_json(
        "ml",
        "first",
        "uid-first",
        1,
        &[(ANNOTATION_GPU_MEMORY, "6Gi")],
    );
    let second = pod_json(
        "ml",
        "second",
        "uid-second",
        1,
        &[(ANNOTATION_GPU_MEMORY, "6Gi")],
    );
    for pod in [&first, &second] {
        post(&r, "/filter", &args_names(pod, &[node.as_str()])).await;
    }
    let lock_wait = ext.cluster().handoff().lock_wait;

    // Answered long before the turn's wait would end.
    let started = std::time::Instant::now();
    let (_, out) = post(&r, "/bind", &bind_args(&first, &node)).await;
    assert_eq!(out["Error"], "", "{out}");
    assert!(
        started.elapsed() < lock_wait / 4,
        "the bind waited {:?} for the pod's admission",
        started.elapsed()
    );
    assert!(ext.cluster().handoff().admitting().contains(&node));

    // The next bind to the node waits until the first pod is admitted.
    let r2 = r.clone();
    let body = bind_args(&second, &node);
    let next = tokio::spawn(async move { post(&r2, "/bind", &body).await.1 });
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert!(
        !next.is_finished(),
        "the second bind did not wait for the first admission"
    );
    assert_eq!(rec.binds.lock().len(), 1);
    ext.cluster().handoff().admitted("uid-first");
    let out = tokio::time::timeout(Duration::from_secs(1), next)
        .await
        .expect("the second bind goes ahead once the first pod is admitted")
        .unwrap();
    assert_eq!(out["Error"], "", "{out}");
    assert_eq!(rec.binds.lock().len(), 2);
}

/// However long the kubelet takes, the next bind to its node never goes ahead on a timeout: it is
/// refused as a conflict that names the pod still awaited, and kube-scheduler retries it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bind_to_a_node_that_never_admits_is_refused_not_let_through() {
    let snap = synthetic::cluster(1, 4);
    let rec = Arc::new(Recorder {
        live: true,
        ..Recorder::default()
    });
    let ext = extender_with(&snap, Policy::Magm, PlacementConfig::default(), rec.clone());
    let r = router(ext.clone());
    let node = synthetic::node_name(0);
    let pods: Vec<Value> = (0..2)
        .map(|i| {
            pod_json(
                "ml",
                &format!("p{i}"),
                &format!("uid-p{i}"),
                1,
                &[(ANNOTATION_GPU_MEMORY, "6Gi")],
            )
        })
        .collect();
    for pod in &pods {
        post(&r, "/filter", &args_names(pod, &[node.as_str()])).await;
    }
    let (_, out) = post(&r, "/bind", &bind_args(&pods[0], &node)).await;
    assert_eq!(out["Error"], "", "{out}");

    let lock_wait = ext.cluster().handoff().lock_wait;
    let started = std::time::Instant::now();
    let (_, out) = post(&r, "/bind", &bind_args(&pods[1], &node)).await;
    let error = out["Error"].as_str().unwrap();
    assert!(
        error.contains("has not yet admitted pod uid-p0"),
        "refused, naming the pod awaited: {out}"
    );
    assert!(started.elapsed() >= lock_wait, "{:?}", started.elapsed());
    assert_eq!(rec.binds.lock().len(), 1, "nothing else was bound");
    assert!(ext.cluster().handoff().admitting().contains(&node));

    // kube-scheduler's retry, once the pod is admitted, binds.
    ext.cluster().handoff().admitted("uid-p0");
    post(&r, "/filter", &args_names(&pods[1], &[node.as_str()])).await;
    let (_, out) = post(&r, "/bind", &bind_args(&pods[1], &node)).await;
    assert_eq!(out["Error"], "", "{out}");
    assert_eq!(rec.binds.lock().len(), 2);
}
