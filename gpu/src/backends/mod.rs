//! GPU backends behind one trait: NVML, DCGM (dcgm-exporter scrape) and simulated.
//!
//! A backend returns one [`GpuSample`] per GPU each time it is asked. Every activity figure carries
//! its [`ActivitySource`], so a consumer can tell DCGM's SM activity from NVML's utilization fallback.

pub mod dcgm;
pub mod nvml;
mod open;
pub mod simulated;

use std::collections::BTreeMap;

use futures::future::BoxFuture;
use thiserror::Error;

pub use open::{Backends, open_backend};

/// A backend could not start or sample.
#[derive(Debug, Clone, Error)]
pub enum BackendError {
    /// NVML (the driver library) cannot be loaded or initialised.
    #[error(
        "NVML is not available ({0}). Is the NVIDIA driver installed and the container started with the NVIDIA runtime (runtimeClassName: nvidia, NVIDIA_VISIBLE_DEVICES=all)? Without a GPU use --backend simulated; with dcgm-exporter only use --backend dcgm"
    )]
    NoDriver(String),
    /// An NVML call failed.
    #[error("NVML: {0}")]
    Nvml(String),
    /// dcgm-exporter could not be scraped or its output is unusable.
    #[error("dcgm-exporter: {0}")]
    Dcgm(String),
    /// A configuration value is not usable.
    #[error("backend configuration: {0}")]
    Config(String),
}

/// Where an activity figure comes from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ActivitySource {
    /// DCGM profiling fields scraped from dcgm-exporter (DCGM_FI_PROF_*).
    Dcgm,
    /// NVML GPM metrics (Hopper and newer).
    Gpm,
    /// NVML utilization rates — a fallback: "% of time a kernel ran", not SM activity.
    NvmlUtil,
    /// The simulated backend's scripted load.
    Simulated,
}

impl ActivitySource {
    /// The label value (`dcgm`, `gpm`, `nvml-util`, `simulated`).
    pub fn as_str(self) -> &'static str {
        match self {
            ActivitySource::Dcgm => "dcgm",
            ActivitySource::Gpm => "gpm",
            ActivitySource::NvmlUtil => "nvml-util",
            ActivitySource::Simulated => "simulated",
        }
    }
}

/// One activity figure (0..1) and its source.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Activity {
    /// Ratio 0..1.
    pub value: f64,
    /// Where it comes from.
    pub source: ActivitySource,
}

impl Activity {
    /// A figure from `source`, clamped to 0..1; `None` when not finite.
    pub fn new(value: f64, source: ActivitySource) -> Option<Self> {
        value.is_finite().then(|| Self {
            value: value.clamp(0.0, 1.0),
            source,
        })
    }
}

/// A compute process on a GPU.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GpuProcess {
    /// Host PID, when known.
    pub pid: Option<u32>,
    /// UID of the pod the process belongs to, when attributed.
    pub pod_uid: Option<String>,
    /// GPU memory the process uses, when the driver reports it.
    pub used_bytes: Option<u64>,
}

/// One sample of one GPU.
#[derive(Debug, Clone, PartialEq)]
pub struct GpuSample {
    /// Index on the node.
    pub index: u32,
    /// NVIDIA UUID.
    pub uuid: String,
    /// Product name.
    pub model: String,
    /// Total memory (bytes).
    pub memory_total_bytes: u64,
    /// Used memory (bytes).
    pub memory_used_bytes: u64,
    /// Free memory (bytes).
    pub memory_free_bytes: u64,
    /// SM activity (DCGM 1002 / GPM SM_UTIL / NVML utilization fallback).
    pub sm_activity: Option<Activity>,
    /// SM occupancy (DCGM 1003 / GPM SM_OCCUPANCY).
    pub sm_occupancy: Option<Activity>,
    /// DRAM activity (DCGM 1005 / GPM DRAM_BW_UTIL / NVML memory utilization fallback).
    pub dram_activity: Option<Activity>,
    /// Power draw (W).
    pub power_watts: Option<f64>,
    /// Energy since driver load (J).
    pub energy_joules: Option<f64>,
    /// Whether the GPU is usable.
    pub healthy: bool,
    /// Why not, when it is not.
    pub health_reason: Option<String>,
    /// Compute processes (MPS control and server processes excluded).
    pub processes: Vec<GpuProcess>,
    /// Whether the backend can list processes at all (dcgm-exporter alone cannot): without a
    /// list, pods are seen through the GPU's memory use instead.
    pub processes_listed: bool,
}

impl GpuSample {
    /// A healthy sample with memory figures and nothing else.
    pub fn basic(
        index: u32,
        uuid: impl Into<String>,
        model: impl Into<String>,
        total: u64,
        used: u64,
    ) -> Self {
        Self {
            index,
            uuid: uuid.into(),
            model: model.into(),
            memory_total_bytes: total,
            memory_used_bytes: used.min(total),
            memory_free_bytes: total.saturating_sub(used),
            sm_activity: None,
            sm_occupancy: None,
            dram_activity: None,
            power_watts: None,
            energy_joules: None,
            healthy: true,
            health_reason: None,
            processes: Vec::new(),
            processes_listed: true,
        }
    }
}

/// A pod placed on a GPU, as far as the telemetry loop knows (the simulated backend attributes its
/// scripted load to these pods).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PodOnGpu {
    /// Pod UID.
    pub uid: String,
    /// Reserved MiB on the GPU.
    pub reserved_mib: u64,
}

/// What the telemetry loop tells a backend before it samples.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct SampleContext {
    /// Pods per GPU UUID.
    pub pods_by_gpu: BTreeMap<String, Vec<PodOnGpu>>,
}

/// A source of GPU samples.
pub trait GpuBackend: Send + Sync + std::fmt::Debug {
    /// Backend name as in `--backend` and `GpuNode.spec.backend`.
    fn name(&self) -> &'static str;

    /// Sample every GPU once.
    fn sample<'a>(
        &'a self,
        ctx: &'a SampleContext,
    ) -> BoxFuture<'a, Result<Vec<GpuSample>, BackendError>>;

    /// The CUDA driver version NVML reports (`1000 × major + 10 × minor`); `None` where there is
    /// no NVML to ask (simulated, DCGM without it).
    fn cuda_driver_version(&self) -> Option<u32> {
        None
    }
}

/// XIDs that report application errors rather than GPU faults; they do not make a GPU unhealthy
/// (13 graphics engine exception, 31 GPU memory page fault, 43 GPU stopped processing, 45 preemptive
/// cleanup, 68 video processor exception, 109 context switch timeout).
pub const APPLICATION_XIDS: [u64; 6] = [13, 31, 43, 45, 68, 109];

/// Whether an XID marks the GPU unhealthy.
pub fn xid_is_fatal(xid: u64) -> bool {
    xid != 0 && !APPLICATION_XIDS.contains(&xid)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn activity_is_clamped_and_finite() {
        assert_eq!(Activity::new(1.2, ActivitySource::Gpm).unwrap().value, 1.0);
        assert_eq!(Activity::new(-0.1, ActivitySource::Gpm).unwrap().value, 0.0);
        assert!(Activity::new(f64::NAN, ActivitySource::Dcgm).is_none());
    }

    #[test]
    fn xid_classification() {
        assert!(xid_is_fatal(79));
        assert!(xid_is_fatal(48));
        assert!(!xid_is_fatal(13));
        assert!(!xid_is_fatal(0));
    }

    #[test]
    fn source_labels() {
        let labels: Vec<&str> = [
            ActivitySource::Dcgm,
            ActivitySource::Gpm,
            ActivitySource::NvmlUtil,
            ActivitySource::Simulated,
        ]
        .iter()
        .map(|s| s.as_str())
        .collect();
        assert_eq!(labels, ["dcgm", "gpm", "nvml-util", "simulated"]);
    }
}
