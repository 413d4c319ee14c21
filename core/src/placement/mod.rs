//! Placement of one demand on one node: exclusive first, then the memory test,
//! the utilization gate and the policy's order; and the node score for prioritize.
//!
//! Scores (0..10, kube-scheduler's `MaxExtenderPriority`): a node that can give the
//! pod idle GPUs scores 10 (CARMA's exclusive-first rule lifted to the cluster).
//! Otherwise the policy's own preference is mapped to 0..9:
//! `ff` prefers the lowest GPU index, `bf` the tightest fit, `magm` the most memory
//! left, `lug` the lowest SM activity, `rr` the fewest pods already sharing.

//!
//! Every sharing rule, the policies' order and the score are judged on per-GPU summaries
//! (`summary.rs`) by one set of rules (`judge.rs`), so that [`place_on_node`] and the
//! allocation-free [`quick_score`] are one implementation.

pub mod hold;
mod judge;
pub mod pack;
mod summary;

use serde::Serialize;

use crate::Millis;
use crate::config::{GpuChoice, PlacementConfig};
use crate::gate::utilization_gate;
use crate::ledger::Ledger;
use crate::model::{Demand, Gpu, Node, Policy, Reservation};
use crate::reason::{GpuRejection, NodeRejection};

pub use judge::quick_score;
use judge::{SharedFailure, collocation_score, judge_shared, memory_test, order};
use summary::idle;
pub use summary::{GpuSummary, VerdictExpiry, expiry_of, summarize};

/// A node that can give the pod idle GPUs scores this (exclusive first, lifted to the cluster).
pub const EXCLUSIVE_SCORE: u8 = 10;

/// Where a demand goes on one node.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct NodePlacement {
    /// Node name.
    pub node: String,
    /// Chosen GPU UUIDs, in the policy's order.
    pub gpus: Vec<String>,
    /// Their indices.
    pub indices: Vec<u32>,
    /// Whether the pod gets the GPUs alone.
    pub exclusive: bool,
    /// MiB booked on each GPU.
    pub reserved_mib: u64,
    /// Node score 0..10 for prioritize.
    pub score: u8,
    /// Whether booking must keep each GPU's reservations within its memory — exactly when placement
    /// checked it, so that a bind never refuses what filter passed: round robin (no memory test, as in
    /// CARMA) books without the check.
    pub capacity_checked: bool,
    /// Expected SM activity to book with the pod on each GPU
    /// ([`PlacementRecord::expected_sm_activity`](crate::PlacementRecord)): the demand's, 1 when
    /// unknown.
    pub expected_sm_activity: f64,
}

impl NodePlacement {
    /// Where round robin starts next on this node: after the last GPU chosen, in the policy's
    /// (rotated) order — after a wrap-around that is not the highest index. The simulator and the
    /// extender both advance their cursors with this.
    pub fn next_rr_cursor(&self) -> Option<usize> {
        self.indices.last().map(|i| *i as usize + 1)
    }

    /// The ledger record that books this placement for `pod` at `now`, in flight until its memory
    /// shows (the simulator, the extender and `carma local` all book with it).
    pub fn record(&self, pod: impl Into<String>, now: Millis) -> crate::PlacementRecord {
        crate::PlacementRecord {
            pod: pod.into(),
            node: self.node.clone(),
            gpus: self.gpus.clone(),
            reserved_mib: self.reserved_mib,
            exclusive: self.exclusive,
            assigned_at: now,
            visible: false,
            expected_sm_activity: self.expected_sm_activity,
        }
    }
}

/// Memory usable for a new pod: telemetry free minus the reserve minus in-flight.
pub fn usable_mib(gpu: &Gpu, ledger: &Ledger, cfg: &PlacementConfig) -> u64 {
    gpu.memory_free_mib
        .saturating_sub(cfg.telemetry_reserve_mib)
        .saturating_sub(ledger.in_flight_mib(&gpu.uuid))
}

/// Whether `demand` takes `gpu` whole: it must be alone on the GPU, or it reserves the GPU's whole
/// memory or more. A reservation that large leaves nothing to share, and an estimate above the GPU
/// (GPUMemNet's classes are upper edges) is best tried on the whole GPU rather than refused; if it
/// really does not fit, the attempt fails with an out-of-memory crash and recovery decides. The
/// simulator and the extender both follow this one rule.
pub fn takes_whole(gpu: &Gpu, demand: &Demand) -> bool {
    demand.wants_exclusive()
        || matches!(demand.reservation, Reservation::Mib(m) if m >= gpu.memory_total_mib)
}

/// CARMA's recovery-first rule: while a recovery attempt (a pod of a task that crashed out of
/// memory, priority class `carma-recovery`) waits for GPUs, every other pod takes idle GPUs only, so
/// no new collocation competes with the recovering task for the GPUs that free up. The simulator
/// applies it with its recovery queue, the extender with the pending `carma-recovery` pods it sees.
pub fn recovery_first(mut demand: Demand, recovery_waiting: bool, is_recovery: bool) -> Demand {
    demand.idle_only = recovery_waiting && !is_recovery;
    demand
}

/// The reason `gpu` (summarized as `s`) fails the sharing rule `failure`.
fn rejection(
    failure: SharedFailure,
    gpu: &Gpu,
    s: &GpuSummary,
    ledger: &Ledger,
    demand: &Demand,
    cfg: &PlacementConfig,
    now: Millis,
) -> GpuRejection {
    let uuid = gpu.uuid.clone();
    let index = gpu.index;
    let pods = s.pods as usize;
    let need_mib = demand
        .reservation
        .booked_mib(s.total_mib, cfg.min_free_without_estimate_mib);
    match failure {
        SharedFailure::NeedsWhole => GpuRejection::NeedsWholeGpu {
            uuid,
            index,
            total_mib: s.total_mib,
            need_mib: match demand.reservation {
                Reservation::Mib(m) => m,
                _ => need_mib,
            },
        },
        SharedFailure::Unhealthy => GpuRejection::Unhealthy { uuid, index },
        SharedFailure::ExclusivelyHeld => GpuRejection::ExclusivelyHeld {
            holder: ledger
                .exclusive_holder(&gpu.uuid)
                .unwrap_or_default()
                .to_string(),
            uuid,
            index,
        },
        SharedFailure::ReplicasTaken => GpuRejection::ReplicasTaken {
            uuid,
            index,
            pods,
            max_pods: s.max_pods,
        },
        SharedFailure::WarmUpLock => {
            let (holder, left_ms) = ledger
                .warmup_holder(&gpu.uuid, cfg.warmup_ms, now)
                .unwrap_or_default();
            GpuRejection::WarmUpLock {
                holder: holder.to_string(),
                uuid,
                index,
                remaining_s: left_ms as f64 / 1000.0,
            }
        }
        SharedFailure::InsufficientMemory => {
            let (need_test, margin) = memory_test(demand, need_mib, cfg);
            GpuRejection::InsufficientMemory {
                uuid,
                index,
                free_mib: gpu.memory_free_mib,
                reserve_mib: cfg.telemetry_reserve_mib,
                in_flight_mib: ledger.in_flight_mib(&gpu.uuid),
                usable_mib: s.usable_mib,
                need_mib: need_test,
                margin_mib: margin,
            }
        }
        SharedFailure::ActivityCap => GpuRejection::ActivityCapExceeded {
            uuid,
            index,
            load: pack::load(s),
            expected: pack::booked_activity(demand),
            limit: pack::crowding_limit(cfg),
        },
        SharedFailure::OverReserved => GpuRejection::OverReserved {
            uuid,
            index,
            booked_mib: s.reserved_mib,
            total_mib: s.total_mib,
            pods,
            need_mib,
        },
        // The summary's staleness and rule come from the gate's own functions: the gate fails here
        // too, and says why.
        SharedFailure::Gate => {
            utilization_gate(gpu, cfg, now)
                .err()
                .unwrap_or(GpuRejection::TelemetryStale {
                    uuid,
                    index,
                    age_s: 0.0,
                    max_age_s: cfg.max_telemetry_age_ms.unwrap_or(0) as f64 / 1000.0,
                })
        }
    }
}

/// Place `demand` on `node`.
///
/// `rr_cursor` is the GPU index round robin starts from (the caller keeps it and
/// advances it past the last GPU chosen). Every rejected node carries the reason
/// of every GPU that failed.
pub fn place_on_node(
    node: &Node,
    ledger: &Ledger,
    demand: &Demand,
    cfg: &PlacementConfig,
    now: Millis,
    rr_cursor: usize,
) -> Result<NodePlacement, NodeRejection> {
    let wanted = demand.gpus.max(1);
    if node.gpus.is_empty() {
        return Err(NodeRejection::NoGpus {
            node: node.name.clone(),
        });
    }
    if node.gpus.len() < wanted as usize {
        return Err(NodeRejection::TooFewGpus {
            node: node.name.clone(),
            wanted,
            have: node.gpus.len(),
        });
    }
    let mut by_index: Vec<&Gpu> = node.gpus.iter().collect();
    by_index.sort_by_key(|g| g.index);
    // Exclusive first is judged before any summary is built: it needs only the pod count of each
    // GPU.
    let pods: Vec<usize> = by_index.iter().map(|g| ledger.pods_on(&g.uuid)).collect();
    let idle: Vec<usize> = (0..by_index.len())
        .filter(|&at| idle(by_index[at].healthy, by_index[at].processes, pods[at]))
        .collect();
    let take_idle = |score: u8| {
        let chosen: Vec<&Gpu> = idle[..wanted as usize]
            .iter()
            .map(|&at| by_index[at])
            .collect();
        // A pod that takes its GPUs whole owns them; a sharer that merely found idle GPUs books
        // its own reservation, so others may join later.
        let whole = chosen.iter().any(|g| takes_whole(g, demand));
        let reserved = chosen
            .iter()
            .map(|g| {
                if whole {
                    g.memory_total_mib
                } else {
                    demand
                        .reservation
                        .booked_mib(g.memory_total_mib, cfg.min_free_without_estimate_mib)
                }
            })
            .max()
            .unwrap_or(0);
        NodePlacement {
            node: node.name.clone(),
            gpus: chosen.iter().map(|g| g.uuid.clone()).collect(),
            indices: chosen.iter().map(|g| g.index).collect(),
            exclusive: whole,
            reserved_mib: reserved,
            score,
            capacity_checked: true,
            expected_sm_activity: pack::booked_activity(demand),
        }
    };
    // Collocation: every rule per GPU, then the policy's order.
    let mut summaries = Vec::new();
    let (gpus, built) = (&by_index, &mut summaries);
    let share = move || {
        // Moved out whole: the fits borrow the summaries past this call.
        let built = built;
        built.extend(gpus.iter().map(|g| GpuSummary::of(g, ledger, cfg)));
        let built: &Vec<GpuSummary> = built;
        let mut fits = Vec::new();
        let mut rejections = Vec::new();
        for (at, s) in built.iter().enumerate() {
            match judge_shared(at, s, demand, cfg, now) {
                Ok(fit) => fits.push(fit),
                Err(f) => rejections.push(rejection(f, gpus[at], s, ledger, demand, cfg, now)),
            }
        }
        (fits.len(), (fits, rejections))
    };
    let totals = by_index.iter().map(|g| g.memory_total_mib);
    let device_order = cfg.gpu_choice == GpuChoice::DeviceOrder;
    match exclusive_first(demand, wanted as usize, idle.len(), totals, share) {
        // A DRA allocator does not prefer idle GPUs: a sharer gets the first passing GPUs in
        // device order, busy or idle; the node keeps the score the policy gave it.
        Route::Idle(score)
            if device_order
                && !demand.wants_exclusive()
                && !by_index.iter().any(|g| takes_whole(g, demand)) =>
        {
            let built: Vec<GpuSummary> = by_index
                .iter()
                .map(|g| GpuSummary::of(g, ledger, cfg))
                .collect();
            let fits: Vec<_> = built
                .iter()
                .enumerate()
                .filter_map(|(at, s)| judge_shared(at, s, demand, cfg, now).ok())
                .take(wanted as usize)
                .collect();
            if fits.len() < wanted as usize {
                return Ok(take_idle(score));
            }
            Ok(shared_placement(node, &by_index, &fits, score, demand, cfg))
        }
        Route::Idle(score) => Ok(take_idle(score)),
        Route::NotIdle => {
            let rejections = (0..by_index.len())
                .filter(|at| !idle.contains(at))
                .map(|at| {
                    let g = by_index[at];
                    if g.healthy {
                        GpuRejection::NotIdle {
                            uuid: g.uuid.clone(),
                            index: g.index,
                            pods: pods[at],
                            processes: g.processes,
                        }
                    } else {
                        GpuRejection::Unhealthy {
                            uuid: g.uuid.clone(),
                            index: g.index,
                        }
                    }
                })
                .collect();
            Err(NodeRejection::NotEnoughGpus {
                node: node.name.clone(),
                wanted,
                passing: idle.len(),
                mode: "exclusively",
                rejections,
            })
        }
        Route::RecoveryFirst => Err(NodeRejection::RecoveryFirst {
            node: node.name.clone(),
            wanted,
            idle: idle.len(),
        }),
        Route::TooFewFits((fits, rejections)) => Err(NodeRejection::NotEnoughGpus {
            node: node.name.clone(),
            wanted,
            passing: fits.len(),
            mode: "to share",
            rejections,
        }),
        Route::Share((mut fits, _)) => {
            let wanted = wanted as usize;
            // Judged in device order; a DRA allocator takes the first as they come (copied only
            // then: the policy's path sorts in place, as the extender's filter needs no copy).
            let first = device_order.then(|| fits[..wanted].to_vec());
            order(&mut fits, demand, cfg, rr_cursor, node.gpus.len());
            let score = collocation_score(&fits[..wanted], demand, cfg);
            let chosen = first.as_deref().unwrap_or(&fits[..wanted]);
            Ok(shared_placement(
                node, &by_index, chosen, score, demand, cfg,
            ))
        }
    }
}

/// A placement that shares `chosen` (GPUs that passed the sharing rules), scored `score`.
fn shared_placement(
    node: &Node,
    by_index: &[&Gpu],
    chosen: &[summary::Fit<'_>],
    score: u8,
    demand: &Demand,
    cfg: &PlacementConfig,
) -> NodePlacement {
    NodePlacement {
        node: node.name.clone(),
        gpus: chosen.iter().map(|f| by_index[f.at].uuid.clone()).collect(),
        indices: chosen.iter().map(|f| f.gpu.index).collect(),
        exclusive: false,
        reserved_mib: chosen.iter().map(|f| f.need_mib).max().unwrap_or(0),
        score,
        capacity_checked: cfg.honor_reservations && demand.policy.checks_memory_and_gate(),
        expected_sm_activity: pack::booked_activity(demand),
    }
}

/// Where [`exclusive_first`] sends a demand on a node.
enum Route<T> {
    /// Take the first idle GPUs; the node scores this.
    Idle(u8),
    /// The demand must not share, and too few GPUs are idle.
    NotIdle,
    /// The demand may take idle GPUs only (recovery first), and too few are idle.
    RecoveryFirst,
    /// Too few GPUs pass the sharing rules; what judging them gave.
    TooFewFits(T),
    /// Enough GPUs pass the sharing rules; what judging them gave.
    Share(T),
}

/// The skeleton [`place_on_node`] and [`quick_score`] share. Exclusive first: enough idle GPUs
/// are taken alone, unless `pack` packs (it shares first and keeps idle GPUs). Otherwise a demand
/// that must not share, or may take idle GPUs only, is refused; the rest go through the sharing
/// rules (`share` judges every GPU and says how many pass), and `pack` falls back on idle GPUs when
/// too few pass (stale telemetry, say).
fn exclusive_first<T>(
    demand: &Demand,
    wanted: usize,
    idle: usize,
    totals_mib: impl Iterator<Item = u64>,
    share: impl FnOnce() -> (usize, T),
) -> Route<T> {
    let packs = pack::packs(demand, totals_mib);
    if idle >= wanted && !packs {
        return Route::Idle(EXCLUSIVE_SCORE);
    }
    if demand.wants_exclusive() {
        return Route::NotIdle;
    }
    if demand.idle_only {
        return Route::RecoveryFirst;
    }
    let (passing, judged) = share();
    if passing >= wanted {
        Route::Share(judged)
    } else if packs && idle >= wanted {
        Route::Idle(pack::IDLE_SCORE)
    } else {
        Route::TooFewFits(judged)
    }
}

/// What [`place_on_node`] reads of a demand: on the same node, ledger and time, demands with equal
/// keys are placed alike (the simulator's memo and the extender's verdict cache key on it).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct DemandKey {
    gpus: u32,
    reservation: Reservation,
    policy: Policy,
    exclusive: bool,
    idle_only: bool,
    /// Expected SM activity in thousandths: `pack` orders and scores by it, and every placement
    /// books it.
    activity_milli: Option<u16>,
    /// `pack`: the demand has waited long enough to crowd a busy GPU.
    aged: bool,
}

impl DemandKey {
    /// The key of `demand` under `cfg`.
    pub fn of(demand: &Demand, cfg: &PlacementConfig) -> Self {
        let packs = demand.policy == Policy::Pack;
        Self {
            gpus: demand.gpus,
            reservation: demand.reservation,
            policy: demand.policy,
            exclusive: demand.exclusive,
            idle_only: demand.idle_only,
            activity_milli: pack::activity_key(demand),
            aged: packs && pack::aged(demand, cfg),
        }
    }

    /// The key for the score or rejection alone: outside `pack` they do not depend on the
    /// expected activity (only the booking does), so demands differing in it share the key.
    pub fn verdict_only(mut self) -> Self {
        if self.policy != Policy::Pack {
            self.activity_milli = None;
        }
        self
    }
}

/// The earliest moments at which [`place_on_node`]'s answer for `node` can change by time alone:
/// a warm-up lock lifting or the node's telemetry turning stale. Until then an answer may be
/// reused while the node, the ledger records on its GPUs and the demand stay the same (the
/// simulator's memo and the extender's verdict cache both follow this).
pub fn verdict_expiry(
    node: &Node,
    ledger: &Ledger,
    cfg: &PlacementConfig,
    now: Millis,
) -> VerdictExpiry {
    expiry_of(&summarize(&node.gpus, ledger, cfg), now)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The route of `demand` needing 2 GPUs of 40 GiB with `idle` idle and `passing` passing the
    /// sharing rules; `None` in the route: the sharing rules were not judged.
    fn route(demand: &Demand, idle: usize, passing: usize) -> Route<Option<usize>> {
        let totals = [40_960u64; 4].into_iter();
        exclusive_first(demand, 2, idle, totals, || (passing, Some(passing)))
    }

    fn is(r: &Route<Option<usize>>) -> String {
        match r {
            Route::Idle(score) => format!("idle {score}"),
            Route::NotIdle => "not idle".into(),
            Route::RecoveryFirst => "recovery first".into(),
            Route::TooFewFits(j) => format!("too few {j:?}"),
            Route::Share(j) => format!("share {j:?}"),
        }
    }

    #[test]
    fn exclusive_first_then_sharing_then_packs_idle_fallback() {
        let ff = Demand::new(2, Reservation::Mib(8_000), Policy::Ff);
        // Enough idle GPUs: taken alone, the sharing rules not judged.
        assert_eq!(is(&route(&ff, 2, 0)), "idle 10");
        assert_eq!(is(&route(&ff, 1, 4)), "share Some(4)");
        assert_eq!(is(&route(&ff, 1, 1)), "too few Some(1)");
        // Must not share, or may take idle GPUs only: refused without judging.
        let mut alone = ff.clone();
        alone.exclusive = true;
        assert_eq!(is(&route(&alone, 1, 4)), "not idle");
        let mut recovery_first = ff.clone();
        recovery_first.idle_only = true;
        assert_eq!(is(&route(&recovery_first, 1, 4)), "recovery first");
        // `pack` shares first and falls back on idle GPUs when too few pass.
        let pack = Demand::new(2, Reservation::Mib(8_000), Policy::Pack);
        assert_eq!(is(&route(&pack, 4, 2)), "share Some(2)");
        assert_eq!(
            is(&route(&pack, 4, 1)),
            format!("idle {}", pack::IDLE_SCORE)
        );
        assert_eq!(is(&route(&pack, 1, 1)), "too few Some(1)");
        // A reservation that fills a GPU does not pack: exclusive first.
        let full = Demand::new(2, Reservation::Mib(40_960), Policy::Pack);
        assert_eq!(is(&route(&full, 2, 0)), "idle 10");
    }
    #[test]
    fn demand_keys_tell_apart_what_placement_reads() {
        let cfg = PlacementConfig::default();
        let mut ff = Demand::new(1, Reservation::Mib(8_000), Policy::Ff);
        ff.expected_sm_activity = Some(0.3);
        let key = DemandKey::of(&ff, &cfg);
        // How long a demand waited matters to `pack` alone, and only once it has aged.
        let mut waited = ff.clone();
        waited.waited_ms = cfg.pack_aging_ms;
        assert_eq!(DemandKey::of(&waited, &cfg), key);
        let mut pack = ff.clone();
        pack.policy = Policy::Pack;
        let mut aged = pack.clone();
        aged.waited_ms = cfg.pack_aging_ms;
        assert_ne!(DemandKey::of(&aged, &cfg), DemandKey::of(&pack, &cfg));
        // Every placement books the expected activity; a verdict outside `pack` does not read it.
        let mut busier = ff.clone();
        busier.expected_sm_activity = Some(0.9);
        assert_ne!(DemandKey::of(&busier, &cfg), key);
        assert_eq!(
            DemandKey::of(&busier, &cfg).verdict_only(),
            key.verdict_only()
        );
        let mut busier_pack = pack.clone();
        busier_pack.expected_sm_activity = Some(0.9);
        assert_ne!(
            DemandKey::of(&busier_pack, &cfg).verdict_only(),
            DemandKey::of(&pack, &cfg).verdict_only()
        );
        // Recovery first changes the answer.
        let mut idle_only = ff.clone();
        idle_only.idle_only = true;
        assert_ne!(DemandKey::of(&idle_only, &cfg), key);
    }
}
