//! What the simulated monitor sees, and when.
//!
//! * A task's memory and activity show in telemetry `lag` after it starts
//!   (framework start-up, model construction and the first batches). At that
//!   moment it also allocates its true peak: if the GPU's summed true peaks would
//!   exceed its memory, the task crashes out of memory instead (CARMA: the later
//!   arrival crashes). Before it shows, the ledger books its reservation as in
//!   flight and the GPU is in its warm-up lock; when it shows, the ledger is
//!   confirmed (`Ledger::confirm`).
//! * Every `interval` the monitor samples each GPU; the scheduler reads CARMA's
//!   risk score over the last `window` samples (`carma_core::telemetry`).
//!
//! Default lag 15 s: half of CARMA's 30 s warm-up lock, which exists because a
//! PyTorch job's memory shows up seconds to tens of seconds after launch.

use carma_core::Millis;
use serde::Serialize;

/// Timing of telemetry and of the scheduler loop.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct TelemetryModel {
    /// Delay between a task's start and its memory showing (default 15 s).
    pub lag_ms: Millis,
    /// Samples in the risk window (CARMA: 30).
    pub window: usize,
    /// Sampling and scheduling period (CARMA: 1 s).
    pub interval_ms: Millis,
}

impl Default for TelemetryModel {
    fn default() -> Self {
        Self {
            lag_ms: 15_000,
            window: carma_core::telemetry::DEFAULT_WINDOW,
            interval_ms: 1_000,
        }
    }
}

impl TelemetryModel {
    /// The first scheduler tick at or after `t`.
    pub fn next_tick(&self, t: Millis) -> Millis {
        let i = self.interval_ms.max(1);
        t.div_ceil(i) * i
    }

    /// How long after an activity change the risk window keeps moving.
    pub fn window_ms(&self) -> Millis {
        self.window as Millis * self.interval_ms
    }
}
