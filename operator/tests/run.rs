//! The whole operator — metrics server, leader election, controller, graceful
//! shutdown — against the scripted API server.

mod common;

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde_json::{Value, json};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use carma_operator::controller::{LeaderElection, OperatorConfig};
use carma_operator::leader::LeaseTiming;
use carma_operator::{Settings, run};

use common::{Fake, client, hanging_client};

async fn http_get(addr: SocketAddr, path: &str) -> String {
    let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
    s.write_all(format!("GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n").as_bytes())
        .await
        .unwrap();
    let mut out = String::new();
    s.read_to_string(&mut out).await.unwrap();
    out
}

async fn eventually(what: &str, mut check: impl FnMut() -> bool) {
    for _ in 0..200 {
        if check() {
            return;
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    panic!("timed out waiting for {what}");
}

/// Short lease timing, so that leadership changes within a test's seconds.
const TIMING: LeaseTiming = LeaseTiming {
    lease_duration: Duration::from_secs(3),
    renew_deadline: Duration::from_secs(2),
    retry_period: Duration::from_millis(100),
};

/// The scripted API server holding one TrainingTask, `default/train`.
fn one_task() -> Arc<Mutex<Fake>> {
    Arc::new(Mutex::new(Fake::with_task(json!({
        "apiVersion": "carma.io/v1alpha1",
        "kind": "TrainingTask",
        "metadata": {"name": "train", "namespace": "default", "uid": "task-uid", "generation": 1, "resourceVersion": "1"},
        "spec": {"gpus": 1, "template": {"spec": {"containers": [{"name": "train", "image": "pytorch"}]}}}
    }))))
}

/// Replica `replica-a` under leader election with `timing`, its metrics on a free loopback port.
fn replica_a(timing: LeaseTiming) -> OperatorConfig {
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    OperatorConfig {
        metrics_addr: SocketAddr::from(([127, 0, 0, 1], port)),
        leader_election: Some(LeaderElection {
            namespace: Some("carma-system".into()),
            lease_name: "carma-operator".into(),
            timing,
        }),
        identity: "replica-a".into(),
        watch_namespace: None,
        concurrency: 2,
        settings: Settings::default(),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn leads_reconciles_and_shuts_down_cleanly() {
    let fake = one_task();
    let config = replica_a(TIMING);
    let addr = config.metrics_addr;
    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
    let operator = tokio::spawn(run(client(fake.clone()), config, async move {
        let _ = stop_rx.await;
    }));

    eventually("the first attempt pod", || {
        fake.lock().unwrap().pods.contains_key("train-a1")
    })
    .await;
    eventually("the status write", || {
        fake.lock().unwrap().task["status"]["phase"] == "Pending"
    })
    .await;
    assert_eq!(
        fake.lock().unwrap().leases["carma-operator"]["spec"]["holderIdentity"],
        "replica-a"
    );
    assert!(http_get(addr, "/readyz").await.starts_with("HTTP/1.1 200"));
    let metrics = http_get(addr, "/metrics").await;
    assert!(metrics.contains("carma_operator_leader 1"), "{metrics}");

    stop_tx.send(()).unwrap();
    tokio::time::timeout(Duration::from_secs(10), operator)
        .await
        .expect("graceful shutdown")
        .unwrap()
        .unwrap();
    // The lease was handed back, and exactly one pod was created.
    let f = fake.lock().unwrap();
    assert_eq!(
        f.leases["carma-operator"]["spec"]["holderIdentity"],
        Value::Null
    );
    assert_eq!(f.pods.len(), 1);
}

#[tokio::test]
async fn bad_configuration_is_refused_before_anything_starts() {
    let fake = Arc::new(Mutex::new(Fake::default()));
    let config = OperatorConfig {
        metrics_addr: "127.0.0.1:0".parse().unwrap(),
        leader_election: Some(LeaderElection {
            namespace: None,
            lease_name: "carma-operator".into(),
            timing: LeaseTiming {
                lease_duration: Duration::from_secs(5),
                renew_deadline: Duration::from_secs(10),
                retry_period: Duration::from_secs(2),
            },
        }),
        identity: "x".into(),
        watch_namespace: None,
        concurrency: 1,
        settings: Settings::default(),
    };
    let err = run(client(fake.clone()), config, async {})
        .await
        .unwrap_err();
    assert_eq!(err.kind(), "config");
    assert!(fake.lock().unwrap().requests.is_empty());
}

/// The operator's /metrics, or "" while its server is not listening yet.
async fn metrics_text(addr: SocketAddr) -> String {
    let Ok(mut s) = tokio::net::TcpStream::connect(addr).await else {
        return String::new();
    };
    let req = "GET /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n";
    if s.write_all(req.as_bytes()).await.is_err() {
        return String::new();
    }
    let mut out = String::new();
    let _ = s.read_to_string(&mut out).await;
    out
}

/// A leader whose reconcile is stuck on an API call that never returns must still stop acting once
/// it loses leadership: its controller is dropped at once, not left to finish the reconcile, so it
/// cannot write beside the next leader.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_leader_stops_acting_at_once_when_it_loses_leadership_with_a_reconcile_stuck() {
    use std::sync::atomic::{AtomicBool, Ordering};
    let fake = one_task();
    let (hang_writes, hang_all) = (
        Arc::new(AtomicBool::new(true)),
        Arc::new(AtomicBool::new(false)),
    );
    let timing = TIMING;
    let config = replica_a(timing);
    let addr = config.metrics_addr;
    // Every write that is not to the Lease hangs while `hang_writes` is set; everything while
    // `hang_all` is.
    let api = {
        let (hang_writes, hang_all) = (hang_writes.clone(), hang_all.clone());
        hanging_client(client(fake.clone()), move |req| {
            let write = req.method() != http::Method::GET;
            let lease = req.uri().path().contains("/leases");
            hang_all.load(Ordering::SeqCst)
                || (write && !lease && hang_writes.load(Ordering::SeqCst))
        })
    };
    let _operator = tokio::spawn(run(api, config, std::future::pending::<()>()));

    // It leads, and its first reconcile is stuck creating the attempt pod.
    let mut leading = false;
    for _ in 0..200 {
        leading = metrics_text(addr).await.contains("carma_operator_leader 1");
        if leading {
            break;
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    assert!(leading, "replica-a never led");
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(fake.lock().unwrap().pods.is_empty(), "the pod create hangs");

    // Now its lease renewals hang too: it must stop leading, and stop its controller, within the
    // renew deadline (plus a little), although the reconcile never returns.
    hang_all.store(true, Ordering::SeqCst);
    let hung_at = std::time::Instant::now();
    let mut stopped = false;
    while hung_at.elapsed() < timing.renew_deadline + Duration::from_millis(1500) {
        if metrics_text(addr).await.contains("carma_operator_leader 0") {
            stopped = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(
        stopped,
        "replica-a still runs its controller {:?} after its API server stopped answering",
        hung_at.elapsed()
    );
    assert!(hung_at.elapsed() < timing.lease_duration);
}
