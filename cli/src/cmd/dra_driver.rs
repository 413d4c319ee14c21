//! `carma dra-driver`: the per-node Dynamic Resource Allocation kubelet plugin.
//!
//! Registers `gpu.carma.io` with the kubelet's plugin watcher (`--registry-dir`), serves the DRA v1
//! node service on `--plugin-dir/dra.sock`, writes one CDI spec per prepared claim into
//! `--cdi-dir`, and publishes the node's GPUs as a ResourceSlice: memory as consumable capacity,
//! the utilization gate and health as device taints. It needs the API server (claims are read
//! from it, the slice is written to it) and Kubernetes 1.36 or newer for shared devices; see
//! docs/dra.md. `/metrics`, `/healthz` and `/readyz` are served on `--metrics-addr`; the process
//! exits with an error when any part of the driver (a gRPC server above all) ends on its own.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use carma_dra_driver::Config;
use carma_dra_driver::config::{DEFAULT_CDI_DIR, DEFAULT_PLUGIN_DIR, DEFAULT_REGISTRY_DIR};
use carma_gpu::config::MpsConfig;

use super::EXIT_BAD_INPUT;
use super::node_agent::{BackendArgs, GateCapArgs, MemoryLimitArgs, parse_interval};

/// Arguments of `carma dra-driver`.
#[derive(Debug, clap::Args)]
pub struct DraDriverArgs {
    #[command(flatten)]
    pub gpus: BackendArgs,
    /// This node's name (NODE_NAME from spec.nodeName): the slice's node and pool.
    #[arg(long, env = "NODE_NAME")]
    pub node_name: String,
    /// The kubelet's plugin-watcher directory (the registration socket is created there).
    #[arg(long, default_value = DEFAULT_REGISTRY_DIR)]
    pub registry_dir: PathBuf,
    /// Directory of the DRA socket (dra.sock).
    #[arg(long, default_value = DEFAULT_PLUGIN_DIR)]
    pub plugin_dir: PathBuf,
    /// The container runtime's CDI spec directory.
    #[arg(long, default_value = DEFAULT_CDI_DIR)]
    pub cdi_dir: PathBuf,
    /// Also hand the runtime NVIDIA's CDI name `nvidia.com/gpu=<UUID>` for each device (needs the
    /// NVIDIA Container Toolkit's generated CDI spec on the node).
    #[arg(long)]
    pub nvidia_cdi: bool,
    #[command(flatten)]
    pub memory_limits: MemoryLimitArgs,
    /// Most claims sharing one GPU (the `slots` capacity).
    #[arg(long, default_value_t = 8)]
    pub slots: u32,
    /// Smallest memory share in MiB; smaller memory requests are rounded up to it.
    #[arg(long, default_value_t = 1024)]
    pub min_share_mib: u64,
    /// Put MPS settings into the CDI specs (CUDA_MPS_PINNED_DEVICE_MEM_LIMIT from the booked memory,
    /// the MPS pipe, shared-memory and log mounts with their default directories).
    #[arg(long)]
    pub mps: bool,
    /// Telemetry sampling interval.
    #[arg(long, default_value = "1s", value_parser = parse_interval)]
    pub sample_interval: Duration,
    #[command(flatten)]
    pub gate: GateCapArgs,
    /// A gated GPU's taint is lifted only below every cap minus this margin.
    #[arg(long, default_value_t = 0.05)]
    pub gate_reopen_margin: f64,
    /// Address of /metrics, /healthz and /readyz.
    #[arg(long, default_value = "0.0.0.0:9403")]
    pub metrics_addr: SocketAddr,
}

impl DraDriverArgs {
    fn to_config(&self) -> Result<Config, String> {
        let mut c = Config::new(self.node_name.trim(), self.gpus.backend);
        c.backend = self.gpus.settings(self.sample_interval);
        c.registry_dir = self.registry_dir.clone();
        c.plugin_dir = self.plugin_dir.clone();
        c.cdi_dir = self.cdi_dir.clone();
        c.nvidia_cdi = self.nvidia_cdi;
        c.memory_limits = self.memory_limits.to_config();
        c.slots = self.slots;
        c.min_share_mib = self.min_share_mib;
        c.mps = self.mps.then(MpsConfig::with_defaults);
        c.gate = self.gate.caps();
        c.gate_reopen_margin = self.gate_reopen_margin;
        c.metrics_addr = Some(self.metrics_addr);
        c.validate().map_err(|e| e.to_string())?;
        Ok(c)
    }
}

/// Run `carma dra-driver`.
pub fn run(args: DraDriverArgs) -> anyhow::Result<ExitCode> {
    let config = match args.to_config() {
        Ok(c) => c,
        Err(e) => {
            eprintln!("carma dra-driver: {e}");
            return Ok(ExitCode::from(EXIT_BAD_INPUT));
        }
    };
    let rt = super::node_agent_runtime("carma-dra")?;
    rt.block_on(async move {
        let kube = kube::Client::try_default().await.map_err(|e| {
            anyhow::anyhow!("carma dra-driver needs the Kubernetes API server: {e}")
        })?;
        let deps = carma_dra_driver::Dependencies {
            kube: Some(kube),
            ..Default::default()
        };
        let running = match carma_dra_driver::start(config, deps).await {
            Ok(r) => r,
            Err(carma_dra_driver::Error::Config(e)) => {
                eprintln!("carma dra-driver: {e}");
                return Ok(ExitCode::from(EXIT_BAD_INPUT));
            }
            Err(e) => return Err(anyhow::Error::new(e).context("carma dra-driver cannot start")),
        };
        // Until SIGTERM / Ctrl-C, or until a part of the driver ends: then the error is the exit.
        running
            .run_until(super::shutdown_signal())
            .await
            .map_err(|e| anyhow::Error::new(e).context("carma dra-driver stopped"))?;
        Ok(ExitCode::SUCCESS)
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Debug, Parser)]
    struct Cli {
        #[command(flatten)]
        args: DraDriverArgs,
    }

    fn parse(argv: &[&str]) -> Result<DraDriverArgs, clap::Error> {
        Cli::try_parse_from(std::iter::once("dra-driver").chain(argv.iter().copied()))
            .map(|c| c.args)
    }

    #[test]
    fn flags_map_to_the_config() {
        let c = parse(&[
            "--backend",
            "simulated",
            "--node-name",
            "gpu-7",
            "--simulated-gpus",
            "2x80GiB",
            "--slots",
            "4",
            "--cdi-dir",
            "/tmp/cdi",
            "--nvidia-cdi",
            "--memory-limit-enforcement",
            "on",
            "--nvidia-cdi-hook-path",
            "/opt/nvidia/nvidia-cdi-hook",
            "--mps",
            "--sm-activity-cap",
            "0.7",
        ])
        .unwrap()
        .to_config()
        .unwrap();
        assert_eq!(c.node_name, "gpu-7");
        assert_eq!(
            (
                c.backend.simulated_gpus.count,
                c.backend.simulated_gpus.memory_mib
            ),
            (2, 81920)
        );
        assert_eq!(c.slots, 4);
        assert_eq!(c.cdi_dir, PathBuf::from("/tmp/cdi"));
        assert!(c.nvidia_cdi && c.mps.is_some());
        assert_eq!(
            c.memory_limits.mode,
            carma_gpu::enforcement::MemoryLimitsMode::On
        );
        assert_eq!(
            c.memory_limits.probe_path,
            PathBuf::from("/opt/nvidia/nvidia-cdi-hook"),
            "looked for where the specs name it unless told otherwise"
        );
        assert_eq!(c.gate.sm_activity, 0.7);
        assert_eq!(
            c.metrics_addr.map(|a| a.to_string()).as_deref(),
            Some("0.0.0.0:9403")
        );
        assert_eq!(
            c.registration_socket(),
            PathBuf::from("/var/lib/kubelet/plugins_registry/gpu.carma.io-reg.sock")
        );
    }

    #[test]
    fn bad_values_name_the_flag() {
        let err = parse(&["--backend", "simulated", "--node-name", "n", "--slots", "0"])
            .unwrap()
            .to_config()
            .unwrap_err();
        assert!(err.contains("--slots"), "{err}");
        assert!(
            parse(&["--backend", "simulated"]).is_err(),
            "--node-name is required"
        );
    }
}
