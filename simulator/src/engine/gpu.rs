//! One simulated GPU: who is on it, what telemetry shows, and the accounting of
//! activity, memory and energy over time.

use std::collections::VecDeque;

use carma_core::Millis;
use carma_core::telemetry::risk_score;

use crate::model::{Activity, PowerModel, TelemetryModel};
use crate::result::GpuPoint;

/// Simulated GPU state.
#[derive(Debug, Clone)]
pub(crate) struct SimGpu {
    /// Node position.
    pub node: usize,
    /// Position of the GPU in its node's list (= its index).
    pub slot: usize,
    /// Memory, MiB.
    pub total_mib: u64,
    /// Tasks placed on it (started, visible or not).
    pub placed: Vec<usize>,
    /// Tasks whose memory and activity show.
    pub shown: Vec<usize>,
    /// Summed true peaks of shown tasks, MiB.
    pub mem_used_mib: u64,
    /// Summed activity of shown tasks (uncapped demand).
    pub demand: Activity,
    /// Reported-activity change points `(time, level)` still inside the window
    /// (plus the last one before it), oldest first.
    history: VecDeque<(Millis, Activity)>,
    /// Last change of reported activity.
    pub last_change: Millis,
    /// Whether the GPU is on the engine's list of risk scores to recompute.
    pub risk_stale: bool,
    acc_since: Option<Millis>,
    /// ∫ reported SM activity dt (activity·ms).
    pub smact_ms: f64,
    /// ∫ memory in use dt (MiB·ms).
    pub mem_mib_ms: f64,
    /// ∫ power dt (J).
    pub energy_j: f64,
    /// Recorded states (when timelines are on).
    pub points: Vec<GpuPoint>,
}

impl SimGpu {
    pub fn new(node: usize, slot: usize, total_mib: u64) -> Self {
        let mut history = VecDeque::new();
        history.push_back((0, Activity::default()));
        Self {
            node,
            slot,
            total_mib,
            placed: Vec::new(),
            shown: Vec::new(),
            mem_used_mib: 0,
            demand: Activity::default(),
            history,
            last_change: 0,
            risk_stale: false,
            acc_since: None,
            smact_ms: 0.0,
            mem_mib_ms: 0.0,
            energy_j: 0.0,
            points: Vec::new(),
        }
    }

    /// Start accounting at `t` (the first dispatch).
    pub fn open_accounts(&mut self, t: Millis) {
        self.acc_since = Some(t);
    }

    /// Add the current state's contribution up to `t`.
    pub fn settle(&mut self, t: Millis, power: &PowerModel) {
        let Some(since) = self.acc_since else { return };
        if t <= since {
            return;
        }
        let dt = (t - since) as f64;
        let sm = self.demand.observed().sm_activity;
        self.smact_ms += sm * dt;
        self.mem_mib_ms += self.mem_used_mib as f64 * dt;
        self.energy_j += power.watts(sm) * dt / 1000.0;
        self.acc_since = Some(t);
    }

    /// Record a new reported activity level at `t` (call after changing `demand`).
    pub fn activity_changed(&mut self, t: Millis, tel: &TelemetryModel) {
        let level = self.demand.observed();
        if let Some(last) = self.history.back_mut() {
            if last.0 == t {
                last.1 = level;
            } else {
                self.history.push_back((t, level));
            }
        }
        self.last_change = t;
        let horizon = t.saturating_sub(tel.window_ms());
        while self.history.len() > 1 && self.history[1].0 <= horizon {
            self.history.pop_front();
        }
    }

    /// Whether the risk window still changes after `t` (samples older than the
    /// last change are still in it).
    pub fn window_moving(&self, t: Millis, tel: &TelemetryModel) -> bool {
        let span = (tel.window as i64 - 1) * tel.interval_ms as i64;
        (t as i64 - span) < self.last_change as i64
    }

    /// CARMA's risk scores (SM activity, SM occupancy, DRAM activity) over the
    /// window of one-second samples ending at `t`, via `carma_core::telemetry`.
    pub fn risk_scores(&self, t: Millis, tel: &TelemetryModel) -> (f64, f64, f64) {
        let n = tel.window;
        let mut sm = Vec::with_capacity(n);
        let mut occ = Vec::with_capacity(n);
        let mut dram = Vec::with_capacity(n);
        let mut idx = 0;
        for k in (0..n).rev() {
            let back = k as Millis * tel.interval_ms;
            let level = if back > t {
                Activity::default()
            } else {
                let s = t - back;
                while idx + 1 < self.history.len() && self.history[idx + 1].0 <= s {
                    idx += 1;
                }
                if self.history[idx].0 <= s {
                    self.history[idx].1
                } else {
                    Activity::default()
                }
            };
            sm.push(level.sm_activity);
            occ.push(level.sm_occupancy);
            dram.push(level.dram_activity);
        }
        let r = |v: &[f64]| risk_score(v).unwrap_or(0.0);
        (r(&sm), r(&occ), r(&dram))
    }

    /// Record the current state as a timeline point.
    pub fn record(&mut self, t: Millis, reserved_mib: u64) {
        let point = GpuPoint {
            t_ms: t,
            mem_used_mib: self.mem_used_mib,
            reserved_mib,
            sm_activity: self.demand.observed().sm_activity,
            tasks: self.placed.len() as u32,
        };
        match self.points.last_mut() {
            Some(last) if last.t_ms == t => *last = point,
            _ => self.points.push(point),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn risk_follows_a_step_and_settles() {
        let tel = TelemetryModel::default();
        let mut g = SimGpu::new(0, 0, 40_960);
        g.demand = Activity {
            sm_activity: 0.6,
            sm_occupancy: 0.3,
            dram_activity: 0.2,
        };
        g.activity_changed(100_000, &tel);
        let (before, _, _) = g.risk_scores(99_000, &tel);
        assert_eq!(before, 0.0);
        let (during, _, _) = g.risk_scores(110_000, &tel);
        assert!(during > 0.0 && during < 0.6, "{during}");
        assert!(g.window_moving(110_000, &tel));
        let (after, occ, _) = g.risk_scores(129_000, &tel);
        assert!((after - 0.6).abs() < 1e-12 && (occ - 0.3).abs() < 1e-12);
        assert!(!g.window_moving(129_000, &tel));
    }

    #[test]
    fn energy_is_idle_power_when_idle() {
        let p = PowerModel::default();
        let mut g = SimGpu::new(0, 0, 40_960);
        g.open_accounts(0);
        g.settle(3_600_000, &p);
        assert!((g.energy_j - 55.0 * 3600.0).abs() < 1e-6);
    }
}
