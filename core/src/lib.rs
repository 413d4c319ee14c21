//! `carma-core`: the pure domain logic of carma.
//!
//! Nothing in this crate performs I/O, talks to Kubernetes or spawns tasks. The
//! scheduler extender, the device plugin, the operator and the simulator all call
//! into it, so a rule such as "a GPU is excluded when its SM activity is above the
//! cap" exists exactly once.
//!
//! * [`model`] — GPUs, nodes, demands and reservations.
//! * [`telemetry`] — CARMA's risk reduction over a sample window.
//! * [`gate`] — the utilization gate for each telemetry source's metric set ([`gate_rule`]: the
//!   rules' names).
//! * [`ledger`] — placements in flight and the warm-up lock.
//! * [`memory_limit`] — the memory limit a placed container is told next to its reservation.
//! * [`placement`] — the exclusive-first rule, memory test, utilization gate, the
//!   policies (CARMA's six and carma's `pack`) and node scores.
//! * [`reason`] — actionable rejection reasons.
//! * [`exit`] — how a training process ended: success, GPU out of memory (by the OOM
//!   patterns), a kernel OOM kill for host memory, or another failure.
//! * [`recovery`] — what to do after an attempt ends.
//! * [`quantity`] — Kubernetes memory quantities in MiB.
//! * [`queue_order`] — pending pods' order: a priority from a declared duration, then arrival.
//! * [`queue_class`] — the PriorityClasses through which kube-scheduler applies that order.
//! * [`history`] — reservations learned from the peaks earlier runs of a model reached.
//! * [`reservation`] — where a first reservation comes from: override, estimate or history,
//!   whole GPU.

pub mod config;
pub mod exit;
pub mod gate;
pub mod gate_rule;
pub mod history;
pub mod ledger;
pub mod memory_limit;
pub mod model;
pub mod pack_gain;
pub mod placement;
pub mod quantity;
pub mod queue_class;
pub mod queue_order;
pub mod reason;
pub mod recovery;
pub mod reservation;
pub mod slowdown;
pub mod telemetry;
pub mod text;

pub use config::{GpuChoice, PlacementConfig, RecoveryConfig};
pub use exit::{
    ContainerExit, DEFAULT_OOM_PATTERNS, OomPatterns, PatternError, Verdict, VerdictKind,
    classify_exit,
};
pub use gate::{GateRule, utilization_gate};
pub use history::{
    HistoryConfig, LearnedReservation, PeakHistory, RunEnd, learned_reservation,
    recorded_reservation_mib,
};
pub use ledger::{Ledger, LedgerError, PlacementRecord};
pub use model::{Demand, Gpu, Node, Policy, PolicyParseError, Reservation};
pub use placement::{NodePlacement, place_on_node};
pub use queue_class::{QUEUE_CLASS_BASE, QueueClass};
pub use queue_order::{Declared, QueueOrder, QueueOrderParseError};
pub use reason::{GpuRejection, NodeRejection};
pub use recovery::{AttemptOutcome, AttemptRecord, RecoveryDecision, decide_next};
pub use reservation::{FirstReservation, first_reservation};
pub use telemetry::{SampleWindow, risk_score};

/// Time in milliseconds on a monotonic or wall clock chosen by the caller.
///
/// The core never reads a clock: callers pass `now` explicitly, which keeps every
/// rule deterministic and lets the simulator run in virtual time.
pub type Millis = u64;
