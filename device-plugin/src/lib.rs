//! `carma-device-plugin`: the per-node part of carma.
//!
//! * advertises each physical GPU to kubelet as `R` replicas of `carma.io/gpu`
//!   (`<UUID>::<k>`) through the device-plugin API v1beta1 on Unix sockets ([`registration`],
//!   [`kubelet`]);
//! * answers Allocate by finding the pod the extender assigned and exposing exactly its GPUs
//!   ([`allocate`], [`pods`]);
//! * samples the GPUs every second through one of three [`backends`] (NVML, DCGM via
//!   dcgm-exporter, simulated), reduces each activity metric to CARMA's risk score
//!   ([`telemetry`], using `carma-core`), publishes the node's `GpuNode` status ([`publisher`]) and
//!   Prometheus [`metrics`] on `/metrics` ([`http`]).
//!
//! [`plugin::start`] wires it all together; `carma device-plugin` is its command line.

pub mod allocate;
pub mod backends;
pub mod cdi;
pub mod cgroup;
pub mod coexistence;
pub mod config;
pub mod devices;
pub mod enforcement;
pub mod http;
pub mod kubelet;
pub mod metrics;
pub mod plugin;
pub mod pods;
pub mod proto;
pub mod publisher;
pub mod registration;
pub mod telemetry;
pub mod windows;

use std::net::SocketAddr;
use std::path::PathBuf;

pub use config::{BackendKind, Config, ConfigError, MpsConfig, SimulatedGpus};
pub use plugin::{Dependencies, RunningPlugin, start};

/// The device plugin cannot start.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A flag value is not usable.
    #[error(transparent)]
    Config(ConfigError),
    /// The GPU backend cannot start.
    #[error(transparent)]
    Backend(#[from] backends::BackendError),
    /// The metrics address cannot be bound.
    #[error("cannot listen on --metrics-addr {addr}: {source}")]
    MetricsBind {
        /// The address.
        addr: SocketAddr,
        /// Why.
        source: std::io::Error,
    },
    /// The memory-limit hook's CDI spec cannot be written (or a stale one removed).
    #[error("memory-limit hook CDI spec in {}: {source}", dir.display())]
    HookSpec {
        /// The CDI directory.
        dir: PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// The device-plugin directory cannot be created.
    #[error("device-plugin directory {}: {source}", dir.display())]
    PluginDir {
        /// The directory.
        dir: PathBuf,
        /// Why.
        source: std::io::Error,
    },
}

/// Resolves once `stop` turns true (or its sender is gone).
pub(crate) async fn stopped(stop: &mut tokio::sync::watch::Receiver<bool>) {
    let _ = stop.wait_for(|s| *s).await;
}
