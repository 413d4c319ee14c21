//! A Philly-like trace generator.
//!
//! * **Inter-arrival gaps** are drawn from the empirical distribution of the 89
//!   gaps of CARMA's `philly_mix-90-tasks` trace (taken from the Microsoft Philly
//!   trace, 2017-12-20): its deciles and 95th percentile, interpolated linearly
//!   (median 88 s, mean ≈ 140 s, maximum 589 s). CARMA replayed them on one
//!   4-GPU server; for a cluster of `G` GPUs the gaps are multiplied by
//!   `4 / (G · load)`, so every GPU sees the same pressure as CARMA's at `load` 1.
//! * **Job mix**: light / medium / heavy with probabilities 0.65 / 0.27 / 0.08
//!   (CARMA's mixes), then a uniformly chosen catalog workload of that class.
//! * The first task arrives at 0. Same seed, same trace.

use carma_core::Millis;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use crate::catalog::{CATALOG, SizeClass, Workload};
use crate::config::MAX_TASKS;
use crate::error::SimError;
use crate::task::Task;
use crate::trace::Trace;

/// (quantile, gap in seconds) knots of CARMA's Philly-derived gaps.
const GAP_QUANTILES: [(f64, f64); 12] = [
    (0.0, 0.0),
    (0.1, 4.0),
    (0.2, 19.0),
    (0.3, 43.0),
    (0.4, 60.0),
    (0.5, 88.0),
    (0.6, 126.0),
    (0.7, 197.0),
    (0.8, 257.0),
    (0.9, 313.0),
    (0.95, 394.0),
    (1.0, 589.0),
];

/// Range of `load`: 1/100 to 100 times CARMA's pressure per GPU. Outside it the
/// gaps are all zero or so long that the trace is a series of lone jobs; the
/// bound also keeps arrival times (589 s × 4 / load per gap) far from overflow.
pub const LOAD_RANGE: (f64, f64) = (0.01, 100.0);

/// GPUs of the server CARMA's gaps were replayed on.
const CARMA_GPUS: f64 = 4.0;

/// What to generate.
#[derive(Debug, Clone, PartialEq)]
pub struct GeneratorConfig {
    /// Number of tasks.
    pub tasks: usize,
    /// Random seed.
    pub seed: u64,
    /// GPUs of the simulated cluster (scales the gaps).
    pub cluster_gpus: u32,
    /// Arrival pressure relative to CARMA's trace (1 = the same per GPU).
    pub load: f64,
    /// Probabilities of light, medium and heavy jobs.
    pub mix: [f64; 3],
}

impl Default for GeneratorConfig {
    fn default() -> Self {
        Self {
            tasks: 90,
            seed: 1,
            cluster_gpus: 4,
            load: 1.0,
            mix: [0.65, 0.27, 0.08],
        }
    }
}

/// A gap in seconds for a uniform draw `u` in 0..1 (inverse empirical CDF).
pub fn gap_s(u: f64) -> f64 {
    let u = u.clamp(0.0, 1.0);
    for pair in GAP_QUANTILES.windows(2) {
        let ((q0, g0), (q1, g1)) = (pair[0], pair[1]);
        if u <= q1 {
            return g0 + (g1 - g0) * (u - q0) / (q1 - q0);
        }
    }
    GAP_QUANTILES[GAP_QUANTILES.len() - 1].1
}

/// Generate a trace.
pub fn generate(cfg: &GeneratorConfig) -> Result<Trace, SimError> {
    if !(1..=MAX_TASKS).contains(&cfg.tasks) {
        return Err(SimError::Config(format!(
            "--tasks is {}; it must be between 1 and {MAX_TASKS}",
            cfg.tasks
        )));
    }
    let (lo, hi) = LOAD_RANGE;
    if !(cfg.load.is_finite() && (lo..=hi).contains(&cfg.load)) {
        return Err(SimError::Config(format!(
            "--load is {:?}; it must be between {lo} and {hi}",
            cfg.load
        )));
    }
    if cfg.cluster_gpus == 0 {
        return Err(SimError::Config("the cluster has no GPU".into()));
    }
    let weights_ok =
        cfg.mix.iter().all(|w| w.is_finite() && *w >= 0.0) && cfg.mix.iter().sum::<f64>() > 0.0;
    if !weights_ok {
        return Err(SimError::Config(format!(
            "job mix {:?} must be non-negative and not all zero",
            cfg.mix
        )));
    }
    let classes = [SizeClass::Light, SizeClass::Medium, SizeClass::Heavy];
    let pools: Vec<Vec<&'static Workload>> = classes
        .iter()
        .map(|c| CATALOG.iter().filter(|w| w.size == *c).collect())
        .collect();
    let total: f64 = cfg.mix.iter().sum();
    let scale = CARMA_GPUS / (cfg.cluster_gpus as f64 * cfg.load);
    let mut rng = StdRng::seed_from_u64(cfg.seed);
    let mut now_ms: Millis = 0;
    let mut tasks = Vec::with_capacity(cfg.tasks);
    for id in 0..cfg.tasks {
        if id > 0 {
            now_ms += (gap_s(rng.random::<f64>()) * scale * 1000.0).round() as Millis;
        }
        let mut pick = rng.random::<f64>() * total;
        let mut class = 2;
        for (i, w) in cfg.mix.iter().enumerate() {
            if pick < *w {
                class = i;
                break;
            }
            pick -= w;
        }
        let pool = &pools[class];
        let w = pool[rng.random_range(0..pool.len())];
        tasks.push(Task::from_workload(id, w, now_ms));
    }
    let [l, m, h] = cfg.mix.map(|w| (w / total * 100.0).round());
    let gaps = if (scale - 1.0).abs() < 1e-9 {
        "Philly gaps".to_string()
    } else {
        format!("Philly gaps ×{scale:.3}")
    };
    Ok(Trace {
        description: format!(
            "{} generated tasks (seed {}; {l}/{m}/{h} % light/medium/heavy; {gaps})",
            cfg.tasks, cfg.seed
        ),
        tasks,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gap_distribution_matches_the_knots() {
        assert_eq!(gap_s(0.0), 0.0);
        assert_eq!(gap_s(0.5), 88.0);
        assert_eq!(gap_s(1.0), 589.0);
        let mean: f64 = (0..10_000)
            .map(|i| gap_s((i as f64 + 0.5) / 10_000.0))
            .sum::<f64>()
            / 10_000.0;
        assert!((120.0..160.0).contains(&mean), "{mean}");
    }

    #[test]
    fn same_seed_same_trace_and_the_mix_holds() {
        let cfg = GeneratorConfig {
            tasks: 2000,
            ..GeneratorConfig::default()
        };
        let a = generate(&cfg).unwrap();
        let b = generate(&cfg).unwrap();
        assert_eq!(a.tasks, b.tasks);
        let light = a
            .tasks
            .iter()
            .filter(|t| t.size == SizeClass::Light)
            .count() as f64
            / 2000.0;
        let heavy = a
            .tasks
            .iter()
            .filter(|t| t.size == SizeClass::Heavy)
            .count() as f64
            / 2000.0;
        assert!((0.60..0.70).contains(&light), "{light}");
        assert!((0.05..0.11).contains(&heavy), "{heavy}");
        assert!(
            a.tasks
                .windows(2)
                .all(|w| w[0].arrival_ms <= w[1].arrival_ms)
        );
        let other = generate(&GeneratorConfig { seed: 2, ..cfg }).unwrap();
        assert_ne!(a.tasks, other.tasks);
    }

    #[test]
    fn gaps_shrink_with_cluster_size() {
        let small = generate(&GeneratorConfig::default()).unwrap();
        let big = generate(&GeneratorConfig {
            cluster_gpus: 40,
            ..GeneratorConfig::default()
        })
        .unwrap();
        let last = |t: &Trace| t.tasks.last().unwrap().arrival_ms;
        assert!(last(&big) * 9 < last(&small) && last(&big) * 11 > last(&small));
    }
}
