//! The telemetry state of a node: per-GPU sample windows, the aggregated snapshot and the
//! `GpuNode` status built from it (when that status is worth writing is the device plugin's
//! publish rule).
//!
//! Each activity metric keeps CARMA's window (30 one-second samples) and is reduced by
//! `carma_core::telemetry` to the risk score; [`crate::windows`] keeps sources from mixing and
//! expires metrics that stop arriving. Each GPU is judged by `carma_core::gate` under the rule its
//! source's metrics allow, and the verdict is published (`sharingAllowed`) and exported.

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::time::Duration;

use carma_api::{EndedPodPeak, GpuNodeStatus, GpuPodStatus, GpuStatus};
use carma_core::{GateRule, PlacementConfig};
use chrono::{DateTime, SecondsFormat, Utc};

use crate::backends::{GpuSample, PodOnGpu, SampleContext};
use crate::pod::PodInfo;
use crate::windows::GpuWindows;

const MIB: u64 = 1024 * 1024;

#[derive(Debug, Clone)]
struct Track {
    last: GpuSample,
    windows: GpuWindows,
    /// Without a process list: the GPU's used memory when each pod was first seen on it.
    baselines: BTreeMap<String, u64>,
    /// The most memory attributed to each pod (by UID) on this GPU so far, with its namespace
    /// and name, bytes.
    peaks: BTreeMap<String, (String, String, u64)>,
}

/// How long a pod's final peak stays in `recentlyEnded` after it left its GPU (the operator looks
/// at a running attempt at least every 15 s, and again when its pod ends).
pub const ENDED_PEAK_RETENTION: Duration = Duration::from_secs(600);
/// At most this many ended pods are published (the newest; each entry's names, UID, GPU UUID and
/// time go into every GpuNode write).
pub const ENDED_PEAK_LIMIT: usize = 64;

/// Without a process list, a pod counts as seen once the GPU's used memory has grown this much
/// since the pod was first assigned to it (a CUDA context alone takes more).
pub const MEMORY_GROWTH_VISIBLE: u64 = 256 * MIB;

impl Track {
    /// Carry each pod's largest observed memory across samples. Pods gone from the GPU are
    /// returned with their final peak (namespace, name, UID, bytes).
    fn track_peaks(&mut self, views: &mut [PodView]) -> Vec<(String, String, String, u64)> {
        let gone: Vec<String> = self
            .peaks
            .keys()
            .filter(|uid| !views.iter().any(|v| &v.uid == *uid))
            .cloned()
            .collect();
        let ended = gone
            .into_iter()
            .filter_map(|uid| {
                let (ns, name, peak) = self.peaks.remove(&uid)?;
                Some((ns, name, uid, peak))
            })
            .collect();
        for v in views.iter_mut() {
            if let Some(now) = v.observed_bytes {
                let entry = self
                    .peaks
                    .entry(v.uid.clone())
                    .or_insert_with(|| (v.namespace.clone(), v.name.clone(), 0));
                entry.2 = entry.2.max(now);
            }
            v.peak_bytes = self.peaks.get(&v.uid).map(|e| e.2);
        }
        ended
    }

    /// For a backend without a process list (dcgm-exporter alone), attribute to each pod the
    /// growth of the GPU's used memory since the pod was first seen, once it reaches
    /// [`MEMORY_GROWTH_VISIBLE`]: an approximation (pods that start together each see the
    /// other's growth), but it ends the in-flight count once the pod really uses the GPU, where
    /// before it stayed in flight for its whole life.
    fn observe_by_memory(&mut self, views: &mut [PodView]) {
        if self.last.processes_listed {
            self.baselines.clear();
            return;
        }
        let used = self.last.memory_used_bytes;
        self.baselines
            .retain(|uid, _| views.iter().any(|v| &v.uid == uid));
        for v in views.iter_mut() {
            let base = *self.baselines.entry(v.uid.clone()).or_insert(used);
            let growth = used.saturating_sub(base);
            v.observed_bytes = (growth >= MEMORY_GROWTH_VISIBLE).then_some(growth);
        }
    }
}

/// A pod on a GPU in a snapshot.
#[derive(Debug, Clone, PartialEq)]
pub struct PodView {
    /// Namespace.
    pub namespace: String,
    /// Name.
    pub name: String,
    /// UID.
    pub uid: String,
    /// Reserved MiB on this GPU.
    pub reserved_mib: u64,
    /// Memory its processes use on this GPU, when attributed (bytes).
    pub observed_bytes: Option<u64>,
    /// The most memory attributed to it on this GPU at any sample so far (bytes).
    pub peak_bytes: Option<u64>,
    /// `carma.io/task` label.
    pub task: Option<String>,
    /// Synthetic pod of the simulated backend.
    pub simulated: bool,
}

/// One GPU in a snapshot.
#[derive(Debug, Clone, PartialEq)]
pub struct GpuView {
    /// The latest sample.
    pub sample: GpuSample,
    /// SM activity risk score (None until the window has filled once).
    pub sm_activity_risk: Option<f64>,
    /// SM occupancy risk score.
    pub sm_occupancy_risk: Option<f64>,
    /// DRAM activity risk score.
    pub dram_activity_risk: Option<f64>,
    /// The gate rule the source's metrics allow.
    pub gate_rule: GateRule,
    /// Whether the gate lets the GPU take another shared pod (telemetry only).
    pub sharing_allowed: bool,
    /// carma pods on the GPU.
    pub pods: Vec<PodView>,
}

impl GpuView {
    /// Sum of the pods' reservations (MiB).
    pub fn reserved_mib(&self) -> u64 {
        self.pods.iter().map(|p| p.reserved_mib).sum()
    }
}

/// Everything known about the node's GPUs after one sample.
#[derive(Debug, Clone, PartialEq)]
pub struct Snapshot {
    /// Node name.
    pub node: String,
    /// When the sample was taken.
    pub taken_at: DateTime<Utc>,
    /// GPUs in index order.
    pub gpus: Vec<GpuView>,
    /// Pods that left a GPU recently, with their final peak.
    pub recently_ended: Vec<EndedPodPeak>,
}

impl Snapshot {
    /// The `GpuNode` status of this snapshot.
    pub fn to_status(&self) -> GpuNodeStatus {
        let gpus: Vec<GpuStatus> = self.gpus.iter().map(gpu_status).collect();
        let pod_uids: BTreeSet<&str> = self
            .gpus
            .iter()
            .flat_map(|g| g.pods.iter().map(|p| p.uid.as_str()))
            .collect();
        GpuNodeStatus {
            gpu_count: gpus.len() as u32,
            pod_count: pod_uids.len() as u32,
            summary: summary(&self.gpus),
            updated_at: Some(self.taken_at.to_rfc3339_opts(SecondsFormat::Secs, true)),
            gpus,
            recently_ended: self.recently_ended.clone(),
            conditions: Vec::new(),
        }
    }
}

fn gpu_status(g: &GpuView) -> GpuStatus {
    let s = &g.sample;
    let source = s
        .sm_activity
        .or(s.sm_occupancy)
        .or(s.dram_activity)
        .map(|a| a.source.as_str().to_string())
        .unwrap_or_default();
    let gate_rule = g.gate_rule.as_str().to_string();
    let sharing_allowed = Some(g.sharing_allowed);
    GpuStatus {
        index: s.index,
        uuid: s.uuid.clone(),
        model: s.model.clone(),
        memory_total_mib: s.memory_total_bytes / MIB,
        memory_free_mib: s.memory_free_bytes / MIB,
        sm_activity: g.sm_activity_risk.map(round3),
        sm_occupancy: g.sm_occupancy_risk.map(round3),
        dram_activity: g.dram_activity_risk.map(round3),
        activity_source: source,
        gate_rule,
        sharing_allowed,
        power_watts: s.power_watts.map(|w| (w * 10.0).round() / 10.0),
        energy_joules: s.energy_joules.map(f64::round),
        healthy: s.healthy,
        health_reason: s.health_reason.clone(),
        processes: s.processes.len() as u32,
        pods: g
            .pods
            .iter()
            .map(|p| GpuPodStatus {
                namespace: p.namespace.clone(),
                name: p.name.clone(),
                uid: p.uid.clone(),
                reserved_mib: p.reserved_mib,
                observed_mib: p.observed_bytes.map(|b| b / MIB),
                peak_mib: p.peak_bytes.map(|b| b / MIB),
            })
            .collect(),
        // Set by the publisher, which knows the start-up decision.
        memory_enforcement: None,
    }
}

/// What the utilization gate reads of a GPU: its rule and the risk scores rounded as published,
/// so the exported verdict is the extender's for the same status (no pods, names or strings copied
/// on every sample). The DRA driver's taints read the same.
pub fn gate_input(g: &GpuView) -> carma_core::Gpu {
    let mut gpu = carma_core::Gpu::idle(String::new(), g.sample.index, 0);
    gpu.sm_activity = g.sm_activity_risk.map(round3);
    gpu.sm_occupancy = g.sm_occupancy_risk.map(round3);
    gpu.dram_activity = g.dram_activity_risk.map(round3);
    gpu.gate_rule = g.gate_rule;
    gpu
}

fn round3(v: f64) -> f64 {
    (v * 1000.0).round() / 1000.0
}

/// The one-line summary, e.g. `0:12/40GiB 35% 1:idle 2:unhealthy`.
pub fn summary(gpus: &[GpuView]) -> String {
    gpus.iter()
        .map(|g| {
            let s = &g.sample;
            if !s.healthy {
                return format!("{}:unhealthy", s.index);
            }
            let used_gib = s.memory_used_bytes as f64 / (1024.0 * MIB as f64);
            let total_gib = s.memory_total_bytes as f64 / (1024.0 * MIB as f64);
            let sm = g
                .sm_activity_risk
                .or(s.sm_activity.map(|a| a.value))
                .unwrap_or(0.0);
            if g.pods.is_empty() && used_gib < 0.5 && sm < 0.01 {
                format!("{}:idle", s.index)
            } else {
                format!(
                    "{}:{used_gib:.0}/{total_gib:.0}GiB {:.0}%",
                    s.index,
                    sm * 100.0
                )
            }
        })
        .collect::<Vec<_>>()
        .join(" ")
}

/// Per-GPU windows of one node.
#[derive(Debug, Clone)]
pub struct Telemetry {
    node: String,
    window: usize,
    stale_after: Duration,
    gate: PlacementConfig,
    tracks: BTreeMap<String, Track>,
    /// Pods that left a GPU, oldest first, with their final peak.
    ended: VecDeque<(DateTime<Utc>, EndedPodPeak)>,
}

/// How long a metric that stops arriving still counts, unless set otherwise.
pub const DEFAULT_STALE_AFTER: Duration = Duration::from_secs(5);

impl Telemetry {
    /// Empty telemetry of `node` with `window` samples per metric, CARMA's gate caps and metrics
    /// that expire [`DEFAULT_STALE_AFTER`] after their last sample.
    pub fn new(node: impl Into<String>, window: usize) -> Self {
        Self {
            node: node.into(),
            window: window.max(1),
            stale_after: DEFAULT_STALE_AFTER,
            gate: PlacementConfig {
                max_telemetry_age_ms: None,
                ..PlacementConfig::default()
            },
            tracks: BTreeMap::new(),
            ended: VecDeque::new(),
        }
    }

    /// Metrics expire this long after their last sample (the loop uses a few sampling intervals).
    pub fn with_stale_after(mut self, stale_after: Duration) -> Self {
        self.stale_after = stale_after;
        self
    }

    /// The utilization caps the exported gate verdict uses (the chart gives the extender's).
    pub fn with_caps(mut self, sm_activity: f64, sm_occupancy: f64, dram_activity: f64) -> Self {
        self.gate.sm_activity_cap = sm_activity;
        self.gate.sm_occupancy_cap = sm_occupancy;
        self.gate.dram_activity_cap = dram_activity;
        self
    }

    /// Add one sample of every GPU and build the snapshot with `pods` (the pods on this node).
    ///
    /// A GPU seen before but missing from `samples` stays in the snapshot, unhealthy.
    pub fn update(
        &mut self,
        samples: Vec<GpuSample>,
        pods: &[PodInfo],
        now: DateTime<Utc>,
    ) -> Snapshot {
        let (cap, stale) = (self.window, self.stale_after);
        let seen: BTreeSet<String> = samples.iter().map(|s| s.uuid.clone()).collect();
        for s in samples {
            let track = self.tracks.entry(s.uuid.clone()).or_insert_with(|| Track {
                last: s.clone(),
                windows: GpuWindows::new(cap, stale),
                baselines: BTreeMap::new(),
                peaks: BTreeMap::new(),
            });
            track.windows.push(&s, now);
            track.last = s;
        }
        for (uuid, track) in self.tracks.iter_mut() {
            if !seen.contains(uuid) {
                track.last.healthy = false;
                track.last.health_reason = Some("not reported by the GPU backend".to_string());
            }
        }
        let mut ended = Vec::new();
        let mut gpus: Vec<GpuView> = self
            .tracks
            .values_mut()
            .map(|t| {
                let risks = t.windows.risks(now);
                let mut on_gpu = pods_on(&t.last, pods);
                t.observe_by_memory(&mut on_gpu);
                let gpu = t.last.uuid.clone();
                ended.extend(t.track_peaks(&mut on_gpu).into_iter().map(
                    |(namespace, name, uid, peak)| EndedPodPeak {
                        namespace,
                        name,
                        uid,
                        gpu: gpu.clone(),
                        peak_mib: peak / MIB,
                        ended_at: now.to_rfc3339_opts(SecondsFormat::Secs, true),
                    },
                ));
                let mut view = GpuView {
                    sample: t.last.clone(),
                    sm_activity_risk: risks.sm_activity,
                    sm_occupancy_risk: risks.sm_occupancy,
                    dram_activity_risk: risks.dram_activity,
                    gate_rule: risks.rule,
                    sharing_allowed: false,
                    pods: on_gpu,
                };
                view.sharing_allowed = view.sample.healthy
                    && carma_core::utilization_gate(&gate_input(&view), &self.gate, 0).is_ok();
                view
            })
            .collect();
        gpus.sort_by(|a, b| {
            a.sample
                .index
                .cmp(&b.sample.index)
                .then(a.sample.uuid.cmp(&b.sample.uuid))
        });
        for e in ended {
            self.ended.push_back((now, e));
        }
        let retention = chrono::Duration::from_std(ENDED_PEAK_RETENTION).unwrap_or_default();
        while self
            .ended
            .front()
            .is_some_and(|(at, _)| now - *at > retention)
            || self.ended.len() > ENDED_PEAK_LIMIT
        {
            self.ended.pop_front();
        }
        Snapshot {
            node: self.node.clone(),
            taken_at: now,
            gpus,
            recently_ended: self.ended.iter().map(|(_, e)| e.clone()).collect(),
        }
    }
}

/// The carma pods assigned to `gpu`, with their observed memory from attributed processes.
fn pods_on(gpu: &GpuSample, pods: &[PodInfo]) -> Vec<PodView> {
    let mut out: Vec<PodView> = pods
        .iter()
        .filter(|p| p.occupies_gpus())
        .filter_map(|p| p.assignment().map(|a| (p, a)))
        .filter(|(_, a)| a.gpus.iter().any(|g| g == &gpu.uuid))
        .map(|(p, a)| {
            let mine: Vec<Option<u64>> = gpu
                .processes
                .iter()
                .filter(|proc| proc.pod_uid.as_deref() == Some(p.uid.as_str()))
                .map(|proc| proc.used_bytes)
                .collect();
            let observed_bytes = (!mine.is_empty() && mine.iter().all(Option::is_some))
                .then(|| mine.iter().flatten().sum());
            PodView {
                namespace: p.namespace.clone(),
                name: p.name.clone(),
                uid: p.uid.clone(),
                reserved_mib: a.estimate.mib,
                observed_bytes,
                peak_bytes: None,
                task: p.task.clone(),
                simulated: p.simulated,
            }
        })
        .collect();
    out.sort_by(|a, b| a.namespace.cmp(&b.namespace).then(a.name.cmp(&b.name)));
    out
}

/// What the backends are told about pods before sampling.
pub fn sample_context(pods: &[PodInfo]) -> SampleContext {
    let mut ctx = SampleContext::default();
    for p in pods.iter().filter(|p| p.occupies_gpus()) {
        if let Some(a) = p.assignment() {
            for g in &a.gpus {
                ctx.pods_by_gpu
                    .entry(g.clone())
                    .or_default()
                    .push(PodOnGpu {
                        uid: p.uid.clone(),
                        reserved_mib: a.estimate.mib,
                    });
            }
        }
    }
    ctx
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backends::{Activity, ActivitySource, GpuProcess};
    use carma_api::{Assignment, EstimateAnnotation};

    fn sample(index: u32, sm: f64) -> GpuSample {
        let mut s = GpuSample::basic(index, format!("GPU-{index}"), "m", 40 * 1024 * MIB, 0);
        s.sm_activity = Activity::new(sm, ActivitySource::Dcgm);
        s
    }

    fn pod(uid: &str, gpus: &[&str], mib: u64) -> PodInfo {
        PodInfo {
            namespace: "ml".into(),
            name: format!("pod-{uid}"),
            uid: uid.into(),
            node_name: Some("n1".into()),
            scheduler_name: "carma-scheduler".into(),
            phase: Some("Running".into()),
            terminating: false,
            gpu_request: gpus.len() as u32,
            gpu_containers: vec![gpus.len() as u32],
            gpu_init_containers: 0,
            assignment: Ok(Some(Assignment {
                gpus: gpus.iter().map(|s| s.to_string()).collect(),
                assigned_at: DateTime::UNIX_EPOCH,
                estimate: EstimateAnnotation {
                    mib,
                    source: "override".into(),
                    class: None,
                    samples: None,
                },
                exclusive: false,
                allocated: true,
            })),
            task: None,
            simulated: false,
        }
    }

    #[test]
    fn risk_appears_once_the_window_fills_and_uses_carma_core() {
        let mut t = Telemetry::new("n1", 3);
        let now = Utc::now();
        assert_eq!(
            t.update(vec![sample(0, 0.5)], &[], now).gpus[0].sm_activity_risk,
            None
        );
        t.update(vec![sample(0, 0.5)], &[], now);
        let snap = t.update(vec![sample(0, 0.5)], &[], now);
        let risk = snap.gpus[0].sm_activity_risk.unwrap();
        assert!((risk - carma_core::risk_score(&[0.5, 0.5, 0.5]).unwrap()).abs() < 1e-12);
        // A new source restarts the window.
        let mut s = sample(0, 0.9);
        s.sm_activity = Activity::new(0.9, ActivitySource::NvmlUtil);
        assert_eq!(t.update(vec![s], &[], now).gpus[0].sm_activity_risk, None);
    }

    #[test]
    fn pods_get_reservations_and_observed_memory() {
        let mut t = Telemetry::new("n1", 30);
        let mut s = sample(0, 0.1);
        s.processes = vec![
            GpuProcess {
                pid: Some(1),
                pod_uid: Some("a".into()),
                used_bytes: Some(1000 * MIB),
            },
            GpuProcess {
                pid: Some(2),
                pod_uid: Some("a".into()),
                used_bytes: Some(24 * MIB),
            },
            GpuProcess {
                pid: Some(3),
                pod_uid: None,
                used_bytes: Some(5 * MIB),
            },
        ];
        let pods = [
            pod("a", &["GPU-0"], 8000),
            pod("b", &["GPU-0", "GPU-1"], 4000),
            pod("c", &["GPU-1"], 1),
        ];
        let snap = t.update(vec![s, sample(1, 0.0)], &pods, Utc::now());
        let g0 = &snap.gpus[0];
        assert_eq!(g0.pods.len(), 2);
        assert_eq!(g0.pods[0].observed_bytes, Some(1024 * MIB));
        assert_eq!(g0.pods[1].observed_bytes, None);
        assert_eq!(g0.reserved_mib(), 12000);
        let status = snap.to_status();
        assert_eq!(status.gpu_count, 2);
        assert_eq!(status.pod_count, 3);
        assert_eq!(status.gpus[0].pods[0].observed_mib, Some(1024));
        assert_eq!(status.gpus[0].activity_source, "dcgm");
        assert_eq!(status.gpus[0].processes, 3);
        let ctx = sample_context(&pods);
        assert_eq!(ctx.pods_by_gpu["GPU-1"].len(), 2);
    }

    #[test]
    fn each_pod_keeps_its_peak_across_samples_until_it_leaves() {
        let mut t = Telemetry::new("n1", 30);
        let with_use = |mib: u64| {
            let mut s = sample(0, 0.1);
            s.processes = vec![GpuProcess {
                pid: Some(1),
                pod_uid: Some("a".into()),
                used_bytes: Some(mib * MIB),
            }];
            s
        };
        let pods = [pod("a", &["GPU-0"], 8000)];
        let now = Utc::now();
        t.update(vec![with_use(3000)], &pods, now);
        t.update(vec![with_use(7100)], &pods, now);
        let snap = t.update(vec![with_use(5200)], &pods, now);
        let status = snap.to_status();
        assert_eq!(status.gpus[0].pods[0].observed_mib, Some(5200));
        assert_eq!(status.gpus[0].pods[0].peak_mib, Some(7100));
        // The pod ends: its final peak stays published for the operator.
        let snap = t.update(vec![sample(0, 0.1)], &[], now);
        let ended = &snap.to_status().recently_ended;
        assert_eq!(ended.len(), 1);
        assert_eq!((ended[0].uid.as_str(), ended[0].peak_mib), ("a", 7100));
        assert_eq!(ended[0].gpu, "GPU-0");
        // ... for ENDED_PEAK_RETENTION, then it is dropped.
        let later = now + chrono::Duration::from_std(ENDED_PEAK_RETENTION).unwrap();
        assert_eq!(
            t.update(vec![sample(0, 0.1)], &[], later)
                .recently_ended
                .len(),
            1
        );
        let after = later + chrono::Duration::seconds(1);
        assert!(
            t.update(vec![sample(0, 0.1)], &[], after)
                .recently_ended
                .is_empty()
        );
        // Seen again (a restarted count): the peak starts afresh.
        let snap = t.update(vec![with_use(1000)], &pods, after);
        assert_eq!(snap.to_status().gpus[0].pods[0].peak_mib, Some(1000));
    }

    #[test]
    fn a_pre_hopper_gpu_publishes_its_rule_and_may_share() {
        // NVML without GPM: utilization rates only, never occupancy. Before the per-source gate
        // this GPU stayed "warming up" forever and never collocated.
        let mut t = Telemetry::new("n1", 3);
        let nvml = |sm: f64, mem: f64| {
            let mut s = GpuSample::basic(0, "GPU-0", "NVIDIA A100-SXM4-40GB", 40 * 1024 * MIB, 0);
            s.sm_activity = Activity::new(sm, ActivitySource::NvmlUtil);
            s.dram_activity = Activity::new(mem, ActivitySource::NvmlUtil);
            s
        };
        let now = Utc::now();
        let mut snap = t.update(vec![nvml(0.3, 0.2)], &[], now);
        assert!(!snap.gpus[0].sharing_allowed, "window still filling");
        for _ in 0..2 {
            snap = t.update(vec![nvml(0.3, 0.2)], &[], now);
        }
        let g = &snap.to_status().gpus[0];
        assert_eq!(g.gate_rule, "smact-drama");
        assert_eq!(g.sharing_allowed, Some(true));
        assert_eq!(g.sm_occupancy, None);
        // Busy SMs and busy memory: the gate closes, under the same rule.
        let mut t = Telemetry::new("n1", 1).with_caps(0.8, 0.45, 0.4);
        let g = &t.update(vec![nvml(0.95, 0.6)], &[], now).to_status().gpus[0];
        assert_eq!(
            (g.gate_rule.as_str(), g.sharing_allowed),
            ("smact-drama", Some(false))
        );
    }

    #[test]
    fn without_a_process_list_pods_are_seen_through_memory_growth() {
        let mut t = Telemetry::new("n1", 30);
        let dcgm = |used_mib: u64| {
            let mut s = sample(0, 0.1);
            s.memory_used_bytes = used_mib * MIB;
            s.processes_listed = false;
            s
        };
        let pods = [pod("a", &["GPU-0"], 8000)];
        let snap = t.update(vec![dcgm(1000)], &pods, Utc::now());
        assert_eq!(snap.gpus[0].pods[0].observed_bytes, None);
        let snap = t.update(vec![dcgm(1100)], &pods, Utc::now());
        assert_eq!(
            snap.gpus[0].pods[0].observed_bytes, None,
            "100 MiB is no context yet"
        );
        let snap = t.update(vec![dcgm(4000)], &pods, Utc::now());
        assert_eq!(snap.gpus[0].pods[0].observed_bytes, Some(3000 * MIB));
        assert_eq!(snap.to_status().gpus[0].pods[0].observed_mib, Some(3000));
    }

    #[test]
    fn missing_gpu_turns_unhealthy() {
        let mut t = Telemetry::new("n1", 30);
        t.update(vec![sample(0, 0.1), sample(1, 0.1)], &[], Utc::now());
        let snap = t.update(vec![sample(0, 0.1)], &[], Utc::now());
        assert_eq!(snap.gpus.len(), 2);
        assert!(!snap.gpus[1].sample.healthy);
    }

    #[test]
    fn summary_line() {
        let mut t = Telemetry::new("n1", 1);
        let mut busy = sample(0, 0.35);
        busy.memory_used_bytes = 12 * 1024 * MIB;
        let mut bad = sample(2, 0.0);
        bad.healthy = false;
        let snap = t.update(vec![busy, sample(1, 0.0), bad], &[], Utc::now());
        assert_eq!(
            snap.to_status().summary,
            "0:12/40GiB 35% 1:idle 2:unhealthy"
        );
    }
}
