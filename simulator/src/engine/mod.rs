//! The discrete-event engine.
//!
//! Virtual time in milliseconds. Events: task arrival, a task's memory showing in
//! telemetry (where an over-committed GPU makes it crash out of memory), task
//! completion, and a crashed task becoming ready again after its back-off. The
//! scheduler runs on a 1 s grid like CARMA's loop, but only at ticks where
//! something it reads may have changed (an event, a warm-up lock expiring, a
//! risk window still moving on a GPU the gate rejected), so idle stretches cost
//! nothing.
//!
//! Each tick serves the recovery queue first, then the main queue, in the order of
//! `SimConfig::queue`: CARMA's strict head-of-line FIFO, or kube-scheduler's (a task
//! that does not fit is set aside for its back-off and the next ones are tried). While
//! the recovery queue holds a task,
//! main-queue tasks may only take idle GPUs (CARMA: collocation only when the
//! recovery queue is empty). Placement is `carma_core::place_on_node` on every
//! node, the highest node score winning (ties to the lowest node), booked with
//! `Ledger::assume` and confirmed when the task's memory shows; recovery is
//! `carma_core::decide_next`.
//!
//! A running task advances through its exclusive run time at the rate the
//! [`slowdown`](crate::model::slowdown) model gives for its GPUs; whenever the set
//! of active tasks on a GPU changes, the rates of the tasks there are updated and
//! their completion events rescheduled (stale events are skipped by version).

pub mod choose;
mod gpu;

use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap, VecDeque};

use carma_core::placement::{DemandKey, recovery_first, verdict_expiry};
use carma_core::{
    AttemptOutcome, AttemptRecord, Demand, Gpu, GpuRejection, Ledger, Millis, Node, NodePlacement,
    NodeRejection, PlacementConfig, Policy, RecoveryDecision, Reservation, decide_next,
    place_on_node,
};
use tracing::{debug, warn};

use crate::config::{QueueDiscipline, SimConfig};
use crate::error::SimError;
use crate::model::Activity;
use crate::result::{
    AttemptEnd, AttemptLog, GpuTimeline, RunResult, Summary, TaskOutcome, mean, percentile,
    worst_waits,
};
use crate::task::Task;
use gpu::SimGpu;

mod learn;

/// Replay `tasks` (in arrival order) under `policy`, with per-task initial
/// reservations `reservations`, labelled `estimator` in the summary.
pub fn simulate(
    tasks: &[Task],
    reservations: &[Reservation],
    estimator: &str,
    policy: Policy,
    cfg: &SimConfig,
) -> Result<RunResult, SimError> {
    cfg.validate()?;
    if tasks.len() != reservations.len() {
        return Err(SimError::Config(format!(
            "{} tasks but {} reservations",
            tasks.len(),
            reservations.len()
        )));
    }
    if tasks.windows(2).any(|w| w[0].arrival_ms > w[1].arrival_ms) {
        return Err(SimError::Config("tasks must be in arrival order".into()));
    }
    let mut engine = Engine::new(tasks, reservations, policy, cfg);
    engine.run();
    engine.within_horizon()?;
    Ok(engine.finish(estimator))
}

/// The latest simulated time the engine represents: 2^62 ms, about 146 million years. Valid input
/// stays far below it (one year per attempt, ten years of arrivals), except where the slowdown
/// model stretches collocated attempts a millionfold and many of them run one after another; the
/// engine then stops with an error instead of letting times saturate or wrap around.
pub const HORIZON_MS: Millis = 1 << 62;

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Event {
    Arrive(usize),
    Show {
        task: usize,
        attempt: u32,
    },
    Finish {
        task: usize,
        attempt: u32,
        version: u64,
    },
    Ready {
        task: usize,
        recovery: bool,
    },
}

#[derive(Debug, Clone)]
struct Run {
    gpus: Vec<usize>,
    pod: String,
    start: Millis,
    shown: bool,
    /// Exclusive-speed milliseconds of work left at `last`.
    work_left: f64,
    rate: f64,
    last: Millis,
    version: u64,
    reserved_mib: u64,
    exclusive: bool,
}

#[derive(Debug, Clone)]
struct TaskState {
    reservation: Reservation,
    exclusive: bool,
    history: Vec<AttemptRecord>,
    attempts: u32,
    ooms: u32,
    run: Option<Run>,
    ready_at: Millis,
    wait_ms: Millis,
    run_ms: Millis,
    first_start: Option<Millis>,
    end: Option<Millis>,
    finished: bool,
    failure: Option<String>,
    /// kube queue: failed scheduling passes of the current attempt, and when it may be tried again.
    unschedulable: u32,
    retry_at: Millis,
}

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
struct Memo {
    version: u64,
    key: DemandKey,
    until: Millis,
    outcome: Outcome,
}

enum TryPlace {
    Placed,
    Blocked(Option<Millis>),
    Impossible(String),
}

struct Engine<'a> {
    cfg: &'a SimConfig,
    pcfg: PlacementConfig,
    policy: Policy,
    tasks: &'a [Task],
    activity: Vec<Activity>,
    /// Each task's expected SM activity as carma would know it: the estimator's prior for its
    /// model class (not the activity the model assigns it), `None` without a profile.
    expected_activity: Vec<Option<f64>>,
    state: Vec<TaskState>,
    nodes: Vec<Node>,
    node_first_gpu: Vec<usize>,
    gpus: Vec<SimGpu>,
    gpu_by_uuid: HashMap<String, usize>,
    ledger: Ledger,
    rr_cursor: Vec<usize>,
    node_version: Vec<u64>,
    memo: Vec<Vec<Memo>>,
    main_q: VecDeque<usize>,
    recovery_q: VecDeque<usize>,
    heap: BinaryHeap<Reverse<(Millis, u64, Event)>>,
    seq: u64,
    now: Millis,
    next_tick: Option<Millis>,
    stale_risk: Vec<usize>,
    start: Option<Millis>,
    last_end: Millis,
    ooms: u32,
    lost_gpu_ms: f64,
    attempts: Vec<AttemptLog>,
    events: u64,
    ticks: u64,
    /// [`HORIZON_MS`] (tests lower it).
    horizon: Millis,
    /// The first event time past the horizon, if any: the run stopped there.
    beyond_horizon: Option<Millis>,
    /// `--learn-peaks`: the observed-peak records first attempts are reserved from.
    learn: Option<learn::PeakBook>,
}

impl<'a> Engine<'a> {
    fn new(
        tasks: &'a [Task],
        reservations: &[Reservation],
        policy: Policy,
        cfg: &'a SimConfig,
    ) -> Self {
        let c = cfg.cluster;
        let mut nodes = Vec::with_capacity(c.nodes as usize);
        let mut gpus = Vec::new();
        let mut gpu_by_uuid = HashMap::new();
        let mut node_first_gpu = Vec::new();
        for n in 0..c.nodes as usize {
            node_first_gpu.push(gpus.len());
            let mut list = Vec::with_capacity(c.gpus_per_node as usize);
            for i in 0..c.gpus_per_node as usize {
                let uuid = format!("GPU-sim-{n}-{i}");
                let mut g = Gpu::idle(uuid.clone(), i as u32, c.gpu_memory_mib);
                g.model = "simulated A100".into();
                gpu_by_uuid.insert(uuid, gpus.len());
                gpus.push(SimGpu::new(n, i, c.gpu_memory_mib));
                list.push(g);
            }
            nodes.push(Node {
                name: format!("node-{n}"),
                gpus: list,
            });
        }
        let state = reservations
            .iter()
            .map(|r| TaskState {
                reservation: *r,
                exclusive: false,
                history: Vec::new(),
                attempts: 0,
                ooms: 0,
                run: None,
                ready_at: 0,
                wait_ms: 0,
                run_ms: 0,
                first_start: None,
                end: None,
                finished: false,
                failure: None,
                unschedulable: 0,
                retry_at: 0,
            })
            .collect();
        let mut engine = Self {
            cfg,
            pcfg: cfg.effective_placement(),
            policy,
            tasks,
            activity: tasks
                .iter()
                .map(|t| t.activity.scaled(cfg.activity_scale))
                .collect(),
            learn: cfg.learn_peaks.map(|h| learn::PeakBook::new(tasks, h)),
            expected_activity: tasks
                .iter()
                .map(|t| {
                    t.workload.map(|w| {
                        carma_estimator::activity::expected_sm_activity(
                            &w.arch.profile(w.batch_size),
                        )
                    })
                })
                .collect(),
            state,
            rr_cursor: vec![0; nodes.len()],
            node_version: vec![0; nodes.len()],
            memo: vec![Vec::new(); nodes.len()],
            nodes,
            node_first_gpu,
            gpus,
            gpu_by_uuid,
            ledger: Ledger::new(),
            main_q: VecDeque::new(),
            recovery_q: VecDeque::new(),
            heap: BinaryHeap::new(),
            seq: 0,
            now: 0,
            next_tick: None,
            stale_risk: Vec::new(),
            start: None,
            last_end: 0,
            ooms: 0,
            lost_gpu_ms: 0.0,
            attempts: Vec::new(),
            events: 0,
            ticks: 0,
            horizon: HORIZON_MS,
            beyond_horizon: None,
        };
        for t in tasks {
            engine.push(t.arrival_ms, Event::Arrive(t.id));
        }
        engine
    }

    fn push(&mut self, at: Millis, ev: Event) {
        if at > self.horizon {
            self.beyond_horizon.get_or_insert(at);
            return;
        }
        self.seq += 1;
        self.heap.push(Reverse((at, self.seq, ev)));
    }

    fn request_tick(&mut self, at: Millis) {
        let t = self.cfg.telemetry.next_tick(at.max(self.now));
        self.next_tick = Some(self.next_tick.map_or(t, |n| n.min(t)));
    }

    fn run(&mut self) {
        while self.beyond_horizon.is_none() {
            let next_event = self.heap.peek().map(|Reverse((t, _, _))| *t);
            match (next_event, self.next_tick) {
                (None, None) => break,
                (Some(te), Some(tt)) if tt < te => self.tick(tt),
                (None, Some(tt)) => self.tick(tt),
                (Some(_), _) => {
                    let Some(Reverse((t, _, ev))) = self.heap.pop() else {
                        break;
                    };
                    self.now = t;
                    self.events += 1;
                    self.handle(ev);
                }
            }
        }
        if self.beyond_horizon.is_none() {
            self.fail_stranded();
        }
    }

    /// An error when the run stopped at the horizon.
    fn within_horizon(&self) -> Result<(), SimError> {
        match self.beyond_horizon {
            None => Ok(()),
            Some(at) => Err(SimError::Config(format!(
                "simulated time would pass {} ms (an event at {at} ms, at {} ms into the run): \
                 collocated tasks slowed down this much cannot be simulated; raise \
                 --slowdown-threshold or lower --slowdown-exponent",
                self.horizon, self.now
            ))),
        }
    }

    fn handle(&mut self, ev: Event) {
        match ev {
            Event::Arrive(id) => {
                self.state[id].ready_at = self.now;
                self.main_q.push_back(id);
                // Behind a blocked head CARMA's queue has nothing to try; kube-scheduler tries the
                // new pod.
                if self.main_q.len() == 1 || self.cfg.queue == QueueDiscipline::Kube {
                    self.request_tick(self.now);
                }
            }
            Event::Ready { task, recovery } => {
                // The next attempt is a new pod: no back-off carried over.
                let s = &mut self.state[task];
                (s.ready_at, s.unschedulable, s.retry_at) = (self.now, 0, 0);
                if recovery {
                    self.recovery_q.push_back(task);
                } else {
                    self.main_q.push_back(task);
                }
                self.request_tick(self.now);
            }
            Event::Show { task, attempt } => self.show(task, attempt),
            Event::Finish {
                task,
                attempt,
                version,
            } => {
                let current = self.state[task]
                    .run
                    .as_ref()
                    .is_some_and(|r| r.version == version)
                    && self.state[task].attempts == attempt;
                if current {
                    self.complete(task);
                }
            }
        }
    }

    // ----- scheduling -------------------------------------------------------

    fn tick(&mut self, t: Millis) {
        self.now = t;
        self.next_tick = None;
        self.ticks += 1;
        self.refresh_risk();
        let wake = earliest(self.drain(true), self.drain(false));
        if let Some(w) = wake {
            self.request_tick(w);
        }
    }

    /// Place what can be placed from the recovery queue or the main queue, in order; the earliest
    /// time a pass should run again for what is left. Under CARMA's discipline a task that does not
    /// fit stops the pass; under kube-scheduler's it is set aside for its back-off and the pass
    /// goes on.
    fn drain(&mut self, recovery: bool) -> Option<Millis> {
        let kube = self.cfg.queue == QueueDiscipline::Kube;
        let mut wake: Option<Millis> = None;
        let mut i = 0;
        loop {
            let queue = if recovery {
                &self.recovery_q
            } else {
                &self.main_q
            };
            let Some(&id) = queue.get(i) else { break };
            if kube && self.state[id].retry_at > self.now {
                wake = earliest(wake, Some(self.state[id].retry_at));
                i += 1;
                continue;
            }
            // CARMA's recovery-first rule: no new sharing while a recovery task waits.
            let share = recovery || self.recovery_q.is_empty();
            match self.try_place(id, share) {
                TryPlace::Placed => {
                    self.queue_mut(recovery).remove(i);
                }
                TryPlace::Impossible(reason) => {
                    self.queue_mut(recovery).remove(i);
                    self.fail(id, reason);
                }
                TryPlace::Blocked(w) if kube => {
                    let s = &mut self.state[id];
                    s.unschedulable += 1;
                    s.retry_at = self
                        .now
                        .saturating_add(QueueDiscipline::kube_backoff_ms(s.unschedulable));
                    // Tried again by the next pass after the back-off; a pass at the back-off's
                    // end only when time alone may change the answer.
                    wake = earliest(wake, w.map(|w| w.max(s.retry_at)));
                    i += 1;
                }
                TryPlace::Blocked(w) => {
                    wake = earliest(wake, w);
                    break;
                }
            }
        }
        wake
    }

    fn queue_mut(&mut self, recovery: bool) -> &mut VecDeque<usize> {
        if recovery {
            &mut self.recovery_q
        } else {
            &mut self.main_q
        }
    }

    fn refresh_risk(&mut self) {
        if self.stale_risk.is_empty() {
            return;
        }
        let tel = self.cfg.telemetry;
        let now = self.now;
        let mut still = Vec::new();
        for g in std::mem::take(&mut self.stale_risk) {
            let (sm, occ, dram) = self.gpus[g].risk_scores(now, &tel);
            let (n, slot) = (self.gpus[g].node, self.gpus[g].slot);
            let view = &mut self.nodes[n].gpus[slot];
            let new = (Some(sm), Some(occ), Some(dram));
            if (view.sm_activity, view.sm_occupancy, view.dram_activity) != new {
                (view.sm_activity, view.sm_occupancy, view.dram_activity) = new;
                self.node_version[n] += 1;
            }
            if self.gpus[g].window_moving(now, &tel) {
                still.push(g);
            } else {
                self.gpus[g].risk_stale = false;
            }
        }
        self.stale_risk = still;
    }

    /// The reservation task `id` asks for now: a first attempt's may come from learned peaks.
    fn reservation(&self, id: usize) -> Reservation {
        let s = &self.state[id];
        match &self.learn {
            Some(book) if s.attempts == 0 => book.first_reservation(id, s.reservation),
            _ => s.reservation,
        }
    }

    fn demand(&self, id: usize) -> Demand {
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
    fn touch(&mut self, n: usize) {
        self.node_version[n] += 1;
    }

    fn try_place(&mut self, id: usize, share: bool) -> TryPlace {
        let demand = recovery_first(self.demand(id), !share, false);
        let key = DemandKey::of(&demand, &self.pcfg);
        let mut best: Option<(usize, NodePlacement)> = None;
        let mut wake: Option<Millis> = None;
        let mut too_few = 0;
        for n in 0..self.nodes.len() {
            match self.outcome_on(n, key, &demand) {
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

    // ----- running tasks ----------------------------------------------------

    fn show(&mut self, id: usize, attempt: u32) {
        if self.state[id].attempts != attempt {
            return;
        }
        let Some(run) = self.state[id].run.as_ref() else {
            return;
        };
        let peak = self.tasks[id].peak_mib;
        let overflow = run
            .gpus
            .iter()
            .copied()
            .find(|g| self.gpus[*g].mem_used_mib + peak > self.gpus[*g].total_mib);
        if let Some(g) = overflow {
            self.crash(id, g);
            return;
        }
        let gpus = run.gpus.clone();
        let pod = run.pod.clone();
        self.ledger.confirm(&pod);
        let node = self.gpus[gpus[0]].node;
        self.touch(node);
        for &g in &gpus {
            self.gpus[g].settle(self.now, &self.cfg.power);
            self.gpus[g].shown.push(id);
            self.recompute_gpu(g);
        }
        if let Some(run) = self.state[id].run.as_mut() {
            run.shown = true;
        }
        self.rerate_on(&gpus);
        self.request_tick(self.now);
    }

    fn complete(&mut self, id: usize) {
        let Some(run) = self.state[id].run.take() else {
            return;
        };
        self.release(id, &run);
        let s = &mut self.state[id];
        s.run_ms += self.now - run.start;
        s.end = Some(self.now);
        s.finished = true;
        s.history.push(AttemptRecord {
            outcome: AttemptOutcome::Succeeded,
            reservation: s.reservation,
            exclusive: s.exclusive,
        });
        if let Some(book) = self.learn.as_mut() {
            book.completed(id, self.tasks[id].peak_mib);
        }
        self.log_attempt(id, &run, AttemptEnd::Finished);
        self.rerate_on(&run.gpus);
        self.last_end = self.last_end.max(self.now);
        self.request_tick(self.now);
    }

    fn crash(&mut self, id: usize, gpu: usize) {
        let Some(run) = self.state[id].run.take() else {
            return;
        };
        self.release(id, &run);
        let ran = self.now - run.start;
        self.ooms += 1;
        self.lost_gpu_ms += ran as f64 * run.gpus.len() as f64;
        self.log_attempt(id, &run, AttemptEnd::OutOfMemory);
        self.last_end = self.last_end.max(self.now);
        let total = self.gpus[gpu].total_mib;
        let s = &mut self.state[id];
        s.run_ms += ran;
        s.ooms += 1;
        s.history.push(AttemptRecord {
            outcome: AttemptOutcome::GpuOutOfMemory {
                observed_peak_mib: None,
            },
            reservation: s.reservation,
            exclusive: run.exclusive,
        });
        if let Some(book) = self.learn.as_mut() {
            let reserved = match s.reservation {
                Reservation::Mib(m) => Some(m),
                Reservation::WholeGpu | Reservation::Unknown => None,
            };
            book.crashed(
                id,
                carma_core::recorded_reservation_mib(run.exclusive, reserved, Some(total)),
            );
        }
        debug!(task = id, gpu, "out of memory");
        match decide_next(&s.history, Some(total), &self.cfg.recovery) {
            RecoveryDecision::Retry {
                reservation,
                exclusive,
                backoff_ms,
                recovery_priority,
                ..
            } => {
                s.reservation = reservation;
                s.exclusive = exclusive;
                self.push(
                    self.now.saturating_add(backoff_ms),
                    Event::Ready {
                        task: id,
                        recovery: recovery_priority,
                    },
                );
            }
            RecoveryDecision::GiveUp { reason } => self.fail(id, reason),
            RecoveryDecision::Done => {
                warn!(task = id, "recovery says done after an out-of-memory crash");
                self.fail(id, "recovery ended after an out-of-memory crash".into());
            }
        }
        self.request_tick(self.now);
    }

    fn fail(&mut self, id: usize, reason: String) {
        let s = &mut self.state[id];
        s.failure = Some(reason);
        s.end = Some(self.now);
        self.last_end = self.last_end.max(self.now);
    }

    /// Tasks still queued when nothing can happen any more.
    fn fail_stranded(&mut self) {
        let stranded: Vec<usize> = self
            .recovery_q
            .drain(..)
            .chain(self.main_q.drain(..))
            .collect();
        for id in stranded {
            let demand = self.demand(id);
            let why = self
                .nodes
                .iter()
                .filter_map(|node| {
                    place_on_node(node, &self.ledger, &demand, &self.pcfg, self.now, 0).err()
                })
                .map(|r| r.to_string())
                .next()
                .unwrap_or_else(|| "no placement became possible".into());
            self.fail(id, format!("never placed: {why}"));
        }
    }

    /// Take a task off its GPUs and out of the ledger.
    fn release(&mut self, id: usize, run: &Run) {
        self.ledger.release(&run.pod);
        if let Some(g) = run.gpus.first() {
            let node = self.gpus[*g].node;
            self.touch(node);
        }
        for &g in &run.gpus {
            self.gpus[g].settle(self.now, &self.cfg.power);
            self.gpus[g].placed.retain(|t| *t != id);
            let was_shown = self.gpus[g].shown.len();
            self.gpus[g].shown.retain(|t| *t != id);
            if self.gpus[g].shown.len() != was_shown {
                self.recompute_gpu(g);
            } else {
                self.record_point(g);
            }
        }
    }

    /// Recompute memory, demand and the telemetry view of a GPU from its shown tasks.
    fn recompute_gpu(&mut self, g: usize) {
        let gpu = &mut self.gpus[g];
        gpu.mem_used_mib = gpu.shown.iter().map(|t| self.tasks[*t].peak_mib).sum();
        gpu.demand = gpu
            .shown
            .iter()
            .fold(Activity::default(), |a, t| a + self.activity[*t]);
        gpu.activity_changed(self.now, &self.cfg.telemetry);
        if !gpu.risk_stale {
            gpu.risk_stale = true;
            self.stale_risk.push(g);
        }
        let (n, slot) = (gpu.node, gpu.slot);
        self.node_version[n] += 1;
        let view = &mut self.nodes[n].gpus[slot];
        view.memory_free_mib = gpu.total_mib.saturating_sub(gpu.mem_used_mib);
        view.processes = gpu.shown.len() as u32;
        self.record_point(g);
    }

    fn record_point(&mut self, g: usize) {
        if self.cfg.record_timelines {
            let (n, slot) = (self.gpus[g].node, self.gpus[g].slot);
            let uuid = &self.nodes[n].gpus[slot].uuid;
            let reserved = self.ledger.reserved_mib(uuid);
            self.gpus[g].record(self.now, reserved);
        }
    }

    /// Update progress rates of every task on `gpus` and reschedule completions.
    fn rerate_on(&mut self, gpus: &[usize]) {
        let mut affected: Vec<usize> = gpus
            .iter()
            .flat_map(|g| self.gpus[*g].placed.iter().copied())
            .collect();
        affected.sort_unstable();
        affected.dedup();
        for id in affected {
            let rate = self.rate_of(id);
            let now = self.now;
            let attempt = self.state[id].attempts;
            let Some(run) = self.state[id].run.as_mut() else {
                continue;
            };
            run.work_left = (run.work_left - run.rate * (now - run.last) as f64).max(0.0);
            run.last = now;
            if (rate - run.rate).abs() <= 1e-12 {
                continue;
            }
            run.rate = rate;
            run.version += 1;
            // `as` and the addition saturate: a time beyond the horizon is refused by `push`.
            let at = now.saturating_add((run.work_left / rate).ceil() as Millis);
            let version = run.version;
            self.push(
                at,
                Event::Finish {
                    task: id,
                    attempt,
                    version,
                },
            );
        }
    }

    fn rate_of(&self, id: usize) -> f64 {
        let Some(run) = self.state[id].run.as_ref() else {
            return 1.0;
        };
        if !run.shown {
            return 1.0;
        }
        let own = self.activity[id].sm_activity;
        run.gpus
            .iter()
            .map(|g| {
                self.cfg
                    .slowdown
                    .rate(own, self.gpus[*g].demand.sm_activity)
            })
            .fold(1.0, f64::min)
    }

    fn log_attempt(&mut self, id: usize, run: &Run, end: AttemptEnd) {
        if !self.cfg.record_timelines {
            return;
        }
        self.attempts.push(AttemptLog {
            task: id,
            name: self.tasks[id].name.clone(),
            attempt: self.state[id].attempts,
            gpus: run.gpus.clone(),
            start_ms: run.start,
            end_ms: self.now,
            end,
            reserved_mib: run.reserved_mib,
            peak_mib: self.tasks[id].peak_mib,
            exclusive: run.exclusive,
        });
    }

    // ----- results ----------------------------------------------------------

    fn finish(mut self, estimator: &str) -> RunResult {
        let start = self.start.unwrap_or(0);
        let end = self.last_end.max(start);
        for g in &mut self.gpus {
            g.settle(end, &self.cfg.power);
        }
        let span_ms = (end - start) as f64;
        let n_gpus = self.gpus.len() as f64;
        let total_mem: f64 = self.gpus.iter().map(|g| g.total_mib as f64).sum();
        let ratio = |num: f64, den: f64| if den > 0.0 { num / den } else { 0.0 };
        let smact_mean = ratio(self.gpus.iter().map(|g| g.smact_ms).sum(), n_gpus * span_ms);
        let mem_used_mean = ratio(
            self.gpus.iter().map(|g| g.mem_mib_ms).sum(),
            total_mem * span_ms,
        );
        let energy_j: f64 = self.gpus.iter().map(|g| g.energy_j).sum();

        let s = |ms: Millis| ms as f64 / 1000.0;
        let outcomes: Vec<TaskOutcome> = self
            .tasks
            .iter()
            .zip(&self.state)
            .map(|(t, st)| TaskOutcome {
                id: t.id,
                name: t.name.clone(),
                arrival_s: s(t.arrival_ms),
                first_start_s: st.first_start.map(s),
                end_s: st.end.map(s),
                finished: st.finished,
                failure: st.failure.clone(),
                attempts: st.attempts,
                ooms: st.ooms,
                wait_s: s(st.wait_ms),
                run_s: s(st.run_ms),
            })
            .collect();
        let jcts: Vec<f64> = outcomes
            .iter()
            .filter(|o| o.finished)
            .filter_map(|o| o.end_s.map(|e| e - o.arrival_s))
            .collect();
        let waits: Vec<f64> = outcomes
            .iter()
            .filter(|o| o.first_start_s.is_some())
            .map(|o| o.wait_s)
            .collect();
        let finished = outcomes.iter().filter(|o| o.finished).count();
        let failed = outcomes.iter().filter(|o| o.failure.is_some()).count();
        let summary = Summary {
            policy: self.policy,
            estimator: estimator.to_string(),
            makespan_s: span_ms / 1000.0,
            mean_jct_s: mean(&jcts),
            p95_jct_s: percentile(&jcts, 0.95),
            mean_wait_s: mean(&waits),
            ooms: self.ooms,
            lost_gpu_s: self.lost_gpu_ms / 1000.0,
            smact_mean,
            mem_used_mean,
            energy_kwh: energy_j / 3.6e6,
            finished,
            failed,
            tasks: self.tasks.len(),
            learned_reservations: self.learn.as_ref().map(|b| b.learned_tasks),
            worst_wait: worst_waits(
                &outcomes,
                &self.tasks.iter().map(|t| t.gpus).collect::<Vec<_>>(),
                &self
                    .tasks
                    .iter()
                    .map(|t| t.exclusive_ms as f64 / 1000.0)
                    .collect::<Vec<_>>(),
            ),
        };
        let gpus = if self.cfg.record_timelines {
            self.gpus
                .iter_mut()
                .map(|g| GpuTimeline {
                    node: self.nodes[g.node].name.clone(),
                    index: g.slot as u32,
                    total_mib: g.total_mib,
                    points: std::mem::take(&mut g.points),
                })
                .collect()
        } else {
            Vec::new()
        };
        RunResult {
            summary,
            tasks: outcomes,
            attempts: self.attempts,
            gpus,
            start_ms: start,
            end_ms: end,
            events: self.events,
            ticks: self.ticks,
        }
    }
}

/// The earlier of two optional times.
fn earliest(a: Option<Millis>, b: Option<Millis>) -> Option<Millis> {
    match (a, b) {
        (Some(x), Some(y)) => Some(x.min(y)),
        (x, None) => x,
        (None, y) => y,
    }
}

#[cfg(test)]
mod horizon_tests {
    use super::*;
    use crate::trace;

    #[test]
    fn a_run_that_passes_the_horizon_stops_with_an_error() {
        // Times used to be added unchecked, so a run whose events pass u64 milliseconds
        // would wrap around (a shorter makespan than the real one, exit 0). Here the horizon is
        // lowered below the run's end to see the engine stop and say why.
        let cfg = SimConfig::default();
        let trace = trace::generate(&trace::GeneratorConfig {
            tasks: 20,
            cluster_gpus: 4,
            ..Default::default()
        })
        .unwrap();
        let res = vec![Reservation::WholeGpu; trace.tasks.len()];
        let mut engine = Engine::new(&trace.tasks, &res, Policy::Exclusive, &cfg);
        engine.run();
        assert!(engine.within_horizon().is_ok());
        let end = engine.last_end;

        let mut engine = Engine::new(&trace.tasks, &res, Policy::Exclusive, &cfg);
        engine.horizon = end / 2;
        engine.run();
        let err = engine.within_horizon().unwrap_err().to_string();
        assert!(err.contains(&format!("would pass {} ms", end / 2)), "{err}");
        assert!(engine.now <= end / 2);
    }
}
