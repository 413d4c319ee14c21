//! The telemetry state of a node: per-GPU sample windows, the aggregated snapshot, the `GpuNode`
//! status built from it and the rule that decides when that status is worth writing.
//!
//! Each activity metric keeps CARMA's window (30 one-second samples) and is reduced by
//! `carma_core::telemetry` to the risk score; [`crate::windows`] keeps sources from mixing and
//! expires metrics that stop arriving. Each GPU is judged by `carma_core::gate` under the rule its
//! source's metrics allow, and the verdict is published (`sharingAllowed`) and exported.

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::time::Duration;

use carma_api::{Condition, EndedPodPeak, GpuNodeStatus, GpuPodStatus, GpuStatus};
use carma_core::{GateRule, PlacementConfig};
use chrono::{DateTime, SecondsFormat, Utc};

use crate::backends::{GpuSample, PodOnGpu, SampleContext};
use crate::config::PublishConfig;
use crate::devices::AdvertisedGpu;
use crate::pods::PodInfo;
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
    /// The GPUs as advertised to kubelet.
    pub fn advertised(&self) -> Vec<AdvertisedGpu> {
        self.gpus
            .iter()
            .map(|g| AdvertisedGpu {
                uuid: g.sample.uuid.clone(),
                healthy: g.sample.healthy,
            })
            .collect()
    }

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

/// Why a status is written: the label of `carma_gpunode_status_writes_total{reason}`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum WriteKind {
    /// The first status this process writes.
    First,
    /// Something changed beyond the deadbands.
    Change,
    /// Nothing did; the heartbeat was due.
    Heartbeat,
}

impl WriteKind {
    /// Every kind, in label order.
    pub const ALL: [WriteKind; 3] = [WriteKind::First, WriteKind::Change, WriteKind::Heartbeat];

    /// The metric label.
    pub fn as_str(self) -> &'static str {
        match self {
            WriteKind::First => "first",
            WriteKind::Change => "change",
            WriteKind::Heartbeat => "heartbeat",
        }
    }
}

/// Why a status is written now: its kind and, for a change, what changed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PublishReason {
    /// First, change or heartbeat.
    pub kind: WriteKind,
    /// What changed (empty for the first publication and the heartbeat).
    pub detail: String,
}

impl PublishReason {
    fn change(detail: String) -> Self {
        Self {
            kind: WriteKind::Change,
            detail,
        }
    }
}

impl std::fmt::Display for PublishReason {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.kind {
            WriteKind::First => f.write_str("first publication"),
            WriteKind::Heartbeat => f.write_str("heartbeat"),
            WriteKind::Change => f.write_str(&self.detail),
        }
    }
}

/// Why `next` should be written now, or `None` to skip it. `since_last` is the time since the last
/// write, `heartbeat` the interval after which an unchanged status is written anyway (the
/// publisher's jittered [`PublishConfig::heartbeat`]).
///
/// At once (the next sample): the first status; a change of the GPU set, a GPU's health, the pods
/// on a GPU or which of them show memory (the extender's in-flight count and warm-up lock end on
/// it); a GPU's gate verdict (`sharingAllowed`, judged with the extender's caps on the figures as
/// published) or gate rule; a risk score appearing or expiring. These are the changes that move a
/// filter decision.
///
/// Deadbands, no sooner than `cfg.min_interval` after the last write: a GPU's free memory moved by
/// `cfg.free_mib_delta` MiB or a risk score by `cfg.risk_delta` since the last write. Inside them
/// the figures the extender holds stay within a known distance of the true ones: under the 512 MiB
/// its memory test holds back from every free figure, and well under the steps (0.15 or more)
/// between the SM-activity priors `pack` adds to them.
///
/// Otherwise only the heartbeat: power, energy, the summary, process counts and peaks ride along
/// with the next write (an ended pod's final peak leaves with its pod-set change).
pub fn publish_reason(
    prev: Option<&GpuNodeStatus>,
    next: &GpuNodeStatus,
    since_last: Duration,
    heartbeat: Duration,
    cfg: &PublishConfig,
) -> Option<PublishReason> {
    let Some(prev) = prev else {
        return Some(PublishReason {
            kind: WriteKind::First,
            detail: String::new(),
        });
    };
    if let Some(detail) = decisive_change(prev, next) {
        return Some(PublishReason::change(detail));
    }
    if since_last >= heartbeat {
        return Some(PublishReason {
            kind: WriteKind::Heartbeat,
            detail: String::new(),
        });
    }
    if since_last < cfg.min_interval {
        return None;
    }
    deadband_change(prev, next, cfg).map(PublishReason::change)
}

/// A change that can move a filter decision, written at once.
fn decisive_change(prev: &GpuNodeStatus, next: &GpuNodeStatus) -> Option<String> {
    let uuids = |s: &GpuNodeStatus| s.gpus.iter().map(|g| g.uuid.clone()).collect::<Vec<_>>();
    if uuids(prev) != uuids(next) {
        return Some("GPU set changed".to_string());
    }
    // A condition that turns (another device plugin found or gone) is news for operators at once;
    // its transition time alone never differs without its status.
    let same = |a: &Condition, b: &Condition| {
        a.type_ == b.type_ && a.status == b.status && a.message == b.message
    };
    if prev.conditions.len() != next.conditions.len()
        || prev
            .conditions
            .iter()
            .zip(&next.conditions)
            .any(|(a, b)| !same(a, b))
    {
        return Some("a condition changed".to_string());
    }
    for (a, b) in prev.gpus.iter().zip(&next.gpus) {
        if a.healthy != b.healthy {
            return Some(format!(
                "GPU {} health changed to {}",
                b.index,
                if b.healthy { "healthy" } else { "unhealthy" }
            ));
        }
        let pods = |g: &GpuStatus| {
            g.pods
                .iter()
                .map(|p| p.uid.clone())
                .collect::<BTreeSet<_>>()
        };
        if pods(a) != pods(b) {
            return Some(format!("pods on GPU {} changed", b.index));
        }
        let shown = |g: &GpuStatus| {
            g.pods
                .iter()
                .filter(|p| p.observed_mib.is_some())
                .map(|p| p.uid.clone())
                .collect::<BTreeSet<_>>()
        };
        // Only a pod starting to show counts: the extender's count of it in flight ends then,
        // and a pod whose figure drops out for a sample is not worth a write.
        if shown(b).difference(&shown(a)).next().is_some() {
            return Some(format!("memory of a pod on GPU {} shows", b.index));
        }
        if a.sharing_allowed != b.sharing_allowed || a.gate_rule != b.gate_rule {
            return Some(format!(
                "gate of GPU {} {}",
                b.index,
                match b.sharing_allowed {
                    Some(true) => "opened",
                    Some(false) => "closed",
                    None => "changed",
                }
            ));
        }
        let risks = [
            ("SM activity", a.sm_activity, b.sm_activity),
            ("SM occupancy", a.sm_occupancy, b.sm_occupancy),
            ("DRAM activity", a.dram_activity, b.dram_activity),
        ];
        for (what, x, y) in risks {
            if x.is_some() != y.is_some() {
                return Some(format!(
                    "{what} risk of GPU {} {}",
                    b.index,
                    if y.is_some() { "appeared" } else { "expired" }
                ));
            }
        }
    }
    None
}

/// A move beyond the deadbands since the last write.
fn deadband_change(
    prev: &GpuNodeStatus,
    next: &GpuNodeStatus,
    cfg: &PublishConfig,
) -> Option<String> {
    for (a, b) in prev.gpus.iter().zip(&next.gpus) {
        let delta = a.memory_free_mib.abs_diff(b.memory_free_mib);
        if delta >= cfg.free_mib_delta {
            return Some(format!(
                "free memory of GPU {} moved by {delta} MiB",
                b.index
            ));
        }
        let risks = [
            ("SM activity", a.sm_activity, b.sm_activity),
            ("SM occupancy", a.sm_occupancy, b.sm_occupancy),
            ("DRAM activity", a.dram_activity, b.dram_activity),
        ];
        for (what, x, y) in risks {
            // Both rounded to thousandths as published: compare in thousandths, so a move of
            // exactly the deadband counts whatever the float rounding.
            if let (Some(x), Some(y)) = (x, y)
                && ((x - y).abs() * 1000.0).round() >= (cfg.risk_delta * 1000.0).round()
            {
                return Some(format!("{what} risk of GPU {} moved", b.index));
            }
        }
    }
    None
}

/// The heartbeat interval of a node's `nth` heartbeat: `base` shortened by up to a tenth, by an
/// amount that differs between nodes and from one heartbeat to the next, so that nodes started
/// (or cut off from the API server) together spread their heartbeats over a tenth of the
/// interval instead of writing at the same moment.
pub fn jittered_heartbeat(base: Duration, node: &str, nth: u64) -> Duration {
    // FNV-1a over the node name and the count: no randomness to seed, reproducible in tests.
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in node.bytes().chain(nth.to_le_bytes()) {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    let fraction = (h % 1000) as u32;
    base.saturating_sub(base / 10 * fraction / 1000)
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
        assert!(!snap.advertised()[1].healthy);
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

    #[test]
    fn publish_rule() {
        let cfg = PublishConfig::default();
        let hb = cfg.heartbeat;
        let mut t = Telemetry::new("n1", 1);
        let base = t.update(vec![sample(0, 0.3)], &[], Utc::now()).to_status();
        let s = Duration::from_secs;
        let why = |prev: Option<&GpuNodeStatus>, next: &GpuNodeStatus, since| {
            publish_reason(prev, next, since, hb, &cfg).map(|r| r.to_string())
        };
        assert_eq!(why(None, &base, s(0)).as_deref(), Some("first publication"));
        assert_eq!(why(Some(&base), &base, s(5)), None);
        assert_eq!(why(Some(&base), &base, hb - s(1)), None);
        assert_eq!(why(Some(&base), &base, hb).as_deref(), Some("heartbeat"));
        let mut next = base.clone();
        next.gpus[0].memory_free_mib -= 300;
        assert!(
            why(Some(&base), &next, s(1))
                .unwrap()
                .contains("free memory")
        );
        assert_eq!(
            why(Some(&base), &next, Duration::from_millis(500)),
            None,
            "rate-limited"
        );
        let mut next = base.clone();
        next.gpus[0].memory_free_mib -= 100;
        next.gpus[0].sm_activity = Some(base.gpus[0].sm_activity.unwrap() + 0.02);
        assert_eq!(why(Some(&base), &next, s(3)), None, "below thresholds");
        next.gpus[0].sm_activity = Some(base.gpus[0].sm_activity.unwrap() + 0.06);
        assert!(
            why(Some(&base), &next, s(3))
                .unwrap()
                .contains("SM activity")
        );
        let mut next = base.clone();
        next.gpus[0].healthy = false;
        assert!(why(Some(&base), &next, s(0)).unwrap().contains("health"));
        let mut next = base.clone();
        next.gpus[0].pods.push(GpuPodStatus {
            namespace: "a".into(),
            name: "b".into(),
            uid: "u".into(),
            reserved_mib: 1,
            observed_mib: None,
            peak_mib: None,
        });
        assert!(why(Some(&base), &next, s(0)).unwrap().contains("pods"));
    }

    #[test]
    fn decision_changes_are_written_at_once_and_noise_never() {
        let cfg = PublishConfig::default();
        let hb = cfg.heartbeat;
        let at_once = Duration::ZERO;
        let kind = |prev: &GpuNodeStatus, next: &GpuNodeStatus, since| {
            publish_reason(Some(prev), next, since, hb, &cfg).map(|r| r.kind)
        };
        let mut t = Telemetry::new("n1", 1);
        let base = t.update(vec![sample(0, 0.3)], &[], Utc::now()).to_status();
        // The gate closing is written at the next sample, even right after a write, and however
        // little the score moved to close it.
        let mut closed = base.clone();
        closed.gpus[0].sm_activity = Some(0.81);
        closed.gpus[0].sharing_allowed = Some(false);
        let mut open = closed.clone();
        open.gpus[0].sm_activity = Some(0.79);
        open.gpus[0].sharing_allowed = Some(true);
        assert_eq!(kind(&open, &closed, at_once), Some(WriteKind::Change));
        assert_eq!(kind(&closed, &open, at_once), Some(WriteKind::Change));
        // A risk score appearing (the window filled) or expiring, at once too.
        let mut warming = base.clone();
        warming.gpus[0].sm_activity = None;
        assert_eq!(kind(&warming, &base, at_once), Some(WriteKind::Change));
        assert_eq!(kind(&base, &warming, at_once), Some(WriteKind::Change));
        // A pod's memory starting to show (its in-flight count ends), not it dropping out.
        let mut with_pod = base.clone();
        with_pod.gpus[0].pods.push(GpuPodStatus {
            namespace: "a".into(),
            name: "b".into(),
            uid: "u".into(),
            reserved_mib: 1000,
            observed_mib: None,
            peak_mib: None,
        });
        let mut shown = with_pod.clone();
        shown.gpus[0].pods[0].observed_mib = Some(100);
        assert!(
            publish_reason(Some(&with_pod), &shown, at_once, hb, &cfg)
                .unwrap()
                .to_string()
                .contains("memory of a pod")
        );
        assert_eq!(kind(&shown, &with_pod, Duration::from_secs(5)), None);
        // Noise inside the deadbands is never written before the heartbeat.
        let mut noisy = base.clone();
        for step in 0..hb.as_secs() {
            let wobble = if step % 2 == 0 { 0.049 } else { -0.049 };
            noisy.gpus[0].sm_activity = Some(base.gpus[0].sm_activity.unwrap() + wobble);
            noisy.gpus[0].memory_free_mib = base.gpus[0].memory_free_mib - 255 * (step % 2);
            noisy.gpus[0].power_watts = Some(100.0 + step as f64);
            noisy.gpus[0].energy_joules = Some(1000.0 * step as f64);
            noisy.updated_at = Some(format!("t{step}"));
            assert_eq!(kind(&base, &noisy, Duration::from_secs(step)), None);
        }
        assert_eq!(kind(&base, &noisy, hb), Some(WriteKind::Heartbeat));
    }

    #[test]
    fn heartbeats_are_jittered_within_a_tenth() {
        let base = Duration::from_secs(300);
        let mut seen = BTreeSet::new();
        for node in ["n1", "n2", "gpu-node-17"] {
            for nth in 0..50 {
                let hb = jittered_heartbeat(base, node, nth);
                assert!(hb <= base && hb >= base - base / 10, "{hb:?}");
                assert_eq!(hb, jittered_heartbeat(base, node, nth));
                seen.insert(hb.as_millis() / 1000);
            }
        }
        assert!(seen.len() > 10, "spread over the tenth: {seen:?}");
    }
}
