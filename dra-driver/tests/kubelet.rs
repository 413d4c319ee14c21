//! The kubelet's side, played by a tonic client over the driver's real Unix sockets: plugin
//! registration, then NodePrepareResources and NodeUnprepareResources for claims allocated on the
//! driver's devices, with the CDI specs they leave on disk.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use carma_dra_driver::checkpoint::{self, PreparedClaims};
use carma_dra_driver::claims::StaticClaims;
use carma_dra_driver::proto::dra::dra_plugin_client::DraPluginClient;
use carma_dra_driver::proto::dra::{
    Claim, NodePrepareResourcesRequest, NodeUnprepareResourcesRequest,
};
use carma_dra_driver::proto::registration::registration_client::RegistrationClient;
use carma_dra_driver::proto::registration::{InfoRequest, RegistrationStatus};
use carma_dra_driver::registration::RegistrationState;
use carma_dra_driver::{Config, Dependencies, RunningDriver};
use carma_gpu::backends::simulated::simulated_uuid;
use carma_gpu::config::{BackendKind, SimulatedGpus};
use carma_gpu::uds::uds_channel;
use k8s_openapi::api::resource::v1::{
    AllocationResult, DeviceAllocationResult, DeviceRequestAllocationResult, ResourceClaim,
    ResourceClaimStatus,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

const NODE: &str = "gpu-node-1";

/// One allocation result: (driver, pool, device, request, consumed memory, share ID).
type Result1<'a> = (
    &'a str,
    &'a str,
    &'a str,
    &'a str,
    Option<&'a str>,
    Option<&'a str>,
);

fn claim(name: &str, uid: &str, results: &[Result1<'_>]) -> ResourceClaim {
    ResourceClaim {
        metadata: ObjectMeta {
            namespace: Some("ml".into()),
            name: Some(name.into()),
            uid: Some(uid.into()),
            ..Default::default()
        },
        spec: Default::default(),
        status: Some(ResourceClaimStatus {
            allocation: Some(AllocationResult {
                devices: Some(DeviceAllocationResult {
                    results: Some(
                        results
                            .iter()
                            .map(|(driver, pool, device, request, mem, share)| {
                                DeviceRequestAllocationResult {
                                    driver: driver.to_string(),
                                    pool: pool.to_string(),
                                    device: device.to_string(),
                                    request: request.to_string(),
                                    consumed_capacity: mem.map(|m| {
                                        BTreeMap::from([(
                                            "memory".to_string(),
                                            Quantity(m.to_string()),
                                        )])
                                    }),
                                    share_id: share.map(str::to_string),
                                    ..Default::default()
                                }
                            })
                            .collect(),
                    ),
                    config: None,
                }),
                ..Default::default()
            }),
            ..Default::default()
        }),
    }
}

fn kubelet_claim(name: &str, uid: &str) -> Claim {
    Claim {
        namespace: "ml".into(),
        name: name.into(),
        uid: uid.into(),
    }
}

async fn start(dir: &std::path::Path, claims: &StaticClaims) -> RunningDriver {
    start_with(dir, claims, |_| {}).await
}

async fn start_with(
    dir: &std::path::Path,
    claims: &StaticClaims,
    tweak: impl FnOnce(&mut Config),
) -> RunningDriver {
    let mut config = Config::new(NODE, BackendKind::Simulated);
    config.backend.simulated_gpus = SimulatedGpus {
        count: 4,
        memory_mib: 40960,
    };
    config.registry_dir = dir.join("plugins_registry");
    config.plugin_dir = dir.join("plugins/gpu.carma.io");
    config.cdi_dir = dir.join("cdi");
    config.backend.sample_interval = Duration::from_millis(100);
    tweak(&mut config);
    let deps = Dependencies {
        claims: Some(Arc::new(claims.clone())),
        ..Default::default()
    };
    carma_dra_driver::start(config, deps).await.unwrap()
}

fn env(dir: &std::path::Path, uid: &str) -> Vec<Vec<String>> {
    let path = dir.join(format!("cdi/gpu.carma.io-claim_{uid}.json"));
    let spec: serde_json::Value = serde_json::from_slice(&std::fs::read(path).unwrap()).unwrap();
    assert_eq!(spec["kind"], "gpu.carma.io/claim");
    spec["devices"]
        .as_array()
        .unwrap()
        .iter()
        .map(|d| {
            d["containerEdits"]["env"]
                .as_array()
                .unwrap()
                .iter()
                .map(|e| e.as_str().unwrap().to_string())
                .collect()
        })
        .collect()
}

#[tokio::test]
async fn the_kubelet_registers_the_driver_through_the_registry_socket() {
    let dir = tempfile::tempdir().unwrap();
    let driver = start(dir.path(), &StaticClaims::default()).await;
    let reg = dir.path().join("plugins_registry/gpu.carma.io-reg.sock");
    assert_eq!(driver.registration_socket(), reg);
    let mut client = RegistrationClient::new(uds_channel(&reg).await.unwrap());
    let info = client.get_info(InfoRequest {}).await.unwrap().into_inner();
    assert_eq!(info.r#type, "DRAPlugin");
    assert_eq!(info.name, "gpu.carma.io");
    let dra = dir.path().join("plugins/gpu.carma.io/dra.sock");
    assert_eq!(info.endpoint, dra.to_string_lossy());
    assert_eq!(info.supported_versions, ["v1.DRAPlugin"]);
    // The kubelet dials the endpoint it was given.
    assert!(uds_channel(&info.endpoint).await.is_ok());

    let mut state = driver.registration();
    assert_eq!(*state.borrow(), RegistrationState::Pending);
    client
        .notify_registration_status(RegistrationStatus {
            plugin_registered: false,
            error: "version not supported".into(),
        })
        .await
        .unwrap();
    assert_eq!(
        *state.borrow_and_update(),
        RegistrationState::Failed("version not supported".into())
    );
    client
        .notify_registration_status(RegistrationStatus {
            plugin_registered: true,
            error: String::new(),
        })
        .await
        .unwrap();
    assert_eq!(*state.borrow_and_update(), RegistrationState::Registered);

    driver.shutdown().await;
    assert!(
        !reg.exists() && !dra.exists(),
        "sockets removed on shutdown"
    );
}

#[tokio::test]
async fn prepare_answers_cdi_names_and_writes_the_spec_then_unprepare_removes_it() {
    let dir = tempfile::tempdir().unwrap();
    let claims = StaticClaims::default();
    claims.insert(claim(
        "train-a",
        "uid-a",
        &[(
            "gpu.carma.io",
            NODE,
            "gpu-1",
            "gpu",
            Some("12Gi"),
            Some("share-7"),
        )],
    ));
    // Two GPUs in one request, each booked whole (no consumedCapacity), next to another
    // driver's device that is not ours to prepare.
    claims.insert(claim(
        "train-b",
        "uid-b",
        &[
            ("gpu.carma.io", NODE, "gpu-0", "gpus", None, None),
            ("gpu.carma.io", NODE, "gpu-3", "gpus", None, None),
            ("net.example.com", NODE, "nic-0", "nic", None, None),
        ],
    ));
    let driver = start(dir.path(), &claims).await;
    let mut kubelet = DraPluginClient::new(uds_channel(driver.dra_socket()).await.unwrap());

    let answer = kubelet
        .node_prepare_resources(NodePrepareResourcesRequest {
            claims: vec![
                kubelet_claim("train-a", "uid-a"),
                kubelet_claim("train-b", "uid-b"),
            ],
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(answer.claims.len(), 2);
    let a = &answer.claims["uid-a"];
    assert_eq!(a.error, "");
    assert_eq!(a.devices.len(), 1);
    let d = &a.devices[0];
    assert_eq!(
        (
            d.pool_name.as_str(),
            d.device_name.as_str(),
            d.request_names.as_slice()
        ),
        (NODE, "gpu-1", ["gpu".to_string()].as_slice())
    );
    assert_eq!(d.cdi_device_ids, ["gpu.carma.io/claim=uid-a-gpu-gpu-1"]);
    assert_eq!(d.share_id.as_deref(), Some("share-7"));
    let uuid1 = simulated_uuid(NODE, 1);
    assert_eq!(
        env(dir.path(), "uid-a"),
        [[
            format!("CARMA_ASSIGNED_GPUS={uuid1}"),
            "CARMA_RESERVED_MIB=12288".to_string(),
            // Bytes; alone on its GPU, the limit is the reservation.
            "NVIDIA_GPU_MEMORY_LIMIT=12884901888".to_string(),
            "NVIDIA_GPU_MEMORY_REQUEST=12884901888".to_string(),
            format!("NVIDIA_VISIBLE_DEVICES={uuid1}"),
        ]]
    );

    let b = &answer.claims["uid-b"];
    assert_eq!(b.error, "");
    let names: Vec<&str> = b.devices.iter().map(|d| d.device_name.as_str()).collect();
    assert_eq!(names, ["gpu-0", "gpu-3"], "only this driver's devices");
    let both = format!("{},{}", simulated_uuid(NODE, 0), simulated_uuid(NODE, 3));
    let env_b = env(dir.path(), "uid-b");
    assert_eq!(env_b.len(), 2);
    assert_eq!(env_b[0], env_b[1]);
    assert!(env_b[0].contains(&format!("NVIDIA_VISIBLE_DEVICES={both}")));
    assert!(
        env_b[0].contains(&"CARMA_RESERVED_MIB=40960".to_string()),
        "whole GPU"
    );
    let mut uids = driver.prepared().claim_uids();
    uids.sort();
    assert_eq!(uids, ["uid-a", "uid-b"]);

    // Preparing again (kubelet retries) gives the same answer.
    let again = kubelet
        .node_prepare_resources(NodePrepareResourcesRequest {
            claims: vec![kubelet_claim("train-a", "uid-a")],
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(again.claims["uid-a"], answer.claims["uid-a"]);

    let spec_a = dir.path().join("cdi/gpu.carma.io-claim_uid-a.json");
    let gone = kubelet
        .node_unprepare_resources(NodeUnprepareResourcesRequest {
            claims: vec![kubelet_claim("train-a", "uid-a")],
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(gone.claims["uid-a"].error, "");
    assert!(!spec_a.exists());
    assert_eq!(driver.prepared().claim_uids(), ["uid-b"]);
    // Unprepare is idempotent, also for a claim this process never prepared.
    let again = kubelet
        .node_unprepare_resources(NodeUnprepareResourcesRequest {
            claims: vec![
                kubelet_claim("train-a", "uid-a"),
                kubelet_claim("old", "uid-old"),
            ],
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(again.claims.len(), 2);
    assert!(again.claims.values().all(|c| c.error.is_empty()));
    driver.shutdown().await;
}

#[tokio::test]
async fn a_subrequest_is_answered_under_its_parent_request() {
    // A `firstAvailable` request `train` whose subrequest `big` was chosen: the allocation result
    // names `train/big`, but a container's `resources.claims[].request` names `train`, and the
    // kubelet matches the answer's request names exactly against that.
    let dir = tempfile::tempdir().unwrap();
    let claims = StaticClaims::default();
    claims.insert(claim(
        "fa",
        "uid-fa",
        &[
            (
                "gpu.carma.io",
                NODE,
                "gpu-2",
                "train/big",
                Some("8Gi"),
                None,
            ),
            ("gpu.carma.io", NODE, "gpu-0", "eval", Some("2Gi"), None),
        ],
    ));
    let driver = start(dir.path(), &claims).await;
    let mut kubelet = DraPluginClient::new(uds_channel(driver.dra_socket()).await.unwrap());
    let answer = kubelet
        .node_prepare_resources(NodePrepareResourcesRequest {
            claims: vec![kubelet_claim("fa", "uid-fa")],
        })
        .await
        .unwrap()
        .into_inner();
    let fa = &answer.claims["uid-fa"];
    assert_eq!(fa.error, "");
    let got: Vec<(&str, Vec<String>, Vec<String>)> = fa
        .devices
        .iter()
        .map(|d| {
            (
                d.device_name.as_str(),
                d.request_names.clone(),
                d.cdi_device_ids.clone(),
            )
        })
        .collect();
    assert_eq!(
        got,
        [
            (
                "gpu-2",
                vec!["train".to_string()],
                // The CDI name keeps the subrequest: it only has to be unique in the claim.
                vec!["gpu.carma.io/claim=uid-fa-train.big-gpu-2".to_string()]
            ),
            (
                "gpu-0",
                vec!["eval".to_string()],
                vec!["gpu.carma.io/claim=uid-fa-eval-gpu-0".to_string()]
            ),
        ]
    );
    driver.shutdown().await;
}

/// Poll `done` for up to 10 s.
async fn eventually(what: &str, done: impl Fn() -> bool) {
    for _ in 0..200 {
        if done() {
            return;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("not within 10 s: {what}");
}

#[tokio::test]
async fn orphaned_carma_specs_are_removed_at_start_and_periodically_and_nobody_elses() {
    let dir = tempfile::tempdir().unwrap();
    let cdi = dir.path().join("cdi");
    std::fs::create_dir_all(&cdi).unwrap();
    let file = |name: &str| cdi.join(name);
    let kept = file("gpu.carma.io-claim_uid-kept.json");
    let orphan = file("gpu.carma.io-claim_uid-gone.json");
    let torn = file("gpu.carma.io-claim_uid-torn.json.tmp");
    let others = [
        file("nvidia.com-gpu.json"),
        file("nvidia.yaml"),
        file("k8s.gpu.nvidia.com-claim_uid-gone.json"),
    ];
    for f in [&kept, &orphan, &torn].into_iter().chain(&others) {
        std::fs::write(f, b"{}").unwrap();
    }
    // A claim prepared before a restart, as the checkpoint records it.
    checkpoint::save(
        &checkpoint::checkpoint_path(&dir.path().join("plugins/gpu.carma.io")),
        &PreparedClaims::from([("uid-kept".to_string(), Vec::new())]),
    )
    .unwrap();
    let claims = StaticClaims::default();
    claims.insert(claim(
        "live",
        "uid-live",
        &[("gpu.carma.io", NODE, "gpu-1", "gpu", Some("4Gi"), None)],
    ));
    let driver = start_with(dir.path(), &claims, |c| {
        c.cdi_sweep_interval = Duration::from_millis(200);
    })
    .await;
    // At start, before the first call is served.
    assert!(!orphan.exists(), "an orphaned spec is removed at start");
    assert!(!torn.exists(), "a torn temporary spec is removed at start");
    assert!(kept.exists(), "a checkpointed claim keeps its spec");
    assert_eq!(driver.prepared().claim_uids(), ["uid-kept"]);

    let mut kubelet = DraPluginClient::new(uds_channel(driver.dra_socket()).await.unwrap());
    let answer = kubelet
        .node_prepare_resources(NodePrepareResourcesRequest {
            claims: vec![kubelet_claim("live", "uid-live")],
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(answer.claims["uid-live"].error, "");
    let live = file("gpu.carma.io-claim_uid-live.json");
    // Periodically: a spec left behind later goes too, the prepared ones stay.
    let late = file("gpu.carma.io-claim_uid-late.json");
    std::fs::write(&late, b"{}").unwrap();
    eventually("the late orphan is swept", || !late.exists()).await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(live.exists() && kept.exists());
    for f in &others {
        assert!(f.exists(), "{} is not carma's", f.display());
    }
    driver.shutdown().await;
}

#[tokio::test]
async fn a_restarted_driver_keeps_the_specs_of_the_claims_it_prepared() {
    let dir = tempfile::tempdir().unwrap();
    let claims = StaticClaims::default();
    claims.insert(claim(
        "train",
        "uid-t",
        &[("gpu.carma.io", NODE, "gpu-2", "gpu", Some("6Gi"), None)],
    ));
    let fast = |c: &mut Config| c.cdi_sweep_interval = Duration::from_millis(100);
    let driver = start_with(dir.path(), &claims, fast).await;
    let mut kubelet = DraPluginClient::new(uds_channel(driver.dra_socket()).await.unwrap());
    let answer = kubelet
        .node_prepare_resources(NodePrepareResourcesRequest {
            claims: vec![kubelet_claim("train", "uid-t")],
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(answer.claims["uid-t"].error, "");
    driver.shutdown().await;

    // The kubelet does not prepare a running claim again after a restart.
    let spec = dir.path().join("cdi/gpu.carma.io-claim_uid-t.json");
    let driver = start_with(dir.path(), &claims, fast).await;
    tokio::time::sleep(Duration::from_millis(400)).await;
    assert!(
        spec.exists(),
        "the spec of a prepared claim survives restart and sweeps"
    );
    assert_eq!(driver.prepared().claim_uids(), ["uid-t"]);
    let ctx = driver.prepared().sample_context();
    assert_eq!(
        ctx.pods_by_gpu[&simulated_uuid(NODE, 2)][0].reserved_mib,
        6144,
        "the load on the GPU is known again"
    );
    let mut kubelet = DraPluginClient::new(uds_channel(driver.dra_socket()).await.unwrap());
    let gone = kubelet
        .node_unprepare_resources(NodeUnprepareResourcesRequest {
            claims: vec![kubelet_claim("train", "uid-t")],
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(gone.claims["uid-t"].error, "");
    assert!(!spec.exists());
    driver.shutdown().await;

    // Without a checkpoint (a driver that kept none), the specs present are adopted, not swept.
    std::fs::remove_file(dir.path().join("plugins/gpu.carma.io/checkpoint.json")).unwrap();
    let old = dir.path().join("cdi/gpu.carma.io-claim_uid-old.json");
    std::fs::write(&old, b"{}").unwrap();
    let driver = start_with(dir.path(), &claims, fast).await;
    tokio::time::sleep(Duration::from_millis(400)).await;
    assert!(old.exists());
    assert_eq!(driver.prepared().claim_uids(), ["uid-old"]);
    driver.shutdown().await;
}

#[tokio::test]
async fn claims_that_are_not_this_nodes_fail_one_by_one() {
    let dir = tempfile::tempdir().unwrap();
    let claims = StaticClaims::default();
    claims.insert(claim(
        "ok",
        "uid-ok",
        &[("gpu.carma.io", NODE, "gpu-2", "gpu", Some("4Gi"), None)],
    ));
    claims.insert(claim(
        "elsewhere",
        "uid-else",
        &[(
            "gpu.carma.io",
            "gpu-node-2",
            "gpu-0",
            "gpu",
            Some("4Gi"),
            None,
        )],
    ));
    claims.insert(claim(
        "no-such-gpu",
        "uid-nogpu",
        &[("gpu.carma.io", NODE, "gpu-9", "gpu", Some("4Gi"), None)],
    ));
    claims.insert(claim(
        "recreated",
        "uid-new",
        &[("gpu.carma.io", NODE, "gpu-0", "gpu", Some("4Gi"), None)],
    ));
    let mut pending = claim("pending", "uid-pending", &[]);
    pending.status = None;
    claims.insert(pending);
    let driver = start(dir.path(), &claims).await;
    let mut kubelet = DraPluginClient::new(uds_channel(driver.dra_socket()).await.unwrap());
    let answer = kubelet
        .node_prepare_resources(NodePrepareResourcesRequest {
            claims: vec![
                kubelet_claim("ok", "uid-ok"),
                kubelet_claim("elsewhere", "uid-else"),
                kubelet_claim("no-such-gpu", "uid-nogpu"),
                kubelet_claim("recreated", "uid-old"),
                kubelet_claim("pending", "uid-pending"),
                kubelet_claim("missing", "uid-missing"),
            ],
        })
        .await
        .unwrap()
        .into_inner();
    let error = |uid: &str| answer.claims[uid].error.clone();
    assert_eq!(error("uid-ok"), "");
    assert!(
        error("uid-else").contains("pool gpu-node-2"),
        "{}",
        error("uid-else")
    );
    assert!(
        error("uid-nogpu").contains("gpu-9"),
        "{}",
        error("uid-nogpu")
    );
    assert!(
        error("uid-old").contains("has UID uid-new"),
        "{}",
        error("uid-old")
    );
    assert!(
        error("uid-pending").contains("not allocated"),
        "{}",
        error("uid-pending")
    );
    assert!(
        error("uid-missing").contains("not found"),
        "{}",
        error("uid-missing")
    );
    for uid in [
        "uid-else",
        "uid-nogpu",
        "uid-old",
        "uid-pending",
        "uid-missing",
    ] {
        assert!(answer.claims[uid].devices.is_empty());
        assert!(
            !dir.path()
                .join(format!("cdi/gpu.carma.io-claim_{uid}.json"))
                .exists()
        );
    }
    assert_eq!(driver.prepared().claim_uids(), ["uid-ok"]);
    driver.shutdown().await;
}

#[tokio::test]
async fn the_driver_offers_one_shareable_device_per_gpu_and_taints_an_unhealthy_one() {
    let dir = tempfile::tempdir().unwrap();
    let driver = start(dir.path(), &StaticClaims::default()).await;
    let mut devices = driver.devices();
    let first = devices.wait_for(|d| !d.is_empty()).await.unwrap().clone();
    assert_eq!(first.len(), 4);
    assert!(
        first
            .iter()
            .all(|d| d.allow_multiple_allocations == Some(true))
    );
    assert_eq!(
        first[2].capacity.as_ref().unwrap()["memory"].value.0,
        "40960Mi"
    );
    driver.simulated().unwrap().set_health(2, Some("XID 79"));
    let tainted = tokio::time::timeout(
        Duration::from_secs(5),
        devices.wait_for(|d| {
            d[2].taints
                .as_ref()
                .is_some_and(|t| t.iter().any(|t| t.key == "gpu.carma.io/unhealthy"))
        }),
    )
    .await
    .expect("the unhealthy GPU is tainted within 5 s")
    .unwrap()
    .clone();
    assert!(
        tainted[0]
            .taints
            .iter()
            .flatten()
            .all(|t| t.key != "gpu.carma.io/unhealthy")
    );
    driver.shutdown().await;
}

/// Two GPUs whose SM activity (and occupancy, DRAM activity) the test sets; it records the
/// context of the last sample.
#[derive(Debug, Default)]
struct ScriptedBackend {
    load: parking_lot::Mutex<[f64; 2]>,
    last_context: parking_lot::Mutex<Option<carma_gpu::backends::SampleContext>>,
}

impl carma_gpu::backends::GpuBackend for ScriptedBackend {
    fn name(&self) -> &'static str {
        "scripted"
    }

    fn sample<'a>(
        &'a self,
        ctx: &'a carma_gpu::backends::SampleContext,
    ) -> futures::future::BoxFuture<
        'a,
        Result<Vec<carma_gpu::backends::GpuSample>, carma_gpu::backends::BackendError>,
    > {
        use carma_gpu::backends::{Activity, ActivitySource, GpuSample};
        *self.last_context.lock() = Some(ctx.clone());
        let load = *self.load.lock();
        Box::pin(async move {
            Ok((0..2u32)
                .map(|i| {
                    let mut s = GpuSample::basic(i, format!("GPU-{i}"), "m", 40 << 30, 0);
                    let l = load[i as usize];
                    s.sm_activity = Activity::new(l, ActivitySource::Dcgm);
                    s.sm_occupancy = Activity::new(l, ActivitySource::Dcgm);
                    s.dram_activity = Activity::new(l, ActivitySource::Dcgm);
                    s
                })
                .collect())
        })
    }
}

#[tokio::test]
async fn the_gate_taint_follows_the_measured_sm_activity_and_prepared_claims_reach_the_backend() {
    let dir = tempfile::tempdir().unwrap();
    let claims = StaticClaims::default();
    claims.insert(claim(
        "a",
        "uid-a",
        &[("gpu.carma.io", NODE, "gpu-1", "gpu", Some("12Gi"), None)],
    ));
    let backend = Arc::new(ScriptedBackend::default());
    let mut config = Config::new(NODE, BackendKind::Simulated);
    config.registry_dir = dir.path().join("registry");
    config.plugin_dir = dir.path().join("plugin");
    config.cdi_dir = dir.path().join("cdi");
    config.backend.sample_interval = Duration::from_millis(50);
    config.backend.window = 1;
    let driver = carma_dra_driver::start(
        config,
        Dependencies {
            backend: Some(backend.clone()),
            claims: Some(Arc::new(claims)),
            ..Default::default()
        },
    )
    .await
    .unwrap();
    let gate = |d: &[k8s_openapi::api::resource::v1::Device], i: usize| {
        d[i].taints
            .iter()
            .flatten()
            .any(|t| t.key == "gpu.carma.io/utilization-gate" && t.effect == "NoSchedule")
    };
    let wait = Duration::from_secs(5);
    let mut devices = driver.devices();
    tokio::time::timeout(
        wait,
        devices.wait_for(|d| d.len() == 2 && !gate(d, 0) && !gate(d, 1)),
    )
    .await
    .expect("idle GPUs are untainted")
    .unwrap();

    *backend.load.lock() = [0.1, 0.95];
    let d = tokio::time::timeout(wait, devices.wait_for(|d| gate(d, 1)))
        .await
        .expect("the busy GPU is tainted")
        .unwrap()
        .clone();
    assert!(!gate(&d, 0), "the idle GPU stays open");
    *backend.load.lock() = [0.1, 0.5];
    tokio::time::timeout(wait, devices.wait_for(|d| !gate(d, 1)))
        .await
        .expect("the taint is lifted once the GPU is below the caps")
        .unwrap();

    let mut kubelet = DraPluginClient::new(uds_channel(driver.dra_socket()).await.unwrap());
    let answer = kubelet
        .node_prepare_resources(NodePrepareResourcesRequest {
            claims: vec![kubelet_claim("a", "uid-a")],
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(answer.claims["uid-a"].error, "");
    tokio::time::sleep(Duration::from_millis(200)).await;
    let ctx = backend.last_context.lock().clone().unwrap();
    let on_gpu1 = &ctx.pods_by_gpu["GPU-1"];
    assert_eq!(
        (on_gpu1[0].uid.as_str(), on_gpu1[0].reserved_mib),
        ("uid-a", 12288)
    );
    driver.shutdown().await;
}

/// Status and body of `GET path` from the driver's HTTP listener.
async fn http_get(addr: std::net::SocketAddr, path: &str) -> (u16, String) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
    s.write_all(format!("GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n").as_bytes())
        .await
        .unwrap();
    let mut answer = String::new();
    s.read_to_string(&mut answer).await.unwrap();
    let status = answer[9..12].parse().unwrap();
    let body = answer
        .split_once("\r\n\r\n")
        .map(|(_, b)| b.to_string())
        .unwrap_or_default();
    (status, body)
}

/// `GET path` until it answers `status`, for up to 10 s; the last body.
async fn http_until(addr: std::net::SocketAddr, path: &str, status: u16) -> String {
    let mut last = (0, String::new());
    for _ in 0..100 {
        last = http_get(addr, path).await;
        if last.0 == status {
            return last.1;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!("GET {path}: not {status} within 10 s, last {last:?}");
}

#[tokio::test]
async fn both_sockets_serve_grpc_health_and_healthz_checks_them_over_the_sockets() {
    use tonic_health::pb::HealthCheckRequest;
    use tonic_health::pb::health_client::HealthClient;

    let dir = tempfile::tempdir().unwrap();
    let driver = start_with(dir.path(), &StaticClaims::default(), |c| {
        c.metrics_addr = Some(([127, 0, 0, 1], 0).into());
        c.health_check_interval = Duration::from_millis(100);
    })
    .await;
    // A kubelet-like client asks each socket's grpc.health.v1 service.
    for (socket, service) in [
        (
            driver.dra_socket(),
            "k8s.io.kubelet.pkg.apis.dra.v1.DRAPlugin",
        ),
        (
            driver.registration_socket(),
            "pluginregistration.Registration",
        ),
    ] {
        let mut health = HealthClient::new(uds_channel(socket).await.unwrap());
        for name in ["", service] {
            let answer = health
                .check(HealthCheckRequest {
                    service: name.into(),
                })
                .await
                .unwrap_or_else(|e| panic!("{} {name:?}: {e}", socket.display()))
                .into_inner();
            assert_eq!(answer.status, 1, "SERVING: {} {name:?}", socket.display());
        }
    }
    let addr = driver.metrics_addr().unwrap();
    // Liveness answers 200 while a socket is still `starting` (not yet checked), so wait for the
    // body that says both were checked, not just for the status.
    let mut live = String::new();
    for _ in 0..100 {
        live = http_until(addr, "/healthz", 200).await;
        if !live.contains("starting") {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(live, "dra=serving registration=serving\n");
    // Not ready until the kubelet registered the driver.
    let ready = http_get(addr, "/readyz").await;
    assert_eq!(ready.0, 503, "{ready:?}");
    assert!(ready.1.ends_with("registered=false\n"), "{ready:?}");
    let mut reg = RegistrationClient::new(uds_channel(driver.registration_socket()).await.unwrap());
    reg.notify_registration_status(RegistrationStatus {
        plugin_registered: true,
        error: String::new(),
    })
    .await
    .unwrap();
    let ready = http_until(addr, "/readyz", 200).await;
    assert_eq!(
        ready,
        "dra=serving registration=serving sampled=true registered=true\n"
    );
    let (status, metrics) = http_get(addr, "/metrics").await;
    assert_eq!(status, 200);
    for line in [
        "carma_dra_driver_grpc_serving{socket=\"dra\"} 1",
        "carma_dra_driver_kubelet_registered 1",
        "carma_dra_driver_devices_published 4",
        "carma_dra_driver_prepares_total{result=\"ok\"} 0",
    ] {
        assert!(metrics.contains(line), "{line} missing in\n{metrics}");
    }

    // The DRA socket is gone (what a kubelet would find for a hung or vanished server): the next
    // checks fail and so does liveness, though the server task itself still runs.
    std::fs::remove_file(driver.dra_socket()).unwrap();
    let live = http_until(addr, "/healthz", 503).await;
    assert!(live.starts_with("dra=cannot connect"), "{live}");
    assert!(live.ends_with("registration=serving\n"), "{live}");
    driver.shutdown().await;
}

#[tokio::test]
async fn prepare_and_unprepare_are_counted_by_result() {
    let dir = tempfile::tempdir().unwrap();
    let claims = StaticClaims::default();
    let driver = start(dir.path(), &claims).await;
    let mut client = DraPluginClient::new(uds_channel(driver.dra_socket()).await.unwrap());
    // A claim the API server does not have: an error for that claim.
    let answer = client
        .node_prepare_resources(NodePrepareResourcesRequest {
            claims: vec![kubelet_claim("gone", "uid-gone")],
        })
        .await
        .unwrap()
        .into_inner();
    assert!(!answer.claims["uid-gone"].error.is_empty());
    client
        .node_unprepare_resources(NodeUnprepareResourcesRequest {
            claims: vec![kubelet_claim("gone", "uid-gone")],
        })
        .await
        .unwrap();
    let text = driver.metrics().encode().unwrap();
    for line in [
        "carma_dra_driver_prepares_total{result=\"error\"} 1",
        "carma_dra_driver_prepares_total{result=\"ok\"} 0",
        "carma_dra_driver_unprepares_total{result=\"ok\"} 1",
        "carma_dra_driver_prepare_duration_seconds_count 1",
        "carma_dra_driver_unprepare_duration_seconds_count 1",
    ] {
        assert!(text.contains(line), "{line} missing in\n{text}");
    }
    driver.shutdown().await;
}

#[tokio::test]
async fn run_until_the_signal_stops_the_driver_promptly() {
    let dir = tempfile::tempdir().unwrap();
    let driver = start_with(dir.path(), &StaticClaims::default(), |c| {
        c.metrics_addr = Some(([127, 0, 0, 1], 0).into());
    })
    .await;
    let addr = driver.metrics_addr().unwrap();
    // A scraper's kept-alive connection stays open meanwhile.
    let (status, _) = http_get(addr, "/metrics").await;
    assert_eq!(status, 200);
    let began = std::time::Instant::now();
    let run = driver.run_until(tokio::time::sleep(Duration::from_millis(300)));
    tokio::time::timeout(Duration::from_secs(5), run)
        .await
        .expect("stopped within 5 s")
        .unwrap();
    assert!(began.elapsed() < Duration::from_secs(5));
}

/// As `carma dra-driver` runs (two workers, an API server that does not answer, health checks
/// going on): the signal stops every part within the grace.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn run_until_stops_promptly_with_an_unreachable_api_server() {
    let dir = tempfile::tempdir().unwrap();
    let mut config = Config::new(NODE, BackendKind::Simulated);
    config.registry_dir = dir.path().join("plugins_registry");
    config.plugin_dir = dir.path().join("plugins/gpu.carma.io");
    config.cdi_dir = dir.path().join("cdi");
    config.metrics_addr = Some(([127, 0, 0, 1], 0).into());
    config.health_check_interval = Duration::from_millis(20);
    let kube =
        kube::Client::try_from(kube::Config::new("http://127.0.0.1:1".parse().unwrap())).unwrap();
    let deps = Dependencies {
        kube: Some(kube),
        ..Default::default()
    };
    let driver = carma_dra_driver::start(config, deps).await.unwrap();
    tokio::time::sleep(Duration::from_secs(3)).await;
    let began = std::time::Instant::now();
    tokio::time::timeout(
        Duration::from_secs(8),
        driver.run_until(tokio::time::sleep(Duration::from_millis(100))),
    )
    .await
    .expect("stopped within 8 s")
    .unwrap();
    assert!(began.elapsed() < Duration::from_secs(8));
}
