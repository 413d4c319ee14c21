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
//! * [`trace`] — CARMA trace import and the Philly-like generator;
//! * [`catalog`] — CARMA's published workloads;
//! * [`model`] — activity, slowdown, power and telemetry models;
//! * [`reservation`] — `--estimator gpumemnet|oracle|recorded|none`;
//! * [`engine`] — the discrete-event engine;
//! * [`report`] — table, JSON and HTML output.
//!
//! Every figure the simulator prints is simulated: run times and peaks are
//! CARMA's measurements, everything that happens while jobs share a GPU comes
//! from the documented models.

pub mod catalog;
pub mod config;
pub mod engine;
pub mod error;
pub mod model;
pub mod profile;
pub mod report;
pub mod reservation;
pub mod result;
pub mod task;
pub mod trace;

pub use config::{ClusterSpec, QueueDiscipline, SimConfig};
pub use engine::simulate;
pub use error::SimError;
pub use reservation::{EstimatorKind, ReservationPlan, plan};
pub use result::{RunResult, Summary};
pub use task::Task;
pub use trace::Trace;

use carma_core::Policy;
use serde::Serialize;

/// Several policies replayed on one trace with one reservation source.
#[derive(Debug, Clone, Serialize)]
pub struct Comparison {
    /// What the trace is.
    pub trace: String,
    /// Number of tasks.
    pub tasks: usize,
    /// Exclusive GPU time of the whole trace, GPU-seconds.
    pub exclusive_gpu_s: f64,
    /// No policy's makespan can be shorter than this under the run's models
    /// ([`SimConfig::makespan_bound_s`]); `None` where the models give no such bound.
    pub makespan_bound_s: Option<f64>,
    /// The configuration used.
    pub config: SimConfig,
    /// Reservations and how they were obtained.
    pub plan: ReservationPlan,
    /// One run per policy, in the order asked.
    pub runs: Vec<RunResult>,
}

impl Comparison {
    /// The exclusive run, if it was part of the comparison.
    pub fn baseline(&self) -> Option<&RunResult> {
        self.runs
            .iter()
            .find(|r| r.summary.policy == Policy::Exclusive)
    }
}

/// Replay `trace` under every policy in `policies` (in parallel threads), with
/// reservations from `kind`.
pub fn compare(
    trace: &Trace,
    kind: EstimatorKind,
    policies: &[Policy],
    cfg: &SimConfig,
) -> Result<Comparison, SimError> {
    cfg.validate()?;
    let plan = reservation::plan(&trace.tasks, kind, cfg.cluster.gpu_memory_mib)?;
    let label = kind.as_str();
    let runs: Vec<Result<RunResult, SimError>> = std::thread::scope(|s| {
        let handles: Vec<_> = policies
            .iter()
            .map(|p| {
                let plan = &plan;
                s.spawn(move || simulate(&trace.tasks, &plan.reservations, label, *p, cfg))
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
