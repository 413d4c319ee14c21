//! Per-claim CDI specs: what the container runtime injects into the containers that use a claim.
//!
//! The DRA kubelet API carries only CDI device names (no environment or mounts, unlike the device
//! plugin's Allocate), so the environment the device plugin sets — `NVIDIA_VISIBLE_DEVICES`,
//! `CARMA_ASSIGNED_GPUS`, `CARMA_RESERVED_MIB`, `NVIDIA_GPU_MEMORY_REQUEST` and
//! `NVIDIA_GPU_MEMORY_LIMIT` (bytes; the limit by [`carma_core::memory_limit`], against the other
//! prepared claims), and with MPS the memory limit and mounts — is written into a CDI spec, one
//! file per claim, built by the GPU layer's `carma_gpu::container::container_env`, the device
//! plugin's too. One CDI device per allocated device; every device of a request carries the whole
//! request's environment, so a container that gets several of them sees identical values. A container should use one request of a carma claim: two requests would set the same
//! variables to different values.

use std::collections::BTreeMap;
use std::io;
use std::path::{Path, PathBuf};

use carma_api::{Assignment, EstimateAnnotation};
use carma_core::memory_limit::{GpuMemory, container_memory_limit_mib};
pub use carma_gpu::cdi::{
    CDI_VERSION, CdiDevice, CdiHook, CdiMount, ContainerEdits, Spec, sync_parent, temp_path,
    write_durably,
};
use carma_gpu::config::MpsConfig;
use carma_gpu::container::container_env;
use chrono::{DateTime, Utc};

use crate::claims::PreparedDevice;

/// CDI kind (`vendor/class`) of carma's per-claim devices.
pub const CDI_KIND: &str = "gpu.carma.io/claim";
/// NVIDIA's CDI kind, as the NVIDIA Container Toolkit names GPUs (`nvidia.com/gpu=<UUID>`).
pub const NVIDIA_CDI_KIND: &str = carma_gpu::container::CDI_KIND;

/// The CDI device name of `dev` in claim `claim_uid`: `<uid>-<request>-<device>` (a subrequest's
/// `/` becomes `.`, which CDI names allow). The request is part of the name because two requests
/// of one claim may share one device.
pub fn device_name(claim_uid: &str, dev: &PreparedDevice) -> String {
    format!(
        "{claim_uid}-{}-{}",
        dev.request.replace('/', "."),
        dev.device
    )
}

/// The fully qualified CDI name the kubelet passes to the runtime: `gpu.carma.io/claim=<name>`.
pub fn qualified_name(claim_uid: &str, dev: &PreparedDevice) -> String {
    format!("{CDI_KIND}={}", device_name(claim_uid, dev))
}

/// The spec of claim `claim_uid` with its devices on this node. `others_reserved_mib` is what the
/// other prepared claims book on each GPU (by UUID): with what other requests of this claim book
/// there, it bounds each request's memory limit ([`carma_core::memory_limit`]). `memory_hook`,
/// when the node runs NVIDIA's memory-limit hook ([`carma_gpu::enforcement`]), goes into
/// the spec-wide edits, which the runtime applies once per container whatever number of the
/// claim's devices it gets; the hook reads the limit from the environment the devices set.
pub fn claim_spec(
    claim_uid: &str,
    devices: &[PreparedDevice],
    mps: Option<&MpsConfig>,
    others_reserved_mib: &BTreeMap<String, u64>,
    memory_hook: Option<&CdiHook>,
) -> Spec {
    let mut by_request: BTreeMap<&str, Vec<&PreparedDevice>> = BTreeMap::new();
    for d in devices {
        by_request.entry(&d.request).or_default().push(d);
    }
    let edits: BTreeMap<&str, ContainerEdits> = by_request
        .iter()
        .map(|(request, devs)| {
            let limit_mib = container_memory_limit_mib(
                request_reservation_mib(devs),
                devs.iter().map(|d| GpuMemory {
                    total_mib: d.gpu.memory_mib,
                    others_reserved_mib: others_reserved_mib
                        .get(&d.gpu.uuid)
                        .copied()
                        .unwrap_or(0)
                        .saturating_add(
                            devices
                                .iter()
                                .filter(|o| o.request != d.request && o.gpu.uuid == d.gpu.uuid)
                                .map(|o| o.reserved_mib)
                                .sum(),
                        ),
                }),
            );
            (*request, request_edits(devs, mps, limit_mib))
        })
        .collect();
    Spec {
        cdi_version: CDI_VERSION.to_string(),
        kind: CDI_KIND.to_string(),
        devices: devices
            .iter()
            .map(|d| CdiDevice {
                name: device_name(claim_uid, d),
                container_edits: edits[d.request.as_str()].clone(),
            })
            .collect(),
        container_edits: ContainerEdits {
            hooks: memory_hook.into_iter().cloned().collect(),
            ..ContainerEdits::default()
        },
    }
}

/// A request's reservation per GPU: the largest of its devices' (the environment carries one).
fn request_reservation_mib(devs: &[&PreparedDevice]) -> u64 {
    devs.iter().map(|d| d.reserved_mib).max().unwrap_or(0)
}

/// The container environment and mounts (the device plugin's) for one request's GPUs.
fn request_edits(
    devs: &[&PreparedDevice],
    mps: Option<&MpsConfig>,
    limit_mib: u64,
) -> ContainerEdits {
    let gpus: Vec<String> = devs.iter().map(|d| d.gpu.uuid.clone()).collect();
    let assignment = Assignment {
        gpus: gpus.clone(),
        assigned_at: DateTime::<Utc>::UNIX_EPOCH,
        estimate: EstimateAnnotation {
            mib: request_reservation_mib(devs),
            source: "resource-claim".to_string(),
            class: None,
            samples: None,
        },
        exclusive: devs.iter().all(|d| d.whole()),
        allocated: true,
    };
    let response = container_env(&assignment, &gpus, mps, limit_mib);
    let mut env: Vec<String> = response
        .envs
        .into_iter()
        .map(|(k, v)| format!("{k}={v}"))
        .collect();
    env.sort();
    let mounts = response
        .mounts
        .into_iter()
        .map(|m| CdiMount {
            host_path: m.host_path,
            container_path: m.container_path,
            options: vec![
                "rbind".to_string(),
                if m.read_only { "ro" } else { "rw" }.to_string(),
            ],
        })
        .collect();
    ContainerEdits {
        env,
        mounts,
        hooks: Vec::new(),
    }
}

/// The start of every spec file carma writes (see [`spec_path`]): `gpu.carma.io-claim_`.
pub const SPEC_PREFIX: &str = "gpu.carma.io-claim_";

/// The spec file of claim `claim_uid` in `dir`.
pub fn spec_path(dir: &Path, claim_uid: &str) -> PathBuf {
    dir.join(format!("{SPEC_PREFIX}{claim_uid}.json"))
}

/// The claim UID of one of carma's spec files (or of its temporary file), from its name; `None`
/// for any other file.
pub fn spec_claim_uid(file_name: &str) -> Option<&str> {
    let rest = file_name.strip_prefix(SPEC_PREFIX)?;
    let uid = rest
        .strip_suffix(".json.tmp")
        .or_else(|| rest.strip_suffix(".json"))?;
    (!uid.is_empty()).then_some(uid)
}

/// Write `spec` for `claim_uid` into `dir`, atomically and durably ([`write_durably`]): the
/// runtime may read the directory at any time, and reads only `*.json` and `*.yaml`, so the
/// temporary name is never loaded. Blocking: call it off the async runtime.
pub fn write_spec(dir: &Path, claim_uid: &str, spec: &Spec) -> io::Result<PathBuf> {
    std::fs::create_dir_all(dir)?;
    let path = spec_path(dir, claim_uid);
    let text = serde_json::to_vec_pretty(spec).map_err(io::Error::other)?;
    write_durably(&path, &text)?;
    Ok(path)
}

/// Remove the spec of `claim_uid`; `false` when there was none (unprepare is idempotent).
/// Blocking.
pub fn remove_spec(dir: &Path, claim_uid: &str) -> io::Result<bool> {
    let path = spec_path(dir, claim_uid);
    match std::fs::remove_file(&path) {
        Ok(()) => {
            sync_parent(&path)?;
            Ok(true)
        }
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(false),
        Err(e) => Err(e),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::claims::GpuInfo;

    fn dev(request: &str, index: u32, reserved_mib: u64) -> PreparedDevice {
        PreparedDevice {
            request: request.to_string(),
            pool: "n1".to_string(),
            device: format!("gpu-{index}"),
            gpu: GpuInfo {
                index,
                uuid: format!("GPU-{index}"),
                memory_mib: 40960,
            },
            reserved_mib,
            share_id: None,
        }
    }

    fn env(spec: &Spec, i: usize) -> &[String] {
        &spec.devices[i].container_edits.env
    }

    /// CDI's own rule (the container-device-interface library containerd 2 uses): a device name
    /// that begins with a digit needs spec version 0.5.0 or later; a spec that breaks it is refused
    /// as a whole, and so is every container that names one of its devices.
    #[test]
    fn a_claim_uid_beginning_with_a_digit_gets_a_spec_version_that_allows_it() {
        let spec = claim_spec(
            "57a00e25-8586-40fb-baab-dfe5fad8306b",
            &[dev("gpu", 0, 7168)],
            None,
            &BTreeMap::new(),
            None,
        );
        assert!(
            spec.devices[0]
                .name
                .starts_with(|c: char| c.is_ascii_digit())
        );
        let version: Vec<u32> = spec
            .cdi_version
            .split('.')
            .map(|p| p.parse().unwrap())
            .collect();
        assert!(
            version >= vec![0, 5, 0],
            "cdiVersion {} is below 0.5.0",
            spec.cdi_version
        );
    }

    #[test]
    fn each_request_gets_the_device_plugins_environment() {
        let devs = [
            dev("train", 0, 12288),
            dev("train", 2, 12288),
            dev("eval/small", 1, 2048),
        ];
        let spec = claim_spec("uid-1", &devs, None, &BTreeMap::new(), None);
        assert_eq!(spec.kind, "gpu.carma.io/claim");
        let names: Vec<&str> = spec.devices.iter().map(|d| d.name.as_str()).collect();
        assert_eq!(
            names,
            [
                "uid-1-train-gpu-0",
                "uid-1-train-gpu-2",
                "uid-1-eval.small-gpu-1"
            ]
        );
        assert_eq!(
            env(&spec, 0),
            [
                "CARMA_ASSIGNED_GPUS=GPU-0,GPU-2",
                "CARMA_RESERVED_MIB=12288",
                "NVIDIA_GPU_MEMORY_LIMIT=12884901888",
                "NVIDIA_GPU_MEMORY_REQUEST=12884901888",
                "NVIDIA_VISIBLE_DEVICES=GPU-0,GPU-2"
            ]
        );
        assert_eq!(env(&spec, 0), env(&spec, 1));
        assert_eq!(
            env(&spec, 2),
            [
                "CARMA_ASSIGNED_GPUS=GPU-1",
                "CARMA_RESERVED_MIB=2048",
                "NVIDIA_GPU_MEMORY_LIMIT=2147483648",
                "NVIDIA_GPU_MEMORY_REQUEST=2147483648",
                "NVIDIA_VISIBLE_DEVICES=GPU-1"
            ]
        );
        assert!(spec.devices[0].container_edits.mounts.is_empty());
        assert_eq!(
            qualified_name("uid-1", &devs[2]),
            "gpu.carma.io/claim=uid-1-eval.small-gpu-1"
        );
    }

    #[test]
    fn the_memory_limit_leaves_room_for_what_the_others_on_the_gpu_book() {
        let limit = |spec: &Spec, i: usize| -> String {
            env(spec, i)
                .iter()
                .find_map(|e| e.strip_prefix("NVIDIA_GPU_MEMORY_LIMIT="))
                .unwrap()
                .to_string()
        };
        let gib = |n: u64| (n << 30).to_string();
        // Other claims book 36 GiB of GPU-0's 40: an 8 GiB request there is limited to 4 GiB.
        let others = BTreeMap::from([("GPU-0".to_string(), 36864), ("GPU-1".to_string(), 1024)]);
        let spec = claim_spec("u", &[dev("gpu", 0, 8192)], None, &others, None);
        assert_eq!(limit(&spec, 0), gib(4));
        assert!(env(&spec, 0).contains(&format!("NVIDIA_GPU_MEMORY_REQUEST={}", gib(8))));
        // Two requests of one claim on one GPU count each other as others.
        let spec = claim_spec(
            "u",
            &[dev("a", 1, 30720), dev("b", 1, 10240)],
            None,
            &others,
            None,
        );
        assert_eq!(limit(&spec, 0), gib(29), "40 − 1 − 10");
        assert_eq!(limit(&spec, 1), gib(9), "40 − 1 − 30");
    }

    #[test]
    fn the_memory_limit_hook_is_in_the_spec_iff_the_node_runs_it() {
        let devs = [dev("gpu", 0, 4096), dev("gpu", 1, 4096)];
        let plain = claim_spec("u", &devs, None, &BTreeMap::new(), None);
        let json = serde_json::to_value(&plain).unwrap();
        assert!(json.get("containerEdits").is_none(), "{json}");
        assert!(json.to_string().find("hooks").is_none());
        let hook = carma_gpu::enforcement::hook(Path::new("/usr/bin/nvidia-cdi-hook"));
        let spec = claim_spec("u", &devs, None, &BTreeMap::new(), Some(&hook));
        let json = serde_json::to_value(&spec).unwrap();
        assert_eq!(
            json["containerEdits"]["hooks"],
            serde_json::json!([{
                "hookName": "createContainer",
                "path": "/usr/bin/nvidia-cdi-hook",
                "args": ["nvidia-cdi-hook", "apply-cuda-memory-limits"]
            }]),
            "once for the spec, not per device"
        );
        assert!(
            spec.devices
                .iter()
                .all(|d| d.container_edits.hooks.is_empty())
        );
        // The environment the hook reads is the same with and without it.
        assert_eq!(spec.devices, plain.devices);
    }

    #[test]
    fn with_mps_the_limit_and_mounts_are_in_the_spec() {
        let spec = claim_spec(
            "u",
            &[dev("gpu", 0, 4096)],
            Some(&MpsConfig::with_defaults()),
            &BTreeMap::new(),
            None,
        );
        let e = env(&spec, 0);
        assert!(
            e.contains(&"CUDA_MPS_PINNED_DEVICE_MEM_LIMIT=0=4096M".to_string()),
            "{e:?}"
        );
        assert!(
            e.contains(&"CUDA_MPS_PIPE_DIRECTORY=/tmp/nvidia-mps".to_string()),
            "{e:?}"
        );
        let m = &spec.devices[0].container_edits.mounts;
        assert!(
            m.iter()
                .any(|m| m.container_path == "/dev/shm" && m.options == ["rbind", "rw"])
        );
        assert!(
            m.iter()
                .any(|m| m.host_path == "/var/log/nvidia-mps" && m.options == ["rbind", "ro"])
        );
    }

    #[test]
    fn specs_are_written_as_cdi_json_and_removed_idempotently() {
        let dir = tempfile::tempdir().unwrap();
        let spec = claim_spec(
            "uid-9",
            &[dev("gpu", 3, 40960)],
            None,
            &BTreeMap::new(),
            None,
        );
        let path = write_spec(dir.path(), "uid-9", &spec).unwrap();
        assert_eq!(path.file_name().unwrap(), "gpu.carma.io-claim_uid-9.json");
        let json: serde_json::Value =
            serde_json::from_slice(&std::fs::read(&path).unwrap()).unwrap();
        assert_eq!(json["cdiVersion"], "0.5.0");
        assert_eq!(json["devices"][0]["name"], "uid-9-gpu-gpu-3");
        assert_eq!(
            json["devices"][0]["containerEdits"]["env"][1],
            "CARMA_RESERVED_MIB=40960"
        );
        let names: Vec<_> = std::fs::read_dir(dir.path()).unwrap().collect();
        assert_eq!(names.len(), 1, "no temporary file left");
        assert!(remove_spec(dir.path(), "uid-9").unwrap());
        assert!(!path.exists());
        assert!(!remove_spec(dir.path(), "uid-9").unwrap());
    }
}
