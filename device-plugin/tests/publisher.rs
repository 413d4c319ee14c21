//! The GpuNode publisher against a scripted API server (tower-test), on a driven clock: at rest it
//! writes only its heartbeat, noise inside the deadbands is never written, a change that can move
//! a placement decision is written at the next sample, and every write is counted by reason.

use std::sync::Arc;
use std::time::{Duration, Instant};

use carma_api::GpuNodeSpec;
use carma_device_plugin::coexistence::{CoexistenceProbe, KUBELET_CHECKPOINT, RECHECK_EVERY};
use carma_device_plugin::config::PublishConfig;
use carma_device_plugin::metrics::Metrics;
use carma_device_plugin::publish_rule::WriteKind;
use carma_device_plugin::publisher::Publisher;
use carma_gpu::backends::{Activity, ActivitySource, GpuSample};
use carma_gpu::telemetry::{Snapshot, Telemetry};
use chrono::Utc;
use http::{Request, Response, StatusCode};
use http_body_util::BodyExt;
use kube::client::Body;
use parking_lot::Mutex;
use serde_json::{Value, json};

const NODE: &str = "n1";
const MIB: u64 = 1024 * 1024;

fn json_response(code: StatusCode, body: Value) -> Response<Body> {
    Response::builder()
        .status(code)
        .header("content-type", "application/json")
        .body(Body::from(serde_json::to_vec(&body).unwrap()))
        .unwrap()
}

/// An API server with no GpuNode until it is created; returns the status patches it received.
fn fake_api() -> (kube::Client, Arc<Mutex<Vec<Value>>>) {
    let (svc, mut handle) = tower_test::mock::pair::<Request<Body>, Response<Body>>();
    let patches = Arc::new(Mutex::new(Vec::new()));
    let log = patches.clone();
    tokio::spawn(async move {
        let mut gpunode: Option<Value> = None;
        while let Some((req, send)) = handle.next_request().await {
            let method = req.method().to_string();
            let path = req.uri().path().to_string();
            let bytes = req.into_body().collect().await.unwrap().to_bytes();
            let body: Value = serde_json::from_slice(&bytes).unwrap_or(Value::Null);
            let not_found = || {
                json_response(
                    StatusCode::NOT_FOUND,
                    json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
                           "reason": "NotFound", "code": 404}),
                )
            };
            let resp = match (method.as_str(), path.as_str()) {
                ("GET", "/api/v1/nodes/n1") => json_response(
                    StatusCode::OK,
                    json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": NODE, "uid": "u1"}}),
                ),
                ("GET", "/apis/carma.io/v1alpha1/gpunodes/n1") => match &gpunode {
                    Some(g) => json_response(StatusCode::OK, g.clone()),
                    None => not_found(),
                },
                ("POST", "/apis/carma.io/v1alpha1/gpunodes") => {
                    let mut g = body.clone();
                    g["metadata"]["uid"] = json!("gpunode-uid-1");
                    g["metadata"]["resourceVersion"] = json!("2");
                    gpunode = Some(g.clone());
                    json_response(StatusCode::CREATED, g)
                }
                ("PATCH", "/apis/carma.io/v1alpha1/gpunodes/n1/status") => {
                    log.lock().push(body["status"].clone());
                    let mut g = gpunode.clone().unwrap_or(json!({}));
                    g["status"] = body["status"].clone();
                    json_response(StatusCode::OK, g)
                }
                _ => not_found(),
            };
            send.send_response(resp);
        }
    });
    (kube::Client::new(svc, "default"), patches)
}

/// One GPU: SM activity `sm` (occupancy and DRAM activity alike), `used_mib` of 40 GiB used.
fn sample(sm: f64, used_mib: u64, watts: f64) -> GpuSample {
    let mut s = GpuSample::basic(0, "GPU-0", "m", 40 * 1024 * MIB, used_mib * MIB);
    s.sm_activity = Activity::new(sm, ActivitySource::Dcgm);
    s.sm_occupancy = Activity::new(sm, ActivitySource::Dcgm);
    s.dram_activity = Activity::new(sm, ActivitySource::Dcgm);
    s.power_watts = Some(watts);
    s
}

/// The node's snapshot of one sample (a one-sample window: the risk score is the sample).
fn snapshot(t: &mut Telemetry, sm: f64, used_mib: u64, second: u64) -> Snapshot {
    t.update(
        vec![sample(sm, used_mib, 100.0 + second as f64)],
        &[],
        Utc::now(),
    )
}

fn writes(metrics: &Metrics, kind: WriteKind) -> u64 {
    let body = metrics.encode().unwrap();
    let prefix = format!(
        "carma_gpunode_status_writes_total{{reason=\"{}\"}} ",
        kind.as_str()
    );
    body.lines()
        .find_map(|l| l.strip_prefix(&prefix))
        .unwrap_or_else(|| panic!("no {prefix} in\n{body}"))
        .parse()
        .unwrap()
}

#[tokio::test]
async fn at_rest_only_heartbeats_and_decision_changes_at_the_next_sample() {
    let (client, patches) = fake_api();
    let metrics = Arc::new(Metrics::new(NODE, 0.8));
    let cfg = PublishConfig::default();
    let spec = GpuNodeSpec {
        backend: "dcgm".into(),
        replicas_per_gpu: 8,
        mps: false,
    };
    let mut p = Publisher::new(client, NODE, spec, cfg, metrics.clone());
    let mut t = Telemetry::new(NODE, 1);
    let t0 = Instant::now();
    let at = |second: u64| t0 + Duration::from_secs(second);
    let count = || patches.lock().len();

    // The first sample is written.
    let first = p.offer_at(&snapshot(&mut t, 0.30, 1000, 0), at(0)).await;
    assert_eq!(first.map(|r| r.kind), Some(WriteKind::First));
    assert_eq!(count(), 1);

    // 100 s at rest: SM activity wobbling by up to 0.04, memory by up to 200 MiB, power every
    // sample. Nothing is written (before: a heartbeat every 30 s).
    for second in 1..100 {
        let wobble = [0.0, 0.04, -0.04, 0.02][second as usize % 4];
        let used = 1000 + [0, 200, 100][second as usize % 3];
        let r = p
            .offer_at(&snapshot(&mut t, 0.30 + wobble, used, second), at(second))
            .await;
        assert_eq!(r, None, "second {second}");
    }
    assert_eq!(count(), 1);

    // A pod allocates 2 GiB: written at this sample.
    let r = p
        .offer_at(&snapshot(&mut t, 0.30, 3048, 100), at(100))
        .await;
    assert!(
        r.as_ref()
            .is_some_and(|r| r.kind == WriteKind::Change && r.to_string().contains("free memory")),
        "{r:?}"
    );
    assert_eq!(count(), 2);
    assert_eq!(patches.lock()[1]["gpus"][0]["memoryFreeMiB"], 40960 - 3048);

    // One sample later the GPU saturates and the gate closes: written at once, although the last
    // write was a second ago (before: held back for 2 s).
    let r = p
        .offer_at(&snapshot(&mut t, 0.95, 3048, 101), at(101))
        .await;
    assert!(
        r.as_ref()
            .is_some_and(|r| r.kind == WriteKind::Change && r.to_string().contains("gate")),
        "{r:?}"
    );
    assert_eq!(count(), 3);
    assert_eq!(patches.lock()[2]["gpus"][0]["sharingAllowed"], false);

    // Then nothing changes: the heartbeat comes after 270-300 s, not before.
    let mut heartbeat_at = None;
    for second in 102..=101 + 300 {
        let r = p
            .offer_at(&snapshot(&mut t, 0.95, 3048, second), at(second))
            .await;
        if let Some(r) = r {
            assert_eq!(r.kind, WriteKind::Heartbeat, "second {second}: {r}");
            heartbeat_at = Some(second);
            break;
        }
    }
    let heartbeat_at = heartbeat_at.expect("a heartbeat within 300 s");
    assert!(
        (101 + 270..=101 + 300).contains(&heartbeat_at),
        "heartbeat at {heartbeat_at}"
    );
    assert_eq!(count(), 4);

    // Every write counted by why it was made.
    assert_eq!(writes(&metrics, WriteKind::First), 1);
    assert_eq!(writes(&metrics, WriteKind::Change), 2);
    assert_eq!(writes(&metrics, WriteKind::Heartbeat), 1);
}

#[tokio::test]
async fn another_plugin_on_the_gpus_is_written_as_a_condition_at_the_next_read() {
    let (client, patches) = fake_api();
    let metrics = Arc::new(Metrics::new(NODE, 0.8));
    let spec = GpuNodeSpec {
        backend: "dcgm".into(),
        replicas_per_gpu: 8,
        mps: false,
    };
    let dir = tempfile::tempdir().unwrap();
    let probe = CoexistenceProbe::new(dir.path().to_path_buf(), "carma.io/gpu", "carma.sock");
    let mut p = Publisher::new(client, NODE, spec, PublishConfig::default(), metrics)
        .with_coexistence(probe);
    let mut t = Telemetry::new(NODE, 1);
    let t0 = Instant::now();
    let at = |second: u64| t0 + Duration::from_secs(second);

    p.offer_at(&snapshot(&mut t, 0.30, 1000, 0), at(0)).await;
    assert_eq!(
        patches.lock()[0]["conditions"][0]["type"],
        "OtherDevicePlugin"
    );
    assert_eq!(patches.lock()[0]["conditions"][0]["status"], "False");

    // NVIDIA's device plugin registers GPU-0 with the kubelet: at the next read of the checkpoint
    // the condition turns True and is written at once, outside any heartbeat.
    std::fs::write(
        dir.path().join(KUBELET_CHECKPOINT),
        r#"{"Data":{"PodDeviceEntries":null,"RegisteredDevices":{"nvidia.com/gpu":["GPU-0"]}},"Checksum":1}"#,
    )
    .unwrap();
    let later = RECHECK_EVERY.as_secs();
    let r = p
        .offer_at(&snapshot(&mut t, 0.30, 1000, later), at(later))
        .await;
    assert!(
        r.as_ref()
            .is_some_and(|r| r.kind == WriteKind::Change && r.to_string().contains("condition")),
        "{r:?}"
    );
    let last = patches.lock().last().unwrap().clone();
    assert_eq!(last["conditions"][0]["status"], "True");
    assert!(
        last["conditions"][0]["message"]
            .as_str()
            .unwrap()
            .contains("nvidia.com/gpu (1 devices, 1 of them carma's GPUs)"),
        "{last}"
    );
}
