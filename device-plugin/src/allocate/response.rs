//! What kubelet is told: the environment, mounts and CDI devices that expose a container's
//! assigned GPUs (Allocate), and the replicas to prefer (GetPreferredAllocation).

use std::collections::HashSet;

use carma_api::Assignment;
use carma_gpu::config::MpsConfig;
use carma_gpu::container::container_env;

use crate::devices::ReplicaId;
use crate::proto::{CdiDevice, ContainerAllocateResponse, Mount};

/// The kubelet's container response for `assignment`'s GPUs: the GPU layer's container
/// environment ([`carma_gpu::container::container_env`]) in the device-plugin API's terms.
pub fn container_response(
    assignment: &Assignment,
    gpus: &[String],
    mps: Option<&MpsConfig>,
    memory_limit_mib: u64,
) -> ContainerAllocateResponse {
    let env = container_env(assignment, gpus, mps, memory_limit_mib);
    ContainerAllocateResponse {
        envs: env.envs,
        mounts: env
            .mounts
            .into_iter()
            .map(|m| Mount {
                container_path: m.container_path,
                host_path: m.host_path,
                read_only: m.read_only,
            })
            .collect(),
        cdi_devices: env
            .cdi_devices
            .into_iter()
            .map(|name| CdiDevice { name })
            .collect(),
        ..Default::default()
    }
}

/// `response` with the memory-limit hook's CDI name ([`carma_gpu::enforcement::HOOK_CDI_NAME`]) added
/// after the GPUs': the runtime then runs NVIDIA's `apply-cuda-memory-limits` hook, which applies
/// the response's `NVIDIA_GPU_MEMORY_REQUEST`/`LIMIT` to the container.
pub fn with_memory_hook(mut response: ContainerAllocateResponse) -> ContainerAllocateResponse {
    response.cdi_devices.push(CdiDevice {
        name: carma_gpu::enforcement::HOOK_CDI_NAME.to_string(),
    });
    response
}

/// Replica IDs kubelet should prefer for one container.
///
/// `must_include` first, then one replica of each of `preferred_gpus` (the pending pod's assigned
/// GPUs), then one replica per further GPU (spreading), then any. Never more than `size`.
pub fn preferred_ids(
    available: &[String],
    must_include: &[String],
    size: usize,
    preferred_gpus: &[String],
) -> Vec<String> {
    let mut out: Vec<String> = Vec::with_capacity(size);
    let mut used_gpus: HashSet<String> = HashSet::new();
    let push = |id: &String, out: &mut Vec<String>, used: &mut HashSet<String>| {
        if out.len() < size && !out.contains(id) {
            if let Some(r) = ReplicaId::parse(id) {
                used.insert(r.uuid);
            }
            out.push(id.clone());
        }
    };
    for id in must_include {
        push(id, &mut out, &mut used_gpus);
    }
    let mut sorted: Vec<(ReplicaId, &String)> = available
        .iter()
        .filter_map(|id| ReplicaId::parse(id).map(|r| (r, id)))
        .collect();
    sorted.sort();
    for gpu in preferred_gpus {
        if used_gpus.contains(gpu) {
            continue;
        }
        if let Some((_, id)) = sorted.iter().find(|(r, _)| &r.uuid == gpu) {
            push(id, &mut out, &mut used_gpus);
        }
    }
    for (r, id) in &sorted {
        if !used_gpus.contains(&r.uuid) {
            push(id, &mut out, &mut used_gpus);
        }
    }
    for id in available {
        push(id, &mut out, &mut used_gpus);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use carma_gpu::fixtures::{ids, shared_assignment};

    #[test]
    fn the_hook_name_follows_the_gpus_only_when_asked_for() {
        let a = &shared_assignment();
        let plain = container_response(a, &a.gpus, None, 6000);
        assert!(
            plain
                .cdi_devices
                .iter()
                .all(|d| !d.name.starts_with("carma.io/"))
        );
        let hooked = with_memory_hook(plain.clone());
        let cdi: Vec<&str> = hooked.cdi_devices.iter().map(|d| d.name.as_str()).collect();
        assert_eq!(
            cdi,
            [
                "nvidia.com/gpu=GPU-a",
                "nvidia.com/gpu=GPU-b",
                "carma.io/memory-limits=hook"
            ]
        );
        assert_eq!(
            hooked.envs, plain.envs,
            "the hook reads the same environment"
        );
    }

    #[test]
    fn preferred_ids_take_the_assigned_gpus_first() {
        let available = ids(&["GPU-a::0", "GPU-a::1", "GPU-b::0", "GPU-b::1", "GPU-c::0"]);
        assert_eq!(
            preferred_ids(&available, &[], 1, &ids(&["GPU-b"])),
            ["GPU-b::0"]
        );
        assert_eq!(
            preferred_ids(&available, &[], 2, &ids(&["GPU-c", "GPU-a"])),
            ["GPU-c::0", "GPU-a::0"]
        );
        // Without a pending pod: spread over GPUs.
        assert_eq!(
            preferred_ids(&available, &[], 3, &[]),
            ["GPU-a::0", "GPU-b::0", "GPU-c::0"]
        );
        assert_eq!(
            preferred_ids(
                &available,
                &ids(&["GPU-b::1"]),
                2,
                &ids(&["GPU-b", "GPU-a"])
            ),
            ["GPU-b::1", "GPU-a::0"]
        );
        // More wanted than GPUs: fill with further replicas.
        assert_eq!(preferred_ids(&available, &[], 4, &[]).len(), 4);
    }
}
