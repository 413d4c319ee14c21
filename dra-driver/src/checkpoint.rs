//! The record of prepared claims that outlives the process, and the sweep of orphaned CDI specs.
//!
//! The kubelet prepares a claim once and unprepares it once its pods are gone; after a driver
//! restart it does not prepare running claims again. So what this process has prepared is kept in
//! a checkpoint file (`checkpoint.json` in the plugin directory), written durably before a prepare
//! is answered and after an unprepare removed the spec, and read back at start.
//!
//! A spec of carma's in the CDI directory whose claim is not in that record is an orphan: left by
//! a crash between writing a spec and recording it (the kubelet, which never got an answer, does
//! not unprepare such a claim), or by an unprepare that failed half-way. [`remove_orphans`] deletes
//! those, and only carma's own files: names starting with [`cdi::SPEC_PREFIX`] (carma's CDI vendor and
//! class), never NVIDIA's or anybody else's specs in the same directory. The driver sweeps at start
//! and every `Config::cdi_sweep_interval`.

use std::collections::{BTreeMap, BTreeSet};
use std::io;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};
use thiserror::Error;
use tracing::warn;

use crate::cdi;
use crate::claims::PreparedDevice;

/// The checkpoint's file name in the plugin directory.
pub const CHECKPOINT_FILE: &str = "checkpoint.json";
/// Version of the checkpoint's format.
pub const CHECKPOINT_VERSION: u32 = 1;

/// Prepared claims by UID, with their devices on this node.
pub type PreparedClaims = BTreeMap<String, Vec<PreparedDevice>>;

/// The checkpoint cannot be read.
#[derive(Debug, Error)]
pub enum CheckpointError {
    /// Reading the file failed.
    #[error("reading checkpoint {}: {source}", path.display())]
    Read {
        /// The file.
        path: PathBuf,
        /// Why.
        source: io::Error,
    },
    /// The file is not a checkpoint of this format.
    #[error("checkpoint {} is not a carma DRA checkpoint of version {CHECKPOINT_VERSION}: {message}", path.display())]
    Format {
        /// The file.
        path: PathBuf,
        /// Why.
        message: String,
    },
}

#[derive(Debug, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
struct CheckpointFile {
    version: u32,
    claims: PreparedClaims,
}

/// The checkpoint's path in `plugin_dir`.
pub fn checkpoint_path(plugin_dir: &Path) -> PathBuf {
    plugin_dir.join(CHECKPOINT_FILE)
}

/// The prepared claims recorded at `path`; `None` when there is no checkpoint (first start, or a
/// driver version that kept none). Blocking.
pub fn load(path: &Path) -> Result<Option<PreparedClaims>, CheckpointError> {
    let bytes = match std::fs::read(path) {
        Ok(b) => b,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
        Err(source) => {
            return Err(CheckpointError::Read {
                path: path.to_path_buf(),
                source,
            });
        }
    };
    let file: CheckpointFile =
        serde_json::from_slice(&bytes).map_err(|e| CheckpointError::Format {
            path: path.to_path_buf(),
            message: e.to_string(),
        })?;
    if file.version != CHECKPOINT_VERSION {
        return Err(CheckpointError::Format {
            path: path.to_path_buf(),
            message: format!("version {}", file.version),
        });
    }
    Ok(Some(file.claims))
}

/// Record `claims` at `path`, durably ([`cdi::write_durably`]). Blocking.
pub fn save(path: &Path, claims: &PreparedClaims) -> io::Result<()> {
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir)?;
    }
    let text = serde_json::to_vec_pretty(&CheckpointFile {
        version: CHECKPOINT_VERSION,
        claims: claims.clone(),
    })
    .map_err(io::Error::other)?;
    cdi::write_durably(path, &text)
}

/// carma's spec files in `dir` (temporary ones included) with their claim UIDs; none when the
/// directory does not exist. Blocking.
pub fn carma_specs(dir: &Path) -> io::Result<Vec<(PathBuf, String)>> {
    let entries = match std::fs::read_dir(dir) {
        Ok(e) => e,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(e),
    };
    let mut out = Vec::new();
    for entry in entries {
        let entry = entry?;
        if !entry.file_type()?.is_file() {
            continue;
        }
        let name = entry.file_name();
        if let Some(uid) = name.to_str().and_then(cdi::spec_claim_uid) {
            out.push((entry.path(), uid.to_string()));
        }
    }
    out.sort();
    Ok(out)
}

/// Remove carma's spec files in `dir` whose claim is not in `keep`; returns the removed files.
/// A file that cannot be removed is logged and left for the next sweep. Blocking.
pub fn remove_orphans(dir: &Path, keep: &BTreeSet<String>) -> io::Result<Vec<PathBuf>> {
    let mut removed = Vec::new();
    for (path, uid) in carma_specs(dir)? {
        if keep.contains(&uid) {
            continue;
        }
        match std::fs::remove_file(&path) {
            Ok(()) => removed.push(path),
            Err(e) if e.kind() == io::ErrorKind::NotFound => {}
            Err(e) => warn!(spec = %path.display(), "cannot remove orphaned CDI spec: {e}"),
        }
    }
    if let Some(first) = removed.first() {
        crate::cdi::sync_parent(first)?;
    }
    Ok(removed)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::claims::GpuInfo;

    #[test]
    fn only_carmas_spec_names_carry_a_claim() {
        assert_eq!(
            cdi::spec_claim_uid("gpu.carma.io-claim_u-1.json"),
            Some("u-1")
        );
        assert_eq!(
            cdi::spec_claim_uid("gpu.carma.io-claim_u-1.json.tmp"),
            Some("u-1")
        );
        for other in [
            "nvidia.com-gpu.json",
            "nvidia.yaml",
            "k8s.gpu.nvidia.com-claim_u-1.json",
            "gpu.carma.io-claim_.json",
            "gpu.carma.io-claim_u-1.yaml",
            "checkpoint.json",
        ] {
            assert_eq!(cdi::spec_claim_uid(other), None, "{other}");
        }
    }

    #[test]
    fn the_checkpoint_round_trips_and_a_missing_one_is_none() {
        let dir = tempfile::tempdir().unwrap();
        let path = checkpoint_path(&dir.path().join("plugin"));
        assert!(load(&path).unwrap().is_none());
        let claims = PreparedClaims::from([(
            "uid-1".to_string(),
            vec![PreparedDevice {
                request: "train/big".into(),
                pool: "n1".into(),
                device: "gpu-1".into(),
                gpu: GpuInfo {
                    index: 1,
                    uuid: "GPU-1".into(),
                    memory_mib: 40960,
                },
                reserved_mib: 8192,
                share_id: Some("s".into()),
            }],
        )]);
        save(&path, &claims).unwrap();
        assert_eq!(load(&path).unwrap(), Some(claims));
        std::fs::write(&path, b"{\"version\": 9, \"claims\": {}}").unwrap();
        assert!(matches!(load(&path), Err(CheckpointError::Format { .. })));
    }
}
