//! `carma-dra-driver`: carma's Dynamic Resource Allocation kubelet plugin (`carma dra-driver`).
//!
//! * registers with the kubelet's plugin watcher as a `DRAPlugin` ([`registration`]) and serves
//!   the DRA v1 node service ([`node`]) on Unix sockets ([`server`]);
//! * prepares a claim by reading its allocation ([`claims`]) and writing a CDI spec with the
//!   GPU layer's container environment, the device plugin's too ([`cdi`]), recorded in a
//!   checkpoint that also tells which of carma's specs are orphans ([`checkpoint`]);
//! * publishes the node's GPUs as one ResourceSlice ([`mod@slice`], [`publisher`]): memory as
//!   consumable capacity, the utilization gate and health as device taints ([`taints`]);
//! * samples the GPUs with the backends and telemetry windows of the GPU layer (`carma-gpu`),
//!   which the device plugin uses too.
//!
//! * serves `grpc.health.v1` on both sockets, checks them itself ([`health`]) and serves
//!   `/healthz`, `/readyz` and `/metrics` ([`metrics`]) over HTTP;
//! * reports devices it withdraws from the slice as Events on the Node ([`publisher`]).
//!
//! [`driver::start`] wires it together; [`RunningDriver::run_until`] ends with an error as soon
//! as a part of it ends. The design is `docs/dra.md`.

pub mod authority;
pub mod cdi;
pub mod checkpoint;
pub mod claims;
pub mod config;
pub mod driver;
pub mod health;
mod loops;
pub mod metrics;
pub mod node;
pub mod proto;
pub mod publisher;
pub mod registration;
pub mod server;
pub mod slice;
pub mod taints;
pub mod tasks;

use std::net::SocketAddr;
use std::path::PathBuf;

pub use config::{Config, ConfigError};
pub use driver::{Dependencies, RunningDriver, start};

/// The driver name: `ResourceSlice.spec.driver`, the plugin name the kubelet registers, and the
/// domain of the taint keys (defined with the claim templates that name its DeviceClass).
pub use carma_api::dra::DRIVER_NAME;

/// The driver cannot start.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A configuration value is not usable.
    #[error(transparent)]
    Config(ConfigError),
    /// The GPU backend cannot start.
    #[error(transparent)]
    Backend(#[from] carma_gpu::backends::BackendError),
    /// The memory-limit hook decision failed (its blocking task did not finish).
    #[error(transparent)]
    MemoryHook(carma_gpu::enforcement::HookSpecError),
    /// Claims cannot be read without an API server.
    #[error(
        "no Kubernetes API server: the DRA driver reads each ResourceClaim's allocation from it"
    )]
    NoApiServer,
    /// A socket cannot be served.
    #[error("cannot serve on {}: {source}", path.display())]
    Socket {
        /// The socket.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// The HTTP listener (`/metrics`, `/healthz`, `/readyz`) cannot be bound.
    #[error("cannot listen on {addr} for /metrics, /healthz and /readyz: {source}")]
    MetricsBind {
        /// The address.
        addr: SocketAddr,
        /// Why.
        source: std::io::Error,
    },
    /// A part of the running driver ended without being told to stop.
    #[error("the DRA driver's {task} ended: {why}")]
    TaskEnded {
        /// Which part: `dra-grpc`, `registration-grpc`, `telemetry`, `resourceslice`,
        /// `cdi-sweep`, `health-checks` or `http`.
        task: &'static str,
        /// Why.
        why: String,
    },
}

/// Resolves once `stop` turns true (or its sender is gone).
pub(crate) async fn stopped(stop: &mut tokio::sync::watch::Receiver<bool>) {
    let _ = stop.wait_for(|s| *s).await;
}
