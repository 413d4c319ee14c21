//! NVML backend (nvml-wrapper): inventory, memory, power, energy, processes, health and activity.
//!
//! Activity: on Hopper and newer the GPM metrics `SM_UTIL`, `SM_OCCUPANCY` and `DRAM_BW_UTIL`
//! (computed between this sample and the previous one; source `gpm`); elsewhere NVML's utilization
//! rates (source `nvml-util`: "% of time a kernel ran", a fallback, not SM activity; no occupancy).
//! Health: a critical XID event (other than the application XIDs in
//! [`super::APPLICATION_XIDS`]) marks the GPU unhealthy until the plugin restarts, and so does a
//! GPU that NVML reports lost. Processes are attributed to pods through `/proc/<pid>/cgroup`
//! (the DaemonSet runs with `hostPID`).
//!
//! `libnvidia-ml.so.1` is loaded at run time: without a driver, [`NvmlBackend::new`] returns
//! [`BackendError::NoDriver`] and nothing crashes.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use futures::future::BoxFuture;
use nvml_wrapper::Nvml;
use nvml_wrapper::bitmasks::event::EventTypes;
use nvml_wrapper::enums::device::UsedGpuMemory;
use nvml_wrapper::enums::event::XidError;
use nvml_wrapper::enums::gpm::GpmMetricId;
use nvml_wrapper::error::NvmlError;
use nvml_wrapper::struct_wrappers::device::ProcessInfo;
use nvml_wrapper::{Device, EventSet, GpmSample};
use parking_lot::Mutex;
use tracing::{info, warn};

use super::{
    Activity, ActivitySource, BackendError, GpuBackend, GpuProcess, GpuSample, SampleContext,
    xid_is_fatal,
};
use crate::cgroup;

/// One GPU's fixed facts.
#[derive(Debug, Clone)]
struct GpuInfo {
    index: u32,
    uuid: String,
    model: String,
}

/// GPM state of one GPU.
enum Gpm {
    /// Not supported (pre-Hopper, old driver, or it failed): use utilization rates.
    Unsupported,
    /// Supported; the previous sample, once taken.
    Ready(Option<GpmSample<'static>>),
}

impl std::fmt::Debug for Gpm {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Gpm::Unsupported => f.write_str("Unsupported"),
            Gpm::Ready(s) => write!(f, "Ready(sampled: {})", s.is_some()),
        }
    }
}

#[derive(Debug)]
struct Shared {
    nvml: &'static Nvml,
    gpus: Vec<GpuInfo>,
    gpm: Mutex<Vec<Gpm>>,
    /// Fatal XID per GPU UUID (sticky).
    xid: Mutex<HashMap<String, String>>,
    stop: AtomicBool,
    proc_root: PathBuf,
}

/// The NVML backend.
#[derive(Debug, Clone)]
pub struct NvmlBackend {
    shared: Arc<Shared>,
}

fn nvml_err(what: &str, e: NvmlError) -> BackendError {
    BackendError::Nvml(format!("{what}: {e}"))
}

impl NvmlBackend {
    /// Load NVML, read the inventory and start the XID watcher.
    ///
    /// `proc_root` is where host processes are visible (`/proc` with `hostPID`).
    pub fn new(proc_root: impl Into<PathBuf>) -> Result<Self, BackendError> {
        let nvml = Nvml::init().map_err(|e| BackendError::NoDriver(e.to_string()))?;
        // The handle lives as long as the process; leaking it gives the samples and devices a
        // 'static lifetime, which the GPM samples kept between calls need.
        let nvml: &'static Nvml = Box::leak(Box::new(nvml));
        let count = nvml
            .device_count()
            .map_err(|e| nvml_err("device count", e))?;
        let mut gpus = Vec::with_capacity(count as usize);
        let mut gpm = Vec::with_capacity(count as usize);
        for index in 0..count {
            let dev = nvml
                .device_by_index(index)
                .map_err(|e| nvml_err(&format!("GPU {index}"), e))?;
            let uuid = dev
                .uuid()
                .map_err(|e| nvml_err(&format!("GPU {index} UUID"), e))?;
            let model = dev.name().unwrap_or_else(|_| "NVIDIA GPU".to_string());
            let gpm_ok = matches!(dev.gpm_support(), Ok(true));
            info!(
                index,
                %uuid,
                %model,
                activity = if gpm_ok { "gpm" } else { "nvml-util (fallback: NVML utilization is not SM activity)" },
                "NVML GPU"
            );
            gpus.push(GpuInfo { index, uuid, model });
            gpm.push(if gpm_ok {
                Gpm::Ready(None)
            } else {
                Gpm::Unsupported
            });
        }
        let shared = Arc::new(Shared {
            nvml,
            gpus,
            gpm: Mutex::new(gpm),
            xid: Mutex::new(HashMap::new()),
            stop: AtomicBool::new(false),
            proc_root: proc_root.into(),
        });
        spawn_xid_watcher(shared.clone());
        Ok(Self { shared })
    }

    /// Number of GPUs NVML sees.
    pub fn gpu_count(&self) -> usize {
        self.shared.gpus.len()
    }

    /// Sample every GPU (blocking NVML calls; run on a blocking thread).
    pub fn sample_blocking(&self) -> Vec<GpuSample> {
        let s = &self.shared;
        let mut gpm = s.gpm.lock();
        s.gpus
            .iter()
            .zip(gpm.iter_mut())
            .map(|(info, gpm)| sample_one(s, info, gpm))
            .collect()
    }
}

impl Drop for Shared {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
    }
}

fn unhealthy(info: &GpuInfo, reason: String) -> GpuSample {
    let mut s = GpuSample::basic(info.index, &info.uuid, &info.model, 0, 0);
    s.healthy = false;
    s.health_reason = Some(reason);
    s
}

fn sample_one(s: &Shared, info: &GpuInfo, gpm: &mut Gpm) -> GpuSample {
    let dev = match s.nvml.device_by_index(info.index) {
        Ok(d) => d,
        Err(e) => return unhealthy(info, format!("NVML cannot open the GPU: {e}")),
    };
    let mem = match dev.memory_info() {
        Ok(m) => m,
        Err(NvmlError::GpuLost) => {
            return unhealthy(info, "GPU lost (fell off the bus)".to_string());
        }
        Err(e) => return unhealthy(info, format!("NVML memory query failed: {e}")),
    };
    let mut out = GpuSample::basic(info.index, &info.uuid, &info.model, mem.total, mem.used);
    out.memory_free_bytes = mem.free;
    out.power_watts = dev.power_usage().ok().map(|mw| f64::from(mw) / 1000.0);
    out.energy_joules = dev
        .total_energy_consumption()
        .ok()
        .map(|mj| mj as f64 / 1000.0);
    activity(s, info, &dev, gpm, &mut out);
    // MPS clients are not in the compute process list (the MPS server is): NVML lists them
    // through a call of their own.
    out.processes = merge_processes(
        dev.running_compute_processes().unwrap_or_default(),
        dev.mps_running_compute_processes().unwrap_or_default(),
    )
    .into_iter()
    .filter(|p| !cgroup::is_mps_process(&s.proc_root, p.pid))
    .map(|p| GpuProcess {
        pid: Some(p.pid),
        pod_uid: cgroup::pod_uid_for_pid(&s.proc_root, p.pid),
        used_bytes: match p.used_gpu_memory {
            UsedGpuMemory::Used(b) => Some(b),
            UsedGpuMemory::Unavailable => None,
        },
    })
    .collect();
    if let Some(reason) = s.xid.lock().get(&info.uuid) {
        out.healthy = false;
        out.health_reason = Some(reason.clone());
    }
    out
}

/// The compute processes and the MPS clients of a GPU, each PID once (the first report wins).
fn merge_processes(compute: Vec<ProcessInfo>, mps: Vec<ProcessInfo>) -> Vec<ProcessInfo> {
    let mut seen = std::collections::HashSet::new();
    compute
        .into_iter()
        .chain(mps)
        .filter(|p| seen.insert(p.pid))
        .collect()
}

fn activity(s: &Shared, info: &GpuInfo, dev: &Device<'static>, gpm: &mut Gpm, out: &mut GpuSample) {
    if let Gpm::Ready(prev) = gpm {
        match dev.gpm_sample() {
            Ok(next) => {
                if let Some(prev) = prev.as_ref() {
                    let ids = [
                        GpmMetricId::SmUtil,
                        GpmMetricId::SmOccupancy,
                        GpmMetricId::DramBwUtil,
                    ];
                    match nvml_wrapper::gpm::gpm_metrics_get(s.nvml, prev, &next, &ids) {
                        Ok(values) => {
                            let pct = |i: usize| {
                                values.get(i).and_then(|r| r.as_ref().ok()).and_then(|m| {
                                    Activity::new(m.value / 100.0, ActivitySource::Gpm)
                                })
                            };
                            out.sm_activity = pct(0);
                            out.sm_occupancy = pct(1);
                            out.dram_activity = pct(2);
                        }
                        Err(e) => {
                            warn!(gpu = info.index, uuid = %info.uuid, "GPM metrics failed ({e}); falling back to NVML utilization (nvml-util)");
                            *gpm = Gpm::Unsupported;
                            return utilization(dev, out);
                        }
                    }
                }
                *prev = Some(next);
                // The first GPM sample has nothing to compare with: no activity figure this time.
                return;
            }
            Err(e) => {
                warn!(gpu = info.index, uuid = %info.uuid, "GPM sample failed ({e}); falling back to NVML utilization (nvml-util)");
                *gpm = Gpm::Unsupported;
            }
        }
    }
    utilization(dev, out);
}

fn utilization(dev: &Device<'static>, out: &mut GpuSample) {
    if let Ok(u) = dev.utilization_rates() {
        out.sm_activity = Activity::new(f64::from(u.gpu) / 100.0, ActivitySource::NvmlUtil);
        out.dram_activity = Activity::new(f64::from(u.memory) / 100.0, ActivitySource::NvmlUtil);
    }
}

/// Build an event set for critical XIDs on every GPU that supports them.
fn xid_event_set(s: &Shared) -> Option<EventSet<'static>> {
    let mut skip: Vec<u32> = Vec::new();
    // A failed registration releases the set, so start over without the GPU that failed.
    for _ in 0..=s.gpus.len() {
        let mut set = match s.nvml.create_event_set() {
            Ok(set) => Some(set),
            Err(e) => {
                warn!(
                    "NVML event set unavailable ({e}): XID health events are off; GPU errors still mark GPUs unhealthy"
                );
                return None;
            }
        };
        let mut registered = 0;
        let mut failed = None;
        for info in s.gpus.iter().filter(|g| !skip.contains(&g.index)) {
            let Ok(dev) = s.nvml.device_by_index(info.index) else {
                continue;
            };
            let supported = dev
                .supported_event_types()
                .map(|t| t.contains(EventTypes::CRITICAL_XID_ERROR))
                .unwrap_or(false);
            if !supported {
                continue;
            }
            let Some(current) = set.take() else { break };
            match dev.register_events(EventTypes::CRITICAL_XID_ERROR, current) {
                Ok(next) => {
                    set = Some(next);
                    registered += 1;
                }
                Err(e) => {
                    warn!(
                        gpu = info.index,
                        "XID events cannot be registered: {}", e.error
                    );
                    failed = Some(info.index);
                    break;
                }
            }
        }
        match failed {
            Some(index) => skip.push(index),
            None => return if registered > 0 { set } else { None },
        }
    }
    None
}

fn spawn_xid_watcher(shared: Arc<Shared>) {
    let weak = Arc::downgrade(&shared);
    let Some(set) = xid_event_set(&shared) else {
        return;
    };
    drop(shared);
    let spawned = std::thread::Builder::new()
        .name("carma-nvml-xid".into())
        .stack_size(256 * 1024)
        .spawn(move || {
            loop {
                let Some(shared) = weak.upgrade() else { return };
                if shared.stop.load(Ordering::Relaxed) {
                    return;
                }
                drop(shared);
                match set.wait(1000) {
                    Ok(event) => {
                        let xid = match event.event_data {
                            Some(XidError::Value(v)) => v,
                            _ => continue,
                        };
                        let uuid = event.device.uuid().unwrap_or_default();
                        if xid_is_fatal(xid) {
                            warn!(%uuid, xid, "critical XID: marking the GPU unhealthy until the plugin restarts");
                            if let Some(shared) = weak.upgrade() {
                                shared.xid.lock().insert(uuid, format!("XID {xid}"));
                            }
                        } else {
                            info!(%uuid, xid, "application XID (GPU stays healthy)");
                        }
                    }
                    Err(NvmlError::Timeout) => {}
                    Err(e) => {
                        warn!("NVML event wait failed ({e}); XID health events are off");
                        return;
                    }
                }
            }
        });
    if let Err(e) = spawned {
        warn!("cannot start the XID watcher thread: {e}");
    }
}

impl GpuBackend for NvmlBackend {
    fn name(&self) -> &'static str {
        "nvml"
    }

    fn cuda_driver_version(&self) -> Option<u32> {
        let v = self.shared.nvml.sys_cuda_driver_version().ok()?;
        u32::try_from(v).ok()
    }

    fn sample<'a>(
        &'a self,
        _ctx: &'a SampleContext,
    ) -> BoxFuture<'a, Result<Vec<GpuSample>, BackendError>> {
        let this = self.clone();
        Box::pin(async move {
            tokio::task::spawn_blocking(move || this.sample_blocking())
                .await
                .map_err(|e| BackendError::Nvml(format!("sampling task failed: {e}")))
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// On a machine without the NVIDIA driver (this CI), loading NVML is an error, not a crash,
    /// and the message says what to do. On a GPU machine it finds the GPUs.
    #[test]
    fn init_without_driver_is_a_clear_error() {
        match NvmlBackend::new("/proc") {
            Err(BackendError::NoDriver(_)) => {
                let msg = NvmlBackend::new("/proc").unwrap_err().to_string();
                assert!(msg.contains("NVML is not available"), "{msg}");
                assert!(msg.contains("--backend simulated"), "{msg}");
            }
            Err(other) => panic!("unexpected error kind: {other}"),
            Ok(b) => {
                let samples = b.sample_blocking();
                assert_eq!(samples.len(), b.gpu_count());
                assert!(samples.iter().all(|s| s.uuid.starts_with("GPU-")));
            }
        }
    }

    #[test]
    fn mps_clients_join_the_compute_processes_once() {
        let p = |pid: u32, mib: u64| ProcessInfo {
            pid,
            used_gpu_memory: UsedGpuMemory::Used(mib << 20),
            gpu_instance_id: None,
            compute_instance_id: None,
        };
        // The compute list holds the MPS server (pid 7); the clients only come from the MPS call.
        let merged = merge_processes(vec![p(7, 300)], vec![p(11, 4000), p(12, 2000), p(7, 300)]);
        let pids: Vec<u32> = merged.iter().map(|p| p.pid).collect();
        assert_eq!(pids, [7, 11, 12]);
    }
}
