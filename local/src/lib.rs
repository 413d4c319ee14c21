//! `carma-local`: CARMA on one GPU machine, without Kubernetes (`carma local`).
//!
//! * [`daemon::serve`] — the daemon: a recovery queue and a main queue (CARMA's strict
//!   first-in-first-out), placement by carma-core, telemetry from the GPU layer's backends (`carma-gpu`),
//!   GPU out-of-memory crashes recognised by carma-core's `classify_exit` and requeued per
//!   carma-core's `decide_next`; state in an fsync'd journal that survives restarts.
//! * [`spec::submit`] — hand a job to the daemon through the state directory's spool.
//! * [`status::status`], [`report::report`] — what happened, from the journal.
//! * [`replay::replay`] — submit a CARMA trace script's jobs at its gaps.
//!
//! The state directory's layout is in [`layout`]; the restart rules in the daemon's `recover`
//! module and in `local/README.md`.

pub mod classify;
pub mod daemon;
pub mod error;
pub mod jobs;
pub mod journal;
pub mod launch;
pub mod layout;
pub mod replay;
pub mod report;
pub mod reservation;
pub mod spec;
pub mod status;
pub mod task_file;
pub mod telemetry;

pub use carma_core::Millis;
pub use daemon::{ServeConfig, serve};
pub use error::{LocalError, Result};
pub use layout::StateDir;
pub use spec::JobSpec;
pub use telemetry::BackendChoice;
