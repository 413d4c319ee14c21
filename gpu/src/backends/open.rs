//! Opening the backend a node agent's flags name: the device plugin's, the DRA driver's and
//! `carma local`'s one way to do it.

use std::sync::Arc;

use tracing::info;

use super::dcgm::DcgmBackend;
use super::nvml::NvmlBackend;
use super::simulated::SimulatedBackend;
use super::{BackendError, GpuBackend};
use crate::config::{BackendKind, BackendSettings, ConfigError};

/// A backend, and the same backend as simulated one when it is.
pub type Backends = (Arc<dyn GpuBackend>, Option<Arc<SimulatedBackend>>);

/// Open the telemetry backend `settings` name on `node` (the simulated backend's GPU UUIDs carry
/// the node's name).
pub fn open_backend(settings: &BackendSettings, node: &str) -> Result<Backends, BackendError> {
    match settings.kind {
        BackendKind::Nvml => Ok((Arc::new(NvmlBackend::new("/proc")?), None)),
        BackendKind::Dcgm => {
            let endpoint = settings
                .dcgm_endpoint
                .as_deref()
                .ok_or_else(|| BackendError::Config(ConfigError::NoDcgmEndpoint.to_string()))?;
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
            let sim = Arc::new(
                SimulatedBackend::new(
                    node,
                    settings.simulated_gpus,
                    settings.sample_interval.as_secs_f64(),
                )
                .with_metrics(settings.simulated_metrics),
            );
            Ok((sim.clone(), Some(sim)))
        }
    }
}
