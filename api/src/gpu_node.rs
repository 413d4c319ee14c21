//! The `GpuNode` custom resource: one per GPU node, written by its device plugin.

#[cfg(feature = "kube")]
use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::condition::Condition;

/// Per-GPU inventory and telemetry of one node, published by carma's device plugin.
// Each `printcolumn(...)` repeats the keys `name`, `type_`, …; clippy reads them as duplicates.
#[allow(clippy::duplicated_attributes)]
#[derive(Deserialize, Serialize, Clone, Debug, PartialEq, Default, JsonSchema)]
#[cfg_attr(
    feature = "kube",
    derive(CustomResource),
    kube(
        group = "carma.io",
        version = "v1alpha1",
        kind = "GpuNode",
        status = "GpuNodeStatus",
        shortname = "gn",
        category = "carma",
        doc = "Per-GPU inventory and telemetry of one node, published by carma's device plugin.",
        printcolumn(
            name = "GPUs",
            type_ = "integer",
            json_path = ".status.gpuCount",
            description = "GPUs on the node"
        ),
        printcolumn(
            name = "Pods",
            type_ = "integer",
            json_path = ".status.podCount",
            description = "carma pods on the node's GPUs"
        ),
        printcolumn(
            name = "Summary",
            type_ = "string",
            json_path = ".status.summary",
            description = "Per-GPU memory use and SM activity"
        ),
        printcolumn(
            name = "Backend",
            type_ = "string",
            json_path = ".spec.backend",
            description = "Telemetry backend"
        ),
        printcolumn(
            name = "Updated",
            type_ = "date",
            json_path = ".status.updatedAt",
            description = "Last publication"
        )
    )
)]
#[serde(rename_all = "camelCase")]
pub struct GpuNodeSpec {
    /// Telemetry backend of the device plugin: nvml, dcgm or simulated.
    #[serde(default)]
    pub backend: String,
    /// Replicas advertised per GPU as carma.io/gpu.
    #[serde(default)]
    pub replicas_per_gpu: u32,
    /// Whether MPS memory and thread limits are applied to containers.
    #[serde(default)]
    pub mps: bool,
}

/// Observed state of a node's GPUs.
#[derive(Deserialize, Serialize, Clone, Debug, PartialEq, Default, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct GpuNodeStatus {
    /// GPUs in index order.
    #[serde(default)]
    pub gpus: Vec<GpuStatus>,
    /// Number of GPUs.
    #[serde(default)]
    pub gpu_count: u32,
    /// Number of carma pods on the node's GPUs.
    #[serde(default)]
    pub pod_count: u32,
    /// One-line summary, e.g. "0:12/40GiB 35% 1:idle".
    #[serde(default)]
    pub summary: String,
    /// When the status was published (RFC 3339).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub updated_at: Option<String>,
    /// Pods that left this node's GPUs in the last minutes, with the peak they reached: the
    /// operator reads an attempt's final peak here once the pod no longer occupies a GPU.
    /// Always written (an empty list clears the old entries under a merge patch).
    #[serde(default)]
    pub recently_ended: Vec<EndedPodPeak>,
    /// The node's conditions, in the Kubernetes style. `OtherDevicePlugin` is True while another
    /// device plugin (most often NVIDIA's, `nvidia.com/gpu`) advertises this node's GPUs: the kubelet
    /// can then give a GPU to that plugin's pods past carma's checks. Always written, like
    /// `recentlyEnded`.
    #[serde(default)]
    pub conditions: Vec<Condition>,
}

/// Condition type: another device plugin advertises this node's GPUs.
pub const CONDITION_OTHER_DEVICE_PLUGIN: &str = "OtherDevicePlugin";

/// The final memory peak of a pod that left a GPU.
#[derive(Deserialize, Serialize, Clone, Debug, PartialEq, Eq, Default, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct EndedPodPeak {
    /// Namespace.
    pub namespace: String,
    /// Name.
    pub name: String,
    /// UID.
    #[serde(default)]
    pub uid: String,
    /// GPU UUID.
    pub gpu: String,
    /// Its peak on that GPU (MiB), as `peakMiB` last showed it.
    #[serde(rename = "peakMiB")]
    pub peak_mib: u64,
    /// When the device plugin stopped seeing it there (RFC 3339).
    pub ended_at: String,
}

/// One GPU's inventory and telemetry.
#[derive(Deserialize, Serialize, Clone, Debug, PartialEq, Default, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct GpuStatus {
    /// Index on the node.
    pub index: u32,
    /// NVIDIA UUID.
    pub uuid: String,
    /// Product name.
    #[serde(default)]
    pub model: String,
    /// Total memory in MiB.
    #[serde(rename = "memoryTotalMiB")]
    pub memory_total_mib: u64,
    /// Free memory in MiB (latest sample).
    #[serde(rename = "memoryFreeMiB")]
    pub memory_free_mib: u64,
    /// SM activity risk score 0..1 over the sample window; absent until the window fills.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sm_activity: Option<f64>,
    /// SM occupancy risk score 0..1; absent until the window fills.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sm_occupancy: Option<f64>,
    /// DRAM activity risk score 0..1; absent until the window fills.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dram_activity: Option<f64>,
    /// Where the activity figures come from: dcgm, gpm, nvml-util (fallback) or simulated.
    #[serde(default)]
    pub activity_source: String,
    /// The utilization gate the source's metrics allow: smact-smocc-drama (CARMA's gate: DCGM,
    /// NVML GPM), smact-drama (NVML without GPM), smact-smocc, smact, or none (no SM activity:
    /// exclusive use only). Empty from device plugins that predate it.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub gate_rule: String,
    /// Whether the gate lets the GPU take another shared pod now (telemetry only: memory and
    /// replicas are judged at placement).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sharing_allowed: Option<bool>,
    /// Power draw in watts.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub power_watts: Option<f64>,
    /// Energy since driver load in joules.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub energy_joules: Option<f64>,
    /// Whether the GPU is healthy.
    #[serde(default = "yes")]
    pub healthy: bool,
    /// Why it is unhealthy, when it is.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub health_reason: Option<String>,
    /// Compute processes on the GPU (MPS daemon excluded).
    #[serde(default)]
    pub processes: u32,
    /// carma pods on the GPU.
    #[serde(default)]
    pub pods: Vec<GpuPodStatus>,
    /// What holds the containers on this GPU to their memory limit (`NVIDIA_GPU_MEMORY_LIMIT`):
    /// `driver` (NVIDIA's CDI hook applies it through NVML), `mps` (MPS pinned device memory) or
    /// `none` (the reservation is advisory). Absent from device plugins that predate it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub memory_enforcement: Option<MemoryEnforcement>,
}

/// How a GPU's per-container memory limits are enforced.
#[derive(Deserialize, Serialize, Clone, Copy, Debug, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum MemoryEnforcement {
    /// NVIDIA's `nvidia-cdi-hook apply-cuda-memory-limits` sets the container's limit through NVML.
    Driver,
    /// MPS clients get `CUDA_MPS_PINNED_DEVICE_MEM_LIMIT`.
    Mps,
    /// Nothing: a container can use more than its limit.
    None,
}

impl MemoryEnforcement {
    /// The status and metric label spelling.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Driver => "driver",
            Self::Mps => "mps",
            Self::None => "none",
        }
    }
}

fn yes() -> bool {
    true
}

/// A pod on a GPU.
#[derive(Deserialize, Serialize, Clone, Debug, PartialEq, Default, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct GpuPodStatus {
    /// Namespace.
    pub namespace: String,
    /// Name.
    pub name: String,
    /// UID.
    #[serde(default)]
    pub uid: String,
    /// Reserved MiB on this GPU.
    #[serde(default, rename = "reservedMiB")]
    pub reserved_mib: u64,
    /// Memory the pod's processes use on this GPU, when attributed (MiB).
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        rename = "observedMiB"
    )]
    pub observed_mib: Option<u64>,
    /// The most memory attributed to the pod on this GPU at any sample since this device plugin
    /// first saw it there (MiB): what the operator records as the attempt's peak. Sampled at the
    /// plugin's interval, so a spike shorter than that can be missed; restarts with the plugin.
    #[serde(default, skip_serializing_if = "Option::is_none", rename = "peakMiB")]
    pub peak_mib: Option<u64>,
}

impl GpuStatus {
    /// The scheduler's view of this GPU.
    pub fn to_core(&self) -> carma_core::Gpu {
        carma_core::Gpu {
            uuid: self.uuid.clone(),
            index: self.index,
            model: self.model.clone(),
            memory_total_mib: self.memory_total_mib,
            memory_free_mib: self.memory_free_mib,
            sm_activity: self.sm_activity,
            sm_occupancy: self.sm_occupancy,
            dram_activity: self.dram_activity,
            healthy: self.healthy,
            processes: self.processes,
            max_pods: None,
            gate_rule: self.gate_rule(),
            telemetry_at: None,
        }
    }

    /// The gate rule this GPU is under: as published, or for an older device plugin that did not
    /// publish one, the rule of its activity source (NVML utilization has no occupancy).
    pub fn gate_rule(&self) -> carma_core::GateRule {
        use carma_core::GateRule;
        match self.gate_rule.parse::<GateRule>() {
            Ok(rule) => rule,
            Err(_) if self.activity_source == "nvml-util" => GateRule::SmactDrama,
            Err(_) => GateRule::SmactSmoccDrama,
        }
    }
}

#[cfg(feature = "kube")]
impl GpuNode {
    /// The scheduler's view of this node.
    pub fn to_core(&self) -> carma_core::Node {
        let name = self.metadata.name.clone().unwrap_or_default();
        let max_pods = (self.spec.replicas_per_gpu > 0).then_some(self.spec.replicas_per_gpu);
        let gpus = self
            .status
            .as_ref()
            .map(|s| {
                s.gpus
                    .iter()
                    .map(|g| carma_core::Gpu {
                        max_pods,
                        ..g.to_core()
                    })
                    .collect()
            })
            .unwrap_or_default();
        carma_core::Node { name, gpus }
    }
}
