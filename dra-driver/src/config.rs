//! Run-time configuration of the DRA driver.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use carma_gpu::config::{BackendKind, BackendSettings, MpsConfig};
use thiserror::Error;

use crate::DRIVER_NAME;

/// A configuration value that cannot be used; the message names the flag.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
#[error("{0}")]
pub struct ConfigError(pub String);

/// The kubelet's plugin-watcher directory: a socket created here is how a plugin registers.
pub const DEFAULT_REGISTRY_DIR: &str = "/var/lib/kubelet/plugins_registry";
/// Where the DRA socket lives (the Go helper's default: `/var/lib/kubelet/plugins/<driver>`).
pub const DEFAULT_PLUGIN_DIR: &str = "/var/lib/kubelet/plugins/gpu.carma.io";
/// The container runtime's directory of dynamically generated CDI specs.
pub const DEFAULT_CDI_DIR: &str = "/var/run/cdi";

/// Default of [`Config::cdi_sweep_interval`].
pub const DEFAULT_CDI_SWEEP_INTERVAL: Duration = Duration::from_secs(300);

/// Default of [`Config::health_check_interval`].
pub const DEFAULT_HEALTH_CHECK_INTERVAL: Duration = Duration::from_secs(5);

/// Everything the DRA driver needs to run.
#[derive(Debug, Clone, PartialEq)]
pub struct Config {
    /// This node's name: the ResourceSlice's `nodeName` and its pool's name.
    pub node_name: String,
    /// The GPU backend and how it is sampled (as for the device plugin).
    pub backend: BackendSettings,
    /// The kubelet's plugin-watcher directory; the registration socket `gpu.carma.io-reg.sock` is
    /// created in it.
    pub registry_dir: PathBuf,
    /// Directory of the DRA socket `dra.sock` (the path the kubelet is told in `GetInfo`).
    pub plugin_dir: PathBuf,
    /// Where per-claim CDI specs are written.
    pub cdi_dir: PathBuf,
    /// Caps of the utilization gate.
    pub gate: carma_gpu::sampling::GateCaps,
    /// A gated GPU is reopened only when the gate passes with every cap lowered by this much, so a
    /// GPU hovering at the cap does not rewrite the slice every second.
    pub gate_reopen_margin: f64,
    /// Value of each device's `slots` capacity: the most claims that can share one GPU (the
    /// device plugin's replicas).
    pub slots: u32,
    /// Smallest memory share (MiB): `requestPolicy.validRange.min` of `memory`; smaller requests
    /// are rounded up to it.
    pub min_share_mib: u64,
    /// MPS settings put into the CDI specs (as the device plugin's); `None`: off.
    pub mps: Option<MpsConfig>,
    /// Also return NVIDIA's CDI name `nvidia.com/gpu=<UUID>` for each device, for runtimes that
    /// expose GPUs through the NVIDIA Container Toolkit's generated CDI spec.
    pub nvidia_cdi: bool,
    /// NVIDIA's memory-limit CDI hook, added to every per-claim spec when it runs
    /// ([`carma_gpu::enforcement`]). Off here; the command line's default is `auto`.
    pub memory_limits: carma_gpu::enforcement::HookConfig,
    /// ResourceSlice writes are at least this far apart.
    pub slice_min_interval: Duration,
    /// How often carma's CDI specs whose claim is not prepared (left by a crash) are removed,
    /// besides once at start ([`crate::checkpoint`]). Default 5 minutes: an orphan is harmless
    /// until a runtime is asked for its device, which only a claim that is prepared again (and
    /// then rewritten) would do, so the sweep only keeps the directory from growing.
    pub cdi_sweep_interval: Duration,
    /// Where `/metrics`, `/healthz` and `/readyz` are served; `None`: no HTTP listener.
    pub metrics_addr: Option<SocketAddr>,
    /// How often the driver checks its own gRPC servers with a `grpc.health.v1` call over each
    /// socket, as a client would (what `/healthz` reports).
    pub health_check_interval: Duration,
}

impl Config {
    /// The defaults for `node_name` and `backend`.
    pub fn new(node_name: impl Into<String>, backend: BackendKind) -> Self {
        Self {
            node_name: node_name.into(),
            backend: BackendSettings::new(backend),
            registry_dir: PathBuf::from(DEFAULT_REGISTRY_DIR),
            plugin_dir: PathBuf::from(DEFAULT_PLUGIN_DIR),
            cdi_dir: PathBuf::from(DEFAULT_CDI_DIR),
            gate: carma_gpu::sampling::GateCaps::default(),
            gate_reopen_margin: 0.05,
            slots: 8,
            min_share_mib: 1024,
            mps: None,
            nvidia_cdi: false,
            memory_limits: carma_gpu::enforcement::HookConfig {
                mode: carma_gpu::enforcement::MemoryLimitsMode::Off,
                ..Default::default()
            },
            slice_min_interval: Duration::from_secs(2),
            cdi_sweep_interval: DEFAULT_CDI_SWEEP_INTERVAL,
            metrics_addr: None,
            health_check_interval: DEFAULT_HEALTH_CHECK_INTERVAL,
        }
    }

    /// The registration socket the kubelet's plugin watcher finds.
    pub fn registration_socket(&self) -> PathBuf {
        self.registry_dir.join(format!("{DRIVER_NAME}-reg.sock"))
    }

    /// The DRA service socket.
    pub fn dra_socket(&self) -> PathBuf {
        self.plugin_dir.join("dra.sock")
    }

    /// Check what the flag parsers cannot.
    pub fn validate(&self) -> Result<(), ConfigError> {
        let bad = |m: String| Err(ConfigError(m));
        if self.node_name.trim().is_empty() {
            return bad(
                "--node-name is empty: pass the node's name (NODE_NAME from spec.nodeName)".into(),
            );
        }
        if let Some(problem) = self.gate.problem() {
            return bad(problem);
        }
        if !(self.gate_reopen_margin.is_finite() && (0.0..0.5).contains(&self.gate_reopen_margin)) {
            return bad(format!(
                "--gate-reopen-margin {}: expected 0 up to (not including) 0.5",
                self.gate_reopen_margin
            ));
        }
        if !(1..=1024).contains(&self.slots) {
            return bad(format!(
                "--slots {}: expected 1..=1024 claims per GPU",
                self.slots
            ));
        }
        if self.min_share_mib == 0 {
            return bad("--min-share-mib 0: expected at least 1 MiB".into());
        }
        for (flag, dir) in [
            ("--registry-dir", &self.registry_dir),
            ("--plugin-dir", &self.plugin_dir),
            ("--cdi-dir", &self.cdi_dir),
        ] {
            // The kubelet dials the DRA socket by the path GetInfo names, from its own working
            // directory.
            if !dir.is_absolute() {
                return bad(format!(
                    "{flag} {}: expected an absolute path",
                    dir.display()
                ));
            }
        }
        if self.cdi_sweep_interval.is_zero() {
            return bad("the CDI sweep interval must be longer than zero".into());
        }
        if self.health_check_interval.is_zero() {
            return bad("the health check interval must be longer than zero".into());
        }
        self.backend
            .validate()
            .map_err(|e| ConfigError(e.to_string()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sockets_are_where_the_kubelet_looks() {
        let c = Config::new("n1", BackendKind::Simulated);
        assert_eq!(
            c.registration_socket(),
            PathBuf::from("/var/lib/kubelet/plugins_registry/gpu.carma.io-reg.sock")
        );
        assert_eq!(
            c.dra_socket(),
            PathBuf::from("/var/lib/kubelet/plugins/gpu.carma.io/dra.sock")
        );
        assert!(c.validate().is_ok());
    }

    #[test]
    fn validation_names_the_flag() {
        let mut c = Config::new("n1", BackendKind::Simulated);
        c.slots = 0;
        assert!(c.validate().unwrap_err().0.contains("--slots"));
        c.slots = 8;
        c.gate_reopen_margin = 0.7;
        assert!(c.validate().unwrap_err().0.contains("--gate-reopen-margin"));
        c.gate_reopen_margin = 0.05;
        c.node_name = " ".into();
        assert!(c.validate().unwrap_err().0.contains("--node-name"));
        c.node_name = "n1".into();
        c.plugin_dir = PathBuf::from("plugins/gpu.carma.io");
        assert!(c.validate().unwrap_err().0.contains("--plugin-dir"));
        c.plugin_dir = PathBuf::from(DEFAULT_PLUGIN_DIR);
        c.backend.kind = BackendKind::Dcgm;
        assert!(c.validate().unwrap_err().0.contains("--dcgm-endpoint"));
    }
}
