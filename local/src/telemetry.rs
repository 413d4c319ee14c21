//! GPU telemetry for the daemon: the GPU layer's backends (NVML, DCGM, simulated), its
//! per-GPU activity windows (`carma_gpu::windows`, CARMA's 30-sample risk scores), and
//! the attribution of GPU memory to jobs.
//!
//! Attribution: with NVML a GPU process belongs to a job when its process group is the job's
//! launcher (every job runs in a process group of its own); the simulated backend attributes its
//! modelled processes to the job ids it is given. dcgm-exporter alone lists no processes, so no
//! per-job memory is known there (the warm-up lock then ends by time).
//!
//! **The simulated backend** is the GPU layer's: on each GPU, each running job uses
//! `300 MiB + (55 % … 90 %) × D` MiB (a slow wave), where `D` is the job's *declared* memory: the
//! whole number of MiB the job last wrote into `$CARMA_LOCAL_MEMORY_FILE`, or else its reservation
//! (the whole GPU for a job that reserves whole GPUs).
//! SM activity, occupancy, DRAM activity, power (`55 W + 300 W × SM activity`) and energy are the
//! GPU layer's scripted model, labelled simulated everywhere they are shown.

use std::collections::BTreeMap;
use std::fs;
use std::sync::Arc;
use std::time::Duration;

use carma_core::{Gpu, Millis};
use carma_gpu::backends::open_backend;
use carma_gpu::backends::{GpuBackend, GpuSample, PodOnGpu, SampleContext};
use carma_gpu::config::SimulatedMetrics;
use carma_gpu::windows::GpuWindows;
use carma_gpu::windows::stale_after;
use carma_gpu::{BackendKind, BackendSettings, SimulatedGpus};
use serde::{Deserialize, Serialize};

use crate::error::Result;
use crate::launch::process_group;
use crate::layout::AttemptDir;

const MIB: u64 = 1024 * 1024;

/// Which backend samples the GPUs.
#[derive(Debug, Clone, PartialEq)]
pub enum BackendChoice {
    /// NVML (GPM SM activity on Hopper and newer, NVML utilization otherwise).
    Nvml,
    /// dcgm-exporter at this URL for activity; NVML for inventory and memory where it loads.
    Dcgm {
        /// e.g. `http://127.0.0.1:9400/metrics`.
        endpoint: String,
    },
    /// The GPU layer's simulated GPUs, mimicking `metrics`' metric set (`Gpm`: all three
    /// activity metrics and a process list; `Nvml`: no occupancy; `Dcgm`: no process list).
    Simulated(SimulatedGpus, SimulatedMetrics),
}

impl BackendChoice {
    /// The backend's name (`nvml`, `dcgm`, `simulated`).
    pub fn name(&self) -> &'static str {
        match self {
            BackendChoice::Nvml => "nvml",
            BackendChoice::Dcgm { .. } => "dcgm",
            BackendChoice::Simulated(..) => "simulated",
        }
    }
}

/// A running job as telemetry needs it.
#[derive(Debug, Clone)]
pub struct JobOnGpus {
    /// Job id.
    pub id: String,
    /// Its GPUs' UUIDs.
    pub uuids: Vec<String>,
    /// MiB it asked for per GPU (the booked MiB for a whole-GPU job): the simulated backend's
    /// default for its memory use.
    pub reserved_mib: u64,
    /// Its launcher's pid (= its process group), once known.
    pub launcher_pid: Option<u32>,
    /// When its attempt was launched.
    pub launched_at_ms: Millis,
    /// Its attempt folder (where it may declare its memory).
    pub dir: AttemptDir,
}

/// One GPU after a sample: what placement reads, and what the report records.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct GpuReading {
    /// carma-core's GPU (risk scores, gate rule, free memory, processes).
    pub gpu: Gpu,
    /// Used memory, MiB.
    pub used_mib: u64,
    /// Latest SM activity sample (not the risk score), 0..1.
    pub sm_activity_now: Option<f64>,
    /// Power, W.
    pub power_w: Option<f64>,
    /// Energy counter, J (since driver load, or since the simulated backend started).
    pub energy_j: Option<f64>,
    /// MiB attributed to each job on this GPU.
    pub jobs_mib: BTreeMap<String, u64>,
    /// Whether the backend lists processes (dcgm-exporter alone does not: no attribution).
    pub processes_listed: bool,
    /// Where the activity figures come from (`dcgm`, `gpm`, `nvml-util`, `simulated`).
    pub activity_source: Option<String>,
}

/// Samples the GPUs and keeps their windows.
#[derive(Debug)]
pub struct Telemetry {
    backend: Arc<dyn GpuBackend>,
    simulated: bool,
    window: usize,
    stale_after: Duration,
    windows: BTreeMap<String, GpuWindows>,
}

impl Telemetry {
    /// Start `choice`, sampled every `interval`, with `window` samples per activity metric.
    pub fn start(choice: &BackendChoice, interval: Duration, window: usize) -> Result<Self> {
        let (kind, dcgm_endpoint, (simulated_gpus, simulated_metrics)) = match choice {
            BackendChoice::Nvml => (BackendKind::Nvml, None, Default::default()),
            BackendChoice::Dcgm { endpoint } => (
                BackendKind::Dcgm,
                Some(endpoint.clone()),
                Default::default(),
            ),
            BackendChoice::Simulated(spec, metrics) => {
                (BackendKind::Simulated, None, (*spec, *metrics))
            }
        };
        let settings = BackendSettings {
            kind,
            simulated_gpus,
            simulated_metrics,
            dcgm_endpoint,
            sample_interval: interval,
            window: window.max(1),
        };
        let (backend, _) = open_backend(&settings, "local")?;
        Ok(Self {
            backend,
            simulated: matches!(choice, BackendChoice::Simulated(..)),
            window: settings.window,
            stale_after: stale_after(interval),
            windows: BTreeMap::new(),
        })
    }

    /// Sample every GPU once at `now` (milliseconds since the Unix epoch) with `jobs` running.
    pub async fn sample(&mut self, jobs: &[JobOnGpus], now: Millis) -> Result<Vec<GpuReading>> {
        let ctx = if self.simulated {
            simulated_context(jobs)
        } else {
            SampleContext::default()
        };
        let samples = self.backend.sample(&ctx).await?;
        let at = chrono::DateTime::from_timestamp_millis(now as i64).unwrap_or_default();
        let mut out = Vec::with_capacity(samples.len());
        for s in samples {
            let w = self
                .windows
                .entry(s.uuid.clone())
                .or_insert_with(|| GpuWindows::new(self.window, self.stale_after));
            w.push(&s, at);
            let risks = w.risks(at);
            let jobs_mib = attribute(&s, jobs);
            out.push(GpuReading {
                gpu: Gpu {
                    uuid: s.uuid.clone(),
                    index: s.index,
                    model: s.model.clone(),
                    memory_total_mib: s.memory_total_bytes / MIB,
                    memory_free_mib: s.memory_free_bytes / MIB,
                    sm_activity: risks.sm_activity,
                    sm_occupancy: risks.sm_occupancy,
                    dram_activity: risks.dram_activity,
                    healthy: s.healthy,
                    processes: s.processes.len() as u32,
                    max_pods: None,
                    gate_rule: risks.rule,
                    telemetry_at: Some(now),
                },
                used_mib: s.memory_used_bytes / MIB,
                sm_activity_now: s.sm_activity.map(|a| a.value),
                power_w: s.power_watts,
                energy_j: s.energy_joules,
                jobs_mib,
                processes_listed: s.processes_listed,
                activity_source: risks.source.map(|s| s.as_str().to_string()),
            });
        }
        out.sort_by_key(|r| r.gpu.index);
        Ok(out)
    }
}

/// What the simulated backend is told: each job on each of its GPUs with its declared memory.
fn simulated_context(jobs: &[JobOnGpus]) -> SampleContext {
    let mut ctx = SampleContext::default();
    for j in jobs {
        let declared = fs::read_to_string(j.dir.memory_mib())
            .ok()
            .and_then(|t| t.trim().parse::<u64>().ok())
            .unwrap_or(j.reserved_mib);
        for uuid in &j.uuids {
            ctx.pods_by_gpu
                .entry(uuid.clone())
                .or_default()
                .push(PodOnGpu {
                    uid: j.id.clone(),
                    reserved_mib: declared,
                });
        }
    }
    ctx
}

/// MiB per job on this GPU from its process list (see the module doc).
fn attribute(s: &GpuSample, jobs: &[JobOnGpus]) -> BTreeMap<String, u64> {
    let mut out = BTreeMap::new();
    for p in &s.processes {
        let owner = match (&p.pod_uid, p.pid) {
            (Some(uid), _) => jobs.iter().find(|j| &j.id == uid),
            (None, Some(pid)) => {
                let group = process_group(pid);
                jobs.iter()
                    .find(|j| j.launcher_pid.is_some_and(|l| l == pid || Some(l) == group))
            }
            (None, None) => None,
        };
        if let (Some(job), Some(bytes)) = (owner, p.used_bytes) {
            *out.entry(job.id.clone()).or_insert(0) += bytes / MIB;
        }
    }
    out
}
