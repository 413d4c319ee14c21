//! Reservations that learn: what earlier runs of the same model profile really used.
//!
//! The operator records each finished attempt's observed peak under a fingerprint of its model
//! profile; the extender reads the record when it reserves for the next pod with that
//! fingerprint. This module holds both rules, so that what is recorded and what is reserved
//! from it cannot drift apart:
//!
//! * [`PeakHistory::record`] — how an ended run changes the record;
//! * [`recorded_reservation_mib`] — the reservation an ended run is recorded under;
//! * [`learned_reservation`] — `max(observed peaks) + headroom`, used when it is *lower* than
//!   the estimate, or when the estimate is known to be too small (a run peaked at or crashed
//!   above it); never below the largest peak seen, and always above a reservation under which a
//!   run of the model still ran out of memory.

use serde::{Deserialize, Serialize};

/// What the cluster has seen of one model profile.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PeakHistory {
    /// Runs that completed with an observed peak: the samples a learned reservation rests on.
    pub completed: u32,
    /// The largest per-GPU peak any recorded run reached (completed or crashed), MiB. It never
    /// decreases, so no learned reservation goes below a peak once seen.
    pub max_peak_mib: u64,
    /// The largest per-GPU reservation under which a run still ran out of GPU memory, MiB. A
    /// learned reservation stays above it by the headroom.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub largest_oom_reservation_mib: Option<u64>,
}

/// How a run ended, as the record takes it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RunEnd {
    /// The run completed; `peak_mib` is the largest per-GPU memory telemetry attributed to it.
    Completed {
        /// Observed peak per GPU, MiB (`None` when telemetry never saw the run).
        peak_mib: Option<u64>,
    },
    /// The run crashed out of GPU memory.
    OutOfMemory {
        /// Its reservation per GPU, MiB (`None` for a whole-GPU reservation of unknown size).
        reserved_mib: Option<u64>,
        /// Observed peak per GPU before the crash, MiB.
        peak_mib: Option<u64>,
    },
}

impl PeakHistory {
    /// Fold one ended run into the record. Returns whether anything changed (a completed run
    /// without an observed peak teaches nothing).
    pub fn record(&mut self, end: RunEnd) -> bool {
        let before = *self;
        match end {
            RunEnd::Completed { peak_mib } => {
                if let Some(peak) = peak_mib.filter(|p| *p > 0) {
                    self.completed = self.completed.saturating_add(1);
                    self.max_peak_mib = self.max_peak_mib.max(peak);
                }
            }
            RunEnd::OutOfMemory {
                reserved_mib,
                peak_mib,
            } => {
                if let Some(peak) = peak_mib {
                    self.max_peak_mib = self.max_peak_mib.max(peak);
                }
                if let Some(r) = reserved_mib {
                    self.largest_oom_reservation_mib =
                        Some(self.largest_oom_reservation_mib.map_or(r, |o| o.max(r)));
                }
            }
        }
        *self != before
    }
}

/// The per-GPU reservation an ended run is recorded under: its own, or for an exclusive run the
/// whole memory of its GPUs (`whole_gpu_mib`). A run that held its GPUs whole and still ran out
/// of memory does not fit them at all, whatever was estimated for it.
pub fn recorded_reservation_mib(
    exclusive: bool,
    reserved_mib: Option<u64>,
    whole_gpu_mib: Option<u64>,
) -> Option<u64> {
    if exclusive {
        whole_gpu_mib
    } else {
        reserved_mib
    }
}

/// Tunables of learned reservations.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct HistoryConfig {
    /// Whether the extender reserves from history at all.
    pub enabled: bool,
    /// Headroom above the largest peak, percent of it.
    pub headroom_percent: u32,
    /// Headroom above the largest peak, at least this many MiB (telemetry samples once a
    /// second or less often and can miss a short spike).
    pub headroom_min_mib: u64,
    /// Completed runs with an observed peak needed before history is trusted.
    pub min_samples: u32,
}

impl Default for HistoryConfig {
    fn default() -> Self {
        Self {
            enabled: true,
            headroom_percent: 10,
            headroom_min_mib: 1024,
            min_samples: 1,
        }
    }
}

impl HistoryConfig {
    /// The headroom added above `mib`: `headroom_percent` of it, at least `headroom_min_mib`.
    pub fn headroom(&self, mib: u64) -> u64 {
        let pct = mib
            .saturating_mul(u64::from(self.headroom_percent))
            .div_ceil(100);
        pct.max(self.headroom_min_mib)
    }
}

/// A reservation taken from history instead of the estimate.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LearnedReservation {
    /// Per-GPU reservation, MiB.
    pub mib: u64,
    /// Completed runs it rests on.
    pub samples: u32,
}

/// The reservation history gives for a pod whose estimate is `estimate_mib`, or `None` when
/// the estimate stands.
///
/// The learned figure is `max_peak + headroom(max_peak)`, raised to `oom + headroom(oom)` (at
/// least 1 MiB above `oom`) when a run crashed out of memory under a reservation `oom`. It
/// replaces the estimate in two cases:
///
/// * **the estimate is known to be too small** — a run peaked at or above it, or ran out of
///   memory under a reservation at or above it: the learned figure, however few runs completed
///   (reserving the estimate again would repeat the crash for every new task of the model);
/// * **the estimate is larger than needed** — at least `min_samples` runs completed and the
///   learned figure is lower.
pub fn learned_reservation(
    estimate_mib: u64,
    history: &PeakHistory,
    cfg: &HistoryConfig,
) -> Option<LearnedReservation> {
    if !cfg.enabled {
        return None;
    }
    let peak = history.max_peak_mib;
    let mut mib = (peak > 0).then(|| peak.saturating_add(cfg.headroom(peak)));
    if let Some(oom) = history.largest_oom_reservation_mib {
        let above_oom = oom.saturating_add(cfg.headroom(oom).max(1));
        mib = Some(mib.map_or(above_oom, |m| m.max(above_oom)));
    }
    let mib = mib?;
    let too_small = peak >= estimate_mib
        || history
            .largest_oom_reservation_mib
            .is_some_and(|o| o >= estimate_mib);
    let trusted = history.completed >= cfg.min_samples.max(1) && peak > 0;
    (too_small || (trusted && mib < estimate_mib)).then_some(LearnedReservation {
        mib,
        samples: history.completed,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn completed(peaks: &[u64]) -> PeakHistory {
        let mut h = PeakHistory::default();
        for p in peaks {
            h.record(RunEnd::Completed { peak_mib: Some(*p) });
        }
        h
    }

    #[test]
    fn learns_the_largest_peak_plus_headroom_only_when_lower() {
        let cfg = HistoryConfig::default();
        let h = completed(&[9_000, 12_000, 10_500]);
        assert_eq!(h.completed, 3);
        assert_eq!(h.max_peak_mib, 12_000);
        let l = learned_reservation(24_000, &h, &cfg).unwrap();
        assert_eq!(l.mib, 12_000 + 1_200);
        assert_eq!(l.samples, 3);
        // Not lower than the estimate: the estimate stands.
        assert_eq!(learned_reservation(13_200, &h, &cfg), None);
        // Small peaks get the minimum headroom.
        let small = completed(&[2_000]);
        assert_eq!(learned_reservation(8_192, &small, &cfg).unwrap().mib, 3_024);
    }

    #[test]
    fn too_few_samples_or_disabled_keep_the_estimate() {
        let h = completed(&[4_000]);
        let two = HistoryConfig {
            min_samples: 2,
            ..HistoryConfig::default()
        };
        assert_eq!(learned_reservation(20_000, &h, &two), None);
        let off = HistoryConfig {
            enabled: false,
            ..HistoryConfig::default()
        };
        assert_eq!(learned_reservation(20_000, &h, &off), None);
        assert_eq!(
            learned_reservation(20_000, &PeakHistory::default(), &HistoryConfig::default()),
            None
        );
        // A completed run telemetry never saw teaches nothing.
        let mut unseen = PeakHistory::default();
        assert!(!unseen.record(RunEnd::Completed { peak_mib: None }));
        assert_eq!(unseen, PeakHistory::default());
    }

    #[test]
    fn an_oom_raises_the_floor_and_its_peak_counts() {
        let cfg = HistoryConfig::default();
        let mut h = completed(&[6_000]);
        assert!(h.record(RunEnd::OutOfMemory {
            reserved_mib: Some(9_000),
            peak_mib: Some(8_800),
        }));
        assert_eq!(h.completed, 1, "a crash is not a completed sample");
        assert_eq!(h.max_peak_mib, 8_800);
        assert_eq!(h.largest_oom_reservation_mib, Some(9_000));
        // max(8_800 + 1_024, 9_000 + 1_024)
        assert_eq!(learned_reservation(40_000, &h, &cfg).unwrap().mib, 10_024);
        // A smaller OOM later does not lower the floor.
        h.record(RunEnd::OutOfMemory {
            reserved_mib: Some(5_000),
            peak_mib: None,
        });
        assert_eq!(h.largest_oom_reservation_mib, Some(9_000));
    }

    #[test]
    fn an_estimate_known_to_be_too_small_is_raised() {
        let cfg = HistoryConfig::default();
        // A run crashed at the estimate (8 GiB) and its recovery peaked at 10 GiB: the next task
        // must not start at 8 GiB again.
        let mut h = PeakHistory::default();
        h.record(RunEnd::OutOfMemory {
            reserved_mib: Some(8_192),
            peak_mib: Some(8_100),
        });
        assert_eq!(
            learned_reservation(8_192, &h, &cfg),
            Some(LearnedReservation {
                mib: 8_192 + 1_024,
                samples: 0
            }),
            "one crash at the estimate suffices, no completed run needed"
        );
        h.record(RunEnd::Completed {
            peak_mib: Some(10_240),
        });
        assert_eq!(
            learned_reservation(8_192, &h, &cfg).unwrap().mib,
            10_240 + 1_024
        );
        // A completed run that peaked above the estimate raises it too.
        let over = completed(&[9_000]);
        assert_eq!(learned_reservation(8_192, &over, &cfg).unwrap().mib, 10_024);
        // History that is merely no better than the estimate leaves it alone.
        assert_eq!(learned_reservation(9_500, &over, &cfg), None);
    }

    #[test]
    fn an_exclusive_crash_records_the_whole_gpu() {
        assert_eq!(
            recorded_reservation_mib(true, Some(8_192), Some(40_960)),
            Some(40_960)
        );
        assert_eq!(recorded_reservation_mib(true, None, None), None);
        assert_eq!(
            recorded_reservation_mib(false, Some(8_192), Some(40_960)),
            Some(8_192)
        );
        // Learned from that crash: never the estimate that crashed on a whole GPU again.
        let mut h = PeakHistory::default();
        h.record(RunEnd::OutOfMemory {
            reserved_mib: recorded_reservation_mib(true, Some(8_192), Some(40_960)),
            peak_mib: None,
        });
        assert_eq!(
            learned_reservation(8_192, &h, &HistoryConfig::default())
                .unwrap()
                .mib,
            40_960 + 4_096
        );
    }

    #[test]
    fn zero_headroom_still_stays_above_a_reservation_that_crashed() {
        let cfg = HistoryConfig {
            headroom_percent: 0,
            headroom_min_mib: 0,
            ..HistoryConfig::default()
        };
        let mut h = completed(&[5_000]);
        h.record(RunEnd::OutOfMemory {
            reserved_mib: Some(6_000),
            peak_mib: None,
        });
        assert_eq!(learned_reservation(20_000, &h, &cfg).unwrap().mib, 6_001);
    }

    #[test]
    fn never_below_the_largest_peak_whatever_the_settings() {
        let cfg = HistoryConfig {
            headroom_percent: 0,
            headroom_min_mib: 0,
            ..HistoryConfig::default()
        };
        let h = completed(&[7_000, 3_000]);
        assert_eq!(learned_reservation(9_000, &h, &cfg).unwrap().mib, 7_000);
        assert!(learned_reservation(u64::MAX, &completed(&[u64::MAX - 1]), &cfg).is_some());
    }
}
