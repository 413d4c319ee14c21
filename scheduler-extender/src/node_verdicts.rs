//! Per-node verdicts of filter and prioritize, computed by `carma-core` and
//! reused while nothing they depend on has changed.
//!
//! A verdict (passes with a score, or the rejection with its reason) is a pure
//! function of the pod's [`Demand`], the node's GPUs and telemetry, the ledger
//! records on those GPUs, the placement thresholds and — through the warm-up
//! lock only — the clock. [`crate::cluster`] gives a node a new generation on
//! every change of the first ones, so a verdict is reused only for the same
//! demand and generation, and only until the earliest warm-up lock on the node
//! could lift (or for at most a second while one is running, so that the
//! seconds left in the reason stay right) and the node's telemetry could turn stale.
//!
//! GPUMemNet reservations are class upper edges, so pods share few distinct
//! demands, and consecutive filter and prioritize calls of a busy scheduler
//! find most verdicts already made: only nodes whose telemetry or bookings
//! changed are judged again. Bind always judges afresh under the write lock.
//!
//! A demand not seen before must be judged on every node (that took 16–25 ms at
//! 5,000 nodes × 8 GPUs when every node went through `place_on_node`'s ledger
//! lookups and allocations). Each node keeps its GPUs' `carma_core::placement::GpuSummary`s,
//! refreshed on every change of the node or of the ledger records on its GPUs, so a node
//! is judged by core's allocation-free `quick_score` — the same rules, order and score
//! as `place_on_node`, on the same summaries — and only a node that cannot take the pod
//! goes through `place_on_node`, for its reason. Bind always places afresh.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use carma_core::placement::{DemandKey, VerdictExpiry, expiry_of, quick_score, verdict_expiry};
use carma_core::{Demand, Millis, NodeRejection, PlacementConfig};
use parking_lot::Mutex;

use crate::cluster::{Inner, NodeEntry};

/// Distinct demands whose verdicts are kept; beyond this all are dropped.
const DEMANDS_KEPT: usize = 64;
/// Fewer misses than this are judged on the calling thread.
const PARALLEL_MIN: usize = 1_024;
/// Misses taken at a time by each thread judging in parallel.
const CHUNK: usize = 64;
/// While a warm-up lock runs on a node, its verdict is reused for at most this long.
const WARMUP_REFRESH_MS: u64 = 1_000;

/// One node's verdict for one demand.
#[derive(Debug, Clone, PartialEq)]
pub enum Verdict {
    /// The node can take the pod; its prioritize score (0..10).
    Pass {
        /// Score.
        score: u8,
    },
    /// The node cannot take the pod.
    Fail {
        /// `NodeRejection::code()`.
        code: &'static str,
        /// Preemption cannot help (no or too few GPUs).
        unresolvable: bool,
        /// `NodeRejection::lifts_unseen`: only telemetry or the clock can lift it.
        lifts_unseen: bool,
        /// `NodeRejection`'s message.
        reason: Arc<str>,
    },
}

impl Verdict {
    fn from_result(r: Result<carma_core::NodePlacement, NodeRejection>) -> Self {
        match r {
            Ok(p) => Verdict::Pass { score: p.score },
            Err(r) => Verdict::Fail {
                code: r.code(),
                lifts_unseen: r.lifts_unseen(),
                unresolvable: matches!(
                    r,
                    NodeRejection::NoGpus { .. } | NodeRejection::TooFewGpus { .. }
                ),
                reason: Arc::from(r.to_string()),
            },
        }
    }

    /// The prioritize score: 0 for a node that cannot take the pod.
    pub fn score(&self) -> u8 {
        match self {
            Verdict::Pass { score } => *score,
            Verdict::Fail { .. } => 0,
        }
    }
}

#[derive(Debug, Clone)]
struct Cached {
    generation: u64,
    valid_until: Millis,
    verdict: Verdict,
}

type Slots = Vec<Option<Cached>>;

/// The verdict cache: per demand, per node slot.
#[derive(Debug, Default)]
pub struct Verdicts {
    demands: Mutex<HashMap<DemandKey, Arc<Mutex<Slots>>>>,
}

impl Verdicts {
    /// An empty cache.
    pub fn new() -> Self {
        Self::default()
    }

    /// Forget every verdict (they are recomputed on demand).
    pub fn clear(&self) {
        self.demands.lock().clear();
    }

    fn slots_for(&self, demand: &Demand, cfg: &PlacementConfig) -> Arc<Mutex<Slots>> {
        // Only the verdict is kept, not the placement: its booking does not matter.
        let key = DemandKey::of(demand, cfg).verdict_only();
        let mut demands = self.demands.lock();
        if demands.len() >= DEMANDS_KEPT && !demands.contains_key(&key) {
            demands.clear();
        }
        Arc::clone(demands.entry(key).or_default())
    }

    /// The verdict of every node in `names` for `demand` at `now`, in order.
    pub fn judge(
        &self,
        state: &Inner,
        names: &[&str],
        demand: &Demand,
        cfg: &PlacementConfig,
        now: Millis,
    ) -> Vec<Verdict> {
        let slots = self.slots_for(demand, cfg);
        let mut slots = slots.lock();
        if slots.len() < state.slot_count() {
            slots.resize(state.slot_count(), None);
        }
        let mut out: Vec<Option<Verdict>> = Vec::with_capacity(names.len());
        let mut misses: Vec<(usize, &NodeEntry)> = Vec::new();
        for (i, name) in names.iter().enumerate() {
            match state.node_entry(name).filter(|e| e.usable()) {
                None => out.push(Some(Verdict::from_result(Err(NodeRejection::NoGpus {
                    node: name.to_string(),
                })))),
                Some(e) => match &slots[e.slot] {
                    Some(c) if c.generation == e.generation && now < c.valid_until => {
                        out.push(Some(c.verdict.clone()));
                    }
                    _ => {
                        out.push(None);
                        misses.push((i, e));
                    }
                },
            }
        }
        for (i, e, cached) in judge_all(state, &misses, demand, cfg, now) {
            out[i] = Some(cached.verdict.clone());
            slots[e.slot] = Some(cached);
        }
        // Every miss was judged above, so every entry is set.
        out.into_iter().flatten().collect()
    }
}

/// Judge one node; `summarized`: its summary was computed under `cfg`.
fn judge_one(
    state: &Inner,
    e: &NodeEntry,
    demand: &Demand,
    cfg: &PlacementConfig,
    now: Millis,
    summarized: bool,
) -> Cached {
    // A node that can take the pod is judged from its summaries alone; a rejection, with its
    // reason, by `place_on_node`.
    let quick = summarized && e.summary.len() == e.node.gpus.len();
    let verdict = quick
        .then(|| quick_score(&e.summary, demand, cfg, now, e.rr_cursor))
        .flatten()
        .map(|score| Verdict::Pass { score })
        .unwrap_or_else(|| Verdict::from_result(state.place_entry(e, demand, cfg, now)));
    // Time alone can change the verdict when a warm-up lock lifts (and, while one runs, the
    // seconds left in its reason) or fresh telemetry turns stale.
    let expiry = if quick {
        expiry_of(&e.summary, now)
    } else {
        verdict_expiry(&e.node, state.ledger(), cfg, now)
    };
    let lock_refresh = expiry
        .lock_lifts_at
        .map(|t| t.min(now.saturating_add(WARMUP_REFRESH_MS)));
    Cached {
        generation: e.generation,
        valid_until: VerdictExpiry {
            lock_lifts_at: lock_refresh,
            ..expiry
        }
        .earliest()
        .unwrap_or(Millis::MAX),
        verdict,
    }
}

/// Read every GPU summary of `part` once, all loads independent of each other, so that the
/// memory system fetches them together rather than one cache miss after another while judging
/// (5,000 nodes' summaries do not stay in a busy machine's caches).
fn touch(part: &[(usize, &NodeEntry)]) {
    let mut sum = 0u32;
    for (_, e) in part {
        for s in &e.summary {
            sum = sum.wrapping_add(s.pods);
        }
    }
    std::hint::black_box(sum);
}

/// Judge the misses, on several threads when there are many: the threads take chunks of
/// [`CHUNK`] misses from a shared counter, so a helper thread that the OS schedules late (a busy
/// machine) holds the caller up for at most the chunk it took.
fn judge_all<'a>(
    state: &Inner,
    misses: &[(usize, &'a NodeEntry)],
    demand: &Demand,
    cfg: &PlacementConfig,
    now: Millis,
) -> Vec<(usize, &'a NodeEntry, Cached)> {
    let summarized = state.summary_config() == Some(cfg);
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get());
    if misses.len() < PARALLEL_MIN || threads < 2 {
        let mut out = Vec::with_capacity(misses.len());
        for part in misses.chunks(CHUNK) {
            touch(part);
            out.extend(
                part.iter()
                    .map(|(i, e)| (*i, *e, judge_one(state, e, demand, cfg, now, summarized))),
            );
        }
        return out;
    }
    let helpers = (threads - 1).min(misses.len().div_ceil(CHUNK) - 1);
    let next = AtomicUsize::new(0);
    let work = || {
        let mut out = Vec::new();
        loop {
            let start = next.fetch_add(CHUNK, Ordering::Relaxed);
            if start >= misses.len() {
                return out;
            }
            let end = (start + CHUNK).min(misses.len());
            touch(&misses[start..end]);
            out.extend(
                misses[start..end]
                    .iter()
                    .map(|(i, e)| (*i, *e, judge_one(state, e, demand, cfg, now, summarized))),
            );
        }
    };
    std::thread::scope(|s| {
        let handles: Vec<_> = (0..helpers).map(|_| s.spawn(work)).collect();
        let mut out = work();
        for h in handles {
            match h.join() {
                Ok(v) => out.extend(v),
                // Only a bug in carma-core can panic here: pass it on.
                Err(panic) => std::panic::resume_unwind(panic),
            }
        }
        out
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cluster::ClusterState;
    use crate::synthetic;
    use carma_core::{Policy, Reservation};

    fn demands() -> Vec<Demand> {
        vec![
            Demand::new(1, Reservation::Mib(2000), Policy::Magm),
            Demand::new(1, Reservation::Mib(16000), Policy::Bf),
            Demand::new(2, Reservation::Mib(8000), Policy::Lug),
            Demand::new(1, Reservation::Mib(4000), Policy::Rr),
            Demand::new(1, Reservation::WholeGpu, Policy::Ff),
        ]
    }

    /// The verdict with the warm-up lock's seconds left blanked: a reused verdict
    /// may show them up to a second old (by design).
    fn normalized(v: &Verdict) -> Verdict {
        match v {
            Verdict::Fail {
                code,
                unresolvable,
                lifts_unseen,
                reason,
            } => {
                let mut out = String::new();
                for (i, part) in reason.split(" s left)").enumerate() {
                    if i > 0 {
                        out.push_str(" s left)");
                    }
                    let cut = part.rfind('(').filter(|_| reason.contains(" s left)"));
                    match cut {
                        Some(c) if part[c + 1..].chars().all(|ch| ch.is_ascii_digit()) => {
                            out.push_str(&part[..=c]);
                        }
                        _ => out.push_str(part),
                    }
                }
                Verdict::Fail {
                    code,
                    unresolvable: *unresolvable,
                    lifts_unseen: *lifts_unseen,
                    reason: Arc::from(out),
                }
            }
            pass => pass.clone(),
        }
    }

    /// A tiny deterministic generator (no dependency needed).
    struct Lcg(u64);
    impl Lcg {
        fn next(&mut self, n: usize) -> usize {
            self.0 = self
                .0
                .wrapping_mul(6_364_136_223_846_793_005)
                .wrapping_add(1_442_695_040_888_963_407);
            ((self.0 >> 33) as usize) % n
        }
    }

    #[test]
    fn cached_verdicts_equal_fresh_ones_under_churn() {
        let cfg = PlacementConfig::default();
        let snap = synthetic::cluster(12, 4);
        let cluster = ClusterState::new();
        cluster.use_placement_config(&cfg);
        snap.apply(&cluster);
        let names: Vec<String> = (0..13).map(synthetic::node_name).collect();
        let names: Vec<&str> = names.iter().map(String::as_str).collect();
        let cache = Verdicts::new();
        let mut rng = Lcg(7);
        let mut now: Millis = 1_000_000;
        let mut placed: Vec<String> = Vec::new();
        for step in 0..400 {
            match rng.next(6) {
                0 => {
                    // New telemetry for a node.
                    let i = rng.next(12);
                    let mut g = snap.gpu_nodes[i].clone();
                    for gpu in &mut g.status.as_mut().unwrap().gpus {
                        gpu.memory_free_mib = 2_000 + rng.next(38_000) as u64;
                        gpu.sm_activity = Some(rng.next(100) as f64 / 100.0);
                        gpu.processes = rng.next(2) as u32;
                    }
                    cluster.apply_gpu_node(&g);
                }
                1 | 2 => {
                    // A bind.
                    let d = &demands()[rng.next(5)];
                    let node = names[rng.next(12)];
                    let uid = format!("pod-{step}");
                    let mut w = cluster.write();
                    if let Ok(p) = w.place(node, d, &cfg, now)
                        && w.book(&uid, &p, &cfg, now).is_ok()
                    {
                        placed.push(uid);
                    }
                }
                3 => {
                    // A pod ends.
                    if !placed.is_empty() {
                        let uid = placed.swap_remove(rng.next(placed.len()));
                        cluster.release_pod(&uid);
                    }
                }
                4 => {
                    // A node comes and goes.
                    let i = rng.next(12);
                    if rng.next(2) == 0 {
                        cluster.delete_gpu_node(names[i]);
                    } else {
                        cluster.apply_gpu_node(&snap.gpu_nodes[i]);
                    }
                }
                _ => now += rng.next(20_000) as u64,
            }
            let state = cluster.read();
            for d in &demands() {
                let cached = cache.judge(&state, &names, d, &cfg, now);
                let fresh = Verdicts::new().judge(&state, &names, d, &cfg, now);
                assert_eq!(
                    cached.iter().map(normalized).collect::<Vec<_>>(),
                    fresh.iter().map(normalized).collect::<Vec<_>>(),
                    "step {step}, demand {d:?}"
                );
            }
        }
    }

    /// Nodes of 0 to 10 GPUs with random telemetry: memory, activity (some scores missing),
    /// health, processes, replicas, gate rules, and telemetry that ages or not.
    fn random_gpu_node(rng: &mut Lcg, i: usize) -> carma_api::GpuNode {
        let count = [0, 1, 2, 4, 8, 8, 10][rng.next(7)];
        let gpus = (0..count)
            .map(|j| {
                let total = [16_384, 40_960, 81_920][rng.next(3)];
                // Indices out of order now and then (placement visits them by index).
                let index = if rng.next(8) == 0 { count - 1 - j } else { j };
                let mut g = synthetic::gpu(
                    &synthetic::gpu_uuid(i, j),
                    index as u32,
                    rng.next(total as usize + 1) as u64,
                    rng.next(101) as f64 / 100.0,
                    rng.next(3).saturating_sub(1) as u32,
                );
                g.memory_total_mib = total;
                g.healthy = rng.next(10) != 0;
                g.sm_occupancy = (rng.next(6) != 0).then(|| rng.next(101) as f64 / 100.0);
                g.dram_activity = (rng.next(6) != 0).then(|| rng.next(101) as f64 / 100.0);
                if rng.next(8) == 0 {
                    g.sm_activity = None;
                }
                g.gate_rule = carma_core::GateRule::ALL[rng.next(5)].as_str().into();
                g
            })
            .collect();
        let mut g = synthetic::gpu_node(&synthetic::node_name(i), gpus);
        g.spec.replicas_per_gpu = [0, 1, 2, 8][rng.next(4)];
        g.status.as_mut().unwrap().updated_at = Some(format!("t{}", rng.next(1_000_000)));
        g
    }

    fn random_demand(rng: &mut Lcg) -> Demand {
        let reservation = match rng.next(6) {
            0 => Reservation::WholeGpu,
            1 => Reservation::Unknown,
            2 => Reservation::Mib([16_384, 40_960, 81_920][rng.next(3)]),
            _ => Reservation::Mib(500 + rng.next(30_000) as u64),
        };
        Demand {
            gpus: rng.next(4) as u32,
            reservation,
            policy: Policy::ALL[rng.next(Policy::ALL.len())],
            exclusive: rng.next(8) == 0,
            idle_only: rng.next(8) == 0,
            expected_sm_activity: match rng.next(4) {
                0 => None,
                _ => Some(rng.next(1001) as f64 / 1000.0),
            },
            waited_ms: [0, PlacementConfig::default().pack_aging_ms][rng.next(2)],
        }
    }

    #[test]
    fn summary_verdicts_equal_place_on_node() {
        // The verdict of every node, from its summaries or not, is place_on_node's, on random
        // clusters under random binds, releases, confirmations and telemetry, at random times; and
        // with fresh summaries core's quick_score gives every passing node's score.
        let mut rng = Lcg(13);
        let mut answered = 0;
        let mut passed = 0;
        for round in 0..12 {
            let cfg = PlacementConfig {
                honor_reservations: rng.next(4) != 0,
                max_telemetry_age_ms: [None, Some(60_000)][rng.next(2)],
                warmup_ms: [0, 30_000][rng.next(2)],
                ..PlacementConfig::default()
            };
            let cluster = ClusterState::new();
            // Summaries under these thresholds (most rounds), under others, or none: the shortcut
            // is used only in the first case.
            match rng.next(8) {
                0 => {}
                1 => cluster.use_placement_config(&PlacementConfig::default()),
                _ => cluster.use_placement_config(&cfg),
            }
            let summarized = cluster.read().summary_config() == Some(&cfg);
            let nodes = 40;
            let names: Vec<String> = (0..nodes).map(synthetic::node_name).collect();
            let mut now: Millis = 10_000_000;
            for (i, name) in names.iter().enumerate() {
                cluster.apply_node(name);
                let seen = (rng.next(3) != 0).then(|| now - rng.next(120_000) as u64);
                cluster.apply_gpu_node_observed(&random_gpu_node(&mut rng, i), seen);
            }
            let mut placed: Vec<(String, usize)> = Vec::new();
            for step in 0..60 {
                match rng.next(5) {
                    0 | 1 => {
                        let d = random_demand(&mut rng);
                        let node = rng.next(nodes);
                        let uid = format!("pod-{round}-{step}");
                        let mut w = cluster.write();
                        if let Ok(p) = w.place(&names[node], &d, &cfg, now)
                            && w.book(&uid, &p, &cfg, now).is_ok()
                        {
                            placed.push((uid, node));
                        }
                    }
                    2 if !placed.is_empty() => {
                        let (uid, _) = placed.swap_remove(rng.next(placed.len()));
                        cluster.release_pod(&uid);
                    }
                    3 if !placed.is_empty() => {
                        // A pod's memory shows in its node's telemetry: it leaves the in-flight set.
                        let (uid, node) = placed[rng.next(placed.len())].clone();
                        let mut g = random_gpu_node(&mut rng, node);
                        if let Some(gpu) = g.status.as_mut().unwrap().gpus.first_mut() {
                            gpu.pods.push(carma_api::GpuPodStatus {
                                namespace: "ml".into(),
                                name: uid.clone(),
                                uid,
                                reserved_mib: 1_000,
                                observed_mib: Some(900),
                                peak_mib: None,
                            });
                        }
                        cluster.apply_gpu_node_observed(&g, Some(now));
                    }
                    _ => now += rng.next(40_000) as u64,
                }
                let state = cluster.read();
                assert!(state.summaries_are_fresh(), "round {round}, step {step}");
                let names: Vec<&str> = names.iter().map(String::as_str).collect();
                for _ in 0..6 {
                    let d = random_demand(&mut rng);
                    let judged = Verdicts::new().judge(&state, &names, &d, &cfg, now);
                    for (name, v) in names.iter().zip(&judged) {
                        let reference = Verdict::from_result(state.place(name, &d, &cfg, now));
                        assert_eq!(v, &reference, "round {round}, step {step}, {name}, {d:?}");
                        if summarized {
                            let e = state.node_entry(name).unwrap();
                            let quick = quick_score(&e.summary, &d, &cfg, now, e.rr_cursor);
                            if let Verdict::Pass { score } = reference {
                                passed += 1;
                                answered += usize::from(quick == Some(score));
                            } else {
                                assert_eq!(quick, None, "round {round}, step {step}, {name}");
                            }
                        }
                    }
                }
            }
        }
        assert!(passed > 5_000, "{passed}");
        assert_eq!(answered, passed);
    }

    #[test]
    fn summaries_answer_the_benchmark_cluster() {
        // The loaded cluster of the latency example: every passing node is judged from summaries.
        let cfg = PlacementConfig::default();
        let snap = synthetic::loaded_cluster(50, 8);
        let cluster = ClusterState::new();
        snap.apply(&cluster);
        cluster.use_placement_config(&cfg);
        let state = cluster.read();
        let now: Millis = 5_000_000;
        for d in demands() {
            for i in 0..50 {
                let name = synthetic::node_name(i);
                let reference = Verdict::from_result(state.place(&name, &d, &cfg, now));
                let e = state.node_entry(&name).unwrap();
                let quick = quick_score(&e.summary, &d, &cfg, now, e.rr_cursor);
                assert_eq!(
                    quick.map(|score| Verdict::Pass { score }),
                    Some(reference).filter(|r| matches!(r, Verdict::Pass { .. })),
                    "{name} {d:?}"
                );
            }
        }
    }

    #[test]
    fn round_robin_bind_books_what_filter_passed() {
        // rr has no memory test, so filter passed a GPU whose bookings already exceeded its memory
        // and bind then refused it (OverCommit): the pod was retried for ever. Both follow core's
        // NodePlacement::capacity_checked now.
        let cfg = PlacementConfig {
            warmup_ms: 0,
            ..PlacementConfig::default()
        };
        let snap = synthetic::cluster(1, 1);
        let cluster = ClusterState::new();
        snap.apply(&cluster);
        let node = synthetic::node_name(0);
        let total = snap.gpu_nodes[0].status.as_ref().unwrap().gpus[0].memory_total_mib;
        let big = Demand::new(1, Reservation::Mib(total - 1000), Policy::Rr);
        let t0: Millis = 5_000_000;
        for (i, uid) in ["a", "b"].iter().enumerate() {
            let now = t0 + i as u64;
            let passed = Verdicts::new().judge(&cluster.read(), &[node.as_str()], &big, &cfg, now);
            assert!(
                matches!(passed[0], Verdict::Pass { .. }),
                "{uid}: {passed:?}"
            );
            let mut w = cluster.write();
            let p = w.place(&node, &big, &cfg, now).unwrap();
            assert!(!p.capacity_checked);
            w.book(uid, &p, &cfg, now)
                .unwrap_or_else(|e| panic!("{uid}: {e}"));
        }
    }

    #[test]
    fn a_lifting_warm_up_lock_is_noticed() {
        let cfg = PlacementConfig::default();
        let mut snap = synthetic::cluster(1, 1);
        snap.gpu_nodes[0].status.as_mut().unwrap().gpus[0].memory_free_mib = 40_000;
        let cluster = ClusterState::new();
        snap.apply(&cluster);
        let node = synthetic::node_name(0);
        let d = Demand::new(1, Reservation::Mib(2000), Policy::Magm);
        let t0: Millis = 5_000_000;
        {
            let mut w = cluster.write();
            let p = w.place(&node, &d, &cfg, t0).unwrap();
            w.book("first", &p, &cfg, t0).unwrap();
        }
        let cache = Verdicts::new();
        let judge = |now| cache.judge(&cluster.read(), &[node.as_str()], &d, &cfg, now);
        let locked = judge(t0 + 1);
        assert!(
            matches!(
                &locked[0],
                Verdict::Fail {
                    code: "warm-up-lock",
                    ..
                }
            ),
            "{locked:?}"
        );
        // Within the second the verdict is reused; after it the seconds left are updated.
        assert_eq!(judge(t0 + 500), locked);
        assert_ne!(judge(t0 + 2_500), locked);
        assert!(matches!(judge(t0 + 30_001)[0], Verdict::Pass { .. }));
    }

    #[test]
    fn telemetry_that_stops_arriving_turns_stale_and_fresh_again() {
        // GpuNode.status.updatedAt was never read: a node whose device plugin died was trusted
        // for ever. Now its GPUs take no new shared pods once no publication was seen for
        // max_telemetry_age_ms, and the cached verdict notices without any change to the node.
        let cfg = PlacementConfig {
            max_telemetry_age_ms: Some(60_000),
            warmup_ms: 0,
            ..PlacementConfig::default()
        };
        let snap = synthetic::cluster(1, 1);
        let cluster = ClusterState::new();
        snap.apply(&cluster);
        cluster.use_placement_config(&cfg);
        let t0: Millis = 5_000_000;
        let mut first = snap.gpu_nodes[0].clone();
        first.status.as_mut().unwrap().updated_at = Some("2026-01-01T00:00:01Z".into());
        cluster.apply_gpu_node_observed(&first, Some(t0));
        let node = synthetic::node_name(0);
        let d = Demand::new(1, Reservation::Mib(2000), Policy::Magm);
        {
            let mut w = cluster.write();
            let p = w.place(&node, &d, &cfg, t0).unwrap();
            w.book("first", &p, &cfg, t0).unwrap();
        }
        let cache = Verdicts::new();
        let judge = |now| cache.judge(&cluster.read(), &[node.as_str()], &d, &cfg, now);
        assert!(matches!(judge(t0 + 60_000)[0], Verdict::Pass { .. }));
        let stale = judge(t0 + 60_001);
        match &stale[0] {
            Verdict::Fail { code, reason, .. } => {
                assert_eq!(*code, "telemetry-stale");
                assert!(reason.contains("device plugin"), "{reason}");
            }
            other => panic!("{other:?}"),
        }
        // A re-list of the same publication does not make it fresh; a new publication does.
        cluster.apply_gpu_node_observed(&first, Some(t0 + 70_000));
        assert_eq!(judge(t0 + 70_001), stale);
        let mut next = snap.gpu_nodes[0].clone();
        next.status.as_mut().unwrap().updated_at = Some("2026-01-01T00:01:10Z".into());
        cluster.apply_gpu_node_observed(&next, Some(t0 + 70_000));
        assert!(matches!(judge(t0 + 70_001)[0], Verdict::Pass { .. }));
    }

    #[test]
    fn a_node_that_only_heartbeats_stays_fresh_and_turns_stale_after_two_missed() {
        // At rest a device plugin writes its GpuNode once per heartbeat (5 min, shortened by up
        // to a tenth), no longer every 30 s: with the default limit such a node stays fresh
        // between heartbeats, and turns stale only once two heartbeats' time passed without one.
        let cfg = PlacementConfig {
            warmup_ms: 0,
            ..PlacementConfig::default()
        };
        assert_eq!(cfg.max_telemetry_age_ms, Some(600_000));
        let heartbeat: Millis = 300_000;
        let snap = synthetic::cluster(1, 1);
        let cluster = ClusterState::new();
        snap.apply(&cluster);
        cluster.use_placement_config(&cfg);
        let node = synthetic::node_name(0);
        let d = Demand::new(1, Reservation::Mib(2000), Policy::Magm);
        let t0: Millis = 5_000_000;
        let publish = |n: u64, at: Millis| {
            let mut g = snap.gpu_nodes[0].clone();
            g.status.as_mut().unwrap().updated_at = Some(format!("2026-01-01T00:{n:02}:00Z"));
            cluster.apply_gpu_node_observed(&g, Some(at));
        };
        publish(0, t0);
        {
            let mut w = cluster.write();
            let p = w.place(&node, &d, &cfg, t0).unwrap();
            w.book("first", &p, &cfg, t0).unwrap();
        }
        let cache = Verdicts::new();
        let judge = |now| cache.judge(&cluster.read(), &[node.as_str()], &d, &cfg, now);
        let code = |v: &[Verdict]| match &v[0] {
            Verdict::Pass { .. } => "pass",
            Verdict::Fail { code, .. } => code,
        };
        // Heartbeats at 5 min: fresh throughout, also just before each one arrives.
        for n in 1..=4 {
            let at = t0 + n * heartbeat;
            assert_eq!(code(&judge(at - 1)), "pass", "before heartbeat {n}");
            publish(n, at);
            assert_eq!(code(&judge(at + 1)), "pass", "after heartbeat {n}");
        }
        // Then they stop: fresh through the next missed heartbeat, stale after the second.
        let last = t0 + 4 * heartbeat;
        assert_eq!(code(&judge(last + 2 * heartbeat)), "pass");
        assert_eq!(code(&judge(last + 2 * heartbeat + 1)), "telemetry-stale");
    }
}
