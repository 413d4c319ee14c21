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
//! Each tick serves the recovery queue first, then the main queue (each sorted by the tasks'
//! priorities under a [`QueueOrdering`], by arrival otherwise), in the order of
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
//!
//! Here: the events, the task and run state, and the time loop. The scheduler's pass is in
//! `queue`, placing one task in `place` (node choice in [`choose`]), running attempts in
//! `running`, how they end in `ends` (learned peaks in `learn`), the run's result in `summary`;
//! `gpu` is one simulated GPU's accounts.

pub mod choose;
mod ends;
mod gpu;
mod learn;
mod place;
mod queue;
mod running;
mod summary;

use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap, VecDeque};

use carma_core::{
    AttemptRecord, Declared, Gpu, Ledger, Millis, Node, PlacementConfig, Policy, QueueOrder,
    Reservation,
};

use crate::config::{QueueDiscipline, SimConfig};
use crate::declared::QueueOrdering;
use crate::error::SimError;
use crate::model::Activity;
use crate::result::{AttemptLog, RunResult};
use crate::task::Task;
use gpu::SimGpu;
use place::Memo;

/// Replay `tasks` (in arrival order) under `policy`, with per-task initial
/// reservations `reservations`, labelled `estimator` in the summary.
pub fn simulate(
    tasks: &[Task],
    reservations: &[Reservation],
    estimator: &str,
    policy: Policy,
    cfg: &SimConfig,
) -> Result<RunResult, SimError> {
    simulate_ordered(
        tasks,
        reservations,
        estimator,
        policy,
        cfg,
        &QueueOrdering::default(),
    )
}

/// [`simulate`] with both queues sorted by the priority `ordering` gives each task (higher first,
/// then the order tasks entered the queue), as kube-scheduler sorts pods by pod priority. Under
/// CARMA's discipline the queue stays strict (its head blocks the rest), but its head is then the
/// highest priority waiting, no longer the earliest arrival.
pub fn simulate_ordered(
    tasks: &[Task],
    reservations: &[Reservation],
    estimator: &str,
    policy: Policy,
    cfg: &SimConfig,
    ordering: &QueueOrdering,
) -> Result<RunResult, SimError> {
    cfg.validate()?;
    ordering.validate()?;
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
    if ordering.order != QueueOrder::Arrival {
        engine.declared = ordering.declared(tasks);
        engine.priority = ordering.priorities(tasks);
        engine.ordering = *ordering;
    }
    engine.hold_after_ms = ordering
        .hold_for_multi_gpu_ms
        .filter(|_| policy == Policy::Pack);
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
    /// Each task's queue priority now ([`QueueOrdering`]); empty: arrival order.
    priority: Vec<i64>,
    /// What each task declares, and the ordering (when `priority` is not empty).
    declared: Vec<Declared>,
    ordering: QueueOrdering,
    /// `pack` only: keep GPUs for a multi-GPU task that has waited this long
    /// ([`QueueOrdering::hold_for_multi_gpu_ms`]); `None`: never.
    hold_after_ms: Option<Millis>,
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
            priority: Vec::new(),
            declared: Vec::new(),
            ordering: QueueOrdering::default(),
            hold_after_ms: None,
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
                let at = self.enqueue(id, false);
                // Behind a blocked head CARMA's queue has nothing to try; kube-scheduler tries the
                // new pod.
                if at == 0 || self.cfg.queue == QueueDiscipline::Kube {
                    self.request_tick(self.now);
                }
            }
            Event::Ready { task, recovery } => {
                // The next attempt is a new pod: no back-off carried over.
                let s = &mut self.state[task];
                (s.ready_at, s.unschedulable, s.retry_at) = (self.now, 0, 0);
                // A new attempt waits anew: a promotion does not carry over.
                if let (Some(p), Some(d)) = (self.priority.get_mut(task), self.declared.get(task)) {
                    *p = self.ordering.priority(d);
                }
                self.enqueue(task, recovery);
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
