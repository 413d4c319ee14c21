//! Another device plugin handing out the same GPUs on this node (most often NVIDIA's own,
//! `nvidia.com/gpu`).
//!
//! Two plugins that advertise one physical GPU let the kubelet give it to a carma pod and to a pod
//! of the other resource at once, past carma's memory and SM-activity checks: the most common
//! support question of GPU-sharing projects. The kubelet's device-manager checkpoint
//! (`kubelet_internal_checkpoint` in the device-plugin directory) lists every registered resource
//! with its device IDs, so a GPU is found shared when another resource's device ID names one of
//! carma's GPU UUIDs (NVIDIA's plugin uses UUIDs by default, `--device-id-strategy=uuid`), and a
//! resource is found suspect when its name is a known GPU resource even where its IDs are indices.
//! Sockets of other plugins in the directory are reported too, for the message.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use carma_api::{CONDITION_OTHER_DEVICE_PLUGIN, Condition};
use chrono::{DateTime, SecondsFormat, Utc};
use serde::Deserialize;
use tracing::warn;

/// File name of the kubelet's device-manager checkpoint in its device-plugin directory.
pub const KUBELET_CHECKPOINT: &str = "kubelet_internal_checkpoint";

/// Resource name prefixes other device plugins use for NVIDIA GPUs, their shares and MIG slices
/// (`nvidia.com/gpu`, `nvidia.com/gpu.shared`, `nvidia.com/mig-1g.10gb`).
const KNOWN_GPU_RESOURCE_PREFIXES: [&str; 2] = ["nvidia.com/gpu", "nvidia.com/mig-"];

/// One other resource registered with the kubelet that hands out carma's GPUs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OtherGpuResource {
    /// e.g. `nvidia.com/gpu`.
    pub resource: String,
    /// How many devices the kubelet has registered for it.
    pub devices: usize,
    /// carma's GPU UUIDs that its device IDs name (empty when its IDs are not UUIDs).
    pub shared_gpus: Vec<String>,
}

/// What the device-plugin directory says about other GPU plugins on this node.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Coexistence {
    pub others: Vec<OtherGpuResource>,
    /// Socket files of other plugins (not the kubelet's, not carma's own).
    pub other_sockets: Vec<String>,
}

/// The checkpoint could not be read.
#[derive(Debug, thiserror::Error)]
pub enum CoexistenceError {
    #[error("reading {path}: {source}")]
    Read {
        path: String,
        source: std::io::Error,
    },
    #[error("{path} is not a kubelet device-manager checkpoint: {source}")]
    Parse {
        path: String,
        source: serde_json::Error,
    },
}

#[derive(Deserialize)]
struct Checkpoint {
    #[serde(rename = "Data")]
    data: CheckpointData,
}

#[derive(Deserialize)]
struct CheckpointData {
    #[serde(rename = "RegisteredDevices", default)]
    registered: Option<BTreeMap<String, Vec<String>>>,
}

impl Coexistence {
    /// Whether another plugin hands out (or is likely to hand out) carma's GPUs.
    pub fn found(&self) -> bool {
        !self.others.is_empty()
    }

    /// One sentence for a condition message and the log; names what to do about it.
    pub fn message(&self) -> String {
        if !self.found() {
            return "no other device plugin advertises this node's GPUs".to_string();
        }
        let what: Vec<String> = self
            .others
            .iter()
            .map(|o| match o.shared_gpus.len() {
                0 => format!("{} ({} devices)", o.resource, o.devices),
                n => format!(
                    "{} ({} devices, {n} of them carma's GPUs)",
                    o.resource, o.devices
                ),
            })
            .collect();
        let sockets = if self.other_sockets.is_empty() {
            String::new()
        } else {
            format!(" (sockets: {})", self.other_sockets.join(", "))
        };
        format!(
            "another device plugin advertises this node's GPUs as {}{sockets}: the kubelet can give a GPU \
             to a pod of that resource and to carma pods at once, past carma's memory and activity checks; \
             keep that plugin off carma's GPU nodes (a nodeSelector or affinity on its DaemonSet)",
            what.join(", ")
        )
    }
}

/// Reads the kubelet's checkpoint and the socket names in `dir`. `own_resource` and `own_socket`
/// are carma's; `gpu_uuids` are the GPUs carma advertises. A missing checkpoint (a kubelet that has
/// not written one yet) reads as nothing found.
pub fn detect(
    dir: &Path,
    own_resource: &str,
    own_socket: &str,
    gpu_uuids: &[String],
) -> Result<Coexistence, CoexistenceError> {
    let path = dir.join(KUBELET_CHECKPOINT);
    let registered = match std::fs::read(&path) {
        Ok(bytes) => {
            let cp: Checkpoint =
                serde_json::from_slice(&bytes).map_err(|source| CoexistenceError::Parse {
                    path: path.display().to_string(),
                    source,
                })?;
            cp.data.registered.unwrap_or_default()
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => BTreeMap::new(),
        Err(source) => {
            return Err(CoexistenceError::Read {
                path: path.display().to_string(),
                source,
            });
        }
    };
    let mut others = Vec::new();
    for (resource, ids) in registered {
        if resource == own_resource {
            continue;
        }
        let shared_gpus: Vec<String> = gpu_uuids
            .iter()
            .filter(|uuid| ids.iter().any(|id| id_names_gpu(id, uuid)))
            .cloned()
            .collect();
        if !shared_gpus.is_empty()
            || KNOWN_GPU_RESOURCE_PREFIXES
                .iter()
                .any(|p| resource.starts_with(p))
        {
            others.push(OtherGpuResource {
                resource,
                devices: ids.len(),
                shared_gpus,
            });
        }
    }
    Ok(Coexistence {
        others,
        other_sockets: other_sockets(dir, own_socket),
    })
}

/// Whether a device ID of another plugin is this GPU: the UUID itself, or the UUID with a suffix
/// (time-slicing replicas such as `GPU-…::3`, HAMi's `GPU-…-1`).
fn id_names_gpu(id: &str, uuid: &str) -> bool {
    id.strip_prefix(uuid)
        .is_some_and(|rest| rest.is_empty() || rest.starts_with(':') || rest.starts_with('-'))
}

fn other_sockets(dir: &Path, own_socket: &str) -> Vec<String> {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return Vec::new();
    };
    let mut names: Vec<String> = entries
        .filter_map(|e| e.ok())
        .filter_map(|e| e.file_name().into_string().ok())
        .filter(|n| n.ends_with(".sock") && n != "kubelet.sock" && n != own_socket)
        .collect();
    names.sort();
    names
}

/// How often the kubelet's checkpoint is read again (another plugin comes and goes with its
/// DaemonSet; minutes of delay are fine, a read per sample is not needed).
pub const RECHECK_EVERY: Duration = Duration::from_secs(60);

/// The GpuNode condition `OtherDevicePlugin`, kept up to date from the device-plugin directory.
#[derive(Debug)]
pub struct CoexistenceProbe {
    dir: PathBuf,
    own_resource: String,
    own_socket: String,
    checked_at: Option<Instant>,
    condition: Option<Condition>,
}

impl CoexistenceProbe {
    /// A probe of `dir` (the kubelet's device-plugin directory) for carma's `own_resource` served
    /// on `own_socket`.
    pub fn new(dir: PathBuf, own_resource: &str, own_socket: &str) -> Self {
        Self {
            dir,
            own_resource: own_resource.to_string(),
            own_socket: own_socket.to_string(),
            checked_at: None,
            condition: None,
        }
    }

    /// The condition for carma's GPUs (`gpu_uuids`, called only when the checkpoint is read): read
    /// again when [`RECHECK_EVERY`] has passed since the last read (`now`), its transition time
    /// `wall` when its status turned. Between reads it costs a clone of the last condition.
    pub fn condition(
        &mut self,
        gpu_uuids: impl FnOnce() -> Vec<String>,
        now: Instant,
        wall: DateTime<Utc>,
    ) -> Condition {
        let due = self
            .checked_at
            .is_none_or(|t| now.saturating_duration_since(t) >= RECHECK_EVERY);
        if due || self.condition.is_none() {
            self.checked_at = Some(now);
            let found = detect(
                &self.dir,
                &self.own_resource,
                &self.own_socket,
                &gpu_uuids(),
            );
            let (status, reason, message) = match &found {
                Ok(c) if c.found() => ("True", "OtherPluginAdvertisesTheseGpus", c.message()),
                Ok(c) => ("False", "NoOtherPlugin", c.message()),
                Err(e) => ("Unknown", "CheckpointUnreadable", e.to_string()),
            };
            let turned = self.condition.as_ref().is_none_or(|c| c.status != status);
            if turned && status != "False" {
                warn!(
                    condition = CONDITION_OTHER_DEVICE_PLUGIN,
                    status, "{message}"
                );
            }
            let since = match &self.condition {
                Some(c) if !turned => c.last_transition_time.clone(),
                _ => Some(wall.to_rfc3339_opts(SecondsFormat::Secs, true)),
            };
            self.condition = Some(Condition {
                type_: CONDITION_OTHER_DEVICE_PLUGIN.to_string(),
                status: status.to_string(),
                reason: Some(reason.to_string()),
                message: Some(message),
                last_transition_time: since,
            });
        }
        self.condition.clone().unwrap_or_default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn checkpoint(dir: &Path, registered: &str) {
        let body = format!(
            r#"{{"Data":{{"PodDeviceEntries":null,"RegisteredDevices":{registered}}},"Checksum":12345}}"#
        );
        std::fs::write(dir.join(KUBELET_CHECKPOINT), body).unwrap();
    }

    fn uuids() -> Vec<String> {
        vec!["GPU-aaaa".to_string(), "GPU-bbbb".to_string()]
    }

    #[test]
    fn nvidias_plugin_on_the_same_gpus_is_found_by_uuid() {
        let dir = tempfile::tempdir().unwrap();
        checkpoint(
            dir.path(),
            r#"{"carma.io/gpu":["GPU-aaaa::0","GPU-aaaa::1"],"nvidia.com/gpu":["GPU-aaaa","GPU-bbbb"]}"#,
        );
        std::fs::write(dir.path().join("nvidia-gpu.sock"), "").unwrap();
        std::fs::write(dir.path().join("carma-gpu.sock"), "").unwrap();
        std::fs::write(dir.path().join("kubelet.sock"), "").unwrap();
        let found = detect(dir.path(), "carma.io/gpu", "carma-gpu.sock", &uuids()).unwrap();
        assert!(found.found());
        assert_eq!(
            found.others,
            vec![OtherGpuResource {
                resource: "nvidia.com/gpu".into(),
                devices: 2,
                shared_gpus: uuids(),
            }]
        );
        assert_eq!(found.other_sockets, vec!["nvidia-gpu.sock".to_string()]);
        let msg = found.message();
        assert!(
            msg.contains("nvidia.com/gpu (2 devices, 2 of them carma's GPUs)"),
            "{msg}"
        );
        assert!(
            msg.contains("nvidia-gpu.sock") && msg.contains("nodeSelector"),
            "{msg}"
        );
    }

    #[test]
    fn time_sliced_replica_ids_name_their_gpu_and_unrelated_resources_do_not_count() {
        let dir = tempfile::tempdir().unwrap();
        checkpoint(
            dir.path(),
            r#"{"example.com/gpu-share":["GPU-bbbb::0","GPU-bbbb::1"],"example.com/nic":["eth1"],"nvidia.com/gpu":["0","1"]}"#,
        );
        let found = detect(dir.path(), "carma.io/gpu", "carma-gpu.sock", &uuids()).unwrap();
        let names: Vec<&str> = found.others.iter().map(|o| o.resource.as_str()).collect();
        // Index-named nvidia.com/gpu is suspect by name; the share names GPU-bbbb; the NIC is not a GPU.
        assert_eq!(names, vec!["example.com/gpu-share", "nvidia.com/gpu"]);
        assert_eq!(found.others[0].shared_gpus, vec!["GPU-bbbb".to_string()]);
        assert!(found.others[1].shared_gpus.is_empty());
        // A UUID that merely starts like another is not that GPU.
        assert!(!id_names_gpu("GPU-aaaab", "GPU-aaaa"));
    }

    #[test]
    fn carma_alone_or_no_checkpoint_finds_nothing() {
        let dir = tempfile::tempdir().unwrap();
        let none = detect(dir.path(), "carma.io/gpu", "carma-gpu.sock", &uuids()).unwrap();
        assert!(!none.found());
        checkpoint(dir.path(), r#"{"carma.io/gpu":["GPU-aaaa::0"]}"#);
        let alone = detect(dir.path(), "carma.io/gpu", "carma-gpu.sock", &uuids()).unwrap();
        assert!(!alone.found());
        assert_eq!(
            alone.message(),
            "no other device plugin advertises this node's GPUs"
        );
    }

    #[test]
    fn a_corrupt_checkpoint_is_an_error_naming_the_file() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join(KUBELET_CHECKPOINT), "{not json").unwrap();
        let err = detect(dir.path(), "carma.io/gpu", "carma-gpu.sock", &uuids()).unwrap_err();
        assert!(err.to_string().contains(KUBELET_CHECKPOINT), "{err}");
    }

    #[test]
    fn the_probe_turns_its_condition_and_keeps_the_transition_time_while_unchanged() {
        let dir = tempfile::tempdir().unwrap();
        let mut probe =
            CoexistenceProbe::new(dir.path().to_path_buf(), "carma.io/gpu", "carma-gpu.sock");
        let t0 = Instant::now();
        let w0 = DateTime::parse_from_rfc3339("2026-11-29T10:00:00Z")
            .unwrap()
            .with_timezone(&Utc);
        let c = probe.condition(uuids, t0, w0);
        assert_eq!(
            (c.type_.as_str(), c.status.as_str()),
            ("OtherDevicePlugin", "False")
        );
        assert_eq!(
            c.last_transition_time.as_deref(),
            Some("2026-11-29T10:00:00Z")
        );

        // NVIDIA's plugin registers: seen at the next read, not before.
        checkpoint(dir.path(), r#"{"nvidia.com/gpu":["GPU-aaaa"]}"#);
        let soon = probe.condition(uuids, t0 + Duration::from_secs(5), w0);
        assert_eq!(soon.status, "False");
        let w1 = w0 + chrono::Duration::seconds(61);
        let c = probe.condition(uuids, t0 + RECHECK_EVERY, w1);
        assert_eq!(c.status, "True");
        assert_eq!(c.reason.as_deref(), Some("OtherPluginAdvertisesTheseGpus"));
        assert!(
            c.message
                .as_deref()
                .unwrap()
                .contains("nvidia.com/gpu (1 devices, 1 of them carma's GPUs)")
        );
        assert_eq!(
            c.last_transition_time.as_deref(),
            Some("2026-11-29T10:01:01Z")
        );

        // Still there later: the transition time stays.
        let w2 = w1 + chrono::Duration::seconds(60);
        let again = probe.condition(uuids, t0 + RECHECK_EVERY * 2, w2);
        assert_eq!(again.last_transition_time, c.last_transition_time);

        // A corrupt checkpoint is Unknown, with the file named.
        std::fs::write(dir.path().join(KUBELET_CHECKPOINT), "{").unwrap();
        let u = probe.condition(uuids, t0 + RECHECK_EVERY * 3, w2);
        assert_eq!(u.status, "Unknown");
        assert!(u.message.unwrap().contains(KUBELET_CHECKPOINT));
    }
}
