//! Memory limits enforced by the driver: NVIDIA's CDI hook `nvidia-cdi-hook
//! apply-cuda-memory-limits`.
//!
//! The hook (NVIDIA Container Toolkit, since September 2026) reads `NVIDIA_GPU_MEMORY_REQUEST` and
//! `NVIDIA_GPU_MEMORY_LIMIT` (bytes) from the container's environment, which carma already sets
//! (`container_env`), and applies them to the container's cgroup through NVML
//! `SetMemoryLimits_v1`; it needs a CUDA 13.4 driver. carma runs it through CDI:
//!
//! * the DRA driver adds it to the spec-wide edits of every per-claim spec;
//! * the device plugin cannot edit NVIDIA's spec, so it writes a spec of its own ([`hook_spec`],
//!   kind `carma.io/memory-limits`, one device `hook` whose edits hold only the hook) and names it
//!   ([`HOOK_CDI_NAME`]) in every container's CDI devices.
//!
//! Whether it runs is decided once at start ([`decide`]): forced on or off by the chart
//! (`enforcement.memoryLimits`), or, with `auto`, when the hook binary is on the node and the
//! driver is new enough (unknown without NVML: the simulated and DCGM backends judge by the binary
//! alone).

use std::fmt;
use std::io;
use std::path::{Path, PathBuf};
use std::str::FromStr;

use carma_api::MemoryEnforcement;
use tracing::{info, warn};

use crate::cdi::{self, CDI_VERSION, CdiDevice, CdiHook, ContainerEdits, Spec};

/// Where NVIDIA's toolkit installs the hook and names it in the specs it generates
/// (`nvidia-ctk cdi generate --nvidia-cdi-hook-path`, default `/usr/bin/nvidia-cdi-hook`).
pub const DEFAULT_HOOK_PATH: &str = "/usr/bin/nvidia-cdi-hook";
/// The hook's argv, as the toolkit writes its own hooks: the program name, then the subcommand.
pub const HOOK_ARGS: [&str; 2] = ["nvidia-cdi-hook", "apply-cuda-memory-limits"];
/// The OCI hook point the toolkit's hooks use.
pub const HOOK_NAME: &str = "createContainer";
/// The oldest CUDA driver version that has `SetMemoryLimits_v1`, as NVML reports it
/// (`1000 × major + 10 × minor`: 13.4).
pub const MIN_CUDA_DRIVER_VERSION: u32 = 13_040;
/// CDI kind of the device plugin's hook spec.
pub const HOOK_CDI_KIND: &str = "carma.io/memory-limits";
/// The one device of that spec.
pub const HOOK_CDI_DEVICE: &str = "hook";
/// The CDI name the device plugin adds to a container's `cdi_devices` when the hook runs.
pub const HOOK_CDI_NAME: &str = "carma.io/memory-limits=hook";
/// File name of the device plugin's hook spec in the CDI directory.
pub const HOOK_SPEC_FILE: &str = "carma.io-memory-limits.json";

/// `--memory-limit-enforcement` (chart `enforcement.memoryLimits`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum MemoryLimitsMode {
    /// Run the hook when the node has it and its driver is new enough.
    #[default]
    Auto,
    /// Always run it (a node without the hook then fails every GPU container's creation).
    On,
    /// Never run it.
    Off,
}

impl MemoryLimitsMode {
    /// The flag's spelling.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Auto => "auto",
            Self::On => "on",
            Self::Off => "off",
        }
    }
}

impl fmt::Display for MemoryLimitsMode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A `--memory-limit-enforcement` value that is not `auto`, `on` or `off`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("memory-limit enforcement {0:?}: expected auto, on or off")]
pub struct BadMode(pub String);

impl FromStr for MemoryLimitsMode {
    type Err = BadMode;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "auto" => Ok(Self::Auto),
            "on" => Ok(Self::On),
            "off" => Ok(Self::Off),
            other => Err(BadMode(other.to_string())),
        }
    }
}

/// Where the hook is and whether to run it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HookConfig {
    /// Forced on, off, or detected.
    pub mode: MemoryLimitsMode,
    /// The hook's path on the node, written into the CDI specs (the runtime runs it on the host).
    pub path: PathBuf,
    /// Where this process sees that file (in a pod, a read-only host mount); detection looks here.
    pub probe_path: PathBuf,
}

impl Default for HookConfig {
    fn default() -> Self {
        Self {
            mode: MemoryLimitsMode::Auto,
            path: PathBuf::from(DEFAULT_HOOK_PATH),
            probe_path: PathBuf::from(DEFAULT_HOOK_PATH),
        }
    }
}

/// The start-up decision: run the hook or not, and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Decision {
    /// Whether every GPU container gets the hook.
    pub hook: bool,
    /// Why, for the log.
    pub reason: String,
}

/// Whether `path` is an executable regular file.
pub fn is_executable(path: &Path) -> bool {
    use std::os::unix::fs::PermissionsExt;
    std::fs::metadata(path).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
}

/// Decide whether the hook runs. `cuda_driver_version` is NVML's (`None` without NVML: no driver
/// to ask, so `auto` judges by the binary alone). Blocking (a `stat`).
pub fn decide(config: &HookConfig, cuda_driver_version: Option<u32>) -> Decision {
    let probe = config.probe_path.display();
    match config.mode {
        MemoryLimitsMode::Off => Decision {
            hook: false,
            reason: "forced off".to_string(),
        },
        MemoryLimitsMode::On => Decision {
            hook: true,
            reason: "forced on".to_string(),
        },
        MemoryLimitsMode::Auto if !is_executable(&config.probe_path) => Decision {
            hook: false,
            reason: format!("no executable hook at {probe}"),
        },
        MemoryLimitsMode::Auto => match cuda_driver_version {
            Some(v) if v < MIN_CUDA_DRIVER_VERSION => Decision {
                hook: false,
                reason: format!(
                    "hook at {probe}, but the CUDA driver is {} (needs {} for SetMemoryLimits_v1)",
                    version_text(v),
                    version_text(MIN_CUDA_DRIVER_VERSION)
                ),
            },
            Some(v) => Decision {
                hook: true,
                reason: format!("hook at {probe}, CUDA driver {}", version_text(v)),
            },
            None => Decision {
                hook: true,
                reason: format!("hook at {probe} (driver version unknown without NVML)"),
            },
        },
    }
}

/// NVML's CUDA driver version as `major.minor`.
pub fn version_text(v: u32) -> String {
    format!("{}.{}", v / 1000, (v % 1000) / 10)
}

/// How a GPU's memory limits are enforced, by what the agent applies to its containers: the
/// driver's hook first, then MPS's pinned limits.
pub fn enforcement(hook: bool, mps: bool) -> MemoryEnforcement {
    match (hook, mps) {
        (true, _) => MemoryEnforcement::Driver,
        (false, true) => MemoryEnforcement::Mps,
        (false, false) => MemoryEnforcement::None,
    }
}

/// The CDI hook entry that runs `apply-cuda-memory-limits` from `path`.
pub fn hook(path: &Path) -> CdiHook {
    CdiHook {
        hook_name: HOOK_NAME.to_string(),
        path: path.to_string_lossy().into_owned(),
        args: HOOK_ARGS.iter().map(|a| a.to_string()).collect(),
        env: Vec::new(),
        timeout: None,
    }
}

/// The device plugin's static spec: kind [`HOOK_CDI_KIND`], one device [`HOOK_CDI_DEVICE`] whose
/// edits hold only the hook.
pub fn hook_spec(path: &Path) -> Spec {
    Spec {
        cdi_version: CDI_VERSION.to_string(),
        kind: HOOK_CDI_KIND.to_string(),
        devices: vec![CdiDevice {
            name: HOOK_CDI_DEVICE.to_string(),
            container_edits: ContainerEdits {
                hooks: vec![hook(path)],
                ..ContainerEdits::default()
            },
        }],
        container_edits: ContainerEdits::default(),
    }
}

/// Write the hook spec into the CDI directory `dir` durably, or with `hook` false remove one an
/// earlier start left (a container that does not name it is not affected, but a stale spec would
/// claim enforcement the node no longer has). Returns the spec's path. Blocking: call it off the
/// async runtime.
pub fn sync_hook_spec(dir: &Path, hook_path: &Path, hook: bool) -> io::Result<PathBuf> {
    let path = dir.join(HOOK_SPEC_FILE);
    if hook {
        std::fs::create_dir_all(dir)?;
        let text = serde_json::to_vec_pretty(&hook_spec(hook_path)).map_err(io::Error::other)?;
        cdi::write_durably(&path, &text)?;
    } else {
        match std::fs::remove_file(&path) {
            Ok(()) => cdi::sync_parent(&path)?,
            Err(e) if e.kind() == io::ErrorKind::NotFound => {}
            Err(e) => return Err(e),
        }
    }
    Ok(path)
}

/// The memory-limit hook's CDI spec cannot be written (or a stale one removed) while the hook is
/// forced on, or the start-up decision did not finish.
#[derive(Debug, thiserror::Error)]
#[error("memory-limit hook CDI spec in {}: {source}", dir.display())]
pub struct HookSpecError {
    /// The CDI directory.
    pub dir: PathBuf,
    /// Why.
    pub source: io::Error,
}

/// Decide at start and, for the device plugin, bring its hook spec in `spec_dir` in line
/// ([`decide`], [`sync_hook_spec`]), off the async runtime; the DRA driver, which puts the hook in
/// its per-claim specs, passes no directory. Returns whether the hook runs. A spec that cannot be
/// written (or a stale one removed) turns `auto` off (logged) and fails `on`, whose containers
/// would otherwise all fail to start.
pub async fn prepare(
    config: &HookConfig,
    spec_dir: Option<&Path>,
    cuda_driver_version: Option<u32>,
) -> Result<bool, HookSpecError> {
    let (config, dir) = (config.clone(), spec_dir.map(Path::to_path_buf));
    let joined = tokio::task::spawn_blocking(move || {
        let decision = decide(&config, cuda_driver_version);
        let Some(dir) = dir else {
            return Ok(decision);
        };
        match sync_hook_spec(&dir, &config.path, decision.hook) {
            Ok(_) => Ok(decision),
            Err(source) if config.mode == MemoryLimitsMode::On => {
                Err(HookSpecError { dir, source })
            }
            Err(e) => {
                warn!(dir = %dir.display(), "memory-limit hook spec not brought in line ({e}): the hook stays off");
                Ok(Decision {
                    hook: false,
                    reason: format!("{}, but its CDI spec could not be written: {e}", decision.reason),
                })
            }
        }
    })
    .await;
    let decision = joined.map_err(|e| HookSpecError {
        dir: spec_dir.map(Path::to_path_buf).unwrap_or_default(),
        source: io::Error::other(e.to_string()),
    })??;
    info!(
        hook = decision.hook,
        reason = %decision.reason,
        "memory limits through NVIDIA's CDI hook apply-cuda-memory-limits: {}",
        if decision.hook { "on" } else { "off" }
    );
    Ok(decision.hook)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    fn config(mode: MemoryLimitsMode, probe: &Path) -> HookConfig {
        HookConfig {
            mode,
            path: PathBuf::from(DEFAULT_HOOK_PATH),
            probe_path: probe.to_path_buf(),
        }
    }

    #[test]
    fn auto_runs_the_hook_only_where_the_binary_is_and_the_driver_is_new_enough() {
        let dir = tempfile::tempdir().unwrap();
        let bin = dir.path().join("nvidia-cdi-hook");
        let auto = config(MemoryLimitsMode::Auto, &bin);
        assert!(!decide(&auto, None).hook, "no binary");
        std::fs::write(&bin, "#!/bin/sh\n").unwrap();
        std::fs::set_permissions(&bin, std::fs::Permissions::from_mode(0o644)).unwrap();
        assert!(!decide(&auto, None).hook, "not executable");
        std::fs::set_permissions(&bin, std::fs::Permissions::from_mode(0o755)).unwrap();
        assert!(decide(&auto, None).hook, "simulated: the binary decides");
        assert!(decide(&auto, Some(13_040)).hook);
        assert!(decide(&auto, Some(14_000)).hook);
        let old = decide(&auto, Some(13_020));
        assert!(!old.hook);
        assert!(
            old.reason.contains("13.2") && old.reason.contains("13.4"),
            "{}",
            old.reason
        );
        // A directory at the path is no hook.
        assert!(!decide(&config(MemoryLimitsMode::Auto, dir.path()), None).hook);
        // Forced either way, whatever the node has.
        assert!(
            decide(
                &config(MemoryLimitsMode::On, &dir.path().join("x")),
                Some(12_000)
            )
            .hook
        );
        assert!(!decide(&config(MemoryLimitsMode::Off, &bin), Some(13_040)).hook);
    }

    #[test]
    fn modes_parse_and_print() {
        for m in [
            MemoryLimitsMode::Auto,
            MemoryLimitsMode::On,
            MemoryLimitsMode::Off,
        ] {
            assert_eq!(m.as_str().parse::<MemoryLimitsMode>(), Ok(m));
        }
        assert!("yes".parse::<MemoryLimitsMode>().is_err());
    }

    #[test]
    fn enforcement_prefers_the_driver_then_mps() {
        assert_eq!(enforcement(true, true), MemoryEnforcement::Driver);
        assert_eq!(enforcement(false, true), MemoryEnforcement::Mps);
        assert_eq!(enforcement(false, false), MemoryEnforcement::None);
    }

    #[test]
    fn the_hook_spec_is_written_when_on_and_removed_when_off() {
        let dir = tempfile::tempdir().unwrap();
        let cdi = dir.path().join("cdi");
        let hook_path = Path::new("/usr/bin/nvidia-cdi-hook");
        let path = sync_hook_spec(&cdi, hook_path, true).unwrap();
        let json: serde_json::Value =
            serde_json::from_slice(&std::fs::read(&path).unwrap()).unwrap();
        assert_eq!(json["kind"], HOOK_CDI_KIND);
        assert_eq!(json["cdiVersion"], "0.5.0");
        assert_eq!(
            HOOK_CDI_NAME,
            format!(
                "{}={}",
                json["kind"].as_str().unwrap(),
                json["devices"][0]["name"].as_str().unwrap()
            )
        );
        let h = &json["devices"][0]["containerEdits"]["hooks"][0];
        assert_eq!(h["hookName"], "createContainer");
        assert_eq!(h["path"], "/usr/bin/nvidia-cdi-hook");
        assert_eq!(
            h["args"],
            serde_json::json!(["nvidia-cdi-hook", "apply-cuda-memory-limits"])
        );
        assert!(json["devices"][0]["containerEdits"].get("env").is_none());
        assert!(json.get("containerEdits").is_none());
        assert_eq!(
            std::fs::read_dir(&cdi).unwrap().count(),
            1,
            "no temporary file"
        );
        sync_hook_spec(&cdi, hook_path, false).unwrap();
        assert!(!path.exists());
        sync_hook_spec(&cdi, hook_path, false).unwrap();
    }
}
