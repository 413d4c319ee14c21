//! CDI specs as carma writes them: the subset of the Container Device Interface format it uses
//! (environment, bind mounts, OCI hooks) and the durable file write. The DRA driver writes one spec
//! per claim with these types; the device plugin writes the static spec of the memory-limit hook
//! ([`crate::enforcement`]).

use std::io::{self, Write};
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

/// CDI spec version written: the oldest that has everything carma uses. Env, mounts and hooks date
/// from 0.3.0, but a device name may begin with a digit only from 0.5.0, and the DRA driver's names
/// begin with the claim's UID, which is hex: containerd 2 refuses a 0.3.0 spec whose UID starts
/// with a digit ("the spec version must be at least v0.5.0") and the container with it.
pub const CDI_VERSION: &str = "0.5.0";

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
    /// Edits applied once to a container that gets any device of the spec (the CDI library merges
    /// them per spec, not per device).
    #[serde(default, skip_serializing_if = "ContainerEdits::is_empty")]
    pub container_edits: ContainerEdits,
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
    /// OCI hooks the runtime adds to the container.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub hooks: Vec<CdiHook>,
}

impl ContainerEdits {
    /// Whether it changes nothing.
    pub fn is_empty(&self) -> bool {
        self.env.is_empty() && self.mounts.is_empty() && self.hooks.is_empty()
    }
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

/// An OCI hook (CDI's `hooks` entry: `hookName`, `path`, `args`, `env`, `timeout`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct CdiHook {
    /// When it runs: `createContainer` for the hooks NVIDIA's toolkit writes (after the container's
    /// namespaces exist, before `pivot_root`; the path is resolved on the host).
    pub hook_name: String,
    /// The executable, a host path.
    pub path: String,
    /// Its argv, the program name first.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub args: Vec<String>,
    /// Its environment (`NAME=value`); not the container's.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub env: Vec<String>,
    /// Seconds before the runtime kills it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timeout: Option<u32>,
}

/// The temporary name `path` is written under before it is renamed into place (`<name>.tmp`).
pub fn temp_path(path: &Path) -> PathBuf {
    let mut name = path.file_name().unwrap_or_default().to_os_string();
    name.push(".tmp");
    path.with_file_name(name)
}

/// Replace `path` with `bytes` so that a crash leaves either the old or the new content, never a
/// torn file, and the new content survives a power loss once this returns: write a temporary file
/// ([`temp_path`]), fsync it, rename it over `path`, fsync the directory (the rename is durable
/// only then). The temporary file is removed when a step fails. Blocking.
pub fn write_durably(path: &Path, bytes: &[u8]) -> io::Result<()> {
    let tmp = temp_path(path);
    let result = (|| {
        let mut file = std::fs::File::create(&tmp)?;
        file.write_all(bytes)?;
        file.sync_all()?;
        drop(file);
        std::fs::rename(&tmp, path)?;
        sync_parent(path)
    })();
    if result.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    result
}

/// Fsync the directory holding `path`, so a rename or removal in it is durable.
pub fn sync_parent(path: &Path) -> io::Result<()> {
    match path.parent() {
        Some(dir) if !dir.as_os_str().is_empty() => std::fs::File::open(dir)?.sync_all(),
        _ => std::fs::File::open(".")?.sync_all(),
    }
}
