//! `carma scheduler-extender`: the kube-scheduler extender (filter, prioritize and bind over
//! HTTP, optionally mutual TLS) that places pods on shared GPUs.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;

use carma_core::{HistoryConfig, PlacementConfig, Policy};
use carma_scheduler_extender::server::{BODY_LIMIT, IDLE_TIMEOUT, TLS_RELOAD_INTERVAL};
use carma_scheduler_extender::{Options, TlsFiles, TlsSettings};

/// Arguments of `carma scheduler-extender`.
///
/// Serves kube-scheduler's extender verbs (`POST /filter`, `/prioritize`,
/// `/bind`) plus `GET /healthz`, `/readyz` and `/metrics`. Without
/// `--cluster-snapshot` it watches Nodes, GpuNodes and Pods through the
/// in-cluster service account (or KUBECONFIG) and writes annotations and
/// Bindings; with it, it serves the snapshot and only records binds.
#[derive(Debug, clap::Args)]
pub struct SchedulerExtenderArgs {
    /// Address to listen on.
    #[arg(long, env = "CARMA_LISTEN", default_value = "0.0.0.0:8888")]
    pub listen: SocketAddr,

    /// Also serve `/healthz`, `/readyz` and `/metrics` (only those) over plain
    /// HTTP on this address, for kubelet probes and Prometheus when `--listen`
    /// requires client certificates (`--client-ca-file`).
    #[arg(long, env = "CARMA_METRICS_LISTEN", value_name = "ADDR")]
    pub metrics_listen: Option<SocketAddr>,

    /// Also serve the bare-pod admission webhook (`POST /mutate-pods`) over HTTPS on this
    /// address, with the `--tls-cert` certificate and no client certificate asked for (the API
    /// server presents none). A pod created with `carma.io/gpu` then takes its GPUs from a DRA
    /// claim sized as the extender would size it, from a ResourceClaimTemplate made when missing.
    #[arg(
        long,
        env = "CARMA_ADMISSION_LISTEN",
        value_name = "ADDR",
        requires = "tls_cert"
    )]
    pub admission_listen: Option<SocketAddr>,

    /// The DeviceClass that the admission webhook's claims name (the chart's dra.deviceClass.name).
    #[arg(
        long,
        env = "CARMA_DRA_DEVICE_CLASS",
        value_name = "NAME",
        default_value = carma_api::dra::DEFAULT_DEVICE_CLASS
    )]
    pub dra_device_class: String,

    /// Serve a static cluster snapshot instead of the API server: a YAML or JSON
    /// List of Nodes, GpuNodes and Pods, e.g. the output of
    /// `kubectl get nodes,gpunodes,pods -A -o yaml`. Binds are recorded and
    /// reported, not written.
    #[arg(long, value_name = "FILE")]
    pub cluster_snapshot: Option<PathBuf>,

    /// Placement policy of pods without a `carma.io/policy` annotation:
    /// exclusive, ff, bf, magm, lug, rr or pack.
    #[arg(long, env = "CARMA_POLICY", default_value_t = Policy::DEFAULT)]
    pub policy: Policy,

    /// PEM certificate chain for HTTPS (kube-scheduler's `enableHTTPS`).
    #[arg(long, value_name = "FILE", requires = "tls_key")]
    pub tls_cert: Option<PathBuf>,

    /// PEM private key for HTTPS.
    #[arg(long, value_name = "FILE", requires = "tls_cert")]
    pub tls_key: Option<PathBuf>,

    /// PEM bundle of the CAs that sign kube-scheduler's client certificate.
    /// With it, every HTTPS connection must present a client certificate that
    /// chains to one of them (mutual TLS); others fail the TLS handshake.
    /// Needs `--tls-cert`.
    #[arg(
        long,
        env = "CARMA_CLIENT_CA_FILE",
        value_name = "FILE",
        requires = "tls_cert"
    )]
    pub client_ca_file: Option<PathBuf>,

    /// How often the certificate, key and client CA files are read again; a
    /// renewed certificate (e.g. from cert-manager) applies to new connections
    /// without a restart. 0 turns reloading off.
    #[arg(long, value_name = "SECONDS", default_value_t = TLS_RELOAD_INTERVAL.as_secs())]
    pub tls_reload_seconds: u64,

    /// Largest request body accepted, in bytes; larger ones get HTTP 413. The
    /// default fits one Pod and the names of thousands of nodes
    /// (`nodeCacheCapable: true`) within the chart's 256Mi memory limit; a
    /// scheduler sending full Node objects needs more, and more memory.
    #[arg(long, env = "CARMA_MAX_REQUEST_BYTES", value_name = "BYTES", default_value_t = BODY_LIMIT)]
    pub max_request_bytes: usize,

    /// Close a connection that waits this long for a request (a client that
    /// connects and sends nothing, or an idle kept-alive connection).
    #[arg(long, value_name = "SECONDS", default_value_t = IDLE_TIMEOUT.as_secs(), value_parser = clap::value_parser!(u64).range(1..))]
    pub idle_timeout_seconds: u64,

    /// Placement thresholds (CARMA's figures by default).
    #[command(flatten)]
    pub thresholds: Thresholds,

    /// Reservations learned from earlier runs of the same model profile.
    #[command(flatten)]
    pub history: HistoryFlags,
}

/// Learned reservations (`MemoryHistory` records, written by the operator), as flags and
/// environment variables (the chart sets them from `estimator.history.*`).
#[derive(Debug, Clone, clap::Args)]
pub struct HistoryFlags {
    /// Never reserve from history: every pod gets its estimate.
    #[arg(long, env = "CARMA_HISTORY_DISABLED")]
    pub no_history: bool,
    /// Headroom above the largest observed peak, percent of it.
    #[arg(long, env = "CARMA_HISTORY_HEADROOM_PERCENT", default_value_t = HistoryConfig::default().headroom_percent, value_parser = clap::value_parser!(u32).range(0..=1000))]
    pub history_headroom_percent: u32,
    /// Headroom above the largest observed peak, at least this many MiB.
    #[arg(long, env = "CARMA_HISTORY_HEADROOM_MIN_MIB", default_value_t = HistoryConfig::default().headroom_min_mib)]
    pub history_headroom_min_mib: u64,
    /// Completed runs with an observed peak needed before history replaces an estimate.
    #[arg(long, env = "CARMA_HISTORY_MIN_SAMPLES", default_value_t = HistoryConfig::default().min_samples, value_parser = clap::value_parser!(u32).range(1..))]
    pub history_min_samples: u32,
}

impl HistoryFlags {
    /// The core configuration with these settings.
    pub fn to_config(&self) -> HistoryConfig {
        HistoryConfig {
            enabled: !self.no_history,
            headroom_percent: self.history_headroom_percent,
            headroom_min_mib: self.history_headroom_min_mib,
            min_samples: self.history_min_samples,
        }
    }
}

/// The placement thresholds of `carma-core`, as flags and environment variables
/// (the Helm chart sets the variables from its `placement.*` values).
#[derive(Debug, Clone, clap::Args)]
pub struct Thresholds {
    /// SM activity risk score at or above which the utilization gate may exclude a GPU.
    #[arg(long, env = "CARMA_SM_ACTIVITY_CAP", default_value_t = PlacementConfig::default().sm_activity_cap, value_parser = ratio)]
    pub sm_activity_cap: f64,
    /// SM occupancy risk score that, with high SM activity, excludes a GPU.
    #[arg(long, env = "CARMA_SM_OCCUPANCY_CAP", default_value_t = PlacementConfig::default().sm_occupancy_cap, value_parser = ratio)]
    pub sm_occupancy_cap: f64,
    /// DRAM activity risk score that, with high SM activity, excludes a GPU.
    #[arg(long, env = "CARMA_DRAM_ACTIVITY_CAP", default_value_t = PlacementConfig::default().dram_activity_cap, value_parser = ratio)]
    pub dram_activity_cap: f64,
    /// MiB a GPU must have free beyond the reservation.
    #[arg(long, env = "CARMA_MEMORY_MARGIN_MIB", default_value_t = PlacementConfig::default().memory_margin_mib)]
    pub memory_margin_mib: u64,
    /// MiB held back from the telemetry free-memory figure.
    #[arg(long, env = "CARMA_TELEMETRY_RESERVE_MIB", default_value_t = PlacementConfig::default().telemetry_reserve_mib)]
    pub telemetry_reserve_mib: u64,
    /// Warm-up lock: a GPU that just received a pod takes no other for this many
    /// milliseconds unless the pod's memory shows in telemetry first.
    #[arg(long, env = "CARMA_WARMUP_MS", default_value_t = PlacementConfig::default().warmup_ms)]
    pub warmup_ms: u64,
    /// A node whose GpuNode telemetry has not been published for this many seconds (as seen by
    /// the extender, immune to clock skew) takes no new shared pods; exclusive placement on idle
    /// GPUs continues. 0 disables the check. Keep it above the device plugins'
    /// --publish-heartbeat (default 600 s: two 5 min heartbeats).
    #[arg(
        long,
        env = "CARMA_MAX_TELEMETRY_AGE_SECONDS",
        default_value_t = carma_core::config::DEFAULT_MAX_TELEMETRY_AGE_MS / 1000
    )]
    pub max_telemetry_age_seconds: u64,
    /// Policy `pack`: a pod that has waited this many seconds since its creation may crowd a busy
    /// GPU past full SM activity instead of waiting for a GPU where its expected activity fits.
    #[arg(
        long,
        env = "CARMA_PACK_AGING_SECONDS",
        default_value_t = carma_core::config::DEFAULT_PACK_AGING_MS / 1000
    )]
    pub pack_aging_seconds: u64,
    /// Policy `pack`: combined expected SM activity up to which a busy GPU may be crowded (1 to 4;
    /// above 1 only where co-located jobs are known to lose little throughput, see docs/pack-policy.md).
    #[arg(
        long,
        env = "CARMA_PACK_CROWDING_LIMIT",
        default_value_t = carma_core::config::DEFAULT_PACK_CROWDING_LIMIT,
        value_parser = crowding_limit
    )]
    pub pack_crowding_limit: f64,
}

impl Thresholds {
    /// The core configuration with these thresholds.
    pub fn to_config(&self) -> PlacementConfig {
        PlacementConfig {
            sm_activity_cap: self.sm_activity_cap,
            sm_occupancy_cap: self.sm_occupancy_cap,
            dram_activity_cap: self.dram_activity_cap,
            memory_margin_mib: self.memory_margin_mib,
            telemetry_reserve_mib: self.telemetry_reserve_mib,
            warmup_ms: self.warmup_ms,
            max_telemetry_age_ms: (self.max_telemetry_age_seconds > 0)
                .then(|| self.max_telemetry_age_seconds.saturating_mul(1000)),
            pack_aging_ms: self.pack_aging_seconds.saturating_mul(1000),
            pack_crowding_limit: self.pack_crowding_limit,
            ..PlacementConfig::default()
        }
    }
}

/// A crowding limit in `carma_core::config::PACK_CROWDING_LIMIT_RANGE`.
fn crowding_limit(text: &str) -> Result<f64, String> {
    number_in(text, carma_core::config::PACK_CROWDING_LIMIT_RANGE)
}

/// A ratio in 0..=1.
fn ratio(text: &str) -> Result<f64, String> {
    number_in(text, 0.0..=1.0)
}

/// A number within `range`.
fn number_in(text: &str, range: std::ops::RangeInclusive<f64>) -> Result<f64, String> {
    let v: f64 = text
        .trim()
        .parse()
        .map_err(|_| format!("{text:?} is not a number"))?;
    if range.contains(&v) {
        Ok(v)
    } else {
        Err(format!("{v} is outside {}..{}", range.start(), range.end()))
    }
}

/// Run `carma scheduler-extender`.
pub fn run(args: SchedulerExtenderArgs) -> anyhow::Result<ExitCode> {
    if let Some(path) = &args.cluster_snapshot
        && !path.is_file()
    {
        eprintln!(
            "carma scheduler-extender: --cluster-snapshot {}: no such file",
            path.display()
        );
        return Ok(ExitCode::from(super::EXIT_BAD_INPUT));
    }
    let tls = match (args.tls_cert, args.tls_key) {
        (Some(cert), Some(key)) => Some(TlsSettings {
            files: TlsFiles { cert, key },
            client_ca: args.client_ca_file,
            reload_interval: std::time::Duration::from_secs(args.tls_reload_seconds),
        }),
        _ => None,
    };
    let opts = Options {
        listen: args.listen,
        metrics_listen: args.metrics_listen,
        cluster_snapshot: args.cluster_snapshot,
        policy: args.policy,
        tls,
        placement: args.thresholds.to_config(),
        history: args.history.to_config(),
        max_body_bytes: args.max_request_bytes,
        idle_timeout: std::time::Duration::from_secs(args.idle_timeout_seconds),
        admission: args
            .admission_listen
            .map(|listen| carma_scheduler_extender::AdmissionOptions {
                listen,
                device_class: args.dra_device_class,
            }),
    };
    match super::runtime()?.block_on(carma_scheduler_extender::run(
        opts,
        super::shutdown_signal(),
    )) {
        Ok(()) => Ok(ExitCode::SUCCESS),
        Err(e) if e.is_bad_input() => {
            eprintln!("carma scheduler-extender: {e}");
            Ok(ExitCode::from(super::EXIT_BAD_INPUT))
        }
        Err(e) => Err(e.into()),
    }
}
