//! `carma-device-plugin`: the per-node part of carma.
//!
//! * advertises each physical GPU to kubelet as `R` replicas of `carma.io/gpu`
//!   (`<UUID>::<k>`) through the device-plugin API v1beta1 on Unix sockets ([`registration`],
//!   [`kubelet`]);
//! * answers Allocate by finding the pod the extender assigned and exposing exactly its GPUs
//!   ([`allocate`], [`pods`]);
//! * samples the GPUs every second through the GPU layer (`carma-gpu`: NVML, DCGM via
//!   dcgm-exporter or simulated backends, CARMA's risk score over telemetry windows), publishes the
//!   node's `GpuNode` status when [`publish_rule`] says so ([`publisher`]) and Prometheus
//!   [`metrics`] on `/metrics` ([`http`]).
//!
//! [`plugin::start`] wires it all together; `carma device-plugin` is its command line.

pub mod allocate;
pub mod coexistence;
pub mod config;
pub mod devices;
pub mod http;
pub mod kubelet;
pub mod metrics;
pub mod plugin;
pub mod pods;
pub mod proto;
pub mod publish_rule;
pub mod publisher;
pub mod registration;

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
    Backend(#[from] carma_gpu::backends::BackendError),
    /// The metrics address cannot be bound.
    #[error("cannot listen on --metrics-addr {addr}: {source}")]
    MetricsBind {
        /// The address.
        addr: SocketAddr,
        /// Why.
        source: std::io::Error,
    },
    /// The memory-limit hook's CDI spec cannot be written (or a stale one removed).
    #[error(transparent)]
    HookSpec(#[from] carma_gpu::enforcement::HookSpecError),
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
