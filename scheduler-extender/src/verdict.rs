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

use std::collections::HashMap;
use std::sync::Arc;

use carma_core::{Demand, Millis, NodeRejection, PlacementConfig, Policy, Reservation};
use parking_lot::Mutex;

use crate::cluster::{Inner, NodeEntry};

/// Distinct demands whose verdicts are kept; beyond this all are dropped.
const DEMANDS_KEPT: usize = 64;
/// Fewer misses than this are judged on the calling thread.
const PARALLEL_MIN: usize = 512;
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

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
struct DemandKey {
    gpus: u32,
    reservation: (u8, u64),
    policy: Policy,
    exclusive: bool,
    idle_only: bool,
}

impl From<&Demand> for DemandKey {
    fn from(d: &Demand) -> Self {
        Self {
            gpus: d.gpus,
            reservation: match d.reservation {
                Reservation::Mib(m) => (0, m),
                Reservation::WholeGpu => (1, 0),
                Reservation::Unknown => (2, 0),
            },
            policy: d.policy,
            exclusive: d.exclusive,
            idle_only: d.idle_only,
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

    fn slots_for(&self, demand: &Demand) -> Arc<Mutex<Slots>> {
        let mut demands = self.demands.lock();
        if demands.len() >= DEMANDS_KEPT && !demands.contains_key(&DemandKey::from(demand)) {
            demands.clear();
        }
        Arc::clone(demands.entry(DemandKey::from(demand)).or_default())
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
        let slots = self.slots_for(demand);
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

fn judge_one(
    state: &Inner,
    e: &NodeEntry,
    demand: &Demand,
    cfg: &PlacementConfig,
    now: Millis,
) -> Cached {
    let verdict = Verdict::from_result(state.place_entry(e, demand, cfg, now));
    let lock_left = e
        .node
        .gpus
        .iter()
        .filter(|g| state.ledger().pods_on(&g.uuid) > 0)
        .filter_map(|g| state.ledger().warmup_holder(&g.uuid, cfg.warmup_ms, now))
        .map(|(_, left)| left.min(WARMUP_REFRESH_MS))
        .min();
    // Telemetry that is fresh now turns stale without any change the generation sees.
    let stale_at = e
        .node
        .gpus
        .iter()
        .filter_map(|g| carma_core::gate::stale_at(g, cfg, now))
        .min();
    let lock_until = lock_left.map_or(Millis::MAX, |left| now.saturating_add(left));
    Cached {
        generation: e.generation,
        valid_until: lock_until.min(stale_at.unwrap_or(Millis::MAX)),
        verdict,
    }
}

/// Judge the misses, on several threads when there are many.
fn judge_all<'a>(
    state: &Inner,
    misses: &[(usize, &'a NodeEntry)],
    demand: &Demand,
    cfg: &PlacementConfig,
    now: Millis,
) -> Vec<(usize, &'a NodeEntry, Cached)> {
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get());
    if misses.len() < PARALLEL_MIN || threads < 2 {
        return misses
            .iter()
            .map(|(i, e)| (*i, *e, judge_one(state, e, demand, cfg, now)))
            .collect();
    }
    let parts = threads.min(misses.len() / (PARALLEL_MIN / 2)).max(1);
    let chunk = misses.len().div_ceil(parts);
    let judge_part = |part: &[(usize, &'a NodeEntry)]| {
        part.iter()
            .map(|(i, e)| (*i, *e, judge_one(state, e, demand, cfg, now)))
            .collect::<Vec<_>>()
    };
    std::thread::scope(|s| {
        let mut chunks = misses.chunks(chunk);
        let first = chunks.next().unwrap_or_default();
        let handles: Vec<_> = chunks
            .map(|part| s.spawn(move || judge_part(part)))
            .collect();
        let mut out = judge_part(first);
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
}
