//! `telemetry.jsonl` read back: per-GPU averages over a time window and timelines.

use std::collections::BTreeMap;
use std::fs;
use std::path::Path;

use carma_workload::result::{GpuPoint, GpuTimeline};
use serde::Deserialize;

use crate::error::{LocalError, Result};

#[derive(Debug, Clone, Deserialize)]
struct Line {
    t_ms: u64,
    gpus: Vec<GpuLine>,
}

#[derive(Debug, Clone, Deserialize)]
struct GpuLine {
    index: u32,
    total_mib: u64,
    used_mib: u64,
    reserved_mib: u64,
    sm_activity: Option<f64>,
    energy_j: Option<f64>,
    jobs: usize,
}

/// One GPU over a time window.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct GpuTotals {
    /// GPU index.
    pub index: u32,
    /// Memory, MiB.
    pub total_mib: u64,
    /// Highest used memory seen, MiB.
    pub peak_used_mib: u64,
    /// Mean SM activity (samples, 0..1).
    pub sm_activity_mean: f64,
    /// Energy counter increase, J.
    pub energy_j: f64,
    /// Samples.
    pub samples: usize,
}

/// Totals so far, SM activity sum and count, lowest and highest energy counter.
type Accumulator = (GpuTotals, f64, usize, Option<(f64, f64)>);

/// Every sample the daemon wrote.
#[derive(Debug, Clone, Default)]
pub(super) struct Samples(Vec<Line>);

/// Averages over all GPUs and a time window.
#[derive(Debug, Clone, Copy, Default)]
pub(super) struct Averages {
    pub sm_activity: f64,
    pub memory_used: f64,
    pub energy_j: f64,
}

impl Samples {
    /// Read `path`; a missing file is no samples, a torn line is skipped.
    pub(super) fn read(path: &Path) -> Result<Self> {
        let text = match fs::read_to_string(path) {
            Ok(t) => t,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Self::default()),
            Err(e) => return Err(LocalError::io(path, e)),
        };
        Ok(Self(
            text.lines()
                .filter_map(|l| serde_json::from_str::<Line>(l).ok())
                .collect(),
        ))
    }

    pub(super) fn len(&self) -> usize {
        self.0.len()
    }

    /// Mean SM activity and memory use over samples in `[from, to]` and GPUs; energy the sum over
    /// GPUs of the counter's increase in the window.
    pub(super) fn averages(&self, from: u64, to: u64) -> Averages {
        let inside: Vec<&Line> = self
            .0
            .iter()
            .filter(|l| l.t_ms >= from && l.t_ms <= to)
            .collect();
        let mut sm = Vec::new();
        let mut mem = Vec::new();
        let mut energy: BTreeMap<u32, (f64, f64)> = BTreeMap::new();
        for l in &inside {
            for g in &l.gpus {
                if let Some(s) = g.sm_activity {
                    sm.push(s);
                }
                if g.total_mib > 0 {
                    mem.push(g.used_mib as f64 / g.total_mib as f64);
                }
                if let Some(e) = g.energy_j {
                    let entry = energy.entry(g.index).or_insert((e, e));
                    entry.0 = entry.0.min(e);
                    entry.1 = entry.1.max(e);
                }
            }
        }
        let avg = |v: &[f64]| {
            if v.is_empty() {
                0.0
            } else {
                v.iter().sum::<f64>() / v.len() as f64
            }
        };
        Averages {
            sm_activity: avg(&sm),
            memory_used: avg(&mem),
            // `+ 0.0`: an empty f64 sum is −0.0, which would print as such.
            energy_j: energy.values().map(|(lo, hi)| hi - lo).sum::<f64>() + 0.0,
        }
    }

    /// Per-GPU totals over samples in `[from, to]`.
    pub(super) fn per_gpu(&self, from: u64, to: u64) -> Vec<GpuTotals> {
        let mut by: BTreeMap<u32, Accumulator> = BTreeMap::new();
        for l in self.0.iter().filter(|l| l.t_ms >= from && l.t_ms <= to) {
            for g in &l.gpus {
                let (t, sm_sum, sm_n, energy) = by.entry(g.index).or_insert_with(|| {
                    let t = GpuTotals {
                        index: g.index,
                        total_mib: g.total_mib,
                        peak_used_mib: 0,
                        sm_activity_mean: 0.0,
                        energy_j: 0.0,
                        samples: 0,
                    };
                    (t, 0.0, 0, None)
                });
                t.samples += 1;
                t.peak_used_mib = t.peak_used_mib.max(g.used_mib);
                if let Some(v) = g.sm_activity {
                    *sm_sum += v;
                    *sm_n += 1;
                }
                if let Some(e) = g.energy_j {
                    let (lo, hi) = energy.get_or_insert((e, e));
                    *lo = lo.min(e);
                    *hi = hi.max(e);
                }
            }
        }
        by.into_values()
            .map(|(mut t, sm_sum, sm_n, energy)| {
                t.sm_activity_mean = if sm_n > 0 { sm_sum / sm_n as f64 } else { 0.0 };
                t.energy_j = energy.map_or(0.0, |(lo, hi)| hi - lo);
                t
            })
            .collect()
    }

    /// One timeline per GPU, times relative to `t0`.
    pub(super) fn timelines(&self, t0: u64) -> Vec<GpuTimeline> {
        let mut by: BTreeMap<u32, GpuTimeline> = BTreeMap::new();
        for l in &self.0 {
            for g in &l.gpus {
                let t = by.entry(g.index).or_insert_with(|| GpuTimeline {
                    node: "local".to_string(),
                    index: g.index,
                    total_mib: g.total_mib,
                    points: Vec::new(),
                });
                t.points.push(GpuPoint {
                    t_ms: l.t_ms.saturating_sub(t0),
                    mem_used_mib: g.used_mib,
                    reserved_mib: g.reserved_mib,
                    sm_activity: g.sm_activity.unwrap_or(0.0),
                    tasks: g.jobs as u32,
                });
            }
        }
        by.into_values().collect()
    }
}
