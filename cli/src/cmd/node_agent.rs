//! What the two Kubernetes node agents' commands share: `carma device-plugin` and
//! `carma dra-driver` take the same GPU backend, utilization-gate and memory-limit hook flags and
//! parse `--sample-interval` alike.

use std::path::PathBuf;
use std::time::Duration;

use carma_gpu::config::{
    self, BackendKind, BackendSettings, ConfigError, SimulatedGpus, SimulatedMetrics,
};
use carma_gpu::enforcement::{DEFAULT_HOOK_PATH, HookConfig, MemoryLimitsMode};
use carma_gpu::sampling::GateCaps;

/// The GPU backend flags, shared by `carma device-plugin` and `carma dra-driver`.
#[derive(Debug, Clone, clap::Args)]
pub struct BackendArgs {
    /// GPU backend: `nvml` (NVML; SM activity from GPM on Hopper and newer, else NVML utilization as a
    /// labelled fallback), `dcgm` (scrape dcgm-exporter for SM activity, occupancy and DRAM
    /// activity; NVML for inventory and memory where available) or `simulated` (no GPU needed).
    #[arg(long, env = "CARMA_BACKEND")]
    pub backend: BackendKind,
    /// Simulated GPUs as COUNTxSIZE (backend `simulated`).
    #[arg(long, default_value = "4x40GiB")]
    pub simulated_gpus: SimulatedGpus,
    /// Metric set the simulated backend mimics: nvml (SM and DRAM activity, no occupancy: gate
    /// rule smact-drama), gpm (all three: smact-smocc-drama) or dcgm (all three, no process list:
    /// pods are seen through memory use).
    #[arg(long, default_value = "gpm")]
    pub simulated_metrics: SimulatedMetrics,
    /// dcgm-exporter URL (backend `dcgm`), e.g. http://127.0.0.1:9400/metrics.
    #[arg(long, env = "CARMA_DCGM_ENDPOINT")]
    pub dcgm_endpoint: Option<String>,
}

impl BackendArgs {
    /// The backend settings, sampled every `sample_interval` (each agent documents that flag its
    /// own way) into CARMA's window.
    pub fn settings(&self, sample_interval: Duration) -> BackendSettings {
        BackendSettings {
            simulated_gpus: self.simulated_gpus,
            simulated_metrics: self.simulated_metrics,
            dcgm_endpoint: self.dcgm_endpoint.clone(),
            sample_interval,
            ..BackendSettings::new(self.backend)
        }
    }
}

/// The utilization gate's caps (the extender's; the chart sets the same values everywhere), shared
/// by `carma device-plugin` (its exported verdict carma_gpu_sharing_allowed and
/// carma_gpu_sm_activity_cap_ratio) and `carma dra-driver` (its device taints).
#[derive(Debug, Clone, clap::Args)]
pub struct GateCapArgs {
    /// SM activity cap of the utilization gate.
    #[arg(long, env = "CARMA_SM_ACTIVITY_CAP", default_value_t = GateCaps::default().sm_activity)]
    pub sm_activity_cap: f64,
    /// SM occupancy cap of the utilization gate.
    #[arg(long, env = "CARMA_SM_OCCUPANCY_CAP", default_value_t = GateCaps::default().sm_occupancy)]
    pub sm_occupancy_cap: f64,
    /// DRAM activity cap of the utilization gate.
    #[arg(long, env = "CARMA_DRAM_ACTIVITY_CAP", default_value_t = GateCaps::default().dram_activity)]
    pub dram_activity_cap: f64,
}

impl GateCapArgs {
    /// The caps.
    pub fn caps(&self) -> GateCaps {
        GateCaps {
            sm_activity: self.sm_activity_cap,
            sm_occupancy: self.sm_occupancy_cap,
            dram_activity: self.dram_activity_cap,
        }
    }
}

/// The memory-limit hook flags, shared by `carma device-plugin` and `carma dra-driver`.
#[derive(Debug, Clone, clap::Args)]
pub struct MemoryLimitArgs {
    /// Enforce each container's NVIDIA_GPU_MEMORY_LIMIT through NVIDIA's CDI hook
    /// `nvidia-cdi-hook apply-cuda-memory-limits` (NVML SetMemoryLimits_v1, CUDA 13.4 drivers):
    /// `auto` runs it where the hook is installed and NVML, when there is one, reports a new enough
    /// driver; `on` always (containers fail to start on a node without the hook); `off` never.
    #[arg(long, env = "CARMA_MEMORY_LIMIT_ENFORCEMENT", default_value = "auto")]
    pub memory_limit_enforcement: MemoryLimitsMode,
    /// The hook's path on the node, as the CDI specs name it (NVIDIA's toolkit installs it at
    /// /usr/bin/nvidia-cdi-hook).
    #[arg(long, env = "CARMA_NVIDIA_CDI_HOOK_PATH", default_value = DEFAULT_HOOK_PATH)]
    pub nvidia_cdi_hook_path: PathBuf,
    /// Where this process sees that file, when not at the same path (in a pod: a read-only
    /// mount of the host directory); `auto` looks for it there.
    #[arg(long, env = "CARMA_NVIDIA_CDI_HOOK_PROBE_PATH")]
    pub nvidia_cdi_hook_probe_path: Option<PathBuf>,
}

impl MemoryLimitArgs {
    /// The hook configuration.
    pub fn to_config(&self) -> HookConfig {
        HookConfig {
            mode: self.memory_limit_enforcement,
            path: self.nvidia_cdi_hook_path.clone(),
            probe_path: self
                .nvidia_cdi_hook_probe_path
                .clone()
                .unwrap_or_else(|| self.nvidia_cdi_hook_path.clone()),
        }
    }
}

/// `--sample-interval` of `carma device-plugin` and `carma dra-driver`.
pub fn parse_interval(text: &str) -> Result<Duration, ConfigError> {
    config::parse_duration("--sample-interval", text)
}
