//! Placing one task: `carma_core::place_on_node` on every node (each node's answer remembered
//! until the node changes or a warm-up lock lifts), the best node chosen, the placement booked
//! in the ledger as in flight, and the attempt started.

use carma_core::placement::hold::{Hold, hold_for, starving, without_held};
use carma_core::placement::{DemandKey, recovery_first, verdict_expiry};
use carma_core::{
    Demand, GpuRejection, Millis, NodePlacement, NodeRejection, Policy, Reservation, place_on_node,
};
use tracing::{debug, warn};

use super::{Engine, Event, Run, choose, earliest};

/// Outcomes remembered per node.
const MEMO_SLOTS: usize = 24;

/// What placing a demand on one node gives.
#[derive(Debug, Clone)]
enum Outcome {
    /// The node can take it (possibly to share).
    Accept(NodePlacement),
    /// It cannot; `wake` is when that may change without an event.
    Reject { wake: Option<Millis>, too_few: bool },
}

/// A node's answer to a demand: valid while the node's version is unchanged and
/// `now < until` (a warm-up lock may lift at `until`).
#[derive(Debug, Clone)]
pub(super) struct Memo {
    version: u64,
    key: DemandKey,
    until: Millis,
    outcome: Outcome,
}

/// What trying to place a task gave.
pub(super) enum TryPlace {
    /// It started.
    Placed,
    /// Not now; a pass at the given time may place it without an event.
    Blocked(Option<Millis>),
    /// Never: the reason it fails with.
    Impossible(String),
}

impl Engine<'_> {
    /// The reservation task `id` asks for now: a first attempt's may come from learned peaks.
    fn reservation(&self, id: usize) -> Reservation {
        let s = &self.state[id];
        match &self.learn {
            Some(book) if s.attempts == 0 => book.first_reservation(id, s.reservation),
            _ => s.reservation,
        }
    }

    /// What task `id` asks placement for now.
    pub(super) fn demand(&self, id: usize) -> Demand {
        let s = &self.state[id];
        Demand {
            gpus: self.tasks[id].gpus,
            reservation: self.reservation(id),
            policy: self.policy,
            exclusive: s.exclusive,
            idle_only: false,
            expected_sm_activity: self.expected_activity[id],
            waited_ms: self.now.saturating_sub(s.ready_at),
        }
    }

    /// Something `place_on_node` reads about node `n` changed.
    pub(super) fn touch(&mut self, n: usize) {
        self.node_version[n] += 1;
    }

    /// Place task `id` on the best node that takes it (only idle GPUs unless `share`).
    pub(super) fn try_place(&mut self, id: usize, share: bool) -> TryPlace {
        let demand = recovery_first(self.demand(id), !share, false);
        let key = DemandKey::of(&demand, &self.pcfg);
        let mut best: Option<(usize, NodePlacement)> = None;
        let mut wake: Option<Millis> = None;
        let mut too_few = 0;
        let hold = self.hold_against(id);
        for n in 0..self.nodes.len() {
            let outcome = match &hold {
                Some(h) if h.node == n => self.outcome_held(n, &demand, h),
                _ => self.outcome_on(n, key, &demand),
            };
            match outcome {
                Outcome::Accept(p) => {
                    if choose::better(&p, best.as_ref().map(|(_, b)| b)) {
                        let top = p.score >= 10;
                        best = Some((n, p));
                        if top {
                            break;
                        }
                    }
                }
                Outcome::Reject {
                    wake: w,
                    too_few: f,
                } => {
                    wake = earliest(wake, w);
                    too_few += usize::from(f);
                }
            }
        }
        match best {
            Some((n, p)) => self.start(id, n, p),
            None if too_few == self.nodes.len() => TryPlace::Impossible(format!(
                "needs {} GPUs on one node; nodes have {}",
                demand.gpus, self.cfg.cluster.gpus_per_node
            )),
            None => {
                // `pack`: a task that has not aged yet may crowd once it has; try again then.
                let ages_at = (demand.policy == Policy::Pack
                    && !carma_core::placement::pack::aged(&demand, &self.pcfg))
                .then(|| {
                    self.state[id]
                        .ready_at
                        .saturating_add(self.pcfg.pack_aging_ms)
                });
                TryPlace::Blocked(earliest(wake, ages_at))
            }
        }
    }

    /// The GPUs kept from task `id` (`--pack-hold-for-multi-gpu`): those of the multi-GPU task
    /// that has waited longest, once it has waited the configured time, when `id` is queued
    /// behind it (the recovery queue first, then the main queue) — the hold stops tasks passing
    /// it, never one ahead of it.
    fn hold_against(&self, id: usize) -> Option<Hold> {
        let after = self.hold_after_ms?;
        let queued = || self.recovery_q.iter().chain(self.main_q.iter()).copied();
        let waiting = queued().map(|t| {
            let waited = self.now.saturating_sub(self.state[t].ready_at);
            (self.tasks[t].gpus, waited)
        });
        let holder = queued().nth(starving(waiting, after)?)?;
        // Behind: the holder comes first in the queues (and is not `id`).
        if holder == id || queued().find(|&t| t == holder || t == id) != Some(holder) {
            return None;
        }
        hold_for(&self.nodes, &self.ledger, self.tasks[holder].gpus)
    }

    /// `place_on_node` for node `n` without the GPUs `hold` keeps (not remembered: the hold
    /// changes with the queue). Too few GPUs left is not final: the hold ends.
    fn outcome_held(&self, n: usize, demand: &Demand, hold: &Hold) -> Outcome {
        let view = without_held(&self.nodes[n], hold);
        match place_on_node(
            &view,
            &self.ledger,
            demand,
            &self.pcfg,
            self.now,
            self.rr_cursor[n],
        ) {
            Ok(p) => Outcome::Accept(p),
            Err(rejection) => Outcome::Reject {
                wake: self.wake_for(&rejection),
                too_few: false,
            },
        }
    }

    /// `place_on_node` for node `n`, remembered: it is a pure function of the
    /// node, its ledger records, the demand and (through warm-up locks) the time,
    /// so its answer stands until the node's version changes or a lock lifts.
    fn outcome_on(&mut self, n: usize, key: DemandKey, demand: &Demand) -> Outcome {
        let version = self.node_version[n];
        let now = self.now;
        if !self.cfg.memoize {
            self.memo[n].clear();
        }
        if let Some(m) = self.memo[n]
            .iter()
            .find(|m| m.version == version && m.key == key && now < m.until)
        {
            let cached = m.outcome.clone();
            return cached;
        }
        let (outcome, until) = match place_on_node(
            &self.nodes[n],
            &self.ledger,
            demand,
            &self.pcfg,
            now,
            self.rr_cursor[n],
        ) {
            Ok(p) => (Outcome::Accept(p), self.next_lock_lift(n)),
            Err(rejection) => {
                let w = self.wake_for(&rejection);
                let few = matches!(rejection, NodeRejection::TooFewGpus { .. });
                (
                    Outcome::Reject {
                        wake: w,
                        too_few: few,
                    },
                    w,
                )
            }
        };
        let slots = &mut self.memo[n];
        slots.retain(|m| m.version == version && m.key != key);
        if slots.len() >= MEMO_SLOTS {
            slots.remove(0);
        }
        slots.push(Memo {
            version,
            key,
            until: until.unwrap_or(Millis::MAX),
            outcome: outcome.clone(),
        });
        outcome
    }

    /// The earliest moment a warm-up lock on node `n` lifts by time alone.
    fn next_lock_lift(&self, n: usize) -> Option<Millis> {
        verdict_expiry(&self.nodes[n], &self.ledger, &self.pcfg, self.now).earliest()
    }

    /// When a rejection may lift without an event: a warm-up lock expiring, or
    /// a gate decision on a GPU whose risk window is still moving.
    fn wake_for(&self, rejection: &NodeRejection) -> Option<Millis> {
        let NodeRejection::NotEnoughGpus { rejections, .. } = rejection else {
            return None;
        };
        let tel = &self.cfg.telemetry;
        let mut wake: Option<Millis> = None;
        for r in rejections {
            let at = match r {
                GpuRejection::WarmUpLock { remaining_s, .. } => Some(
                    self.now
                        .saturating_add((remaining_s * 1000.0).ceil() as Millis),
                ),
                GpuRejection::UtilizationGate { uuid, .. }
                | GpuRejection::ActivityCapExceeded { uuid, .. }
                | GpuRejection::TelemetryWarmingUp { uuid, .. } => self
                    .gpu_by_uuid
                    .get(uuid)
                    .filter(|g| self.gpus[**g].window_moving(self.now, tel))
                    .map(|_| self.now.saturating_add(tel.interval_ms)),
                _ => None,
            };
            wake = earliest(wake, at);
        }
        wake
    }

    /// Book placement `p` on node `n` in the ledger and start task `id`'s next attempt there.
    fn start(&mut self, id: usize, n: usize, p: NodePlacement) -> TryPlace {
        let attempt = self.state[id].attempts + 1;
        let pod = format!("{id}/{attempt}");
        let record = p.record(pod.clone(), self.now);
        let gpus = &self.gpus;
        let by_uuid = &self.gpu_by_uuid;
        // The ledger checks reservations against capacity only where placement
        // did (core's rule; round robin has no memory test, CARMA's RR relies on recovery).
        let check_capacity = p.capacity_checked;
        if let Err(e) = self.ledger.assume(
            record,
            |u| {
                by_uuid
                    .get(u)
                    .filter(|_| check_capacity)
                    .map(|g| gpus[*g].total_mib)
            },
            self.pcfg.warmup_ms,
            self.now,
        ) {
            warn!(task = id, error = %e, "ledger refused a placement that place_on_node accepted");
            return TryPlace::Blocked(None);
        }
        if self.start.is_none() {
            self.start = Some(self.now);
            for g in &mut self.gpus {
                g.open_accounts(self.now);
            }
        }
        let flat: Vec<usize> = p
            .indices
            .iter()
            .map(|i| self.node_first_gpu[n] + *i as usize)
            .collect();
        for &g in &flat {
            self.gpus[g].settle(self.now, &self.cfg.power);
            self.gpus[g].placed.push(id);
            self.record_point(g);
        }
        if let Some(next) = p.next_rr_cursor() {
            self.rr_cursor[n] = next;
        }
        self.touch(n);
        let reservation = self.reservation(id);
        if attempt == 1
            && reservation != self.state[id].reservation
            && let Some(book) = self.learn.as_mut()
        {
            book.learned_tasks += 1;
        }
        let task = &self.tasks[id];
        let s = &mut self.state[id];
        s.reservation = reservation;
        s.attempts = attempt;
        s.wait_ms += self.now - s.ready_at;
        s.first_start.get_or_insert(self.now);
        s.run = Some(Run {
            gpus: flat,
            pod,
            start: self.now,
            shown: false,
            work_left: task.exclusive_ms as f64,
            rate: 1.0,
            last: self.now,
            version: 0,
            reserved_mib: p.reserved_mib,
            exclusive: p.exclusive,
        });
        debug!(task = id, attempt, node = n, gpus = ?p.indices, reserved = p.reserved_mib, "start");
        let lag = self.cfg.telemetry.lag_ms;
        self.push(
            self.now.saturating_add(lag),
            Event::Show { task: id, attempt },
        );
        self.push(
            self.now.saturating_add(task.exclusive_ms),
            Event::Finish {
                task: id,
                attempt,
                version: 0,
            },
        );
        TryPlace::Placed
    }
}
