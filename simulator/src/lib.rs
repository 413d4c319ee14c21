//! `carma-simulator`: discrete-event replay of deep-learning job traces on
//! simulated GPUs, with carma's own placement, warm-up lock and recovery logic
//! (`carma-core`) and memory estimates (`carma-estimator`) — the code the
//! extender and operator run, not copies.
//!
//! ```
//! use carma_core::Policy;
//! use carma_simulator::{compare, trace, EstimatorKind, SimConfig};
//!
//! let trace = trace::generate(&trace::GeneratorConfig { tasks: 12, ..Default::default() })?;
//! let cfg = SimConfig::default(); // one node, 4 × 40 GiB, CARMA's thresholds
//! let cmp = compare(&trace, EstimatorKind::Oracle, &[Policy::Exclusive, Policy::Magm], &cfg)?;
//! assert_eq!(cmp.runs.len(), 2);
//! assert!(cmp.runs.iter().all(|r| r.summary.finished == 12));
//! # Ok::<(), carma_simulator::SimError>(())
//! ```
//!
//! The workloads it replays and the record and report of a run live in `carma-workload`, shared
//! with `carma local`; they are re-exported here under their old paths:
//!
//! * [`trace`] — CARMA trace import and the Philly-like generator;
//! * [`catalog`] — CARMA's published workloads;
//! * [`model`] — activity, slowdown, power and telemetry models;
//! * [`reservation`] — `--estimator gpumemnet|oracle|recorded|none`;
//! * [`result`], [`report`] — what a run produces; table, JSON and HTML output.
//!
//! This crate is the discrete-event [`engine`] ([`simulate`]) and [`compare`], which runs it
//! once per policy; [`declared`] gives tasks the durations a queue order reads
//! ([`simulate_ordered`], [`compare_ordered`]).
//!
//! Every figure the simulator prints is simulated: run times and peaks are
//! CARMA's measurements, everything that happens while jobs share a GPU comes
//! from the documented models.

pub mod declared;
pub mod engine;

pub use carma_workload::{
    ClusterSpec, Comparison, EstimatorKind, QueueDiscipline, ReservationPlan, RunResult, SimConfig,
    SimError, Summary, Task, Trace, catalog, config, error, model, plan, profile, report,
    reservation, result, task, trace,
};
pub use declared::QueueOrdering;
pub use engine::{simulate, simulate_ordered};

use carma_core::Policy;

/// Replay `trace` under every policy in `policies` (in parallel threads), with
/// reservations from `kind`.
pub fn compare(
    trace: &Trace,
    kind: EstimatorKind,
    policies: &[Policy],
    cfg: &SimConfig,
) -> Result<Comparison, SimError> {
    compare_ordered(trace, kind, policies, cfg, &QueueOrdering::default())
}

/// [`compare`] with the queues in `ordering`'s order (every policy alike).
pub fn compare_ordered(
    trace: &Trace,
    kind: EstimatorKind,
    policies: &[Policy],
    cfg: &SimConfig,
    ordering: &QueueOrdering,
) -> Result<Comparison, SimError> {
    cfg.validate()?;
    ordering.validate()?;
    let plan = reservation::plan(&trace.tasks, kind, cfg.cluster.gpu_memory_mib)?;
    let label = kind.as_str();
    let runs: Vec<Result<RunResult, SimError>> = std::thread::scope(|s| {
        let handles: Vec<_> = policies
            .iter()
            .map(|p| {
                let plan = &plan;
                s.spawn(move || {
                    simulate_ordered(&trace.tasks, &plan.reservations, label, *p, cfg, ordering)
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| {
                h.join().unwrap_or_else(|_| {
                    Err(SimError::Config("a simulation thread panicked".into()))
                })
            })
            .collect()
    });
    let runs = runs.into_iter().collect::<Result<Vec<_>, _>>()?;
    Ok(Comparison {
        trace: trace.description.clone(),
        tasks: trace.tasks.len(),
        exclusive_gpu_s: trace.exclusive_gpu_s(),
        makespan_bound_s: cfg.makespan_bound_s(&trace.tasks),
        config: cfg.clone(),
        plan,
        runs,
    })
}
