//! `carma-workload`: what the simulator (`carma simulate`) and `carma local` share — the
//! workloads they run and the record of a run.
//!
//! * [`trace`] — CARMA trace scripts, `.rad` task files and run-time CSVs, and the Philly-like
//!   generator;
//! * [`catalog`], [`profile`], [`task`] — CARMA's published workloads, their model profiles, and a
//!   task as it is replayed;
//! * [`config`], [`model`] — the cluster and its configuration; the activity, slowdown, power and
//!   telemetry models;
//! * [`reservation`] — each task's first reservation (`--estimator gpumemnet|oracle|recorded|none`);
//! * [`result`] — what a run produces: per-task outcomes, attempts, GPU timelines and the
//!   summary's figures;
//! * [`report`] — the table, JSON and HTML writers of a [`Comparison`].
//!
//! The discrete-event engine that produces simulated runs is `carma-simulator`; `carma local`
//! builds the same records from a real run, so the two print through the same writers.

pub mod catalog;
pub mod config;
pub mod error;
pub mod model;
pub mod profile;
pub mod report;
pub mod reservation;
pub mod result;
pub mod task;
pub mod trace;

pub use config::{ClusterSpec, QueueDiscipline, SimConfig};
pub use error::SimError;
pub use reservation::{EstimatorKind, ReservationPlan, plan};
pub use result::{RunResult, Summary};
pub use task::Task;
pub use trace::Trace;

use carma_core::Policy;
use serde::Serialize;

/// Several policies run on one trace with one reservation source: what the report writers print.
/// `carma simulate` builds it with `carma_simulator::compare`; `carma local report` from its
/// journal, as a one-policy comparison.
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
