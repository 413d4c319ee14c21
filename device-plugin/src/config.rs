//! Run-time configuration of the device plugin and the parsers for its flag values.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

pub use carma_gpu::config::{
    BackendKind, BackendSettings, ConfigError, MpsConfig, SimulatedGpus, SimulatedMetrics,
    parse_duration, parse_duration_up_to,
};

/// Most synthetic pods per simulated GPU (`--simulated-pods`): each carries a
/// load script and time series, and a million of them took 2.1 GB in 4 s.
pub const MAX_SIMULATED_PODS: u32 = 64;

/// Everything the device plugin needs to run.
#[derive(Debug, Clone, PartialEq)]
pub struct Config {
    /// The GPU backend and how it is sampled.
    pub backend: BackendSettings,
    /// Synthetic pods per simulated GPU; `None`: 2 when no API server is reachable, else 0.
    /// At most [`MAX_SIMULATED_PODS`].
    pub simulated_pods: Option<u32>,
    /// Replicas advertised per GPU (`<UUID>::<k>`, k = 0..R-1).
    pub replicas: u32,
    /// Kubelet's device-plugin directory (holds `kubelet.sock` and the plugin's socket).
    pub device_plugin_dir: PathBuf,
    /// File name of the plugin's socket in `device_plugin_dir`.
    pub socket_name: String,
    /// Address of `/metrics`, `/healthz` and `/readyz`.
    pub metrics_addr: SocketAddr,
    /// This node's name (GpuNode name, pod lookup).
    pub node_name: String,
    /// MPS limits in Allocate responses; `None`: off (memory limits are advisory).
    pub mps: Option<MpsConfig>,
    /// Caps of the exported gate verdict; the SM activity cap is also exported as
    /// `carma_gpu_sm_activity_cap_ratio`.
    pub gate: carma_gpu::sampling::GateCaps,
    /// Publish thresholds and heartbeat of the GpuNode status.
    pub publish: PublishConfig,
    /// How long a pod list serves the telemetry loop before it is refreshed.
    pub pod_cache_ttl: Duration,
    /// How often the device-plugin directory is checked for a kubelet restart.
    pub watch_interval: Duration,
    /// NVIDIA's memory-limit CDI hook and whether it runs ([`carma_gpu::enforcement`]). Off here; the
    /// command line's default is `auto`.
    pub memory_limits: carma_gpu::enforcement::HookConfig,
    /// The container runtime's CDI spec directory, where the hook's spec is written (or removed
    /// when the hook does not run); `None`: nothing is written, and the hook cannot run.
    pub cdi_dir: Option<PathBuf>,
}

/// When the GpuNode status is written (see [`crate::publish_rule::publish_reason`]).
///
/// At rest (telemetry unchanged, or moving inside the deadbands) a node writes only its heartbeat:
/// at the defaults one status write per node every 270–300 s, so 5,000 nodes write about 18 a
/// second (ARCHITECTURE.md, "A quiet API server"). A change that can alter a placement decision is
/// written at the next sample.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct PublishConfig {
    /// Free memory change (MiB) of any GPU since the last write that triggers a write. Below the
    /// 512 MiB the extender holds back from every published free figure, so a pod it admits on a
    /// figure up to this far off still has its whole memory margin.
    pub free_mib_delta: u64,
    /// Risk-score change of any activity metric since the last write that triggers a write. A
    /// change that opens or closes the utilization gate is written whatever its size.
    pub risk_delta: f64,
    /// Write at least this often even when nothing changed: the extender's liveness signal
    /// (`maxTelemetryAgeSeconds` must be longer; the default is two heartbeats). Each interval is
    /// shortened by up to a tenth, differently on each node, so nodes restarted together do not
    /// write together.
    pub heartbeat: Duration,
    /// Deadband-driven writes are at least this far apart (a change of GPUs, health, pods, a pod's
    /// memory showing or of the gate verdict is never delayed). The default, 750 ms, allows one
    /// write per 1 s sample whatever the sampler's jitter, and no more at shorter intervals.
    pub min_interval: Duration,
}

/// Default heartbeat of the GpuNode status (see [`PublishConfig::heartbeat`]).
pub const DEFAULT_PUBLISH_HEARTBEAT: Duration = Duration::from_secs(300);

impl Default for PublishConfig {
    fn default() -> Self {
        Self {
            free_mib_delta: 256,
            risk_delta: 0.05,
            heartbeat: DEFAULT_PUBLISH_HEARTBEAT,
            min_interval: Duration::from_millis(750),
        }
    }
}

/// The kubelet device-plugin directory.
pub const DEFAULT_DEVICE_PLUGIN_DIR: &str = "/var/lib/kubelet/device-plugins";
/// The plugin's socket file name.
pub const DEFAULT_SOCKET_NAME: &str = "carma.sock";
/// Default metrics port (next to dcgm-exporter's 9400).
pub const DEFAULT_METRICS_ADDR: &str = "0.0.0.0:9402";

impl Config {
    /// A configuration with the documented defaults for `node_name` and `backend`.
    pub fn new(node_name: impl Into<String>, backend: BackendKind) -> Self {
        Self {
            backend: BackendSettings::new(backend),
            simulated_pods: None,
            replicas: 8,
            device_plugin_dir: PathBuf::from(DEFAULT_DEVICE_PLUGIN_DIR),
            socket_name: DEFAULT_SOCKET_NAME.to_string(),
            metrics_addr: DEFAULT_METRICS_ADDR
                .parse()
                .unwrap_or_else(|_| SocketAddr::from(([0, 0, 0, 0], 9402))),
            node_name: node_name.into(),
            mps: None,
            gate: carma_gpu::sampling::GateCaps::default(),
            publish: PublishConfig::default(),
            pod_cache_ttl: Duration::from_secs(10),
            watch_interval: Duration::from_secs(1),
            memory_limits: carma_gpu::enforcement::HookConfig {
                mode: carma_gpu::enforcement::MemoryLimitsMode::Off,
                ..Default::default()
            },
            cdi_dir: None,
        }
    }

    /// Check the values that the flag parsers cannot check alone.
    pub fn validate(&self) -> Result<(), ConfigError> {
        if self.memory_limits.mode != carma_gpu::enforcement::MemoryLimitsMode::Off
            && self.cdi_dir.is_none()
        {
            return Err(ConfigError::Invalid(
                "memory-limit enforcement needs a CDI directory for the hook's spec (--cdi-dir)"
                    .to_string(),
            ));
        }
        if self.node_name.trim().is_empty() {
            return Err(ConfigError::Invalid(
                "--node-name is empty: pass the node's name (the DaemonSet sets NODE_NAME from spec.nodeName)"
                    .to_string(),
            ));
        }
        if let Some(n) = self.simulated_pods
            && n > MAX_SIMULATED_PODS
        {
            return Err(ConfigError::Invalid(format!(
                "--simulated-pods {n}: expected 0..={MAX_SIMULATED_PODS} synthetic pods per GPU"
            )));
        }
        if !(1..=1024).contains(&self.replicas) {
            return Err(ConfigError::Invalid(format!(
                "--replicas {}: expected 1..=1024 replicas per GPU",
                self.replicas
            )));
        }
        if let Some(problem) = self.gate.problem() {
            return Err(ConfigError::Invalid(problem));
        }
        if self.socket_name.is_empty()
            || self.socket_name.contains('/')
            || self.socket_name == "kubelet.sock"
        {
            return Err(ConfigError::Invalid(format!(
                "socket name {:?}: expected a plain file name other than kubelet.sock",
                self.socket_name
            )));
        }
        self.backend.validate()?;
        let p = &self.publish;
        let interval = self.backend.sample_interval;
        if p.heartbeat < p.min_interval.max(interval) {
            return Err(ConfigError::Invalid(format!(
                "--publish-heartbeat {:?}: expected at least the sample interval ({interval:?})",
                p.heartbeat
            )));
        }
        if !(p.risk_delta.is_finite() && p.risk_delta > 0.0 && p.risk_delta <= 1.0) {
            return Err(ConfigError::Invalid(format!(
                "--publish-risk-delta {}: expected a risk-score change above 0 and at most 1",
                p.risk_delta
            )));
        }
        if p.free_mib_delta == 0 {
            return Err(ConfigError::Invalid(
                "--publish-free-mib-delta 0: expected at least 1 MiB (every sample would be written)"
                    .into(),
            ));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn validation_names_the_flag() {
        let mut c = Config::new("n1", BackendKind::Simulated);
        assert!(c.validate().is_ok());
        c.replicas = 0;
        assert!(c.validate().unwrap_err().to_string().contains("--replicas"));
        c.replicas = 8;
        c.gate.sm_activity = 1.5;
        assert!(
            c.validate()
                .unwrap_err()
                .to_string()
                .contains("--sm-activity-cap")
        );
        c.gate.sm_activity = 0.8;
        c.backend.kind = BackendKind::Dcgm;
        assert!(
            c.validate()
                .unwrap_err()
                .to_string()
                .contains("--dcgm-endpoint")
        );
        c.backend.kind = BackendKind::Simulated;
        c.node_name = " ".into();
        assert!(
            c.validate()
                .unwrap_err()
                .to_string()
                .contains("--node-name")
        );
    }

    #[test]
    fn simulated_pods_are_bounded() {
        let mut c = Config::new("n1", BackendKind::Simulated);
        c.simulated_pods = Some(MAX_SIMULATED_PODS);
        assert!(c.validate().is_ok());
        c.simulated_pods = Some(1_000_000);
        let err = c.validate().unwrap_err().to_string();
        assert!(
            err.contains("--simulated-pods 1000000") && err.contains("0..=64"),
            "{err}"
        );
    }
}
