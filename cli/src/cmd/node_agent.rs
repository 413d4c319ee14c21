//! What the two Kubernetes node agents' commands share: `carma device-plugin` and
//! `carma dra-driver` take the same memory-limit hook flags and parse `--sample-interval` alike.

use std::path::PathBuf;
use std::time::Duration;

use carma_gpu::config::{self, ConfigError};
use carma_gpu::enforcement::{DEFAULT_HOOK_PATH, HookConfig, MemoryLimitsMode};

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
