//! `carma-http`: what carma's HTTP listeners share.
//!
//! * [`idle`] — every listener (the scheduler extender's, the device plugin's and the operator's):
//!   connections that wait too long for a request are closed.
//! * [`health`] — the device plugin's and the operator's router of `/healthz`, `/readyz` and
//!   `/metrics`; each component says what its checks and metrics are.

pub mod health;
pub mod idle;

pub use idle::{IDLE_TIMEOUT, IdleListener, IdleTimeout};
