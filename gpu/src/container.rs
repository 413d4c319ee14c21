//! What a GPU container gets, on both node paths: the environment, host mounts and CDI device
//! names that expose exactly its assigned GPUs. The device plugin hands them to kubelet in its
//! Allocate response, the DRA driver writes them into each claim's CDI spec.

use std::collections::HashMap;

use carma_api::Assignment;
use carma_api::names::{ENV_ASSIGNED_GPUS, ENV_RESERVED_MIB, ENV_VISIBLE_DEVICES};

use crate::config::MpsConfig;

/// A host directory mounted into the container.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HostMount {
    /// Where the container sees it.
    pub container_path: String,
    /// The host directory.
    pub host_path: String,
    /// Mounted read-only.
    pub read_only: bool,
}

/// The environment, mounts and CDI device names of one GPU container.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct ContainerEnv {
    /// Environment variables.
    pub envs: HashMap<String, String>,
    /// Host directories to mount.
    pub mounts: Vec<HostMount>,
    /// Fully qualified CDI device names (`nvidia.com/gpu=<UUID>`).
    pub cdi_devices: Vec<String>,
}

/// CDI device kind of NVIDIA GPUs (devices are named `nvidia.com/gpu=<UUID>`).
pub const CDI_KIND: &str = "nvidia.com/gpu";
/// MPS: per-GPU device memory limit of a client.
pub const ENV_MPS_MEM_LIMIT: &str = "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT";
/// MPS: share of SMs a client may use.
pub const ENV_MPS_THREAD_PERCENTAGE: &str = "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE";
/// MPS: directory of the control daemon's pipes.
pub const ENV_MPS_PIPE_DIRECTORY: &str = "CUDA_MPS_PIPE_DIRECTORY";
/// MPS: directory of the control daemon's logs.
pub const ENV_MPS_LOG_DIRECTORY: &str = "CUDA_MPS_LOG_DIRECTORY";
/// The container's GPU memory reservation per GPU, in bytes.
pub const ENV_GPU_MEMORY_REQUEST: &str = "NVIDIA_GPU_MEMORY_REQUEST";
/// The container's GPU memory limit per GPU, in bytes ([`carma_core::memory_limit`]).
pub const ENV_GPU_MEMORY_LIMIT: &str = "NVIDIA_GPU_MEMORY_LIMIT";
/// Where a container sees the MPS server's shared memory.
pub const MPS_SHM_MOUNT: &str = "/dev/shm";

/// The container environment exposing exactly `assignment`'s GPUs.
///
/// Environment: `NVIDIA_VISIBLE_DEVICES` and `CARMA_ASSIGNED_GPUS` = the UUIDs comma-separated,
/// `CARMA_RESERVED_MIB` = the per-GPU reservation; `NVIDIA_GPU_MEMORY_REQUEST` = that reservation
/// and `NVIDIA_GPU_MEMORY_LIMIT` = `memory_limit_mib` (the caller's [`carma_core::memory_limit`]),
/// both in bytes (NVIDIA documents no format for these names, so carma uses bytes, the unit of
/// NVML's memory figures). With MPS: `CUDA_MPS_PINNED_DEVICE_MEM_LIMIT` = that limit in
/// the ordinal form `0=<MiB>M,1=<MiB>M,…` (ordinals are the container's own CUDA devices, i.e. the
/// assigned GPUs; every GPU of a pod carries the same per-GPU reservation, so their enumeration order
/// does not matter, and the ordinal form is the one MPS is known to honour), and
/// `CUDA_MPS_ACTIVE_THREAD_PERCENTAGE` only when configured, for shared pods; the pipe, shared-memory
/// and log directories are mounted (and the pipe and log directories exported) when configured.
/// `gpus` are the container's share of the assignment (all of it for a pod with one GPU container).
pub fn container_env(
    assignment: &Assignment,
    gpus: &[String],
    mps: Option<&MpsConfig>,
    memory_limit_mib: u64,
) -> ContainerEnv {
    let uuids = gpus.join(",");
    let mut envs = HashMap::new();
    envs.insert(ENV_VISIBLE_DEVICES.to_string(), uuids.clone());
    envs.insert(ENV_ASSIGNED_GPUS.to_string(), uuids);
    envs.insert(
        ENV_RESERVED_MIB.to_string(),
        assignment.estimate.mib.to_string(),
    );
    envs.insert(
        ENV_GPU_MEMORY_REQUEST.to_string(),
        assignment.estimate.mib.saturating_mul(MIB).to_string(),
    );
    envs.insert(
        ENV_GPU_MEMORY_LIMIT.to_string(),
        memory_limit_mib.saturating_mul(MIB).to_string(),
    );
    let mut mounts = Vec::new();
    if let Some(mps) = mps {
        let limit = (0..gpus.len())
            .map(|i| format!("{i}={memory_limit_mib}M"))
            .collect::<Vec<_>>()
            .join(",");
        envs.insert(ENV_MPS_MEM_LIMIT.to_string(), limit);
        if let Some(pct) = mps.active_thread_percentage
            && !assignment.exclusive
        {
            envs.insert(ENV_MPS_THREAD_PERCENTAGE.to_string(), pct.to_string());
        }
        let text = |p: &std::path::Path| p.to_string_lossy().to_string();
        if let Some(dir) = mps.pipe_directory.as_deref().map(text) {
            envs.insert(ENV_MPS_PIPE_DIRECTORY.to_string(), dir.clone());
            mounts.push(HostMount {
                container_path: dir.clone(),
                host_path: dir,
                read_only: false,
            });
        }
        if let Some(dir) = mps.shm_directory.as_deref().map(text) {
            mounts.push(HostMount {
                container_path: MPS_SHM_MOUNT.to_string(),
                host_path: dir,
                read_only: false,
            });
        }
        if let Some(dir) = mps.log_directory.as_deref().map(text) {
            envs.insert(ENV_MPS_LOG_DIRECTORY.to_string(), dir.clone());
            mounts.push(HostMount {
                container_path: dir.clone(),
                host_path: dir,
                read_only: true,
            });
        }
    }
    ContainerEnv {
        envs,
        mounts,
        // CDI names as NVIDIA's container toolkit generates them, for nodes whose runtime ignores
        // NVIDIA_VISIBLE_DEVICES from unprivileged containers (accept-nvidia-visible-devices-envvar-when-unprivileged=false).
        cdi_devices: gpus.iter().map(|u| format!("{CDI_KIND}={u}")).collect(),
    }
}

const MIB: u64 = 1024 * 1024;
#[cfg(test)]
mod tests {
    use super::*;
    use crate::fixtures::shared_assignment;

    #[test]
    fn response_exposes_exactly_the_assigned_gpus() {
        let a = &shared_assignment();
        let r = container_env(a, &a.gpus, None, 6000);
        assert_eq!(r.envs[ENV_VISIBLE_DEVICES], "GPU-a,GPU-b");
        assert_eq!(r.envs[ENV_ASSIGNED_GPUS], "GPU-a,GPU-b");
        assert_eq!(r.envs[ENV_RESERVED_MIB], "6000");
        assert_eq!(r.envs[ENV_GPU_MEMORY_REQUEST], (6000u64 << 20).to_string());
        assert_eq!(r.envs[ENV_GPU_MEMORY_LIMIT], (6000u64 << 20).to_string());
        assert!(!r.envs.contains_key(ENV_MPS_MEM_LIMIT));
        let cdi: Vec<&str> = r.cdi_devices.iter().map(String::as_str).collect();
        assert_eq!(cdi, ["nvidia.com/gpu=GPU-a", "nvidia.com/gpu=GPU-b"]);
        let mps = MpsConfig::with_defaults();
        let r = container_env(a, &a.gpus, Some(&mps), 6000);
        assert_eq!(r.envs[ENV_MPS_MEM_LIMIT], "0=6000M,1=6000M");
        // A limit below the reservation (the GPU is overcommitted): the limit and MPS take it, the
        // request stays the reservation.
        let r = container_env(a, &a.gpus, Some(&mps), 4000);
        assert_eq!(r.envs[ENV_GPU_MEMORY_REQUEST], (6000u64 << 20).to_string());
        assert_eq!(r.envs[ENV_GPU_MEMORY_LIMIT], (4000u64 << 20).to_string());
        assert_eq!(r.envs[ENV_RESERVED_MIB], "6000");
        assert_eq!(r.envs[ENV_MPS_MEM_LIMIT], "0=4000M,1=4000M");
        let r = container_env(a, &a.gpus, Some(&mps), 6000);
        // SMs unlimited by default: a pod alone on its GPU is not held to 1/replicas of it.
        assert!(!r.envs.contains_key(ENV_MPS_THREAD_PERCENTAGE));
        assert_eq!(r.envs[ENV_MPS_PIPE_DIRECTORY], "/tmp/nvidia-mps");
        assert_eq!(r.envs[ENV_MPS_LOG_DIRECTORY], "/var/log/nvidia-mps");
        // What an MPS client needs: the pipes, the server's shared memory, the logs.
        let mounts: Vec<(&str, &str, bool)> = r
            .mounts
            .iter()
            .map(|m| (m.host_path.as_str(), m.container_path.as_str(), m.read_only))
            .collect();
        assert_eq!(
            mounts,
            [
                ("/tmp/nvidia-mps", "/tmp/nvidia-mps", false),
                ("/dev/shm", "/dev/shm", false),
                ("/var/log/nvidia-mps", "/var/log/nvidia-mps", true),
            ]
        );
        // An explicit limit applies to shared pods only.
        let capped = MpsConfig {
            active_thread_percentage: Some(50),
            ..MpsConfig::with_defaults()
        };
        let r = container_env(a, &a.gpus, Some(&capped), 6000);
        assert_eq!(r.envs[ENV_MPS_THREAD_PERCENTAGE], "50");
        let mut alone = a.clone();
        alone.exclusive = true;
        let r = container_env(&alone, &alone.gpus, Some(&capped), 6000);
        assert!(!r.envs.contains_key(ENV_MPS_THREAD_PERCENTAGE));
    }
}
