//! `carma-http`: what carma's HTTP listeners share.
//!
//! * [`idle`] — every listener (the scheduler extender's, the device plugin's and the operator's):
//!   connections that wait too long for a request are closed.
//! * [`health`] — the router of `/healthz`, `/readyz` and `/metrics` (the device plugin's, the
//!   operator's and the scheduler extender's; each component says what its checks and metrics are)
//!   and the answer to a request no route takes, which the extender's verbs router uses too.

pub mod health;
pub mod idle;

pub use idle::{IDLE_TIMEOUT, IdleListener, IdleTimeout};
