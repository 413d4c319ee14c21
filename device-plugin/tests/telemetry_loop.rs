//! The simulated backend through the whole loop: samples → windows → GpuNode status written to a
//! scripted API server (tower-test) → /metrics; and Allocate annotating the pod through the API.

mod common;

use std::sync::Arc;
use std::time::Duration;

use carma_device_plugin::proto::{AllocateRequest, ContainerAllocateRequest};
use carma_device_plugin::{Dependencies, start};
use carma_gpu::backends::simulated::simulated_uuid;
use common::*;
use http::{Method, Request, Response, StatusCode};
use http_body_util::BodyExt;
use kube::client::Body;
use parking_lot::Mutex;
use serde_json::{Value, json};
use tokio::sync::mpsc;

const NODE: &str = "n1";
const NODE_UID: &str = "5b0c2a4e-0000-4000-8000-00000000a001";
const WAIT: Duration = Duration::from_secs(15);

/// Every metric family the dashboards and alerts read.
const METRIC_NAMES: &[&str] = &[
    "carma_gpu_memory_total_bytes",
    "carma_gpu_memory_used_bytes",
    "carma_gpu_memory_reserved_bytes",
    "carma_gpu_sm_activity_ratio",
    "carma_gpu_sm_occupancy_ratio",
    "carma_gpu_dram_activity_ratio",
    "carma_gpu_sm_activity_risk_score",
    "carma_gpu_sm_occupancy_risk_score",
    "carma_gpu_dram_activity_risk_score",
    "carma_gpu_power_watts",
    "carma_gpu_energy_joules_total",
    "carma_gpu_pods",
    "carma_gpu_healthy",
    "carma_gpu_sharing_allowed",
    "carma_gpu_memory_enforcement",
    "carma_gpu_sm_activity_cap_ratio",
    "carma_pod_gpu_info",
    "carma_pod_gpu_memory_reserved_bytes",
    "carma_pod_gpu_memory_used_bytes",
    "carma_pod_gpu_memory_peak_bytes",
    "carma_device_plugin_allocations_total",
    "carma_telemetry_last_sample_timestamp_seconds",
    "carma_gpunode_publish_total",
    "carma_gpunode_status_writes_total",
];

#[derive(Debug, Clone)]
struct Seen {
    method: Method,
    uri: String,
    content_type: Option<String>,
    body: Value,
}

fn json_response(code: StatusCode, body: Value) -> Response<Body> {
    Response::builder()
        .status(code)
        .header("content-type", "application/json")
        .body(Body::from(serde_json::to_vec(&body).unwrap()))
        .unwrap()
}

fn not_found(kind: &str, name: &str) -> Response<Body> {
    json_response(
        StatusCode::NOT_FOUND,
        json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
               "message": format!("{kind} \"{name}\" not found"), "reason": "NotFound", "code": 404}),
    )
}

/// A scripted API server: pods on the node, no GpuNode until it is created, the Node object.
fn fake_api(
    pods: Vec<Value>,
) -> (
    kube::Client,
    Arc<Mutex<Vec<Seen>>>,
    mpsc::UnboundedReceiver<Value>,
) {
    let (svc, mut handle) = tower_test::mock::pair::<Request<Body>, Response<Body>>();
    let seen = Arc::new(Mutex::new(Vec::new()));
    let (status_tx, status_rx) = mpsc::unbounded_channel();
    let log = seen.clone();
    tokio::spawn(async move {
        let mut gpunode: Option<Value> = None;
        while let Some((req, send)) = handle.next_request().await {
            let method = req.method().clone();
            let uri = req.uri().to_string();
            let path = req.uri().path().to_string();
            let content_type = req
                .headers()
                .get("content-type")
                .and_then(|v| v.to_str().ok())
                .map(str::to_string);
            let bytes = req.into_body().collect().await.unwrap().to_bytes();
            let body: Value = serde_json::from_slice(&bytes).unwrap_or(Value::Null);
            log.lock().push(Seen {
                method: method.clone(),
                uri: uri.clone(),
                content_type,
                body: body.clone(),
            });
            let resp = match (method.as_str(), path.as_str()) {
                ("GET", "/api/v1/pods") => {
                    assert!(uri.contains("fieldSelector=spec.nodeName%3Dn1"), "{uri}");
                    json_response(
                        StatusCode::OK,
                        json!({"apiVersion": "v1", "kind": "PodList", "metadata": {"resourceVersion": "1"}, "items": pods}),
                    )
                }
                ("GET", "/api/v1/nodes/n1") => json_response(
                    StatusCode::OK,
                    json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": NODE, "uid": NODE_UID}}),
                ),
                ("GET", "/apis/carma.io/v1alpha1/gpunodes/n1") => match &gpunode {
                    Some(g) => json_response(StatusCode::OK, g.clone()),
                    None => not_found("gpunodes.carma.io", NODE),
                },
                ("POST", "/apis/carma.io/v1alpha1/gpunodes") => {
                    let mut g = body.clone();
                    g["metadata"]["uid"] = json!("gpunode-uid-1");
                    g["metadata"]["resourceVersion"] = json!("2");
                    gpunode = Some(g.clone());
                    json_response(StatusCode::CREATED, g)
                }
                ("PATCH", "/apis/carma.io/v1alpha1/gpunodes/n1/status") => {
                    let _ = status_tx.send(body["status"].clone());
                    let mut g = gpunode.clone().unwrap_or(json!({}));
                    g["status"] = body["status"].clone();
                    json_response(StatusCode::OK, g)
                }
                ("PATCH", p) if p.starts_with("/api/v1/namespaces/ml/pods/") => {
                    let name = p.rsplit('/').next().unwrap();
                    let pod = pods
                        .iter()
                        .find(|x| x["metadata"]["name"] == name)
                        .cloned()
                        .unwrap();
                    json_response(StatusCode::OK, pod)
                }
                _ => not_found("unexpected", &uri),
            };
            send.send_response(resp);
        }
    });
    (kube::Client::new(svc, "default"), seen, status_rx)
}

async fn next_status(
    rx: &mut mpsc::UnboundedReceiver<Value>,
    what: &str,
    f: impl Fn(&Value) -> bool,
) -> Value {
    tokio::time::timeout(WAIT, async {
        loop {
            let s = rx.recv().await.expect("API server gone");
            if f(&s) {
                return s;
            }
        }
    })
    .await
    .unwrap_or_else(|_| panic!("no GpuNode status with {what} in time"))
}

fn metric_lines<'a>(body: &'a str, name: &str) -> Vec<&'a str> {
    body.lines()
        .filter(|l| !l.starts_with('#'))
        .filter(|l| {
            l.strip_prefix(name)
                .is_some_and(|rest| rest.starts_with('{') || rest.starts_with(' '))
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn simulated_gpus_reach_gpunode_status_and_metrics() {
    let g0 = simulated_uuid(NODE, 0);
    let g1 = simulated_uuid(NODE, 1);
    let pods = vec![
        TestPod {
            allocated: true,
            phase: "Running",
            ..TestPod::new("p1", NODE, &[&g0], "2026-01-01T10:00:00Z", 8000)
        }
        .json(),
        TestPod::new("p2", NODE, &[&g1], "2026-01-01T10:00:05Z", 6000).json(),
    ];
    let (client, seen, mut statuses) = fake_api(pods);
    let dir = tempfile::tempdir().unwrap();
    let mut config = test_config(NODE, dir.path());
    config.publish.min_interval = Duration::from_millis(50);
    let running = start(
        config,
        Dependencies {
            kube: Some(client),
            ..Default::default()
        },
    )
    .await
    .unwrap();

    // The first publication: inventory, pods with reservations and observed memory.
    let first = next_status(&mut statuses, "gpus", |s| s["gpuCount"] == 4).await;
    assert_eq!(first["podCount"], 2);
    assert!(first["updatedAt"].is_string());
    assert!(!first["summary"].as_str().unwrap().is_empty());
    let gpu0 = &first["gpus"][0];
    assert_eq!(gpu0["uuid"], g0.as_str());
    assert_eq!(gpu0["memoryTotalMiB"], 40960);
    assert_eq!(gpu0["activitySource"], "simulated");
    assert_eq!(gpu0["healthy"], true);
    assert_eq!(gpu0["pods"][0]["name"], "p1");
    assert_eq!(gpu0["pods"][0]["reservedMiB"], 8000);
    assert!(gpu0["pods"][0]["observedMiB"].as_u64().unwrap() > 4000);
    assert_eq!(first["gpus"][1]["pods"][0]["name"], "p2");
    assert!(first["gpus"][2]["pods"].as_array().unwrap().is_empty());
    // No hook, no MPS: nothing enforces the memory limits, and the status says so per GPU.
    assert!(
        first["gpus"]
            .as_array()
            .unwrap()
            .iter()
            .all(|g| g["memoryEnforcement"] == "none"),
        "{first}"
    );

    // Created first, owned by the Node, with the plugin's spec; status through the subresource.
    {
        let seen = seen.lock();
        let post = seen
            .iter()
            .find(|s| s.method == Method::POST)
            .expect("GpuNode created");
        assert_eq!(post.body["metadata"]["name"], NODE);
        assert_eq!(post.body["metadata"]["ownerReferences"][0]["uid"], NODE_UID);
        assert_eq!(post.body["metadata"]["ownerReferences"][0]["kind"], "Node");
        assert_eq!(post.body["spec"]["backend"], "simulated");
        assert_eq!(post.body["spec"]["replicasPerGpu"], 4);
        assert_eq!(post.body["spec"]["mps"], false);
        let patch = seen
            .iter()
            .find(|s| s.uri.contains("/gpunodes/n1/status"))
            .unwrap();
        assert_eq!(patch.method, Method::PATCH);
        assert_eq!(
            patch.content_type.as_deref(),
            Some("application/merge-patch+json")
        );
    }

    // Once the 30-sample windows fill, the risk scores are published.
    let scored = next_status(&mut statuses, "risk scores", |s| {
        s["gpus"][0]["smActivity"].is_number()
    })
    .await;
    let risk = scored["gpus"][0]["smActivity"].as_f64().unwrap();
    assert!((0.0..=1.0).contains(&risk));
    assert!(scored["gpus"][0]["smOccupancy"].is_number());
    assert!(scored["gpus"][0]["dramActivity"].is_number());

    // Allocate through the API path: p2 is the pending pod; it gets annotated.
    let mut plugin = plugin_client(running.socket()).await;
    let r = plugin
        .allocate(AllocateRequest {
            container_requests: vec![ContainerAllocateRequest {
                devices_ids: vec![format!("{g1}::2")],
            }],
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(r.container_responses[0].envs["NVIDIA_VISIBLE_DEVICES"], g1);
    let cdi: Vec<&str> = r.container_responses[0]
        .cdi_devices
        .iter()
        .map(|d| d.name.as_str())
        .collect();
    assert_eq!(
        cdi,
        [format!("nvidia.com/gpu={g1}")],
        "no hook name while off"
    );
    {
        let seen = seen.lock();
        let patch = seen
            .iter()
            .find(|s| s.uri.starts_with("/api/v1/namespaces/ml/pods/p2"))
            .expect("pod annotated");
        assert_eq!(patch.method, Method::PATCH);
        assert_eq!(
            patch.body["metadata"]["annotations"]["carma.io/allocated"],
            "true"
        );
    }

    // /metrics: every family exists, with the labels the dashboards use.
    let (code, body) = http_get(running.metrics_addr(), "/metrics").await;
    assert_eq!(code, 200);
    for name in METRIC_NAMES {
        assert!(
            !metric_lines(&body, name).is_empty(),
            "{name} missing:\n{body}"
        );
    }
    let info = metric_lines(&body, "carma_pod_gpu_info");
    assert!(
        info.iter()
            .any(|l| l.contains(r#"node="n1",namespace="ml",pod="p1""#)
                && l.contains(&format!(r#"uuid="{g0}",gpu="0""#))
                && l.contains(r#"task="task-p1""#)
                && l.ends_with(" 1")),
        "{info:?}"
    );
    let used = metric_lines(&body, "carma_pod_gpu_memory_used_bytes");
    assert!(used.iter().any(|l| l.contains(r#"pod="p1""#)), "{used:?}");
    let peak = metric_lines(&body, "carma_pod_gpu_memory_peak_bytes");
    let value = |lines: &[&str]| -> f64 {
        lines
            .iter()
            .find(|l| l.contains(r#"pod="p1""#))
            .and_then(|l| l.rsplit(' ').next())
            .and_then(|v| v.parse().ok())
            .unwrap_or(-1.0)
    };
    assert!(
        value(&peak) >= value(&used) && value(&used) > 0.0,
        "the running peak is at least the current use: {peak:?} {used:?}"
    );
    let sm = metric_lines(&body, "carma_gpu_sm_activity_ratio");
    assert!(
        sm.iter().all(|l| l.contains(r#"source="simulated""#)),
        "{sm:?}"
    );
    assert!(metric_lines(&body, "carma_gpu_sm_activity_cap_ratio")[0].ends_with(" 0.8"));
    let enforcement = metric_lines(&body, "carma_gpu_memory_enforcement");
    assert_eq!(enforcement.len(), 4, "{enforcement:?}");
    assert!(
        enforcement
            .iter()
            .all(|l| l.contains(r#"mode="none""#) && l.ends_with(" 1")),
        "{enforcement:?}"
    );
    let published = metric_lines(&body, "carma_gpunode_publish_total");
    assert!(
        published
            .iter()
            .any(|l| l.contains(r#"result="ok""#) && !l.ends_with(" 0")),
        "{published:?}"
    );
    let alloc = metric_lines(&body, "carma_device_plugin_allocations_total");
    assert!(
        alloc
            .iter()
            .any(|l| l.contains(r#"result="ok""#) && l.ends_with(" 1")),
        "{alloc:?}"
    );
    assert!(
        metric_lines(&body, "carma_telemetry_last_sample_timestamp_seconds")[0]
            .contains(r#"node="n1""#)
    );

    running.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_api_server_synthetic_pods_feed_the_per_pod_metrics() {
    let dir = tempfile::tempdir().unwrap();
    let running = start(test_config(NODE, dir.path()), Dependencies::default())
        .await
        .unwrap();
    let addr = running.metrics_addr();
    let body = eventually(WAIT, || async move {
        let (_, body) = http_get(addr, "/metrics").await;
        (!metric_lines(&body, "carma_gpu_sm_activity_risk_score").is_empty()).then_some(body)
    })
    .await;
    for name in METRIC_NAMES {
        assert!(
            !metric_lines(&body, name).is_empty(),
            "{name} missing:\n{body}"
        );
    }
    let info = metric_lines(&body, "carma_pod_gpu_info");
    assert_eq!(info.len(), 8, "2 synthetic pods × 4 GPUs: {info:?}");
    assert!(
        info.iter()
            .all(|l| l.contains(r#"namespace="simulated""#) && l.contains(r#"simulated="true""#))
    );
    assert_eq!(metric_lines(&body, "carma_gpu_pods").len(), 4);
    running.shutdown().await;
}

/// Each simulated metric set, end to end: the rule it leads to shows in /metrics, and the GPUs get a
/// verdict once their windows fill (with `nvml`, the occupancy window never fills and before the
/// per-source gate no GPU ever could share).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_simulated_metric_set_shows_its_gate_rule() {
    use carma_device_plugin::config::SimulatedMetrics;
    for (metrics, rule) in [
        (SimulatedMetrics::Nvml, "smact-drama"),
        (SimulatedMetrics::Gpm, "smact-smocc-drama"),
        (SimulatedMetrics::Dcgm, "smact-smocc-drama"),
    ] {
        let dir = tempfile::tempdir().unwrap();
        let mut config = test_config(NODE, dir.path());
        config.backend.simulated_metrics = metrics;
        let running = start(config, Dependencies::default()).await.unwrap();
        let addr = running.metrics_addr();
        let body = eventually(WAIT, || async move {
            let (_, body) = http_get(addr, "/metrics").await;
            (!metric_lines(&body, "carma_gpu_sm_activity_risk_score").is_empty()).then_some(body)
        })
        .await;
        let gate = metric_lines(&body, "carma_gpu_sharing_allowed");
        assert_eq!(gate.len(), 4, "{metrics:?}: {gate:?}");
        let want = format!(r#"rule="{rule}""#);
        assert!(
            gate.iter().all(|l| l.contains(&want)),
            "{metrics:?}: {gate:?}"
        );
        assert!(
            gate.iter().any(|l| l.ends_with(" 1")),
            "{metrics:?}: a lightly loaded simulated GPU may share: {gate:?}"
        );
        let occupancy = metric_lines(&body, "carma_gpu_sm_occupancy_risk_score");
        assert_eq!(
            occupancy.is_empty(),
            metrics == SimulatedMetrics::Nvml,
            "{metrics:?}: {occupancy:?}"
        );
        // dcgm-exporter alone lists no processes: memory growth stands in for them.
        let used = metric_lines(&body, "carma_pod_gpu_memory_used_bytes");
        assert!(!used.is_empty(), "{metrics:?}: pods seen: {body}");
        running.shutdown().await;
    }
}

/// A node with NVIDIA's hook (auto-detected: the simulated backend has no driver to ask): the hook's
/// CDI spec is written, every container gets its name after the GPUs', and the status and metrics say
/// `driver`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_with_the_hook_runs_it_on_every_container() {
    use carma_gpu::enforcement::{HOOK_CDI_NAME, HOOK_SPEC_FILE, MemoryLimitsMode};
    use std::os::unix::fs::PermissionsExt;
    let g1 = simulated_uuid(NODE, 1);
    let pods = vec![TestPod::new("p2", NODE, &[&g1], "2026-01-01T10:00:05Z", 6000).json()];
    let (client, _seen, mut statuses) = fake_api(pods);
    let dir = tempfile::tempdir().unwrap();
    let hook = dir.path().join("nvidia-cdi-hook");
    std::fs::write(&hook, "#!/bin/sh\n").unwrap();
    std::fs::set_permissions(&hook, std::fs::Permissions::from_mode(0o755)).unwrap();
    let cdi_dir = dir.path().join("cdi");
    let mut config = test_config(NODE, dir.path());
    config.publish.min_interval = Duration::from_millis(50);
    config.memory_limits.mode = MemoryLimitsMode::Auto;
    config.memory_limits.path = "/usr/bin/nvidia-cdi-hook".into();
    config.memory_limits.probe_path = hook.clone();
    config.cdi_dir = Some(cdi_dir.clone());
    let running = start(
        config,
        Dependencies {
            kube: Some(client),
            ..Default::default()
        },
    )
    .await
    .unwrap();
    let spec: Value =
        serde_json::from_slice(&std::fs::read(cdi_dir.join(HOOK_SPEC_FILE)).unwrap()).unwrap();
    assert_eq!(spec["kind"], "carma.io/memory-limits");
    assert_eq!(
        spec["devices"][0]["containerEdits"]["hooks"][0]["path"], "/usr/bin/nvidia-cdi-hook",
        "the spec names the hook where the runtime finds it, not where the plugin probed"
    );
    let first = next_status(&mut statuses, "gpus", |s| s["gpuCount"] == 4).await;
    assert!(
        first["gpus"]
            .as_array()
            .unwrap()
            .iter()
            .all(|g| g["memoryEnforcement"] == "driver"),
        "{first}"
    );
    let mut plugin = plugin_client(running.socket()).await;
    let r = plugin
        .allocate(AllocateRequest {
            container_requests: vec![ContainerAllocateRequest {
                devices_ids: vec![format!("{g1}::0")],
            }],
        })
        .await
        .unwrap()
        .into_inner();
    let c = &r.container_responses[0];
    let cdi: Vec<&str> = c.cdi_devices.iter().map(|d| d.name.as_str()).collect();
    assert_eq!(
        cdi,
        [format!("nvidia.com/gpu={g1}").as_str(), HOOK_CDI_NAME]
    );
    assert_eq!(
        c.envs["NVIDIA_GPU_MEMORY_REQUEST"],
        (6000u64 << 20).to_string()
    );
    let (_, body) = http_get(running.metrics_addr(), "/metrics").await;
    let enforcement = metric_lines(&body, "carma_gpu_memory_enforcement");
    assert!(
        enforcement.len() == 4 && enforcement.iter().all(|l| l.contains(r#"mode="driver""#)),
        "{enforcement:?}"
    );
    running.shutdown().await;
    // Restarted with the hook off: its spec goes, so no container can name it any more.
    let mut config = test_config(NODE, dir.path());
    config.memory_limits.probe_path = hook;
    config.memory_limits.mode = MemoryLimitsMode::Off;
    config.cdi_dir = Some(cdi_dir.clone());
    let running = start(config, Dependencies::default()).await.unwrap();
    assert!(!cdi_dir.join(HOOK_SPEC_FILE).exists());
    running.shutdown().await;
}
