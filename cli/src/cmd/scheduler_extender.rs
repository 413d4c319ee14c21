//! `carma scheduler-extender` (issue #4).

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;

use carma_core::{PlacementConfig, Policy};
use carma_scheduler_extender::{Options, TlsFiles};

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

    /// Serve a static cluster snapshot instead of the API server: a YAML or JSON
    /// List of Nodes, GpuNodes and Pods, e.g. the output of
    /// `kubectl get nodes,gpunodes,pods -A -o yaml`. Binds are recorded and
    /// reported, not written.
    #[arg(long, value_name = "FILE")]
    pub cluster_snapshot: Option<PathBuf>,

    /// Placement policy of pods without a `carma.io/policy` annotation:
    /// exclusive, ff, bf, magm, lug or rr.
    #[arg(long, env = "CARMA_POLICY", default_value = "magm")]
    pub policy: Policy,

    /// PEM certificate chain for HTTPS (kube-scheduler's `enableHTTPS`).
    #[arg(long, value_name = "FILE", requires = "tls_key")]
    pub tls_cert: Option<PathBuf>,

    /// PEM private key for HTTPS.
    #[arg(long, value_name = "FILE", requires = "tls_cert")]
    pub tls_key: Option<PathBuf>,
}

/// Run `carma scheduler-extender`.
pub fn run(args: SchedulerExtenderArgs) -> anyhow::Result<ExitCode> {
    if let Some(path) = &args.cluster_snapshot {
        if !path.is_file() {
            eprintln!(
                "carma scheduler-extender: --cluster-snapshot {}: no such file",
                path.display()
            );
            return Ok(ExitCode::from(super::EXIT_BAD_INPUT));
        }
    }
    let tls = match (args.tls_cert, args.tls_key) {
        (Some(cert), Some(key)) => Some(TlsFiles { cert, key }),
        _ => None,
    };
    let opts = Options {
        listen: args.listen,
        cluster_snapshot: args.cluster_snapshot,
        policy: args.policy,
        tls,
        placement: PlacementConfig::default(),
    };
    match super::runtime()?.block_on(carma_scheduler_extender::run(opts)) {
        Ok(()) => Ok(ExitCode::SUCCESS),
        Err(e) if e.is_bad_input() => {
            eprintln!("carma scheduler-extender: {e}");
            Ok(ExitCode::from(super::EXIT_BAD_INPUT))
        }
        Err(e) => Err(e.into()),
    }
}
