//! `carma operator`: the TrainingTask controller with GPU
//! out-of-memory recovery.

use std::net::SocketAddr;
use std::process::ExitCode;
use std::time::Duration;

use anyhow::Context as _;
use carma_operator::attempt::GpuClaims;
use carma_operator::controller::{LeaderElection, OperatorConfig};
use carma_operator::leader::LeaseTiming;
use carma_operator::{DEFAULT_OOM_PATTERNS, OomPatterns, Settings};

use super::EXIT_BAD_INPUT;

fn default_oom_patterns() -> Vec<String> {
    DEFAULT_OOM_PATTERNS.iter().map(|s| s.to_string()).collect()
}

/// Arguments of `carma operator`.
#[derive(Debug, clap::Args)]
pub struct OperatorArgs {
    /// Address serving /healthz, /readyz and /metrics.
    #[arg(long, env = "CARMA_METRICS_ADDR", default_value = "0.0.0.0:8080")]
    pub metrics_addr: SocketAddr,
    /// Namespace of the leader-election Lease (default: the client's namespace).
    #[arg(long, env = "POD_NAMESPACE")]
    pub leader_election_namespace: Option<String>,
    /// Name of the leader-election Lease.
    #[arg(long, default_value = "carma-operator")]
    pub leader_election_lease: String,
    /// This replica's identity in the Lease and in Events (default: the pod name, else the host name).
    #[arg(long, env = "POD_NAME")]
    pub leader_election_identity: Option<String>,
    /// Reconcile without leader election (only safe with a single replica).
    #[arg(long)]
    pub no_leader_election: bool,
    /// Seconds a Lease stays valid after its last renewal.
    #[arg(long, default_value_t = 15)]
    pub lease_duration_seconds: u64,
    /// Seconds a leader keeps leading without a successful renewal.
    #[arg(long, default_value_t = 10)]
    pub renew_deadline_seconds: u64,
    /// Seconds between attempts to acquire or renew the Lease.
    #[arg(long, default_value_t = 2)]
    pub retry_period_seconds: u64,
    /// Text marking a GPU out-of-memory crash in a termination message or log,
    /// matched case-insensitively (comma-separated; replaces the defaults).
    #[arg(long, value_delimiter = ',', default_values_t = default_oom_patterns())]
    pub oom_patterns: Vec<String>,
    /// Log lines read from a failed attempt whose termination message is empty.
    #[arg(long, default_value_t = 50)]
    pub log_tail_lines: i64,
    /// Seconds between looks at a running attempt (to record its GPU memory peak).
    #[arg(long, default_value_t = 15)]
    pub peak_poll_seconds: u64,
    /// Only watch TrainingTasks in this namespace (default: all namespaces).
    #[arg(long)]
    pub watch_namespace: Option<String>,
    /// TrainingTasks reconciled concurrently.
    #[arg(long, default_value_t = 4)]
    pub concurrency: u16,
    /// The kube-scheduler profile whose extender is carma; attempt pods set it as
    /// spec.schedulerName (the chart sets it from scheduler.schedulerName).
    #[arg(long, env = "CARMA_SCHEDULER_NAME", default_value = carma_api::names::SCHEDULER_NAME)]
    pub scheduler_name: String,
    /// How attempt pods get their GPUs: `device-plugin` (the carma.io/gpu resource, booked by
    /// carma-scheduler's extender) or `dra` (a ResourceClaim of --dra-device-class that books the
    /// memory as consumable capacity, sized by the operator when it creates the pod; needs
    /// Kubernetes 1.36+ and carma's DRA driver on the nodes).
    #[arg(long, env = "CARMA_GPU_CLAIMS", value_enum, default_value_t = GpuClaimsArg::DevicePlugin)]
    pub gpu_claims: GpuClaimsArg,
    /// The DeviceClass of carma's GPUs that DRA claims name (the chart's dra.deviceClass.name).
    #[arg(long, default_value = carma_api::dra::DEFAULT_DEVICE_CLASS)]
    pub dra_device_class: String,
    /// Order of pending attempt pods for tasks that declare spec.expectedDurationSeconds, applied
    /// through priority classes kube-scheduler sorts by: arrival (no class), shortest-first,
    /// longest-first or `short-then-longest[:MINUTES]`. The classes must exist (`carma
    /// queue-classes --queue-order ORDER`; the chart creates them).
    #[arg(long, env = "CARMA_QUEUE_ORDER", default_value = "arrival", value_parser = |s: &str| s.parse::<carma_core::QueueOrder>())]
    pub queue_order: carma_core::QueueOrder,
    /// The RuntimeClass attempt pods run under when their template names none: the NVIDIA
    /// container runtime's (e.g. `nvidia`) where it is a RuntimeClass rather than the nodes'
    /// default runtime. Empty: none is set.
    #[arg(long, env = "CARMA_ATTEMPT_RUNTIME_CLASS", default_value = "")]
    pub attempt_runtime_class: String,
}

/// Values of `--gpu-claims`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum GpuClaimsArg {
    /// The device plugin's carma.io/gpu resource.
    DevicePlugin,
    /// Dynamic Resource Allocation claims.
    Dra,
}

/// Run `carma operator`.
pub fn run(args: OperatorArgs) -> anyhow::Result<ExitCode> {
    let config = match config(&args) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("carma operator: {e:#}");
            return Ok(ExitCode::from(EXIT_BAD_INPUT));
        }
    };
    let rt = super::runtime()?;
    rt.block_on(async move {
        let client = kube::Client::try_default().await.context(
            "connecting to the Kubernetes API (in-cluster service account or kubeconfig)",
        )?;
        carma_operator::run(client, config, super::shutdown_signal()).await?;
        Ok(ExitCode::SUCCESS)
    })
}

/// The operator's configuration from the flags; an error is bad input.
fn config(args: &OperatorArgs) -> anyhow::Result<OperatorConfig> {
    let oom_patterns = OomPatterns::new(args.oom_patterns.iter().map(|p| p.trim().to_string()))
        .context("--oom-patterns")?;
    let leader_election = (!args.no_leader_election).then(|| LeaderElection {
        namespace: args
            .leader_election_namespace
            .clone()
            .filter(|n| !n.is_empty()),
        lease_name: args.leader_election_lease.clone(),
        timing: LeaseTiming {
            lease_duration: Duration::from_secs(args.lease_duration_seconds),
            renew_deadline: Duration::from_secs(args.renew_deadline_seconds),
            retry_period: Duration::from_secs(args.retry_period_seconds),
        },
    });
    let config = OperatorConfig {
        metrics_addr: args.metrics_addr,
        leader_election,
        identity: args
            .leader_election_identity
            .clone()
            .filter(|i| !i.trim().is_empty())
            .unwrap_or_else(default_identity),
        watch_namespace: args.watch_namespace.clone().filter(|n| !n.is_empty()),
        concurrency: args.concurrency.max(1),
        settings: Settings {
            oom_patterns,
            log_tail_lines: args.log_tail_lines,
            peak_poll: Duration::from_secs(args.peak_poll_seconds),
            scheduler_name: args.scheduler_name.clone(),
            gpu_claims: match args.gpu_claims {
                GpuClaimsArg::DevicePlugin => GpuClaims::DevicePlugin,
                GpuClaimsArg::Dra if args.dra_device_class.trim().is_empty() => {
                    anyhow::bail!(
                        "--dra-device-class is empty; --gpu-claims=dra needs a DeviceClass"
                    )
                }
                GpuClaimsArg::Dra => GpuClaims::Dra {
                    device_class: args.dra_device_class.trim().to_string(),
                },
            },
            queue_order: args.queue_order,
            runtime_class_name: Some(args.attempt_runtime_class.trim())
                .filter(|c| !c.is_empty())
                .map(str::to_string),
            ..Settings::default()
        },
    };
    config.validate()?;
    Ok(config)
}

/// The host name, else a name with the process id.
fn default_identity() -> String {
    std::env::var("HOSTNAME")
        .ok()
        .or_else(|| std::fs::read_to_string("/etc/hostname").ok())
        .map(|h| h.trim().to_string())
        .filter(|h| !h.is_empty())
        .unwrap_or_else(|| format!("carma-operator-{}", std::process::id()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Debug, Parser)]
    struct Cli {
        #[command(flatten)]
        args: OperatorArgs,
    }

    fn parse(argv: &[&str]) -> OperatorArgs {
        Cli::try_parse_from(std::iter::once("operator").chain(argv.iter().copied()))
            .unwrap()
            .args
    }

    #[test]
    fn defaults() {
        let c = config(&parse(&["--leader-election-identity", "me"])).unwrap();
        assert_eq!(c.metrics_addr.to_string(), "0.0.0.0:8080");
        assert_eq!(c.identity, "me");
        let le = c.leader_election.unwrap();
        assert_eq!(le.lease_name, "carma-operator");
        assert_eq!(le.timing, LeaseTiming::default());
        assert_eq!(
            c.settings.oom_patterns.patterns(),
            OomPatterns::default().patterns()
        );
        assert_eq!(c.settings.log_tail_lines, 50);
    }

    #[test]
    fn flags() {
        let c = config(&parse(&[
            "--no-leader-election",
            "--metrics-addr",
            "127.0.0.1:9090",
            "--oom-patterns",
            "CUDA out of memory,my allocator failed",
            "--watch-namespace",
            "ml",
        ]))
        .unwrap();
        assert!(c.leader_election.is_none());
        assert_eq!(c.metrics_addr.port(), 9090);
        assert_eq!(
            c.settings.oom_patterns.patterns(),
            ["CUDA out of memory", "my allocator failed"]
        );
        assert_eq!(c.watch_namespace.as_deref(), Some("ml"));
        assert_eq!(c.settings.gpu_claims, GpuClaims::DevicePlugin);
        let c = config(&parse(&[
            "--gpu-claims",
            "dra",
            "--dra-device-class",
            "gpus",
        ]))
        .unwrap();
        assert_eq!(
            c.settings.gpu_claims,
            GpuClaims::Dra {
                device_class: "gpus".into()
            }
        );
    }

    #[test]
    fn bad_input_is_rejected() {
        assert!(config(&parse(&["--oom-patterns", "a,,b"])).is_err());
        assert!(config(&parse(&["--renew-deadline-seconds", "20"])).is_err());
        assert!(config(&parse(&["--log-tail-lines", "0"])).is_err());
        assert!(config(&parse(&["--gpu-claims", "dra", "--dra-device-class", " "])).is_err());
        assert!(Cli::try_parse_from(["operator", "--gpu-claims", "mig"]).is_err());
        assert!(Cli::try_parse_from(["operator", "--metrics-addr", "nowhere"]).is_err());
    }
}
