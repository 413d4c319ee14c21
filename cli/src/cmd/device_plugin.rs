//! `carma device-plugin`: the per-node DaemonSet process.
//!
//! Serves the kubelet device-plugin API on `<--device-plugin-dir>/carma.sock`, registers
//! `carma.io/gpu` with `--replicas` replicas per GPU, samples the GPUs every `--sample-interval`,
//! publishes the node's `GpuNode` status and serves `/metrics`, `/healthz` and `/readyz` on
//! `--metrics-addr`. Without a reachable API server it still serves kubelet and `/metrics`; GpuNode
//! publishing and pod lookup are then off, and Allocate refuses with that reason.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use carma_device_plugin::config::{
    self, Config, DEFAULT_DEVICE_PLUGIN_DIR, DEFAULT_METRICS_ADDR, DEFAULT_SOCKET_NAME, MpsConfig,
};
use tracing::{info, warn};

use super::EXIT_BAD_INPUT;
use super::node_agent::{BackendArgs, GateCapArgs, MemoryLimitArgs, parse_interval};

/// Arguments of `carma device-plugin`.
#[derive(Debug, clap::Args)]
pub struct DevicePluginArgs {
    #[command(flatten)]
    pub gpus: BackendArgs,
    /// Synthetic pods per simulated GPU (namespace `simulated`, labelled simulated="true" in
    /// metrics) that carry the scripted load, 0..=64; default: 2 without an API server, 0 with one.
    #[arg(long)]
    pub simulated_pods: Option<u32>,
    /// Replicas advertised per GPU (`<UUID>::<k>`): the most pods that can share one GPU.
    #[arg(long, default_value_t = 8)]
    pub replicas: u32,
    /// Kubelet's device-plugin directory (holds kubelet.sock; the plugin's socket is created there).
    #[arg(long, default_value = DEFAULT_DEVICE_PLUGIN_DIR)]
    pub device_plugin_dir: PathBuf,
    /// File name of the plugin's socket in --device-plugin-dir.
    #[arg(long, default_value = DEFAULT_SOCKET_NAME)]
    pub socket_name: String,
    /// Address of /metrics, /healthz and /readyz.
    #[arg(long, default_value = DEFAULT_METRICS_ADDR)]
    pub metrics_addr: SocketAddr,
    /// This node's name (the DaemonSet sets NODE_NAME from spec.nodeName); default: the hostname.
    #[arg(long, env = "NODE_NAME")]
    pub node_name: Option<String>,
    /// Enforce reservations with NVIDIA MPS: Allocate sets CUDA_MPS_PINNED_DEVICE_MEM_LIMIT
    /// (`0=<MiB>M,1=<MiB>M,…`) and mounts what MPS clients need (pipes, shared memory, logs). SMs
    /// stay unlimited unless --mps-active-thread-percentage is given. Needs an MPS control daemon
    /// on the node. Without it, memory reservations are advisory.
    #[arg(long)]
    pub mps: bool,
    /// MPS pipe directory mounted into containers and exported as CUDA_MPS_PIPE_DIRECTORY (with --mps).
    #[arg(
        long,
        env = "CARMA_MPS_PIPE_DIRECTORY",
        default_value = "/tmp/nvidia-mps"
    )]
    pub mps_pipe_directory: PathBuf,
    /// Host directory with the MPS server's shared memory, mounted at the containers' /dev/shm
    /// (with --mps). The host's /dev/shm unless the MPS daemon uses its own.
    #[arg(long, env = "CARMA_MPS_SHM_DIRECTORY", default_value = "/dev/shm")]
    pub mps_shm_directory: Option<PathBuf>,
    /// MPS control daemon's log directory, mounted read-only and exported as
    /// CUDA_MPS_LOG_DIRECTORY (with --mps).
    #[arg(
        long,
        env = "CARMA_MPS_LOG_DIRECTORY",
        default_value = "/var/log/nvidia-mps"
    )]
    pub mps_log_directory: Option<PathBuf>,
    /// CUDA_MPS_ACTIVE_THREAD_PERCENTAGE for shared pods (1..=100; with --mps). Unset: SMs are not
    /// split, a pod alone on its GPU gets all of it, and the utilization gate keeps collocated
    /// pods apart from saturated GPUs.
    #[arg(long, env = "CARMA_MPS_ACTIVE_THREAD_PERCENTAGE", value_parser = clap::value_parser!(u32).range(1..=100))]
    pub mps_active_thread_percentage: Option<u32>,
    /// Telemetry sampling interval (CARMA: 1s, with a 30-sample window).
    #[arg(long, default_value = "1s", value_parser = parse_interval)]
    pub sample_interval: Duration,
    /// Write the GpuNode status at least this often when nothing changed (each interval shortened
    /// by up to a tenth per node). The extender's --max-telemetry-age-seconds must be longer (its
    /// default, 600 s, is two default heartbeats). At 5,000 nodes the default writes about 18
    /// statuses a second at rest.
    #[arg(long, env = "CARMA_PUBLISH_HEARTBEAT", default_value = "5m", value_parser = parse_heartbeat)]
    pub publish_heartbeat: Duration,
    /// Write the GpuNode status when a GPU's free memory moved by this many MiB since the last
    /// write (keep it below the extender's 512 MiB telemetry reserve).
    #[arg(long, env = "CARMA_PUBLISH_FREE_MIB_DELTA", default_value_t = 256)]
    pub publish_free_mib_delta: u64,
    /// Write the GpuNode status when a GPU's risk score moved by this much since the last write (a
    /// change that opens or closes the utilization gate is written whatever its size).
    #[arg(long, env = "CARMA_PUBLISH_RISK_DELTA", default_value_t = 0.05)]
    pub publish_risk_delta: f64,
    #[command(flatten)]
    pub gate: GateCapArgs,
    /// The container runtime's CDI spec directory: the memory-limit hook's spec
    /// (`carma.io/memory-limits`) is written there while the hook runs.
    #[arg(long, env = "CARMA_CDI_DIR", default_value = "/var/run/cdi")]
    pub cdi_dir: PathBuf,
    #[command(flatten)]
    pub memory_limits: MemoryLimitArgs,
}

fn parse_heartbeat(text: &str) -> Result<Duration, config::ConfigError> {
    config::parse_duration("--publish-heartbeat", text)
}

fn hostname() -> Option<String> {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .ok()
        .map(|h| h.trim().to_string())
        .filter(|h| !h.is_empty())
}

impl DevicePluginArgs {
    fn to_config(&self) -> Result<Config, String> {
        let node = match self.node_name.as_deref().map(str::trim) {
            Some(n) if !n.is_empty() => n.to_string(),
            _ => {
                let h = hostname().ok_or(
                    "--node-name is not given (nor NODE_NAME) and the hostname is unknown",
                )?;
                warn!(node = %h, "--node-name not given: using the hostname as node name");
                h
            }
        };
        let mut c = Config::new(node, self.gpus.backend);
        c.backend = self.gpus.settings(self.sample_interval);
        c.simulated_pods = self.simulated_pods;
        c.replicas = self.replicas;
        c.device_plugin_dir = self.device_plugin_dir.clone();
        c.socket_name = self.socket_name.clone();
        c.metrics_addr = self.metrics_addr;
        c.mps = self.mps.then(|| MpsConfig {
            pipe_directory: Some(self.mps_pipe_directory.clone()),
            shm_directory: self.mps_shm_directory.clone(),
            log_directory: self.mps_log_directory.clone(),
            active_thread_percentage: self.mps_active_thread_percentage,
        });
        c.gate = self.gate.caps();
        c.publish.heartbeat = self.publish_heartbeat;
        c.publish.free_mib_delta = self.publish_free_mib_delta;
        c.publish.risk_delta = self.publish_risk_delta;
        c.cdi_dir = Some(self.cdi_dir.clone());
        c.memory_limits = self.memory_limits.to_config();
        c.validate().map_err(|e| e.to_string())?;
        Ok(c)
    }
}

/// A Kubernetes client when an API server is configured and reachable (always when in a cluster,
/// where it may come up later); `None` otherwise.
async fn connect_kube() -> Option<kube::Client> {
    let client = match kube::Client::try_default().await {
        Ok(c) => c,
        Err(e) => {
            info!("no Kubernetes configuration ({e})");
            return None;
        }
    };
    let in_cluster = std::env::var_os("KUBERNETES_SERVICE_HOST").is_some();
    match tokio::time::timeout(Duration::from_secs(5), client.apiserver_version()).await {
        Ok(Ok(v)) => {
            info!(version = %v.git_version, "Kubernetes API server reachable");
            Some(client)
        }
        Ok(Err(e)) if in_cluster => {
            warn!("Kubernetes API server not reachable yet ({e}); publishing and pod lookup retry");
            Some(client)
        }
        Err(_) if in_cluster => {
            warn!(
                "Kubernetes API server did not answer within 5 s; publishing and pod lookup retry"
            );
            Some(client)
        }
        Ok(Err(e)) => {
            warn!("Kubernetes API server not reachable ({e})");
            None
        }
        Err(_) => {
            warn!("Kubernetes API server did not answer within 5 s");
            None
        }
    }
}

/// Run `carma device-plugin`.
pub fn run(args: DevicePluginArgs) -> anyhow::Result<ExitCode> {
    let config = match args.to_config() {
        Ok(c) => c,
        Err(e) => {
            eprintln!("carma device-plugin: {e}");
            return Ok(ExitCode::from(EXIT_BAD_INPUT));
        }
    };
    let rt = super::node_agent_runtime("carma-dp")?;
    rt.block_on(async move {
        let kube = connect_kube().await;
        let deps = carma_device_plugin::Dependencies {
            kube,
            ..Default::default()
        };
        let running = match carma_device_plugin::start(config, deps).await {
            Ok(r) => r,
            Err(carma_device_plugin::Error::Config(e)) => {
                eprintln!("carma device-plugin: {e}");
                return Ok(ExitCode::from(EXIT_BAD_INPUT));
            }
            Err(e) => return Err(anyhow::Error::new(e).context("carma device-plugin cannot start")),
        };
        super::shutdown_signal().await;
        running.shutdown().await;
        Ok(ExitCode::SUCCESS)
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use carma_gpu::config::{BackendKind, SimulatedMetrics};
    use carma_gpu::enforcement::MemoryLimitsMode;
    use clap::Parser;

    #[derive(Debug, Parser)]
    struct Cli {
        #[command(flatten)]
        args: DevicePluginArgs,
    }

    fn parse(argv: &[&str]) -> Result<DevicePluginArgs, clap::Error> {
        Cli::try_parse_from(std::iter::once("device-plugin").chain(argv.iter().copied()))
            .map(|c| c.args)
    }

    #[test]
    fn flags_map_to_the_config() {
        let args = parse(&[
            "--backend",
            "simulated",
            "--simulated-gpus",
            "8x80GiB",
            "--replicas",
            "4",
            "--device-plugin-dir",
            "/tmp/dp",
            "--metrics-addr",
            "127.0.0.1:9999",
            "--node-name",
            "gpu-7",
            "--sample-interval",
            "500ms",
            "--sm-activity-cap",
            "0.7",
            "--mps",
            "--simulated-metrics",
            "nvml",
            "--dram-activity-cap",
            "0.3",
            "--memory-limit-enforcement",
            "off",
            "--cdi-dir",
            "/tmp/cdi",
            "--nvidia-cdi-hook-probe-path",
            "/host/usr/bin/nvidia-cdi-hook",
        ])
        .unwrap();
        let c = args.to_config().unwrap();
        assert_eq!(c.backend.kind, BackendKind::Simulated);
        assert_eq!(
            (
                c.backend.simulated_gpus.count,
                c.backend.simulated_gpus.memory_mib
            ),
            (8, 81920)
        );
        assert_eq!(c.replicas, 4);
        assert_eq!(c.device_plugin_dir, PathBuf::from("/tmp/dp"));
        assert_eq!(c.metrics_addr.port(), 9999);
        assert_eq!(c.node_name, "gpu-7");
        assert_eq!(c.backend.sample_interval, Duration::from_millis(500));
        assert_eq!(c.gate.sm_activity, 0.7);
        assert_eq!(c.gate.dram_activity, 0.3);
        assert_eq!(c.backend.simulated_metrics, SimulatedMetrics::Nvml);
        assert!(c.mps.is_some());
        assert_eq!(c.socket_name, "carma.sock");
        assert_eq!(c.memory_limits.mode, MemoryLimitsMode::Off);
        assert_eq!(c.cdi_dir, Some(PathBuf::from("/tmp/cdi")));
        assert_eq!(
            c.memory_limits.path,
            PathBuf::from("/usr/bin/nvidia-cdi-hook")
        );
        assert_eq!(
            c.memory_limits.probe_path,
            PathBuf::from("/host/usr/bin/nvidia-cdi-hook")
        );
        let err = parse(&["--backend", "nvml", "--memory-limit-enforcement", "yes"])
            .unwrap_err()
            .to_string();
        assert!(err.contains("--memory-limit-enforcement"), "{err}");
    }

    #[test]
    fn defaults_follow_the_contract() {
        let c = parse(&["--backend", "nvml", "--node-name", "n"])
            .unwrap()
            .to_config()
            .unwrap();
        assert_eq!(c.replicas, 8);
        assert_eq!(c.metrics_addr.to_string(), "0.0.0.0:9402");
        assert_eq!(c.backend.sample_interval, Duration::from_secs(1));
        assert_eq!(
            c.device_plugin_dir,
            PathBuf::from("/var/lib/kubelet/device-plugins")
        );
        assert!(c.mps.is_none());
        // The memory-limit hook: detected at NVIDIA's path, its spec in the runtime's CDI dir.
        assert_eq!(
            c.memory_limits,
            carma_gpu::enforcement::HookConfig::default()
        );
        assert_eq!(c.memory_limits.mode, MemoryLimitsMode::Auto);
        assert_eq!(c.cdi_dir, Some(PathBuf::from("/var/run/cdi")));
        // The GpuNode status: on change, else a heartbeat every 5 min, which the extender's
        // default staleness limit outlasts twice.
        assert_eq!(
            c.publish,
            carma_device_plugin::config::PublishConfig::default()
        );
        assert_eq!(c.publish.heartbeat, Duration::from_secs(300));
        assert!(
            2 * c.publish.heartbeat.as_millis()
                <= u128::from(carma_core::config::DEFAULT_MAX_TELEMETRY_AGE_MS)
        );
        let c = parse(&[
            "--backend",
            "nvml",
            "--node-name",
            "n",
            "--publish-heartbeat",
            "4m",
            "--publish-free-mib-delta",
            "128",
            "--publish-risk-delta",
            "0.02",
        ])
        .unwrap()
        .to_config()
        .unwrap();
        assert_eq!(
            (
                c.publish.heartbeat,
                c.publish.free_mib_delta,
                c.publish.risk_delta
            ),
            (Duration::from_secs(240), 128, 0.02)
        );
    }

    #[test]
    fn bad_values_name_the_flag() {
        let err = parse(&["--backend", "cuda"]).unwrap_err().to_string();
        assert!(err.contains("--backend"), "{err}");
        let err = parse(&["--backend", "simulated", "--simulated-gpus", "0x40GiB"])
            .unwrap_err()
            .to_string();
        assert!(err.contains("--simulated-gpus"), "{err}");
        let err = parse(&["--backend", "simulated", "--sample-interval", "0s"])
            .unwrap_err()
            .to_string();
        assert!(err.contains("--sample-interval"), "{err}");
        for (flag, value) in [
            ("--publish-heartbeat", "0s"),
            ("--publish-risk-delta", "0"),
            ("--publish-free-mib-delta", "0"),
        ] {
            let err = match parse(&["--backend", "nvml", "--node-name", "n", flag, value]) {
                Err(e) => e.to_string(),
                Ok(a) => a.to_config().unwrap_err(),
            };
            assert!(err.contains(flag), "{flag}: {err}");
        }
        let err = parse(&["--backend", "dcgm", "--node-name", "n"])
            .unwrap()
            .to_config()
            .unwrap_err();
        assert!(err.contains("--dcgm-endpoint"), "{err}");
    }
}
