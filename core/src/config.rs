//! Thresholds, with CARMA's published figures as defaults.

use serde::{Deserialize, Serialize};

pub use crate::pack_gain::{PackGain, SharingModel};

/// Default limit on telemetry age: two of the device plugin's heartbeats (one write per node every
/// 270–300 s when nothing changes, so 5,000 nodes write about 18 statuses a second). A node is
/// stale after a whole heartbeat and the retries of the next one failed, 10 minutes at most; a
/// plugin that died is caught sooner by the kubelet, whose device manager withdraws
/// `carma.io/gpu` from the node, and a node that died by its NotReady taint.
pub const DEFAULT_MAX_TELEMETRY_AGE_MS: u64 = 600_000;

/// Default wait after which `pack` lets a pod crowd any busy GPU: eight hours, a bound on waiting
/// rather than a setting that acts on the simulated grid of docs/default-policy.md: there, aging
/// sooner met fewer rows (10 min: 0 of 36, 30 min: 8, 2 h: 20, at a crowding limit of 1.0), and
/// 8 h and 24 h gave the same figures.
pub const DEFAULT_PACK_AGING_MS: u64 = 8 * 60 * 60_000;
/// `pack`'s default crowding limit: combined expected SM activity of 1.3. Expected activities are
/// coarse priors by model class; on the simulated grid of docs/default-policy.md (both queues, both
/// interference exponents) 1.2-1.3 met the most rows and closed the most of the gap to the makespan
/// bound, 1.4 and 1.6 fewer; 1.3 has the shortest worst makespan of them.
pub const DEFAULT_PACK_CROWDING_LIMIT: f64 = 1.3;
/// The crowding limits `pack` accepts: from full SM activity to four jobs' worth.
pub const PACK_CROWDING_LIMIT_RANGE: std::ops::RangeInclusive<f64> = 1.0..=4.0;

/// Every threshold the placement rules use. Defaults are CARMA's figures.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct PlacementConfig {
    /// Memory held back from the telemetry free figure (CARMA: 512 MiB).
    pub telemetry_reserve_mib: u64,
    /// Extra memory a GPU must have beyond the reservation (CARMA: 2048 MiB).
    pub memory_margin_mib: u64,
    /// Free memory demanded when a pod has no estimate (CARMA's OR-* policies: 5120 MiB).
    pub min_free_without_estimate_mib: u64,
    /// SM activity risk score at or above which the gate may exclude a GPU (0.80).
    pub sm_activity_cap: f64,
    /// SM occupancy risk score that, with high SM activity, excludes a GPU (0.45).
    pub sm_occupancy_cap: f64,
    /// DRAM activity risk score that, with high SM activity, excludes a GPU (0.40).
    pub dram_activity_cap: f64,
    /// A GPU that just received a pod takes no other for this long unless the
    /// pod's memory shows in telemetry first (CARMA: 30 s).
    pub warmup_ms: u64,
    /// Whether the sum of reservations of pods assigned to a GPU must also fit its
    /// total memory (bookkeeping on top of telemetry). CARMA relies on telemetry
    /// alone; carma checks both by default so that a GPU is never over-committed
    /// on paper either.
    pub honor_reservations: bool,
    /// GPUs whose telemetry is older than this take no new shared pods (exclusive placement on
    /// idle GPUs continues): a node whose device plugin stopped publishing is not trusted with
    /// collocation. `None`: telemetry never ages.
    pub max_telemetry_age_ms: Option<u64>,
    /// `pack` only: a pod that has waited this long may crowd a busy GPU past full SM activity
    /// (least loaded first) instead of waiting for a GPU where its expected activity fits.
    pub pack_aging_ms: u64,
    /// `pack` only: the combined expected SM activity up to which a busy GPU may be crowded (the
    /// last tier; never below the SM-activity cap). Above 1.0 bets that co-located jobs lose
    /// little throughput when they take turns on saturated SMs — right when the interference
    /// model's slowdown exponent is near 1, wrong near 2 (docs/pack-policy.md).
    pub pack_crowding_limit: f64,
    /// `pack` only: take idle GPUs before complementary busy ones (exclusive first, as CARMA's
    /// policies do), sharing only when no idle GPU fits. Off by default.
    pub pack_idle_first: bool,
    /// `pack` only: judge busy GPUs by the throughput a slowdown model predicts the placement adds
    /// (see [`PackGain`]) instead of by summed activity against the cap and the crowding limit.
    /// `None` by default.
    pub pack_gain: Option<PackGain>,
    /// Which of a node's passing GPUs a pod gets. Not a production setting: the simulator's
    /// `--gpu-choice device-order` measures what Dynamic Resource Allocation loses by letting
    /// kube-scheduler's allocator, not the policy, pick the GPU.
    pub gpu_choice: GpuChoice,
    /// Whether a GPU must also show the reservation free in telemetry (CARMA's memory test:
    /// usable ≥ reservation + margin), on top of the booked capacity. On by default; the
    /// simulator's `--no-telemetry-memory-test` measures what DRA, whose allocator sees only
    /// booked capacity, loses without it.
    pub telemetry_memory_test: bool,
}

/// Who picks the GPUs inside the node the policy's score chose.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum GpuChoice {
    /// The policy: exclusive first, then its order (best fit, most memory, `pack`'s tiers, …).
    #[default]
    Policy,
    /// A DRA allocator: the first GPUs in device order that pass the same rules (memory, gate,
    /// warm-up), idle or not; a pod that takes GPUs whole takes the first idle ones. The node is
    /// still the one the policy scores highest, as carma's extender ranks nodes on DRA too.
    DeviceOrder,
}

impl Default for PlacementConfig {
    fn default() -> Self {
        Self {
            telemetry_reserve_mib: 512,
            memory_margin_mib: 2048,
            min_free_without_estimate_mib: 5120,
            sm_activity_cap: 0.80,
            sm_occupancy_cap: 0.45,
            dram_activity_cap: 0.40,
            warmup_ms: 30_000,
            honor_reservations: true,
            max_telemetry_age_ms: Some(DEFAULT_MAX_TELEMETRY_AGE_MS),
            pack_aging_ms: DEFAULT_PACK_AGING_MS,
            pack_crowding_limit: DEFAULT_PACK_CROWDING_LIMIT,
            pack_idle_first: false,
            pack_gain: None,
            gpu_choice: GpuChoice::Policy,
            telemetry_memory_test: true,
        }
    }
}

/// How the operator (and the simulator) recover from failed attempts.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct RecoveryConfig {
    /// Attempts in all, the first included, before the task fails.
    pub max_attempts: u32,
    /// After this many GPU out-of-memory crashes the next attempt runs exclusively.
    pub exclusive_after_ooms: u32,
    /// Added to an observed peak when it is known.
    pub headroom_mib: u64,
    /// Upper edges of GPUMemNet's 8 GB classes (MiB); the next reservation after an
    /// OOM is the first edge above the failed one.
    pub class_edges_mib: Vec<u64>,
    /// Retries after a failure that is neither an OOM nor an eviction.
    pub retries_on_failure: u32,
    /// First backoff before a retry, doubled each attempt.
    pub backoff_base_ms: u64,
    /// Ceiling of the backoff.
    pub backoff_max_ms: u64,
    /// Evictions and preemptions tolerated (they do not count as attempts).
    pub max_evictions: u32,
}

impl Default for RecoveryConfig {
    fn default() -> Self {
        Self {
            max_attempts: 5,
            exclusive_after_ooms: 2,
            headroom_mib: 1024,
            class_edges_mib: vec![8000, 16000, 24000, 32000, 40000, 50000],
            retries_on_failure: 0,
            backoff_base_ms: 10_000,
            backoff_max_ms: 300_000,
            max_evictions: 10,
        }
    }
}
