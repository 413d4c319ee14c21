//! Opening the backend a node agent's flags name: the device plugin's, the DRA driver's and
//! `carma local`'s one way to do it.

use std::sync::Arc;
use std::time::Duration;

use tracing::info;

use super::dcgm::DcgmBackend;
use super::nvml::NvmlBackend;
use super::simulated::SimulatedBackend;
use super::{BackendError, GpuBackend};
use crate::config::{BackendKind, SimulatedGpus, SimulatedMetrics};

/// A backend, and the same backend as simulated one when it is.
pub type Backends = (Arc<dyn GpuBackend>, Option<Arc<SimulatedBackend>>);

/// What [`open_backend`] opens.
#[derive(Debug, Clone, Copy)]
pub struct BackendSpec<'a> {
    /// Which backend.
    pub kind: BackendKind,
    /// Node name (the simulated backend's GPU UUIDs carry it).
    pub node: &'a str,
    /// dcgm-exporter's metrics URL (`dcgm` only).
    pub dcgm_endpoint: Option<&'a str>,
    /// The simulated GPUs and the metric set they mimic (`simulated` only).
    pub simulated: (SimulatedGpus, SimulatedMetrics),
    /// Sampling interval.
    pub interval: Duration,
}

/// Open a telemetry backend.
pub fn open_backend(spec: BackendSpec<'_>) -> Result<Backends, BackendError> {
    match spec.kind {
        BackendKind::Nvml => Ok((Arc::new(NvmlBackend::new("/proc")?), None)),
        BackendKind::Dcgm => {
            let endpoint = spec.dcgm_endpoint.ok_or_else(|| {
                BackendError::Config("--backend dcgm needs --dcgm-endpoint".into())
            })?;
            let nvml = match NvmlBackend::new("/proc") {
                Ok(n) => Some(n),
                Err(e) => {
                    info!(
                        "NVML not available ({e}); dcgm-exporter supplies inventory and memory too"
                    );
                    None
                }
            };
            Ok((Arc::new(DcgmBackend::new(endpoint, nvml)?), None))
        }
        BackendKind::Simulated => {
            let (gpus, metrics) = spec.simulated;
            let sim = Arc::new(
                SimulatedBackend::new(spec.node, gpus, spec.interval.as_secs_f64())
                    .with_metrics(metrics),
            );
            Ok((sim.clone(), Some(sim)))
        }
    }
}
