//! Simulated GPUs with scripted load, for tests and demos (`--backend simulated`).
//!
//! The load is a deterministic function of the sample number: each GPU with pods on it runs a
//! slow wave of SM activity (higher with more pods), occupancy and DRAM activity follow it, and
//! each pod uses a wave between 55 % and 90 % of its reservation plus a 300 MiB CUDA context. A GPU
//! without pods is idle. Load is attributed to the pods the telemetry loop reports on each GPU, so
//! per-pod used memory exists too. Every activity figure is labelled `simulated`.
//!
//! Without an API server there are no real pods; [`SimulatedBackend::synthetic_pods`] makes a few
//! per GPU, in namespace `simulated`, so the per-pod metrics exist for dashboards.

use std::collections::{BTreeMap, BTreeSet};
use std::f64::consts::TAU;
use std::sync::Arc;

use carma_api::names::SCHEDULER_NAME;
use carma_api::{Assignment, EstimateAnnotation};
use chrono::{DateTime, Utc};
use futures::future::BoxFuture;
use parking_lot::Mutex;

use super::{
    Activity, ActivitySource, BackendError, GpuBackend, GpuProcess, GpuSample, SampleContext,
};
use crate::config::{SimulatedGpus, SimulatedMetrics};
use crate::pod::PodInfo;

const MIB: u64 = 1024 * 1024;
/// Namespace of synthetic pods.
pub const SIMULATED_NAMESPACE: &str = "simulated";
/// CUDA context of a pod's process (MiB).
const CONTEXT_MIB: u64 = 300;

/// One simulated GPU's fixed facts.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SimGpu {
    /// Index.
    pub index: u32,
    /// Deterministic UUID (derived from the node name and index).
    pub uuid: String,
    /// Model name.
    pub model: String,
    /// Memory (MiB).
    pub memory_mib: u64,
}

#[derive(Debug, Default)]
struct State {
    tick: u64,
    energy_j: Vec<f64>,
    health: BTreeMap<u32, String>,
    /// Sample number at which each pod was first seen.
    first_seen: BTreeMap<String, u64>,
}

/// Changes the simulated GPUs from outside (tests, demos).
#[derive(Debug, Clone)]
pub struct SimulatedControl {
    state: Arc<Mutex<State>>,
}

impl SimulatedControl {
    /// Mark GPU `index` unhealthy with `reason`, or healthy again with `None`.
    pub fn set_health(&self, index: u32, unhealthy_reason: Option<&str>) {
        let mut s = self.state.lock();
        match unhealthy_reason {
            Some(r) => {
                s.health.insert(index, r.to_string());
            }
            None => {
                s.health.remove(&index);
            }
        }
    }
}

/// The simulated backend.
#[derive(Debug)]
pub struct SimulatedBackend {
    gpus: Vec<SimGpu>,
    metrics: SimulatedMetrics,
    interval_secs: f64,
    state: Arc<Mutex<State>>,
}

/// FNV-1a, 64 bit: a stable hash for UUIDs and phases.
fn fnv(text: &str) -> u64 {
    text.bytes().fold(0xcbf2_9ce4_8422_2325, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
    })
}

/// A UUID-shaped ID, stable for a node name and index.
pub fn simulated_uuid(node: &str, index: u32) -> String {
    let a = fnv(&format!("carma-sim/{node}/{index}/a"));
    let b = fnv(&format!("carma-sim/{node}/{index}/b"));
    format!(
        "GPU-{:08x}-{:04x}-{:04x}-{:04x}-{:012x}",
        a >> 32,
        (a >> 16) & 0xffff,
        a & 0xffff,
        b >> 48,
        b & 0xffff_ffff_ffff
    )
}

/// A phase in 0..TAU from a string.
fn phase(text: &str) -> f64 {
    (fnv(text) % 10_000) as f64 / 10_000.0 * TAU
}

impl SimulatedBackend {
    /// `spec.count` GPUs of `spec.memory_mib` on `node`, sampled every `interval_secs`.
    pub fn new(node: &str, spec: SimulatedGpus, interval_secs: f64) -> Self {
        let gib = spec.memory_mib as f64 / 1024.0;
        let gpus = (0..spec.count)
            .map(|index| SimGpu {
                index,
                uuid: simulated_uuid(node, index),
                model: format!("carma simulated GPU {gib:.0}GiB"),
                memory_mib: spec.memory_mib,
            })
            .collect();
        Self {
            gpus,
            metrics: SimulatedMetrics::default(),
            interval_secs,
            state: Arc::new(Mutex::new(State {
                energy_j: vec![0.0; spec.count as usize],
                ..Default::default()
            })),
        }
    }

    /// Mimic `metrics`' metric set (default: GPM's, all three metrics and a process list).
    pub fn with_metrics(mut self, metrics: SimulatedMetrics) -> Self {
        self.metrics = metrics;
        self
    }

    /// The simulated GPUs.
    pub fn gpus(&self) -> &[SimGpu] {
        &self.gpus
    }

    /// A handle that changes the GPUs' health.
    pub fn control(&self) -> SimulatedControl {
        SimulatedControl {
            state: self.state.clone(),
        }
    }

    /// `per_gpu` synthetic pods on every GPU (namespace `simulated`, names `sim-gpu<i>-<k>`), each
    /// reserving an equal share of half the GPU, rounded down to 256 MiB.
    pub fn synthetic_pods(&self, node: &str, per_gpu: u32) -> Vec<PodInfo> {
        let at: DateTime<Utc> = DateTime::UNIX_EPOCH;
        let mut out = Vec::new();
        for gpu in &self.gpus {
            for k in 0..per_gpu {
                let share = gpu.memory_mib / 2 / u64::from(per_gpu.max(1));
                let reserved = (share / 256 * 256).max(256);
                let name = format!("sim-gpu{}-{k}", gpu.index);
                let h = fnv(&format!("{node}/{name}"));
                out.push(PodInfo {
                    namespace: SIMULATED_NAMESPACE.to_string(),
                    uid: format!(
                        "{:08x}-{:04x}-4{:03x}-8{:03x}-{:012x}",
                        h >> 32,
                        (h >> 16) & 0xffff,
                        h & 0xfff,
                        (h >> 20) & 0xfff,
                        h & 0xffff_ffff_ffff
                    ),
                    name,
                    node_name: Some(node.to_string()),
                    scheduler_name: SCHEDULER_NAME.to_string(),
                    phase: Some("Running".to_string()),
                    terminating: false,
                    gpu_request: 1,
                    gpu_containers: vec![1],
                    gpu_init_containers: 0,
                    assignment: Ok(Some(Assignment {
                        gpus: vec![gpu.uuid.clone()],
                        assigned_at: at,
                        estimate: EstimateAnnotation {
                            mib: reserved,
                            source: "simulated".to_string(),
                            class: None,
                            samples: None,
                        },
                        exclusive: false,
                        allocated: true,
                    })),
                    task: Some("simulated".to_string()),
                    simulated: true,
                });
            }
        }
        out
    }

    /// The sample of every GPU at sample number `tick` with `ctx`'s pods, `just_assigned` being those
    /// first seen at this sample (pure: tests call it).
    pub fn sample_at(
        &self,
        tick: u64,
        ctx: &SampleContext,
        energy: &mut [f64],
        health: &BTreeMap<u32, String>,
        just_assigned: &BTreeSet<String>,
    ) -> Vec<GpuSample> {
        let t = tick as f64;
        self.gpus
            .iter()
            .map(|gpu| {
                let i = f64::from(gpu.index);
                let mut pods: Vec<_> = ctx.pods_by_gpu.get(&gpu.uuid).cloned().unwrap_or_default();
                pods.sort_by(|a, b| a.uid.cmp(&b.uid));
                let n = pods.len() as f64;
                let mut used_mib = 0u64;
                let mut processes = Vec::with_capacity(pods.len());
                for (k, pod) in pods.iter().enumerate() {
                    // dcgm mimicry: a container starts after its pod is assigned, so the memory
                    // growth that stands in for a process list is there to be seen.
                    if self.metrics == SimulatedMetrics::Dcgm && just_assigned.contains(&pod.uid) {
                        continue;
                    }
                    let wave = 0.5 + 0.5 * (TAU * t / 90.0 + phase(&pod.uid) + k as f64).sin();
                    let mib = CONTEXT_MIB + (pod.reserved_mib as f64 * (0.55 + 0.35 * wave)) as u64;
                    used_mib += mib;
                    processes.push(GpuProcess {
                        pid: None,
                        pod_uid: Some(pod.uid.clone()),
                        used_bytes: Some(mib * MIB),
                    });
                }
                let used_mib = used_mib.min(gpu.memory_mib);
                let (sm, occ, dram) = if pods.is_empty() {
                    (0.0, 0.0, 0.0)
                } else {
                    let period = 60.0 + 7.0 * i;
                    let sm = (0.2 + 0.15 * n + 0.2 * (TAU * t / period + i).sin()).clamp(0.0, 0.97);
                    (sm, 0.5 * sm, (0.35 * sm + 0.05 * n).min(0.95))
                };
                let mut s = GpuSample::basic(
                    gpu.index,
                    &gpu.uuid,
                    &gpu.model,
                    gpu.memory_mib * MIB,
                    used_mib * MIB,
                );
                s.sm_activity = Activity::new(sm, ActivitySource::Simulated);
                if self.metrics != SimulatedMetrics::Nvml {
                    s.sm_occupancy = Activity::new(occ, ActivitySource::Simulated);
                }
                s.dram_activity = Activity::new(dram, ActivitySource::Simulated);
                let power = 55.0 + 300.0 * sm;
                s.power_watts = Some(power);
                if let Some(e) = energy.get_mut(gpu.index as usize) {
                    *e += power * self.interval_secs;
                    s.energy_joules = Some(*e);
                }
                if self.metrics == SimulatedMetrics::Dcgm {
                    s.processes_listed = false;
                } else {
                    s.processes = processes;
                }
                if let Some(reason) = health.get(&gpu.index) {
                    s.healthy = false;
                    s.health_reason = Some(reason.clone());
                }
                s
            })
            .collect()
    }
}

impl GpuBackend for SimulatedBackend {
    fn name(&self) -> &'static str {
        "simulated"
    }

    fn sample<'a>(
        &'a self,
        ctx: &'a SampleContext,
    ) -> BoxFuture<'a, Result<Vec<GpuSample>, BackendError>> {
        Box::pin(async move {
            let mut guard = self.state.lock();
            let state = &mut *guard;
            let tick = state.tick;
            state.tick += 1;
            let live: BTreeSet<String> = ctx
                .pods_by_gpu
                .values()
                .flatten()
                .map(|p| p.uid.clone())
                .collect();
            state.first_seen.retain(|uid, _| live.contains(uid));
            let mut new = BTreeSet::new();
            for uid in live {
                if let std::collections::btree_map::Entry::Vacant(e) =
                    state.first_seen.entry(uid.clone())
                {
                    e.insert(tick);
                    new.insert(uid);
                }
            }
            Ok(self.sample_at(tick, ctx, &mut state.energy_j, &state.health, &new))
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backends::PodOnGpu;

    fn backend() -> SimulatedBackend {
        SimulatedBackend::new("node-a", "2x40GiB".parse().unwrap(), 1.0)
    }

    #[test]
    fn uuids_are_stable_distinct_and_uuid_shaped() {
        let a = simulated_uuid("n1", 0);
        assert_eq!(a, simulated_uuid("n1", 0));
        assert_ne!(a, simulated_uuid("n1", 1));
        assert_ne!(a, simulated_uuid("n2", 0));
        assert!(a.starts_with("GPU-"));
        let parts: Vec<usize> = a[4..].split('-').map(str::len).collect();
        assert_eq!(parts, [8, 4, 4, 4, 12]);
    }

    #[test]
    fn idle_gpus_are_idle_and_loaded_gpus_carry_their_pods() {
        let b = backend();
        let uuid = b.gpus()[1].uuid.clone();
        let mut ctx = SampleContext::default();
        ctx.pods_by_gpu.insert(
            uuid.clone(),
            vec![PodOnGpu {
                uid: "p1".into(),
                reserved_mib: 8000,
            }],
        );
        let mut energy = vec![0.0; 2];
        let samples = b.sample_at(10, &ctx, &mut energy, &BTreeMap::new(), &BTreeSet::new());
        assert_eq!(samples[0].memory_used_bytes, 0);
        assert_eq!(samples[0].sm_activity.unwrap().value, 0.0);
        let s = &samples[1];
        let used_mib = s.memory_used_bytes / MIB;
        assert!(
            (CONTEXT_MIB + 4400..=CONTEXT_MIB + 7200).contains(&used_mib),
            "{used_mib}"
        );
        assert_eq!(s.processes.len(), 1);
        assert_eq!(s.processes[0].pod_uid.as_deref(), Some("p1"));
        let sm = s.sm_activity.unwrap();
        assert_eq!(sm.source, ActivitySource::Simulated);
        assert!(sm.value > 0.0);
        assert!(energy[1] > energy[0]);
        // Deterministic.
        let again = b.sample_at(10, &ctx, &mut [0.0; 2], &BTreeMap::new(), &BTreeSet::new());
        assert_eq!(again[1].memory_used_bytes, s.memory_used_bytes);
    }

    #[tokio::test]
    async fn health_can_be_scripted() {
        let b = backend();
        b.control().set_health(0, Some("XID 79 (simulated)"));
        let s = b.sample(&SampleContext::default()).await.unwrap();
        assert!(!s[0].healthy);
        assert!(s[1].healthy);
        b.control().set_health(0, None);
        let s = b.sample(&SampleContext::default()).await.unwrap();
        assert!(s[0].healthy);
    }

    #[test]
    fn synthetic_pods_are_labelled_simulated() {
        let b = backend();
        let pods = b.synthetic_pods("node-a", 2);
        assert_eq!(pods.len(), 4);
        assert!(
            pods.iter()
                .all(|p| p.simulated && p.namespace == SIMULATED_NAMESPACE)
        );
        assert_eq!(pods[0].assignment().unwrap().estimate.mib, 10240);
        assert_eq!(
            pods[2].assignment().unwrap().gpus,
            [b.gpus()[1].uuid.clone()]
        );
    }
}
