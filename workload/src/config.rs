//! Everything a simulation run is parameterised by.

use carma_core::{Millis, PlacementConfig, RecoveryConfig};
use serde::Serialize;

use crate::error::SimError;
use crate::model::{PowerModel, SlowdownModel, TelemetryModel};

// Limits on input. The engine keeps state per GPU and per task and times in
// u64 milliseconds; these bounds keep memory within a workstation's and every
// sum of times far below u64::MAX, so bad input is refused up front instead of
// exhausting memory, wrapping around or spinning.

/// Most nodes of a simulated cluster (`--nodes`).
pub const MAX_NODES: u32 = 100_000;
/// Most GPUs per node (`--gpus-per-node`), also the most GPUs one task may ask
/// for: the largest single systems sold have 72 (NVL72); 1,024 leaves room.
pub const MAX_GPUS_PER_NODE: u32 = 1_024;
/// Most GPUs in all (nodes × GPUs per node): 100 × the scale benchmark's 1,000.
pub const MAX_TOTAL_GPUS: u64 = 100_000;
/// Most memory per GPU (`--gpu-memory`) and per task (`.rad` peak and
/// estimate): 1 TiB, five times the largest GPU sold today.
pub const MAX_GPU_MEMORY_MIB: u64 = 1 << 20;
/// Most tasks in a trace, generated (`--tasks`) or imported: 10 × the scale
/// benchmark's 10,000 (which takes seconds per policy), about the size of the
/// Philly trace. Run time grows faster than linearly: 100,000 tasks on 100,000
/// GPUs took over 15 minutes for one policy in a debug build.
pub const MAX_TASKS: usize = 100_000;
/// Longest delay setting (`--warm-up`, `--telemetry-lag`, `--recovery-backoff`):
/// one day. CARMA's figures are seconds; a day is longer than any setting that
/// means something for a scheduler.
pub const MAX_DELAY_MS: Millis = 86_400_000;
/// Longest exclusive run time of one task: one year. With [`MAX_TASKS`] tasks
/// of [`MAX_ATTEMPTS`] attempts each, run back to back, the end is still below
/// 2^59 ms.
pub const MAX_RUN_MS: Millis = 365 * 86_400_000;
/// Latest submission time in a trace: ten years after the start.
pub const MAX_ARRIVAL_MS: Millis = 10 * MAX_RUN_MS;
/// Most attempts per task (`--max-attempts`); each failed attempt is a crash
/// the engine replays.
pub const MAX_ATTEMPTS: u32 = 100;
/// `--slowdown-threshold` range, exclusive of 0: summed SM activity of the
/// tasks on one GPU; at 100 no realistic GPU ever slows, so more means nothing.
pub const SLOWDOWN_THRESHOLD_RANGE: (f64, f64) = (0.0, 100.0);
/// Largest `--slowdown-exponent`: at 10 two saturating tasks already run 1,000
/// times slower; the model clamps the rate at 10^-6 in any case.
pub const MAX_SLOWDOWN_EXPONENT: f64 = 10.0;
/// Largest `--max-power`: 10 kW, ten times the largest GPU's board power.
pub const MAX_POWER_W: f64 = 10_000.0;
/// `--activity-scale` range, exclusive of 0: 100 turns the lightest task into
/// one that saturates the GPU many times over.
pub const ACTIVITY_SCALE_RANGE: (f64, f64) = (0.0, 100.0);

/// kube-scheduler's back-off for a pod that did not fit: 1 s after the first failure
/// (`podInitialBackoffSeconds`), doubling with each further failure.
pub const KUBE_INITIAL_BACKOFF_MS: Millis = 1_000;
/// The back-off's ceiling (`podMaxBackoffSeconds`).
pub const KUBE_MAX_BACKOFF_MS: Millis = 10_000;

/// How waiting tasks are taken from the queues.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum QueueDiscipline {
    /// CARMA's: first in, first out; a task that does not fit blocks every task behind it until it
    /// is placed. The recovery queue goes first.
    Carma,
    /// kube-scheduler's, which is how carma's pods are queued on Kubernetes: recovery pods (priority
    /// class `carma-recovery`) first, then by arrival; a task that does not fit is set aside with
    /// kube-scheduler's back-off ([`KUBE_INITIAL_BACKOFF_MS`] doubling to [`KUBE_MAX_BACKOFF_MS`])
    /// and the tasks behind it are tried. A task set aside is tried again at the first scheduling
    /// pass (a task finishing, arriving or being placed, or a warm-up lock lifting) after its
    /// back-off; kube-scheduler's own pass after an unrelated cluster event, or its 5-minute flush,
    /// is not modelled.
    #[default]
    Kube,
}

impl QueueDiscipline {
    /// Both, in a fixed order.
    pub const ALL: [QueueDiscipline; 2] = [QueueDiscipline::Carma, QueueDiscipline::Kube];

    /// The name used on the command line and in JSON.
    pub fn as_str(self) -> &'static str {
        match self {
            QueueDiscipline::Carma => "carma",
            QueueDiscipline::Kube => "kube",
        }
    }

    /// kube-scheduler's back-off after `failures` failed scheduling attempts (at least one).
    pub fn kube_backoff_ms(failures: u32) -> Millis {
        let doublings = failures.saturating_sub(1).min(16);
        KUBE_INITIAL_BACKOFF_MS
            .saturating_mul(1 << doublings)
            .min(KUBE_MAX_BACKOFF_MS)
    }
}

impl std::str::FromStr for QueueDiscipline {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        QueueDiscipline::ALL
            .into_iter()
            .find(|q| q.as_str() == s.trim())
            .ok_or_else(|| format!("unknown queue {s:?}; expected carma or kube"))
    }
}

/// The simulated cluster: identical nodes of identical GPUs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct ClusterSpec {
    /// Nodes.
    pub nodes: u32,
    /// GPUs per node.
    pub gpus_per_node: u32,
    /// Memory of each GPU in MiB.
    pub gpu_memory_mib: u64,
}

impl Default for ClusterSpec {
    /// CARMA's DGX Station A100: one node, 4 × 40 GiB.
    fn default() -> Self {
        Self {
            nodes: 1,
            gpus_per_node: 4,
            gpu_memory_mib: 40 * 1024,
        }
    }
}

impl ClusterSpec {
    /// Total GPUs.
    pub fn total_gpus(&self) -> u32 {
        self.nodes.saturating_mul(self.gpus_per_node)
    }
}

/// Parameters of a run; defaults are CARMA's figures and the documented models.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct SimConfig {
    /// The cluster.
    pub cluster: ClusterSpec,
    /// Placement thresholds (carma-core; CARMA's defaults).
    pub placement: PlacementConfig,
    /// Recovery settings (carma-core).
    pub recovery: RecoveryConfig,
    /// Slowdown while sharing.
    pub slowdown: SlowdownModel,
    /// Power model.
    pub power: PowerModel,
    /// Telemetry lag, window and scheduler period.
    pub telemetry: TelemetryModel,
    /// Multiplier on every task's activity figures.
    pub activity_scale: f64,
    /// Whether the utilization gate applies.
    pub gate: bool,
    /// How waiting tasks are taken from the queues.
    pub queue: QueueDiscipline,
    /// Whether to keep per-GPU timelines and attempt logs (for the HTML report).
    pub record_timelines: bool,
    /// Remember each node's placement answer until the node changes (same
    /// results, much faster on large clusters). Off only to check exactly that.
    pub memoize: bool,
    /// Reserve first attempts from the peaks earlier tasks of the same profile reached
    /// (carma's learned reservations); `None`: estimates only, as CARMA.
    pub learn_peaks: Option<carma_core::HistoryConfig>,
}

impl Default for SimConfig {
    fn default() -> Self {
        Self {
            cluster: ClusterSpec::default(),
            placement: PlacementConfig::default(),
            recovery: RecoveryConfig::default(),
            slowdown: SlowdownModel::default(),
            power: PowerModel::default(),
            telemetry: TelemetryModel::default(),
            activity_scale: 1.0,
            gate: true,
            queue: QueueDiscipline::default(),
            record_timelines: false,
            memoize: true,
            learn_peaks: None,
        }
    }
}

impl SimConfig {
    /// A makespan no placement policy can beat on `tasks` under these models (seconds), for a
    /// run in which every task finishes; tasks that need more GPUs than a node has are left out.
    /// From the slowdown model's conservation of work: a GPU whose shown tasks sum to SM activity
    /// `D` runs each at `(max(θ,s)/max(θ,D))^γ`, so with γ ≥ 1 they advance at most
    /// `max(θ, largest s)` units of SM-activity-seconds per second. Until its memory and activity
    /// show (`telemetry.lag_ms`) a task runs at full speed outside that budget, so each task's work
    /// is counted without its first `lag_ms`. The bound is the longer of: that work over every GPU
    /// at that rate; and, for every task, its arrival after the first task's plus its exclusive
    /// time, less one scheduling step (the first task starts within a step of its arrival on the
    /// empty cluster, and no task runs faster than alone). Memory and the gate only lengthen it.
    /// `None` for γ < 1 (sharing then creates throughput and there is no such bound).
    pub fn makespan_bound_s(&self, tasks: &[crate::task::Task]) -> Option<f64> {
        let placeable: Vec<&crate::task::Task> = tasks
            .iter()
            .filter(|t| t.gpus <= self.cluster.gpus_per_node)
            .collect();
        if self.slowdown.exponent < 1.0 || placeable.is_empty() {
            return None;
        }
        let activity = |t: &crate::task::Task| t.activity.scaled(self.activity_scale).sm_activity;
        let rate = placeable
            .iter()
            .map(|t| activity(t))
            .fold(self.slowdown.threshold, f64::max);
        let work: f64 = placeable
            .iter()
            .map(|t| {
                let shown_ms = t.exclusive_ms.saturating_sub(self.telemetry.lag_ms);
                activity(t) * shown_ms as f64 / 1000.0 * f64::from(t.gpus)
            })
            .sum();
        let gpus = f64::from(self.cluster.nodes) * f64::from(self.cluster.gpus_per_node);
        let first = placeable.iter().map(|t| t.arrival_ms).min().unwrap_or(0);
        let tail = placeable
            .iter()
            .map(|t| (t.arrival_ms - first).saturating_add(t.exclusive_ms))
            .max()
            .unwrap_or(0)
            .saturating_sub(self.telemetry.interval_ms) as f64
            / 1000.0;
        Some((work / (gpus * rate)).max(tail))
    }

    /// Reject values the models cannot work with.
    pub fn validate(&self) -> Result<(), SimError> {
        let bad = |m: String| Err(SimError::Config(m));
        let c = &self.cluster;
        if !(1..=MAX_NODES).contains(&c.nodes) {
            return bad(format!(
                "--nodes is {}; it must be between 1 and {MAX_NODES}",
                c.nodes
            ));
        }
        if !(1..=MAX_GPUS_PER_NODE).contains(&c.gpus_per_node) {
            return bad(format!(
                "--gpus-per-node is {}; it must be between 1 and {MAX_GPUS_PER_NODE}",
                c.gpus_per_node
            ));
        }
        let total = u64::from(c.nodes) * u64::from(c.gpus_per_node);
        if total > MAX_TOTAL_GPUS {
            return bad(format!(
                "--nodes × --gpus-per-node is {} × {} = {total} GPUs; at most {MAX_TOTAL_GPUS} are simulated",
                c.nodes, c.gpus_per_node
            ));
        }
        if !(1024..=MAX_GPU_MEMORY_MIB).contains(&c.gpu_memory_mib) {
            return bad(format!(
                "--gpu-memory is {} MiB; it must be between 1024 MiB (1 GiB) and {MAX_GPU_MEMORY_MIB} MiB (1 TiB)",
                c.gpu_memory_mib
            ));
        }
        for (flag, ms) in [
            ("--warm-up", self.placement.warmup_ms),
            ("--telemetry-lag", self.telemetry.lag_ms),
            ("--recovery-backoff", self.recovery.backoff_base_ms),
        ] {
            if ms > MAX_DELAY_MS {
                return bad(format!(
                    "{flag} is {} s; it must be between 0 and {} s (one day)",
                    ms as f64 / 1000.0,
                    MAX_DELAY_MS / 1000
                ));
            }
        }
        let s = &self.slowdown;
        let (lo, hi) = SLOWDOWN_THRESHOLD_RANGE;
        if !(s.threshold.is_finite() && s.threshold > lo && s.threshold <= hi) {
            return bad(format!(
                "--slowdown-threshold is {:?}; it must be more than {lo} and at most {hi}",
                s.threshold
            ));
        }
        if !(s.exponent.is_finite() && (0.0..=MAX_SLOWDOWN_EXPONENT).contains(&s.exponent)) {
            return bad(format!(
                "--slowdown-exponent is {:?}; it must be between 0 and {MAX_SLOWDOWN_EXPONENT}",
                s.exponent
            ));
        }
        let p = &self.power;
        if !(p.idle_w.is_finite()
            && p.max_w.is_finite()
            && 0.0 <= p.idle_w
            && p.idle_w <= p.max_w
            && p.max_w <= MAX_POWER_W)
        {
            return bad(format!(
                "power must satisfy 0 ≤ --idle-power ≤ --max-power ≤ {MAX_POWER_W} W, got idle {:?} W, max {:?} W",
                p.idle_w, p.max_w
            ));
        }
        let (lo, hi) = ACTIVITY_SCALE_RANGE;
        if !(self.activity_scale.is_finite()
            && self.activity_scale > lo
            && self.activity_scale <= hi)
        {
            return bad(format!(
                "--activity-scale is {:?}; it must be more than {lo} and at most {hi}",
                self.activity_scale
            ));
        }
        if self.telemetry.interval_ms == 0 || self.telemetry.window == 0 {
            return bad("telemetry interval and window must be positive".into());
        }
        let crowding = carma_core::config::PACK_CROWDING_LIMIT_RANGE;
        if !crowding.contains(&self.placement.pack_crowding_limit) {
            return bad(format!(
                "--pack-crowding-limit is {:?}; it must be between {} and {}",
                self.placement.pack_crowding_limit,
                crowding.start(),
                crowding.end()
            ));
        }
        if !(1..=MAX_ATTEMPTS).contains(&self.recovery.max_attempts) {
            return bad(format!(
                "--max-attempts is {}; it must be between 1 and {MAX_ATTEMPTS}",
                self.recovery.max_attempts
            ));
        }
        Ok(())
    }

    /// The placement thresholds the engine hands to carma-core, with the gate
    /// switched off by an unreachable SM-activity cap when `gate` is false.
    pub fn effective_placement(&self) -> PlacementConfig {
        let mut p = self.placement.clone();
        if !self.gate {
            p.sm_activity_cap = f64::INFINITY;
        }
        p
    }
}
