//! The ResourceSlice publisher against a scripted API server (tower-test): server-side apply of
//! the node's slice owned by its Node, pool generations that only grow, no write when nothing
//! changed, and the devices withdrawn when the API server drops the sharing fields; devices that
//! leave the slice are reported as an Event on the Node.

use std::sync::Arc;
use std::time::Duration;

use carma_dra_driver::metrics::Metrics;
use carma_dra_driver::publisher::{PublishError, REASON_DEVICES_WITHDRAWN, SlicePublisher};
use carma_dra_driver::slice::{CapacityPolicy, devices};
use carma_dra_driver::taints::Tainter;
use carma_gpu::backends::GpuSample;
use carma_gpu::telemetry::Telemetry;
use chrono::Utc;
use http::{Request, Response, StatusCode};
use http_body_util::BodyExt;
use k8s_openapi::api::resource::v1::Device;
use kube::client::Body;
use parking_lot::Mutex;
use serde_json::{Value, json};

const NODE: &str = "n1";
const NODE_UID: &str = "5b0c2a4e-0000-4000-8000-00000000a001";
const SLICE_PATH: &str = "/apis/resource.k8s.io/v1/resourceslices/n1-gpu.carma.io";

#[derive(Debug, Clone)]
struct Seen {
    method: String,
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

/// An API server holding at most one slice (`stored`); with `drop_sharing` it stores slices the
/// way an API server with `DRAConsumableCapacity` off does.
fn fake_api(stored: Option<Value>, drop_sharing: bool) -> (kube::Client, SeenLog) {
    let (client, seen, _) = fake_api_with_store(stored, drop_sharing);
    (client, seen)
}

/// Requests the fake API server has seen.
type SeenLog = Arc<Mutex<Vec<Seen>>>;
/// The fake API server's one slice.
type Store = Arc<Mutex<Option<Value>>>;

/// [`fake_api`], and its stored slice (a test may delete it, as the kubelet does).
fn fake_api_with_store(
    stored: Option<Value>,
    drop_sharing: bool,
) -> (kube::Client, SeenLog, Store) {
    let (svc, mut handle) = tower_test::mock::pair::<Request<Body>, Response<Body>>();
    let seen = Arc::new(Mutex::new(Vec::new()));
    let log = seen.clone();
    let store = Arc::new(Mutex::new(stored));
    let slice = store.clone();
    let uids = std::sync::atomic::AtomicU32::new(0);
    tokio::spawn(async move {
        while let Some((req, send)) = handle.next_request().await {
            let method = req.method().to_string();
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
                uri,
                content_type,
                body: body.clone(),
            });
            let resp = match (method.as_str(), path.as_str()) {
                ("GET", "/api/v1/nodes/n1") => json_response(
                    StatusCode::OK,
                    json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": NODE, "uid": NODE_UID}}),
                ),
                ("GET", SLICE_PATH) => match &*slice.lock() {
                    Some(s) => json_response(StatusCode::OK, s.clone()),
                    None => json_response(
                        StatusCode::NOT_FOUND,
                        json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
                               "reason": "NotFound", "code": 404}),
                    ),
                },
                ("PATCH", SLICE_PATH) => {
                    let mut s = body.clone();
                    if drop_sharing {
                        for d in s["spec"]["devices"].as_array_mut().unwrap() {
                            let d = d.as_object_mut().unwrap();
                            d.remove("allowMultipleAllocations");
                            for c in d["capacity"].as_object_mut().unwrap().values_mut() {
                                c.as_object_mut().unwrap().remove("requestPolicy");
                            }
                        }
                    }
                    let mut stored = slice.lock();
                    // A created slice gets a new UID; an applied one keeps its UID.
                    s["metadata"]["uid"] = match &*stored {
                        Some(old) => old["metadata"]["uid"].clone(),
                        None => json!(format!(
                            "slice-{}",
                            uids.fetch_add(1, std::sync::atomic::Ordering::SeqCst)
                        )),
                    };
                    *stored = Some(s.clone());
                    json_response(StatusCode::OK, s)
                }
                ("POST", "/apis/events.k8s.io/v1/namespaces/default/events") => {
                    json_response(StatusCode::CREATED, body.clone())
                }
                _ => json_response(
                    StatusCode::NOT_FOUND,
                    json!({"kind": "Status", "code": 404}),
                ),
            };
            send.send_response(resp);
        }
    });
    (kube::Client::new(svc, "default"), seen, store)
}

/// Two GPUs' devices; with `busy`, the second one's gate is closed.
fn node_devices(busy: bool) -> Vec<Device> {
    use carma_gpu::backends::{Activity, ActivitySource};
    let samples = (0..2)
        .map(|i| {
            let mut s = GpuSample::basic(i, format!("GPU-{i}"), "m", 40 << 30, 0);
            let load = if busy && i == 1 { 0.95 } else { 0.1 };
            s.sm_activity = Activity::new(load, ActivitySource::Dcgm);
            s.sm_occupancy = Activity::new(load, ActivitySource::Dcgm);
            s.dram_activity = Activity::new(load, ActivitySource::Dcgm);
            s
        })
        .collect();
    let now = Utc::now();
    let snap = Telemetry::new(NODE, 1).update(samples, &[], now);
    let taints = Tainter::new(
        carma_gpu::sampling::GateCaps::default(),
        0.05,
        Duration::from_secs(5),
    )
    .taints(&snap, now);
    let policy = CapacityPolicy {
        slots: 8,
        min_share_mib: 1024,
    };
    devices(&snap, &taints, policy)
}

/// The Events posted.
fn events(seen: &Mutex<Vec<Seen>>) -> Vec<Value> {
    seen.lock()
        .iter()
        .filter(|s| s.method == "POST" && s.uri.contains("/events"))
        .map(|s| s.body.clone())
        .collect()
}

fn patches(seen: &Mutex<Vec<Seen>>) -> Vec<Seen> {
    seen.lock()
        .iter()
        .filter(|s| s.method == "PATCH")
        .cloned()
        .collect()
}

#[tokio::test]
async fn the_slice_is_applied_owned_by_the_node_and_rewritten_only_on_change() {
    let (client, seen) = fake_api(None, false);
    let mut p = SlicePublisher::new(client, NODE, Duration::ZERO);
    assert_eq!(p.offer(&node_devices(false)).await.unwrap(), Some(1));
    let first = &patches(&seen)[0];
    assert!(
        first.uri.contains("fieldManager=carma-dra-driver"),
        "{}",
        first.uri
    );
    assert!(first.uri.contains("force=true"), "{}", first.uri);
    assert_eq!(
        first.content_type.as_deref(),
        Some("application/apply-patch+yaml")
    );
    let b = &first.body;
    assert_eq!(b["apiVersion"], "resource.k8s.io/v1");
    assert_eq!(b["kind"], "ResourceSlice");
    assert_eq!(b["metadata"]["name"], "n1-gpu.carma.io");
    assert_eq!(
        b["metadata"]["ownerReferences"][0],
        json!({"apiVersion": "v1", "kind": "Node", "name": NODE, "uid": NODE_UID, "controller": true})
    );
    assert_eq!(b["spec"]["driver"], "gpu.carma.io");
    assert_eq!(b["spec"]["nodeName"], NODE);
    assert_eq!(
        b["spec"]["pool"],
        json!({"name": NODE, "generation": 1, "resourceSliceCount": 1})
    );
    assert_eq!(b["spec"]["devices"][1]["allowMultipleAllocations"], true);
    assert!(b["spec"]["devices"][1].get("taints").is_none());

    // Nothing changed: no request at all.
    let requests = seen.lock().len();
    assert_eq!(p.offer(&node_devices(false)).await.unwrap(), None);
    assert_eq!(seen.lock().len(), requests);

    // The second GPU's gate closes: a new generation with its taint.
    assert_eq!(p.offer(&node_devices(true)).await.unwrap(), Some(2));
    let second = patches(&seen).pop().unwrap();
    assert_eq!(second.body["spec"]["pool"]["generation"], 2);
    assert_eq!(
        second.body["spec"]["devices"][1]["taints"][0]["key"],
        "gpu.carma.io/utilization-gate"
    );
}

#[tokio::test]
async fn writes_inside_the_minimum_interval_wait_for_a_later_offer() {
    let (client, seen) = fake_api(None, false);
    let mut p = SlicePublisher::new(client, NODE, Duration::from_millis(300));
    assert_eq!(p.offer(&node_devices(false)).await.unwrap(), Some(1));
    assert_eq!(p.offer(&node_devices(true)).await.unwrap(), None);
    assert_eq!(patches(&seen).len(), 1);
    tokio::time::sleep(Duration::from_millis(350)).await;
    assert_eq!(p.offer(&node_devices(true)).await.unwrap(), Some(2));
}

#[tokio::test]
async fn a_restarted_driver_continues_from_the_stored_generation() {
    let stored = json!({
        "apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice",
        "metadata": {"name": "n1-gpu.carma.io"},
        "spec": {"driver": "gpu.carma.io", "nodeName": NODE,
                 "pool": {"name": NODE, "generation": 7, "resourceSliceCount": 1}, "devices": []}
    });
    let (client, seen) = fake_api(Some(stored), false);
    let mut p = SlicePublisher::new(client, NODE, Duration::ZERO);
    assert_eq!(p.offer(&node_devices(false)).await.unwrap(), Some(8));
    assert_eq!(patches(&seen)[0].body["spec"]["pool"]["generation"], 8);
}

#[tokio::test]
async fn devices_are_withdrawn_when_the_api_server_drops_the_sharing_fields() {
    let (client, seen) = fake_api(None, true);
    let mut p = SlicePublisher::new(client, NODE, Duration::ZERO);
    let err = p.offer(&node_devices(false)).await.unwrap_err();
    assert!(matches!(err, PublishError::SharingDropped { .. }), "{err}");
    assert!(err.to_string().contains("DRAConsumableCapacity"), "{err}");
    let written = patches(&seen);
    assert_eq!(written.len(), 2);
    let last = &written[1].body["spec"];
    assert_eq!(
        last["devices"],
        json!([]),
        "the pool is left without devices"
    );
    assert_eq!(last["pool"]["generation"], 2);
    // And it stays so: later offers fail the same way and write nothing.
    assert!(matches!(
        p.offer(&node_devices(true)).await,
        Err(PublishError::SharingDropped { .. })
    ));
    assert_eq!(patches(&seen).len(), 2);
}

#[tokio::test]
async fn an_unchanged_slice_is_applied_again_after_the_resync_so_a_wiped_one_comes_back() {
    let (client, seen, store) = fake_api_with_store(None, false);
    let mut p =
        SlicePublisher::new(client, NODE, Duration::ZERO).with_resync(Duration::from_millis(200));
    assert_eq!(p.offer(&node_devices(false)).await.unwrap(), Some(1));
    // The kubelet wipes the node's slices when it starts.
    *store.lock() = None;
    assert_eq!(p.offer(&node_devices(false)).await.unwrap(), None);
    assert_eq!(
        patches(&seen).len(),
        1,
        "nothing changed, the resync is not due"
    );
    tokio::time::sleep(Duration::from_millis(250)).await;
    assert_eq!(p.offer(&node_devices(false)).await.unwrap(), None);
    let written = patches(&seen);
    assert_eq!(written.len(), 2, "re-applied after the resync");
    assert_eq!(
        written[1].body["spec"]["pool"]["generation"], 1,
        "same content, same generation"
    );
    assert!(store.lock().is_some(), "the slice exists again");
}

#[tokio::test]
async fn devices_that_leave_the_slice_are_reported_as_an_event_on_the_node() {
    let (client, seen) = fake_api(None, false);
    let metrics = Arc::new(Metrics::new());
    let mut p = SlicePublisher::new(client, NODE, Duration::ZERO).with_metrics(metrics.clone());
    let both = node_devices(false);
    assert_eq!(p.offer(&both).await.unwrap(), Some(1));
    // A taint changes, no device leaves: no Event.
    assert_eq!(p.offer(&node_devices(true)).await.unwrap(), Some(2));
    assert!(events(&seen).is_empty(), "{:?}", events(&seen));
    // The backend stops reporting the second GPU.
    assert_eq!(p.offer(&both[..1]).await.unwrap(), Some(3));
    let posted = events(&seen);
    assert_eq!(posted.len(), 1, "{posted:?}");
    let e = &posted[0];
    assert_eq!(e["reason"], REASON_DEVICES_WITHDRAWN);
    assert_eq!(e["type"], "Warning");
    assert_eq!(
        e["regarding"],
        json!({"apiVersion": "v1", "kind": "Node", "name": NODE, "uid": NODE_UID})
    );
    let note = e["note"].as_str().unwrap();
    assert!(
        note.starts_with("1 of 2 devices withdrawn from ResourceSlice n1-gpu.carma.io (gpu-1)"),
        "{note}"
    );
    assert!(
        note.contains("GPU backend no longer reports them"),
        "{note}"
    );
    let text = metrics.encode().unwrap();
    assert!(
        text.contains("carma_dra_driver_devices_withdrawn_total{reason=\"gpus_gone\"} 1"),
        "{text}"
    );
    assert!(
        text.contains("carma_dra_driver_devices_published 1"),
        "{text}"
    );
}

#[tokio::test]
async fn a_restarted_driver_reports_the_devices_its_predecessor_published_and_it_does_not() {
    let stored = json!({
        "apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice",
        "metadata": {"name": "n1-gpu.carma.io", "uid": "old"},
        "spec": {"driver": "gpu.carma.io", "nodeName": NODE,
                 "pool": {"name": NODE, "generation": 4, "resourceSliceCount": 1},
                 "devices": [{"name": "gpu-0"}, {"name": "gpu-1"}, {"name": "gpu-2"}]}
    });
    let (client, seen) = fake_api(Some(stored), false);
    let mut p = SlicePublisher::new(client, NODE, Duration::ZERO);
    assert_eq!(p.offer(&node_devices(false)).await.unwrap(), Some(5));
    let posted = events(&seen);
    assert_eq!(posted.len(), 1, "{posted:?}");
    let note = posted[0]["note"].as_str().unwrap();
    assert!(
        note.starts_with("1 of 3 devices withdrawn from ResourceSlice n1-gpu.carma.io (gpu-2)"),
        "{note}"
    );
}

#[tokio::test]
async fn withdrawing_every_device_over_dropped_sharing_fields_is_an_event_too() {
    let (client, seen) = fake_api(None, true);
    let mut p = SlicePublisher::new(client, NODE, Duration::ZERO);
    assert!(matches!(
        p.offer(&node_devices(false)).await,
        Err(PublishError::SharingDropped { .. })
    ));
    let posted = events(&seen);
    assert_eq!(posted.len(), 1, "{posted:?}");
    assert_eq!(posted[0]["reason"], REASON_DEVICES_WITHDRAWN);
    let note = posted[0]["note"].as_str().unwrap();
    assert!(
        note.starts_with(
            "2 of 2 devices withdrawn from ResourceSlice n1-gpu.carma.io (gpu-0, gpu-1)"
        ),
        "{note}"
    );
    assert!(note.contains("DRAConsumableCapacity"), "{note}");
}
