//! `carma-operator`: the `TrainingTask` controller and its GPU out-of-memory
//! recovery.
//!
//! A `TrainingTask` runs as a series of *attempts*, one pod each (`<task>-a<N>`).
//! When an attempt crashes out of GPU memory — detected from its termination
//! message or log, since a CUDA OOM is an ordinary non-zero exit, not
//! `OOMKilled` — the next attempt gets a larger reservation (the next GPUMemNet
//! class edge, or the peak telemetry observed plus headroom), the priority class
//! `carma-recovery` so that it is scheduled before new work, and after the
//! configured number of OOMs an exclusive GPU; after the last allowed attempt the
//! task fails with the reason. The decisions are `carma-core`'s
//! ([`carma_core::decide_next`]); this crate is the Kubernetes adapter.
//!
//! Modules, each small; `history`, `leader` (its adapter), `reconcile`, `server` and `controller`
//! do I/O, the others none:
//!
//! * [`mod@classify`] — how a finished attempt ended: the pod read into `carma_core::exit`'s rule
//!   (success, GPU OOM, failure, host-memory kill), plus what only a pod shows (eviction);
//! * [`attempt`] — the attempt pod built from `spec.template`;
//! * [`waiting`] — why an attempt pod that has not started waits (no node fits, an image that
//!   cannot be pulled);
//! * [`observe`] — what is read off a pod and its node's `GpuNode`;
//! * [`status`] — conditions and the status write (server-side apply);
//! * [`mod@plan`] — one reconcile step as data: pod to create, status, events, requeue;
//! * [`history`] — ended attempts' observed peaks, recorded per model profile
//!   (`MemoryHistory`) for the extender's learned reservations;
//! * [`leader`] — Lease-based leader election (pure state machine + adapter);
//! * [`metrics`] — Prometheus metrics;
//! * [`mod@reconcile`] — the executor: reads the API, plans, writes;
//! * [`server`] — `/healthz`, `/readyz`, `/metrics`;
//! * [`controller`] — wiring: controller, leader election, server, shutdown.
//!
//! **Deletion.** Attempt pods carry a controller owner reference to their task
//! with `blockOwnerDeletion: true`; deleting a `TrainingTask` lets the Kubernetes
//! garbage collector delete its pods (foreground deletion waits for them). The
//! operator needs no finalizer and writes nothing on deletion. With the
//! `OwnerReferencesPermissionEnforcement` admission plugin the operator needs
//! `update` on `trainingtasks/finalizers` to set `blockOwnerDeletion`.

pub mod attempt;
pub mod classify;
pub mod controller;
pub mod error;
pub mod history;
pub mod leader;
pub mod metrics;
mod naming;
pub mod observe;
pub mod plan;
pub mod reconcile;
pub mod server;
pub mod sizing;
pub mod status;
pub mod waiting;

pub use classify::{DEFAULT_OOM_PATTERNS, OomPatterns, PodProgress, Verdict, classify};
pub use controller::{OperatorConfig, run};
pub use error::{Error, Result};
pub use metrics::Metrics;
pub use plan::{Plan, PlanInput, plan};
pub use reconcile::{Context, Settings, reconcile};
