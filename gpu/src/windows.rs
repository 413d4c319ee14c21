//! One GPU's activity windows: which metrics its source delivers now, their risk scores, and
//! nothing older or from another source.
//!
//! * A window belongs to one source; a sample from another source restarts it.
//! * A metric that stops arriving expires after `stale_after` (its window is dropped), so a GPU
//!   never keeps reporting a score nobody measures any more.
//! * Only windows of the *current* source (the source of the latest activity figure) count: when
//!   DCGM stops answering and NVML's fallback takes over, the GPM occupancy window left from the
//!   old source is not combined with NVML's utilization in one gate decision.
//!
//! The gate rule follows from the metrics the current source delivers (see `carma_core::gate`).

use std::time::Duration;

use carma_core::{GateRule, SampleWindow};
use chrono::{DateTime, Utc};

use crate::backends::{Activity, ActivitySource, GpuSample};

/// A window of one activity metric, its source and when it last received a sample.
#[derive(Debug, Clone)]
struct Metric {
    window: SampleWindow,
    source: Option<ActivitySource>,
    last_at: Option<DateTime<Utc>>,
}

impl Metric {
    fn new(capacity: usize) -> Self {
        Self {
            window: SampleWindow::new(capacity),
            source: None,
            last_at: None,
        }
    }

    fn push(&mut self, capacity: usize, a: Option<Activity>, now: DateTime<Utc>, stale: Duration) {
        match a {
            Some(a) => {
                if self.source != Some(a.source) {
                    *self = Self::new(capacity);
                    self.source = Some(a.source);
                }
                self.window.push(a.value);
                self.last_at = Some(now);
            }
            None if !self.fresh(now, stale) && self.source.is_some() => *self = Self::new(capacity),
            None => {}
        }
    }

    fn fresh(&self, now: DateTime<Utc>, stale: Duration) -> bool {
        self.last_at.is_some_and(|at| {
            now.signed_duration_since(at)
                .to_std()
                .map_or(true, |age| age <= stale)
        })
    }

    /// Whether this metric counts for a decision under `current`.
    fn live(&self, current: Option<ActivitySource>, now: DateTime<Utc>, stale: Duration) -> bool {
        current.is_some() && self.source == current && self.fresh(now, stale)
    }
}

/// The risk scores and gate rule of one GPU after a sample.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Risks {
    /// SM activity risk (None until its window filled, or when the source has no such metric).
    pub sm_activity: Option<f64>,
    /// SM occupancy risk.
    pub sm_occupancy: Option<f64>,
    /// DRAM activity risk.
    pub dram_activity: Option<f64>,
    /// The rule the current source's metrics allow.
    pub rule: GateRule,
    /// The source of the figures (None: no activity figure at all).
    pub source: Option<ActivitySource>,
}

/// The three activity windows of one GPU.
#[derive(Debug, Clone)]
pub struct GpuWindows {
    capacity: usize,
    stale_after: Duration,
    current: Option<ActivitySource>,
    sm: Metric,
    occ: Metric,
    dram: Metric,
}

impl GpuWindows {
    /// Windows of `capacity` samples whose metrics expire `stale_after` after their last sample.
    pub fn new(capacity: usize, stale_after: Duration) -> Self {
        Self {
            capacity,
            stale_after,
            current: None,
            sm: Metric::new(capacity),
            occ: Metric::new(capacity),
            dram: Metric::new(capacity),
        }
    }

    /// Add one sample taken at `now`.
    pub fn push(&mut self, s: &GpuSample, now: DateTime<Utc>) {
        if let Some(a) = s.sm_activity.or(s.sm_occupancy).or(s.dram_activity) {
            self.current = Some(a.source);
        }
        let (cap, stale) = (self.capacity, self.stale_after);
        self.sm.push(cap, s.sm_activity, now, stale);
        self.occ.push(cap, s.sm_occupancy, now, stale);
        self.dram.push(cap, s.dram_activity, now, stale);
    }

    /// Risk scores and rule at `now`, from the current source's live windows only.
    pub fn risks(&self, now: DateTime<Utc>) -> Risks {
        let (cur, stale) = (self.current, self.stale_after);
        let live = |m: &Metric| m.live(cur, now, stale);
        let risk = |m: &Metric| if live(m) { m.window.risk() } else { None };
        Risks {
            sm_activity: risk(&self.sm),
            sm_occupancy: risk(&self.occ),
            dram_activity: risk(&self.dram),
            rule: GateRule::for_metrics(live(&self.sm), live(&self.occ), live(&self.dram)),
            source: cur.filter(|_| live(&self.sm) || live(&self.occ) || live(&self.dram)),
        }
    }
}

/// How long a metric that stops arriving still counts: three missed samples, at least 3 s
/// (dcgm-exporter refreshes its figures less often than carma samples). `carma local` uses it too.
pub fn stale_after(interval: Duration) -> Duration {
    (interval * 3).max(Duration::from_secs(3))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backends::GpuSample;

    const SECOND: Duration = Duration::from_secs(1);

    fn at(s: i64) -> DateTime<Utc> {
        DateTime::from_timestamp(1_800_000_000 + s, 0).unwrap()
    }

    fn sample(
        src: ActivitySource,
        sm: Option<f64>,
        occ: Option<f64>,
        dram: Option<f64>,
    ) -> GpuSample {
        let mut s = GpuSample::basic(0, "GPU-0", "m", 1 << 34, 0);
        s.sm_activity = sm.and_then(|v| Activity::new(v, src));
        s.sm_occupancy = occ.and_then(|v| Activity::new(v, src));
        s.dram_activity = dram.and_then(|v| Activity::new(v, src));
        s
    }

    #[test]
    fn nvml_without_gpm_is_judged_on_activity_and_dram() {
        let mut w = GpuWindows::new(3, 3 * SECOND);
        for t in 0..3 {
            w.push(
                &sample(ActivitySource::NvmlUtil, Some(0.5), None, Some(0.2)),
                at(t),
            );
        }
        let r = w.risks(at(2));
        assert_eq!(r.rule, GateRule::SmactDrama);
        assert!(r.sm_activity.is_some() && r.dram_activity.is_some());
        assert_eq!(r.sm_occupancy, None);
    }

    #[test]
    fn a_metric_that_stops_arriving_expires() {
        let mut w = GpuWindows::new(2, 3 * SECOND);
        for t in 0..2 {
            w.push(
                &sample(ActivitySource::Gpm, Some(0.5), Some(0.3), Some(0.2)),
                at(t),
            );
        }
        assert_eq!(w.risks(at(1)).rule, GateRule::SmactSmoccDrama);
        // Occupancy stops arriving: it still counts within `stale_after`, not after.
        w.push(
            &sample(ActivitySource::Gpm, Some(0.5), None, Some(0.2)),
            at(2),
        );
        assert!(w.risks(at(2)).sm_occupancy.is_some());
        for t in 3..6 {
            w.push(
                &sample(ActivitySource::Gpm, Some(0.5), None, Some(0.2)),
                at(t),
            );
        }
        let r = w.risks(at(5));
        assert_eq!(
            r.sm_occupancy, None,
            "a 4 s old occupancy window must not report"
        );
        assert_eq!(r.rule, GateRule::SmactDrama);
        // Everything stops: nothing is reported, and the rule says so.
        let r = w.risks(at(60));
        assert_eq!(
            (r.sm_activity, r.rule, r.source),
            (None, GateRule::NoActivity, None)
        );
    }

    #[test]
    fn a_source_switch_never_mixes_sources() {
        let mut w = GpuWindows::new(2, 30 * SECOND);
        for t in 0..2 {
            w.push(
                &sample(ActivitySource::Gpm, Some(0.9), Some(0.9), Some(0.9)),
                at(t),
            );
        }
        // GPM fails, NVML utilization takes over: the GPM occupancy window (still within
        // `stale_after`) must not join NVML's figures.
        w.push(
            &sample(ActivitySource::NvmlUtil, Some(0.1), None, Some(0.1)),
            at(2),
        );
        let r = w.risks(at(2));
        assert_eq!(r.source, Some(ActivitySource::NvmlUtil));
        assert_eq!(r.sm_occupancy, None);
        assert_eq!(r.rule, GateRule::SmactDrama);
        assert_eq!(
            r.sm_activity, None,
            "NVML's window restarted and is still filling"
        );
        w.push(
            &sample(ActivitySource::NvmlUtil, Some(0.1), None, Some(0.1)),
            at(3),
        );
        let r = w.risks(at(3));
        assert!((r.sm_activity.unwrap() - 0.1).abs() < 1e-9);
    }
}
