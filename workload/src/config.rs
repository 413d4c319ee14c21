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
    /// `None` for γ < 1 (sharing then creates throughput and there is no such bound).
    ///
    /// Makespan runs from the first dispatch `S`. An empty node takes any task that fits it under
    /// every policy (exclusive-first takes idle GPUs; `pack` falls back on them), so `S` is
    /// `tick(a₀)`, the first scheduler tick (a multiple of `telemetry.interval_ms`) at or after
    /// the first arrival; a task arriving at `a` starts at `tick(a)` or later.
    ///
    /// A task of SM activity `s` on `g` GPUs with exclusive time `x` has work `w = s·g·(x − lag)⁺`
    /// (`lag = telemetry.lag_ms`): until its activity shows it runs at full speed outside any
    /// GPU's budget, and an attempt crashes only when it shows, so the attempt that finishes does
    /// all of `w`, none of it before `tick(a) + lag`, at most `s·g` per second. On a GPU whose
    /// shown tasks sum to `D`, each runs at `(max(θ,s)/max(θ,D))^γ ≤ max(θ,s)/max(θ,D)` (γ ≥ 1),
    /// so any subset `A` of them does at most `M_A = max(θ, largest s in A)` work per second (θ
    /// read as the model reads it, at least 10⁻⁶). The model's lowest rate, 10⁻⁶, only matters
    /// where `max(θ,D) > 10⁶·M_A`, and there gives `A` at most `10⁻⁶·Σ_A s ≤ M_A` while fewer
    /// than 10⁶ tasks share the GPU. Under the time-slicing form (β ≤ 1, η ≤ 1) the same holds
    /// with its `θ`: a task of demand `b` that gets `a ≤ b` of the GPU's time does `s·a/b` work
    /// per second, `s/b ≤ max(θ, s)` when β ≤ 1, and the shares sum to at most η ≤ 1 (a task
    /// alone does `s`). Otherwise (γ < 1, β > 1) there is no bound.
    ///
    /// Hence for every tick `T`, the tasks with `tick(a) ≥ T` cannot be done before their rate
    /// cap, `min(GPUs·M_A, Σ s·g over those whose tick(a) + lag has passed)`, integrated from
    /// `T + lag`, reaches their total work (at the first tick: all the work over the whole
    /// cluster, after one lag).
    ///
    /// Memory gives a second such bound. A task shows its true peak `p` on each of its GPUs
    /// from `lag` after its dispatch until it ends, and one whose peak does not fit beside the
    /// shown peaks of a GPU crashes when it shows, so the shown peaks on a GPU never sum past
    /// its memory `m`. The attempt that finishes is shown for at least `(x − lag)⁺` (its rate
    /// is at most 1), so the tasks released at `T` or later hold `Σ p·g·(x − lag)⁺`
    /// MiB-seconds, none before `T + lag`, at most `min(GPUs·m, Σ p·g of those released)` per
    /// second. Where reservations are generous this one is the longer: every task holds its
    /// memory however little SM activity it has.
    ///
    /// The bound is the latest of both and of `tick(a) + x` over tasks, less `S`.
    pub fn makespan_bound_s(&self, tasks: &[crate::task::Task]) -> Option<f64> {
        let floor = match &self.slowdown.time_slicing {
            None if self.slowdown.exponent < 1.0 => return None,
            None => self.slowdown.threshold.max(1e-6),
            Some(ts) if ts.exponent > 1.0 || ts.efficiency > 1.0 => return None,
            Some(ts) => ts.full_activity,
        };
        let step = self.telemetry.interval_ms.max(1);
        let tick = |t: Millis| t.div_ceil(step).saturating_mul(step);
        let lag = self.telemetry.lag_ms;
        let placeable: Vec<&crate::task::Task> = tasks
            .iter()
            .filter(|t| t.gpus <= self.cluster.gpus_per_node)
            .collect();
        let start = placeable.iter().map(|t| tick(t.arrival_ms)).min()?;
        let secs = |t: Millis| t.saturating_sub(start) as f64 / 1000.0;
        let alone = placeable
            .iter()
            .map(|t| secs(tick(t.arrival_ms).saturating_add(t.exclusive_ms)))
            .fold(0.0, f64::max);
        // Tasks by the tick they may first start at, earliest first: SM-activity work and
        // memory-time, each with what the released tasks can do per second.
        let mut releases: Vec<Release> = Vec::new();
        let mut memory: Vec<Release> = Vec::new();
        let mut by_tick: Vec<(Millis, &crate::task::Task)> =
            placeable.iter().map(|t| (tick(t.arrival_ms), *t)).collect();
        by_tick.sort_by_key(|(at, _)| *at);
        for (at, t) in by_tick {
            let s = t.activity.scaled(self.activity_scale).sm_activity;
            let g = f64::from(t.gpus);
            let shown_s = t.exclusive_ms.saturating_sub(lag) as f64 / 1000.0;
            let p = t.peak_mib as f64;
            Release::add(&mut releases, at, s * g * shown_s, s * g, s);
            Release::add(&mut memory, at, p * g * shown_s, p * g, 0.0);
        }
        let gpus = f64::from(self.cluster.nodes) * f64::from(self.cluster.gpus_per_node);
        let (mut work, mut activity) = (0.0, floor);
        let mut released = 0.0;
        for first in (0..releases.len()).rev() {
            work += releases[first].work;
            activity = f64::max(activity, releases[first].activity);
            if work > 0.0 {
                let from = secs(releases[first].at.saturating_add(lag));
                let took = drain_s(&releases[first..], work, gpus * activity);
                released = f64::max(released, from + took);
            }
        }
        let capacity_mib = gpus * self.cluster.gpu_memory_mib as f64;
        let mut held = 0.0;
        for first in (0..memory.len()).rev() {
            held += memory[first].work;
            if held > 0.0 {
                let from = secs(memory[first].at.saturating_add(lag));
                let took = drain_s(&memory[first..], held, capacity_mib);
                released = f64::max(released, from + took);
            }
        }
        Some(alone.max(released))
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
        if let Some(ts) = &s.time_slicing {
            if !(ts.full_activity.is_finite() && ts.full_activity > lo && ts.full_activity <= hi) {
                return bad(format!(
                    "--slicing-full-activity is {:?}; it must be more than {lo} and at most {hi}",
                    ts.full_activity
                ));
            }
            if !(ts.exponent.is_finite() && (0.0..=MAX_SLOWDOWN_EXPONENT).contains(&ts.exponent)) {
                return bad(format!(
                    "--slicing-exponent is {:?}; it must be between 0 and {MAX_SLOWDOWN_EXPONENT}",
                    ts.exponent
                ));
            }
            if !(ts.efficiency.is_finite() && ts.efficiency > 0.0 && ts.efficiency <= 1.0) {
                return bad(format!(
                    "--slicing-efficiency is {:?}; it must be more than 0 and at most 1",
                    ts.efficiency
                ));
            }
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

/// Release groups [`drain_s`] follows the rate cap through before it takes the whole cluster's
/// rate: that only lowers the bound (the rate it assumes is never below the cap), and keeps its
/// cost at most this many steps per group.
const RAMP_STEPS: usize = 1024;

/// The tasks that may first start at one scheduler tick, for [`SimConfig::makespan_bound_s`]:
/// of one resource, SM activity or memory.
struct Release {
    /// The tick.
    at: Millis,
    /// Their work once shown: SM-activity-seconds, or MiB-seconds of memory held.
    work: f64,
    /// The most work per second they can do together (each at most its own speed).
    rate: f64,
    /// Their largest SM activity (0 for memory).
    activity: f64,
}

impl Release {
    /// Add one task to the group of tick `at`, the last of `groups` or a new one after it.
    fn add(groups: &mut Vec<Release>, at: Millis, work: f64, rate: f64, activity: f64) {
        match groups.last_mut() {
            Some(r) if r.at == at => {
                r.work += work;
                r.rate += rate;
                r.activity = r.activity.max(activity);
            }
            _ => groups.push(Release {
                at,
                work,
                rate,
                activity,
            }),
        }
    }
}

/// Seconds after `releases[0].at` (each shifted by the same lag) until `work` can be done at a
/// rate of at most `full` and at most the summed `rate` of the groups released so far.
fn drain_s(releases: &[Release], work: f64, full: f64) -> f64 {
    let origin = releases.first().map_or(0, |r| r.at);
    let (mut done, mut rate) = (0.0, 0.0);
    for (k, r) in releases.iter().enumerate() {
        let since = r.at.saturating_sub(origin) as f64 / 1000.0;
        rate += r.rate;
        let now = if k >= RAMP_STEPS {
            full
        } else {
            rate.min(full)
        };
        match releases.get(k + 1) {
            Some(next) if now < full => {
                let span = next.at.saturating_sub(r.at) as f64 / 1000.0;
                if done + now * span >= work {
                    return since + (work - done) / now;
                }
                done += now * span;
            }
            _ => return since + (work - done) / now,
        }
    }
    0.0
}
