//! The device plugin against the project's own fake kubelet, over real Unix sockets in a tempdir:
//! Register, ListAndWatch, GetPreferredAllocation, Allocate, kubelet restart, health change.

mod common;

use std::sync::Arc;
use std::time::Duration;

use carma_device_plugin::config::SimulatedGpus;
use carma_device_plugin::proto::{
    AllocateRequest, ContainerAllocateRequest, ContainerPreferredAllocationRequest, Empty,
    PreferredAllocationRequest,
};
use carma_device_plugin::{Dependencies, MpsConfig, start};
use carma_gpu::backends::simulated::simulated_uuid;
use common::*;
use tokio_stream::StreamExt;

const NODE: &str = "gpu-node-1";
const WAIT: Duration = Duration::from_secs(10);

fn alloc(ids: &[String]) -> AllocateRequest {
    AllocateRequest {
        container_requests: vec![ContainerAllocateRequest {
            devices_ids: ids.to_vec(),
        }],
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn registers_lists_and_follows_health_and_kubelet_restarts() {
    let dir = tempfile::tempdir().unwrap();
    let mut kubelet = FakeKubelet::start(dir.path());
    let running = start(test_config(NODE, dir.path()), Dependencies::default())
        .await
        .unwrap();

    let reg = kubelet.next_registration(WAIT).await;
    assert_eq!(reg.version, "v1beta1");
    assert_eq!(reg.resource_name, "carma.io/gpu");
    assert_eq!(reg.endpoint, "carma.sock");
    let opts = reg.options.unwrap();
    assert!(opts.get_preferred_allocation_available);
    assert!(!opts.pre_start_required);

    let socket = dir.path().join(&reg.endpoint);
    let mut client = plugin_client(&socket).await;
    let opts = client
        .get_device_plugin_options(Empty {})
        .await
        .unwrap()
        .into_inner();
    assert!(opts.get_preferred_allocation_available);

    // The full list at once: 4 GPUs × 4 replicas, all healthy, IDs <UUID>::<k>.
    let mut stream = client.list_and_watch(Empty {}).await.unwrap().into_inner();
    let first = stream.next().await.unwrap().unwrap();
    assert_eq!(first.devices.len(), 16);
    assert!(first.devices.iter().all(|d| d.health == "Healthy"));
    let gpu1 = simulated_uuid(NODE, 1);
    assert!(first.devices.iter().any(|d| d.id == format!("{gpu1}::3")));

    // Health change → a new list with GPU 1's replicas unhealthy.
    running
        .simulated()
        .unwrap()
        .set_health(1, Some("XID 79 (simulated)"));
    let next = tokio::time::timeout(WAIT, stream.next())
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    let unhealthy: Vec<&str> = next
        .devices
        .iter()
        .filter(|d| d.health == "Unhealthy")
        .map(|d| d.id.as_str())
        .collect();
    assert_eq!(unhealthy.len(), 4);
    assert!(unhealthy.iter().all(|id| id.starts_with(&gpu1)));
    running.simulated().unwrap().set_health(1, None);
    let healed = tokio::time::timeout(WAIT, stream.next())
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    assert!(healed.devices.iter().all(|d| d.health == "Healthy"));

    // Kubelet restart: sockets wiped, a new kubelet.sock → the plugin serves and registers again,
    // and the old ListAndWatch stream ends.
    kubelet.stop_and_wipe(dir.path()).await;
    let ended = tokio::time::timeout(WAIT, async {
        while let Some(item) = stream.next().await {
            if item.is_err() {
                break;
            }
        }
    })
    .await;
    assert!(ended.is_ok(), "the old ListAndWatch stream must end");
    let mut kubelet = FakeKubelet::start(dir.path());
    let again = kubelet.next_registration(WAIT).await;
    assert_eq!(again.resource_name, "carma.io/gpu");
    assert!(socket.exists(), "the plugin socket is back");
    let mut client = plugin_client(&socket).await;
    let mut stream = client.list_and_watch(Empty {}).await.unwrap().into_inner();
    assert_eq!(stream.next().await.unwrap().unwrap().devices.len(), 16);

    // Only the kubelet.sock re-created (plugin socket kept): registers again too.
    let _ = std::fs::remove_file(dir.path().join("kubelet.sock"));
    let mut kubelet2 = FakeKubelet::start(dir.path());
    kubelet2.next_registration(WAIT).await;
    drop(kubelet);

    // Graceful shutdown removes the socket.
    running.shutdown().await;
    assert!(!socket.exists(), "socket removed on shutdown");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn allocate_chooses_among_pending_pods() {
    let dir = tempfile::tempdir().unwrap();
    let g: Vec<String> = (0..4).map(|i| simulated_uuid(NODE, i)).collect();
    let pods = Arc::new(FakePods::default());
    *pods.pods.lock() = vec![
        TestPod::new("a", NODE, &[&g[0]], "2026-01-01T10:00:05Z", 6000).info(),
        TestPod::new("b", NODE, &[&g[1]], "2026-01-01T10:00:01Z", 7000).info(),
        TestPod {
            allocated: true,
            ..TestPod::new("c", NODE, &[&g[2]], "2026-01-01T10:00:00Z", 5000)
        }
        .info(),
        TestPod::new("d", NODE, &[&g[0], &g[1]], "2026-01-01T09:00:00Z", 4000).info(),
        TestPod {
            scheduler: "default-scheduler",
            ..TestPod::new("e", NODE, &[], "", 0)
        }
        .info(),
        TestPod::new("f", "other-node", &[&g[3]], "2026-01-01T08:00:00Z", 1000).info(),
    ];
    let mut config = test_config(NODE, dir.path());
    config.mps = Some(MpsConfig::with_defaults());
    let running = start(
        config,
        Dependencies {
            pods: Some(pods.clone()),
            ..Default::default()
        },
    )
    .await
    .unwrap();
    let socket = running.socket().to_path_buf();
    eventually(WAIT, || {
        let socket = socket.clone();
        async move { socket.exists().then_some(()) }
    })
    .await;
    let mut client = plugin_client(&socket).await;
    let all: Vec<String> = g
        .iter()
        .flat_map(|u| (0..4).map(move |k| format!("{u}::{k}")))
        .collect();

    // Preferred allocation for one replica: the oldest pending 1-GPU pod is b → its GPU.
    let pref = client
        .get_preferred_allocation(PreferredAllocationRequest {
            container_requests: vec![ContainerPreferredAllocationRequest {
                available_device_i_ds: all.clone(),
                must_include_device_i_ds: vec![],
                allocation_size: 1,
            }],
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(
        pref.container_responses[0].device_i_ds,
        [format!("{}::0", g[1])]
    );
    // For two replicas: d's GPUs.
    let pref = client
        .get_preferred_allocation(PreferredAllocationRequest {
            container_requests: vec![ContainerPreferredAllocationRequest {
                available_device_i_ds: all.clone(),
                must_include_device_i_ds: vec![],
                allocation_size: 2,
            }],
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(
        pref.container_responses[0].device_i_ds,
        [format!("{}::0", g[0]), format!("{}::0", g[1])]
    );

    // 1 replica of a GPU nobody is assigned: the oldest pending 1-GPU pod (b), never that GPU.
    let r = client
        .allocate(alloc(&[format!("{}::2", g[3])]))
        .await
        .unwrap()
        .into_inner();
    let envs = &r.container_responses[0].envs;
    assert_eq!(envs["NVIDIA_VISIBLE_DEVICES"], g[1]);
    assert_eq!(envs["CARMA_ASSIGNED_GPUS"], g[1]);
    assert_eq!(envs["CARMA_RESERVED_MIB"], "7000");
    assert_eq!(envs["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"], "0=7000M");
    // In bytes; d (4000 MiB) is the only other pod on the GPU, so the limit is the reservation.
    assert_eq!(
        envs["NVIDIA_GPU_MEMORY_REQUEST"],
        (7000u64 << 20).to_string()
    );
    assert_eq!(envs["NVIDIA_GPU_MEMORY_LIMIT"], (7000u64 << 20).to_string());
    assert!(
        !envs.contains_key("CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"),
        "SMs are not split statically unless configured"
    );
    let mounts: Vec<&str> = r.container_responses[0]
        .mounts
        .iter()
        .map(|m| m.container_path.as_str())
        .collect();
    assert_eq!(
        mounts,
        ["/tmp/nvidia-mps", "/dev/shm", "/var/log/nvidia-mps"]
    );
    assert_eq!(pods.annotated.lock().as_slice(), ["ml/b"]);

    // Next 1-replica request naming GPU 0: a (exact match, and b is allocated now).
    let r = client
        .allocate(alloc(&[format!("{}::1", g[0])]))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(
        r.container_responses[0].envs["NVIDIA_VISIBLE_DEVICES"],
        g[0]
    );

    // Two replicas: d, both GPUs, in its assignment's order.
    let r = client
        .allocate(alloc(&[format!("{}::3", g[1]), format!("{}::3", g[0])]))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(
        r.container_responses[0].envs["NVIDIA_VISIBLE_DEVICES"],
        format!("{},{}", g[0], g[1])
    );
    assert_eq!(
        r.container_responses[0].envs["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"],
        "0=4000M,1=4000M"
    );
    assert_eq!(pods.annotated.lock().as_slice(), ["ml/b", "ml/a", "ml/d"]);

    // A pod bound a moment ago is only in a fresh list, and the API fails twice while the plugin
    // lists: the plugin retries (a failed Allocate is terminal for a bare pod).
    pods.pods
        .lock()
        .push(TestPod::new("g", NODE, &[&g[3]], "2026-01-01T11:00:00Z", 3000).info());
    *pods.fail_next.lock() = 2;
    let r = client
        .allocate(alloc(&[format!("{}::0", g[3])]))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(
        r.container_responses[0].envs["NVIDIA_VISIBLE_DEVICES"],
        g[3]
    );
    assert_eq!(
        *pods.fail_next.lock(),
        0,
        "both failures were met and retried"
    );

    // Nothing left: a gRPC error that says why, naming the pod of another scheduler.
    let err = client
        .allocate(alloc(&[format!("{}::0", g[2])]))
        .await
        .unwrap_err();
    assert_eq!(err.code(), tonic::Code::FailedPrecondition);
    let msg = err.message();
    assert!(
        msg.contains(&format!(
            "no pod on node {NODE} with a carma GPU assignment awaits allocation of 1 GPU(s)"
        )),
        "{msg}"
    );
    assert!(
        msg.contains("ml/e (schedulerName default-scheduler)"),
        "{msg}"
    );
    assert!(
        msg.contains("pods scheduled by another scheduler cannot use carma.io/gpu"),
        "{msg}"
    );

    // Device IDs that are not carma's.
    let err = client
        .allocate(alloc(&["nvidia0".to_string()]))
        .await
        .unwrap_err();
    assert!(
        err.message().contains("not carma.io/gpu replicas"),
        "{}",
        err.message()
    );

    let (code, body) = http_get(running.metrics_addr(), "/metrics").await;
    assert_eq!(code, 200);
    assert!(
        body.contains("carma_device_plugin_allocations_total{result=\"ok\"} 4"),
        "{body}"
    );
    assert!(
        body.contains("carma_device_plugin_allocations_total{result=\"no_pod\"} 1"),
        "{body}"
    );
    running.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn allocate_limits_memory_so_the_limits_on_a_gpu_fit_in_it() {
    let dir = tempfile::tempdir().unwrap();
    let g: Vec<String> = (0..2).map(|i| simulated_uuid(NODE, i)).collect();
    let pods = Arc::new(FakePods::default());
    // 16 GiB GPUs. On GPU 0 a running pod reserves 10000 MiB and a finished one 16000 MiB (its
    // memory is free again); the telemetry's free memory let a pod reserving 8000 MiB join.
    *pods.pods.lock() = vec![
        TestPod {
            allocated: true,
            phase: "Running",
            ..TestPod::new("big", NODE, &[&g[0]], "2026-01-01T09:00:00Z", 10000)
        }
        .info(),
        TestPod {
            allocated: true,
            phase: "Succeeded",
            ..TestPod::new("done", NODE, &[&g[0]], "2026-01-01T08:00:00Z", 16000)
        }
        .info(),
        TestPod::new("late", NODE, &[&g[0]], "2026-01-01T10:00:00Z", 8000).info(),
    ];
    let mut config = test_config(NODE, dir.path());
    config.backend.simulated_gpus = SimulatedGpus {
        count: 2,
        memory_mib: 16384,
    };
    let running = start(
        config,
        Dependencies {
            pods: Some(pods.clone()),
            ..Default::default()
        },
    )
    .await
    .unwrap();
    let socket = running.socket().to_path_buf();
    eventually(WAIT, || {
        let socket = socket.clone();
        async move { socket.exists().then_some(()) }
    })
    .await;
    let mut client = plugin_client(&socket).await;
    let r = client
        .allocate(alloc(&[format!("{}::1", g[0])]))
        .await
        .unwrap()
        .into_inner();
    let envs = &r.container_responses[0].envs;
    assert_eq!(envs["NVIDIA_VISIBLE_DEVICES"], g[0]);
    assert_eq!(
        envs["NVIDIA_GPU_MEMORY_REQUEST"],
        (8000u64 << 20).to_string()
    );
    assert_eq!(
        envs["NVIDIA_GPU_MEMORY_LIMIT"],
        ((16384u64 - 10000) << 20).to_string(),
        "what the running pod's reservation leaves of the GPU"
    );
    running.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn allocate_without_api_server_says_lookup_is_off() {
    let dir = tempfile::tempdir().unwrap();
    let running = start(test_config(NODE, dir.path()), Dependencies::default())
        .await
        .unwrap();
    let socket = running.socket().to_path_buf();
    eventually(WAIT, || {
        let socket = socket.clone();
        async move { socket.exists().then_some(()) }
    })
    .await;
    let mut client = plugin_client(&socket).await;
    let id = format!("{}::0", simulated_uuid(NODE, 0));
    let err = client.allocate(alloc(&[id])).await.unwrap_err();
    assert_eq!(err.code(), tonic::Code::FailedPrecondition);
    assert!(
        err.message().contains("pod lookup is off"),
        "{}",
        err.message()
    );
    // Readiness does not wait for kubelet; /healthz is fine.
    let (code, _) = http_get(running.metrics_addr(), "/healthz").await;
    assert_eq!(code, 200);
    let (code, body) = http_get(running.metrics_addr(), "/readyz").await;
    assert_eq!(code, 200, "{body}");
    running.shutdown().await;
}
