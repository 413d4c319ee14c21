//! Generated clusters and kube-scheduler-shaped objects, for tests, benchmarks,
//! examples and fuzz targets. Deterministic: the same arguments give the same objects.
//!
//! Built only with the `test-fixtures` feature (and for this crate's unit tests), so the
//! extender itself never carries them.

use carma_api::names::{RESOURCE_GPU, SCHEDULER_NAME};
use carma_api::{GpuNode, GpuNodeSpec, GpuNodeStatus, GpuPodStatus, GpuStatus};
use k8s_openapi::api::core::v1::Node;
use serde_json::{Value, json};

use crate::snapshot::Snapshot;

/// Memory of the generated GPUs (an A100 40 GB as NVML reports it).
pub const GPU_MIB: u64 = 40_960;

/// UUID of GPU `index` on node number `node`.
pub fn gpu_uuid(node: usize, index: usize) -> String {
    format!("GPU-{node:08x}-0000-4000-8000-{index:012x}")
}

/// One GPU's status with the given free memory and activity risk scores.
pub fn gpu(uuid: &str, index: u32, free_mib: u64, sm_activity: f64, processes: u32) -> GpuStatus {
    GpuStatus {
        index,
        uuid: uuid.to_string(),
        model: "NVIDIA A100-SXM4-40GB".into(),
        memory_total_mib: GPU_MIB,
        memory_free_mib: free_mib,
        sm_activity: Some(sm_activity),
        sm_occupancy: Some(sm_activity * 0.5),
        dram_activity: Some(sm_activity * 0.4),
        activity_source: "simulated".into(),
        gate_rule: carma_core::GateRule::SmactSmoccDrama.as_str().into(),
        sharing_allowed: None,
        power_watts: Some(60.0 + 300.0 * sm_activity),
        energy_joules: None,
        healthy: true,
        health_reason: None,
        processes,
        pods: Vec::<GpuPodStatus>::new(),
    }
}

/// A `GpuNode` named `name` with `gpus`.
pub fn gpu_node(name: &str, gpus: Vec<GpuStatus>) -> GpuNode {
    let mut g = GpuNode::new(
        name,
        GpuNodeSpec {
            backend: "simulated".into(),
            replicas_per_gpu: 8,
            mps: false,
        },
    );
    g.status = Some(GpuNodeStatus {
        gpu_count: u32::try_from(gpus.len()).unwrap_or(u32::MAX),
        pod_count: gpus.iter().map(|g| g.pods.len() as u32).sum(),
        summary: String::new(),
        updated_at: Some("2026-01-01T00:00:00Z".into()),
        gpus,
        recently_ended: Vec::new(),
    });
    g
}

/// A full v1 Node object as kube-scheduler sends it in `Nodes.items`.
pub fn node_json(name: &str, gpus: usize) -> Value {
    let replicas = (gpus * 8).to_string();
    json!({
        "metadata": {
            "name": name,
            "uid": format!("node-uid-{name}"),
            "resourceVersion": "81234",
            "creationTimestamp": "2026-01-01T00:00:00Z",
            "labels": {
                "kubernetes.io/hostname": name,
                "kubernetes.io/os": "linux",
                "kubernetes.io/arch": "amd64",
                "node.kubernetes.io/instance-type": "dgx-a100",
                "nvidia.com/gpu.product": "NVIDIA-A100-SXM4-40GB"
            },
            "annotations": {
                "node.alpha.kubernetes.io/ttl": "0",
                "volumes.kubernetes.io/controller-managed-attach-detach": "true"
            }
        },
        "spec": { "podCIDR": "10.244.1.0/24", "podCIDRs": ["10.244.1.0/24"] },
        "status": {
            "capacity": { "cpu": "128", "memory": "1056674536Ki", "pods": "110", (RESOURCE_GPU): replicas },
            "allocatable": { "cpu": "127", "memory": "1056572136Ki", "pods": "110", (RESOURCE_GPU): replicas },
            "conditions": [
                { "type": "MemoryPressure", "status": "False", "reason": "KubeletHasSufficientMemory",
                  "lastHeartbeatTime": "2026-01-01T00:00:00Z", "lastTransitionTime": "2026-01-01T00:00:00Z" },
                { "type": "DiskPressure", "status": "False", "reason": "KubeletHasNoDiskPressure",
                  "lastHeartbeatTime": "2026-01-01T00:00:00Z", "lastTransitionTime": "2026-01-01T00:00:00Z" },
                { "type": "Ready", "status": "True", "reason": "KubeletReady", "message": "kubelet is posting ready status",
                  "lastHeartbeatTime": "2026-01-01T00:00:00Z", "lastTransitionTime": "2026-01-01T00:00:00Z" }
            ],
            "addresses": [ { "type": "InternalIP", "address": "10.0.0.1" }, { "type": "Hostname", "address": name } ],
            "nodeInfo": {
                "machineID": "0123456789abcdef", "systemUUID": "4c4c4544-0000", "bootID": "b0000000-0000",
                "kernelVersion": "6.8.0-45-generic", "osImage": "Ubuntu 24.04.1 LTS",
                "containerRuntimeVersion": "containerd://1.7.22", "kubeletVersion": "v1.35.0",
                "kubeProxyVersion": "", "operatingSystem": "linux", "architecture": "amd64"
            }
        }
    })
}

/// A Kubernetes `Node` named `name`.
pub fn node(name: &str, gpus: usize) -> Node {
    // The JSON above is a valid Node by construction.
    serde_json::from_value(node_json(name, gpus)).unwrap_or_default()
}

/// Name of generated node `i`.
pub fn node_name(i: usize) -> String {
    format!("gpu-node-{i:05}")
}

/// A cluster of `nodes` nodes with `gpus_per_node` busy A100s each: free memory
/// between 8 and 38 GiB, SM activity between 0 and 0.9 (some GPUs fail the
/// utilization gate), one compute process per GPU, so every GPU is judged by
/// the full collocation rules (no exclusive-first shortcut).
pub fn cluster(nodes: usize, gpus_per_node: usize) -> Snapshot {
    let mut s = Snapshot::default();
    for i in 0..nodes {
        let name = node_name(i);
        s.nodes.push(node(&name, gpus_per_node));
        let gpus = (0..gpus_per_node)
            .map(|j| {
                let used_gib = ((i * 7 + j * 13) % 31) as u64 + 2;
                let smact = ((i + 3 * j) % 10) as f64 / 10.0;
                gpu(
                    &gpu_uuid(i, j),
                    j as u32,
                    GPU_MIB - used_gib * 1024,
                    smact,
                    1,
                )
            })
            .collect();
        s.gpu_nodes.push(gpu_node(&name, gpus));
    }
    s
}

/// [`cluster`] with one running carma pod on every other GPU (reserving 4,000
/// MiB, visible in telemetry), so that the ledger holds `nodes × gpus / 2`
/// placements, as in a busy shared cluster.
pub fn loaded_cluster(nodes: usize, gpus_per_node: usize) -> Snapshot {
    let mut s = cluster(nodes, gpus_per_node);
    for (i, gn) in s.gpu_nodes.iter_mut().enumerate() {
        let name = node_name(i);
        let Some(status) = gn.status.as_mut() else {
            continue;
        };
        for (j, g) in status
            .gpus
            .iter_mut()
            .enumerate()
            .filter(|(j, _)| j % 2 == 0)
        {
            let pod = format!("train-{i}-{j}");
            let uid = format!("{i:08x}-{j:04x}-4000-8000-000000000000");
            g.pods.push(GpuPodStatus {
                namespace: "ml".into(),
                name: pod.clone(),
                uid: uid.clone(),
                reserved_mib: 4_000,
                observed_mib: Some(3_500),
                peak_mib: None,
            });
            let ann = [
                (carma_api::names::ANNOTATION_ASSIGNED_GPUS, g.uuid.as_str()),
                (
                    carma_api::names::ANNOTATION_ASSIGNED_AT,
                    "2026-01-01T00:00:00.000Z",
                ),
                (carma_api::names::ANNOTATION_ASSIGNED_NODE, name.as_str()),
                (
                    carma_api::names::ANNOTATION_ESTIMATE,
                    r#"{"mib":4000,"source":"gpumemnet-mlp","class":"(3000,4000]"}"#,
                ),
            ];
            let mut v = pod_json("ml", &pod, &uid, 1, &ann);
            v["spec"]["nodeName"] = json!(name);
            v["status"]["phase"] = json!("Running");
            if let Ok(p) = serde_json::from_value(v) {
                s.pods.push(p);
            }
        }
    }
    s
}

/// A pending training pod exactly as kube-scheduler sends it (`Pod` of
/// `ExtenderArgs`): scheduler `carma-scheduler`, `carma.io/gpu` = `gpus` in the
/// limits and requests of its one training container, and `annotations`.
pub fn pod_json(
    namespace: &str,
    name: &str,
    uid: &str,
    gpus: u32,
    annotations: &[(&str, &str)],
) -> Value {
    let mut ann = serde_json::Map::new();
    for (k, v) in annotations {
        ann.insert((*k).to_string(), Value::String((*v).to_string()));
    }
    let gpu = gpus.to_string();
    json!({
        "metadata": {
            "name": name,
            "namespace": namespace,
            "uid": uid,
            "resourceVersion": "912345",
            "creationTimestamp": "2026-01-01T00:00:00Z",
            "labels": { "app.kubernetes.io/name": "resnet50-train", "carma.io/task": name, "carma.io/attempt": "1" },
            "annotations": ann,
            "ownerReferences": [ {
                "apiVersion": "carma.io/v1alpha1", "kind": "TrainingTask", "name": name,
                "uid": "0f0e0d0c-0000-4000-8000-000000000001", "controller": true, "blockOwnerDeletion": true
            } ],
            "managedFields": [ {
                "manager": "carma-operator", "operation": "Update", "apiVersion": "v1",
                "time": "2026-01-01T00:00:00Z", "fieldsType": "FieldsV1",
                "fieldsV1": { "f:metadata": { "f:annotations": {}, "f:labels": {} }, "f:spec": { "f:containers": {} } }
            } ]
        },
        "spec": {
            "schedulerName": SCHEDULER_NAME,
            "containers": [ {
                "name": "train",
                "image": "nvcr.io/nvidia/pytorch:24.10-py3",
                "command": ["python", "train.py"],
                "args": ["--model", "resnet50", "--batch-size", "64", "--epochs", "1"],
                "env": [ { "name": "NCCL_DEBUG", "value": "WARN" } ],
                "resources": {
                    "limits": { (RESOURCE_GPU): gpu, "cpu": "8", "memory": "32Gi" },
                    "requests": { (RESOURCE_GPU): gpu, "cpu": "4", "memory": "16Gi" }
                },
                "volumeMounts": [
                    { "name": "data", "mountPath": "/data", "readOnly": true },
                    { "name": "kube-api-access-abcde", "mountPath": "/var/run/secrets/kubernetes.io/serviceaccount", "readOnly": true }
                ],
                "terminationMessagePath": "/dev/termination-log",
                "terminationMessagePolicy": "FallbackToLogsOnError",
                "imagePullPolicy": "IfNotPresent"
            } ],
            "volumes": [
                { "name": "data", "persistentVolumeClaim": { "claimName": "imagenet" } },
                { "name": "kube-api-access-abcde", "projected": { "defaultMode": 420, "sources": [
                    { "serviceAccountToken": { "expirationSeconds": 3607, "path": "token" } },
                    { "configMap": { "name": "kube-root-ca.crt", "items": [ { "key": "ca.crt", "path": "ca.crt" } ] } }
                ] } }
            ],
            "restartPolicy": "Never",
            "terminationGracePeriodSeconds": 30,
            "dnsPolicy": "ClusterFirst",
            "serviceAccountName": "default",
            "serviceAccount": "default",
            "securityContext": {},
            "priority": 0,
            "enableServiceLinks": true,
            "preemptionPolicy": "PreemptLowerPriority",
            "tolerations": [
                { "key": "node.kubernetes.io/not-ready", "operator": "Exists", "effect": "NoExecute", "tolerationSeconds": 300 },
                { "key": "node.kubernetes.io/unreachable", "operator": "Exists", "effect": "NoExecute", "tolerationSeconds": 300 }
            ]
        },
        "status": {
            "phase": "Pending",
            "qosClass": "Burstable",
            "conditions": [ {
                "type": "PodScheduled", "status": "False", "reason": "Unschedulable",
                "lastTransitionTime": "2026-01-01T00:00:00Z", "lastProbeTime": null
            } ]
        }
    })
}

/// The model profile of the benchmark pod (an MLP, estimated by GPUMemNet).
pub const BENCH_PROFILE: &str = r#"{"family":"mlp","batchSize":256,"parameters":2000000,"activations":6000,"depth":5,"activation":"ReLU","layers":{"linear":5}}"#;

/// kube-scheduler's filter/prioritize body for one single-GPU pod (with
/// [`BENCH_PROFILE`]) against the first `nodes` nodes of [`cluster`]:
/// `NodeNames` (`nodeCacheCapable: true`) or full `Nodes` objects.
pub fn extender_args_body(nodes: usize, node_cache_capable: bool) -> Vec<u8> {
    let pod = pod_json(
        "ml",
        "bench-pod",
        "00000000-0000-4000-8000-00000000beef",
        1,
        &[(carma_api::names::ANNOTATION_MODEL_PROFILE, BENCH_PROFILE)],
    );
    args_body(&pod, nodes, node_cache_capable)
}

/// kube-scheduler's filter/prioritize body for `pod` against the first `nodes`
/// nodes of [`cluster`].
pub fn args_body(pod: &Value, nodes: usize, node_cache_capable: bool) -> Vec<u8> {
    let body = if node_cache_capable {
        let names: Vec<String> = (0..nodes).map(node_name).collect();
        json!({ "Pod": pod, "Nodes": null, "NodeNames": names })
    } else {
        let items: Vec<Value> = (0..nodes).map(|i| node_json(&node_name(i), 8)).collect();
        json!({ "Pod": pod, "Nodes": { "metadata": {}, "items": items }, "NodeNames": null })
    };
    serde_json::to_vec(&body).unwrap_or_default()
}
