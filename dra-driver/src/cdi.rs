//! Per-claim CDI specs: what the container runtime injects into the containers that use a claim.
//!
//! The DRA kubelet API carries only CDI device names (no environment or mounts, unlike the device
//! plugin's Allocate), so the environment the device plugin sets — `NVIDIA_VISIBLE_DEVICES`,
//! `CARMA_ASSIGNED_GPUS`, `CARMA_RESERVED_MIB`, and with MPS the memory limit and mounts — is
//! written into a CDI spec, one file per claim, built by the device plugin's own
//! `container_response`. One CDI device per allocated device; every device of a request carries
//! the whole request's environment, so a container that gets several of them sees identical
//! values. A container should use one request of a carma claim: two requests would set the same
//! variables to different values.

use std::collections::BTreeMap;
use std::io;
use std::path::{Path, PathBuf};

use carma_api::{Assignment, EstimateAnnotation};
use carma_device_plugin::allocate::container_response;
use carma_device_plugin::config::MpsConfig;
use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};

use crate::claims::PreparedDevice;

/// CDI kind (`vendor/class`) of carma's per-claim devices.
pub const CDI_KIND: &str = "gpu.carma.io/claim";
/// CDI spec version written: the oldest that has everything used here (env and mounts).
pub const CDI_VERSION: &str = "0.3.0";
/// NVIDIA's CDI kind, as the NVIDIA Container Toolkit names GPUs (`nvidia.com/gpu=<UUID>`).
pub const NVIDIA_CDI_KIND: &str = carma_device_plugin::allocate::CDI_KIND;

/// A CDI spec (the subset carma writes).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Spec {
    /// Spec format version.
    pub cdi_version: String,
    /// `vendor/class`.
    pub kind: String,
    /// Devices.
    pub devices: Vec<CdiDevice>,
}

/// One CDI device.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct CdiDevice {
    /// Name, unique in the kind.
    pub name: String,
    /// What injecting it changes in the container.
    pub container_edits: ContainerEdits,
}

/// Container edits (the subset carma writes).
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ContainerEdits {
    /// `NAME=value` entries.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub env: Vec<String>,
    /// Bind mounts.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub mounts: Vec<CdiMount>,
}

/// A bind mount.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct CdiMount {
    /// Host path.
    pub host_path: String,
    /// Path in the container.
    pub container_path: String,
    /// Mount options.
    pub options: Vec<String>,
}

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

/// The spec of claim `claim_uid` with its devices on this node.
pub fn claim_spec(claim_uid: &str, devices: &[PreparedDevice], mps: Option<&MpsConfig>) -> Spec {
    let mut by_request: BTreeMap<&str, Vec<&PreparedDevice>> = BTreeMap::new();
    for d in devices {
        by_request.entry(&d.request).or_default().push(d);
    }
    let edits: BTreeMap<&str, ContainerEdits> = by_request
        .iter()
        .map(|(request, devs)| (*request, request_edits(devs, mps)))
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
    }
}

/// The device plugin's container environment and mounts for one request's GPUs.
fn request_edits(devs: &[&PreparedDevice], mps: Option<&MpsConfig>) -> ContainerEdits {
    let gpus: Vec<String> = devs.iter().map(|d| d.gpu.uuid.clone()).collect();
    let assignment = Assignment {
        gpus: gpus.clone(),
        assigned_at: DateTime::<Utc>::UNIX_EPOCH,
        estimate: EstimateAnnotation {
            mib: devs.iter().map(|d| d.reserved_mib).max().unwrap_or(0),
            source: "resource-claim".to_string(),
            class: None,
            samples: None,
        },
        exclusive: devs.iter().all(|d| d.whole()),
        allocated: true,
    };
    let response = container_response(&assignment, &gpus, mps);
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
    ContainerEdits { env, mounts }
}

/// The spec file of claim `claim_uid` in `dir`.
pub fn spec_path(dir: &Path, claim_uid: &str) -> PathBuf {
    dir.join(format!("gpu.carma.io-claim_{claim_uid}.json"))
}

/// Write `spec` for `claim_uid` into `dir`, atomically: the runtime may read the directory at any
/// time, and reads only `*.json` and `*.yaml`, so the temporary name is never loaded.
pub fn write_spec(dir: &Path, claim_uid: &str, spec: &Spec) -> io::Result<PathBuf> {
    std::fs::create_dir_all(dir)?;
    let path = spec_path(dir, claim_uid);
    let tmp = path.with_extension("json.tmp");
    let text = serde_json::to_vec_pretty(spec).map_err(io::Error::other)?;
    std::fs::write(&tmp, text)?;
    std::fs::rename(&tmp, &path)?;
    Ok(path)
}

/// Remove the spec of `claim_uid`; `false` when there was none (unprepare is idempotent).
pub fn remove_spec(dir: &Path, claim_uid: &str) -> io::Result<bool> {
    match std::fs::remove_file(spec_path(dir, claim_uid)) {
        Ok(()) => Ok(true),
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

    #[test]
    fn each_request_gets_the_device_plugins_environment() {
        let devs = [
            dev("train", 0, 12288),
            dev("train", 2, 12288),
            dev("eval/small", 1, 2048),
        ];
        let spec = claim_spec("uid-1", &devs, None);
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
                "NVIDIA_VISIBLE_DEVICES=GPU-0,GPU-2"
            ]
        );
        assert_eq!(env(&spec, 0), env(&spec, 1));
        assert_eq!(
            env(&spec, 2),
            [
                "CARMA_ASSIGNED_GPUS=GPU-1",
                "CARMA_RESERVED_MIB=2048",
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
    fn with_mps_the_limit_and_mounts_are_in_the_spec() {
        let spec = claim_spec(
            "u",
            &[dev("gpu", 0, 4096)],
            Some(&MpsConfig::with_defaults()),
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
        let spec = claim_spec("uid-9", &[dev("gpu", 3, 40960)], None);
        let path = write_spec(dir.path(), "uid-9", &spec).unwrap();
        assert_eq!(path.file_name().unwrap(), "gpu.carma.io-claim_uid-9.json");
        let json: serde_json::Value =
            serde_json::from_slice(&std::fs::read(&path).unwrap()).unwrap();
        assert_eq!(json["cdiVersion"], "0.3.0");
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
