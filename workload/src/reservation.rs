//! Where each task's first reservation comes from (`--estimator`).
//!
//! | source | reservation | as in |
//! |---|---|---|
//! | `gpumemnet` | `carma_estimator::Estimator` on the task's model profile (GPUMemNet class upper edge, or the analytic upper bound for families without a trained model) | the extender |
//! | `oracle` | the true peak | CARMA's oracle runs |
//! | `recorded` | the GPUMemNet estimate in the task's `.rad` file (line 11) | CARMA's GPUMemNet runs |
//! | `none` | `Reservation::Unknown` (share when 5120 MiB are free) | CARMA's OR-MAGM / OR-LUG |
//!
//! A task without a profile or recorded estimate gets a whole GPU, as carma does
//! for a pod without an estimate (its first reservation is the `carma.io/gpu-memory`
//! override, else the estimate, else the whole GPU); so does any reservation that cannot
//! fit beside another job on the simulated GPU.

use std::collections::HashMap;
use std::convert::Infallible;
use std::fmt;
use std::str::FromStr;

use carma_core::{FirstReservation, Reservation, first_reservation};
use carma_estimator::Estimator;
use serde::Serialize;

use crate::error::SimError;
use crate::task::Task;

/// The reservation sources.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum EstimatorKind {
    /// carma's estimator (GPUMemNet).
    Gpumemnet,
    /// The true peak.
    Oracle,
    /// The GPUMemNet estimate recorded in CARMA's task files.
    Recorded,
    /// No estimate (CARMA's OR-* rule).
    None,
}

impl EstimatorKind {
    /// Every source.
    pub const ALL: [EstimatorKind; 4] = [
        EstimatorKind::Gpumemnet,
        EstimatorKind::Oracle,
        EstimatorKind::Recorded,
        EstimatorKind::None,
    ];

    /// The flag value.
    pub fn as_str(self) -> &'static str {
        match self {
            EstimatorKind::Gpumemnet => "gpumemnet",
            EstimatorKind::Oracle => "oracle",
            EstimatorKind::Recorded => "recorded",
            EstimatorKind::None => "none",
        }
    }
}

impl fmt::Display for EstimatorKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for EstimatorKind {
    type Err = SimError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        EstimatorKind::ALL
            .into_iter()
            .find(|k| k.as_str() == s.trim().to_ascii_lowercase())
            .ok_or_else(|| {
                SimError::Config(format!(
                    "unknown estimator {s:?}: expected gpumemnet, oracle, recorded or none"
                ))
            })
    }
}

/// The first reservation of every task, with how it was obtained.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ReservationPlan {
    /// Source.
    pub kind: EstimatorKind,
    /// One per task, in trace order.
    pub reservations: Vec<Reservation>,
    /// Tasks that fell back to a whole GPU because the source had nothing for them.
    pub fallbacks: usize,
    /// Tasks whose reservation is below their true peak (they may crash when sharing).
    pub underestimates: usize,
    /// Tasks that take whole GPUs under carma-core's rule (`placement::takes_whole`): no
    /// estimate, or one of the GPU's whole memory or more. A cluster does the same with them.
    pub whole_gpu: usize,
    /// How many tasks each estimate source (e.g. `gpumemnet-mlp`) served.
    pub sources: Vec<(String, usize)>,
}

/// Compute every task's first reservation from `kind` for GPUs of `gpu_memory_mib`.
pub fn plan(
    tasks: &[Task],
    kind: EstimatorKind,
    gpu_memory_mib: u64,
) -> Result<ReservationPlan, SimError> {
    let estimator = match kind {
        EstimatorKind::Gpumemnet => {
            Some(Estimator::new().map_err(|e| SimError::Estimator(e.to_string()))?)
        }
        _ => None,
    };
    let mut cache: HashMap<(&'static str, u32), Option<(u64, String)>> = HashMap::new();
    let mut sources: HashMap<String, usize> = HashMap::new();
    let mut fallbacks = 0;
    let mut reservations = Vec::with_capacity(tasks.len());
    for task in tasks {
        let estimate = || {
            let mib = match kind {
                EstimatorKind::Oracle => Some(task.peak_mib),
                EstimatorKind::Recorded => task.recorded_mib,
                EstimatorKind::None => None,
                EstimatorKind::Gpumemnet => {
                    let est = estimator.as_ref().expect("estimator loaded for gpumemnet");
                    task.workload.and_then(|w| {
                        let key = (w.key, w.batch_size);
                        let entry = cache.entry(key).or_insert_with(|| {
                            match est.estimate(&w.arch.profile(w.batch_size)) {
                                Ok(e) => Some((e.mib, e.source.as_str().to_string())),
                                Err(e) => {
                                    tracing::warn!(workload = w.key, error = %e, "estimate failed; whole GPU");
                                    None
                                }
                            }
                        });
                        entry.as_ref().map(|(mib, source)| {
                            *sources.entry(source.clone()).or_default() += 1;
                            *mib
                        })
                    })
                }
            };
            Ok::<_, Infallible>(mib.map(|mib| (mib, ())))
        };
        let r = if kind == EstimatorKind::None {
            // CARMA's OR-* rule, outside carma's order: no estimate, yet the task may share.
            Reservation::Unknown
        } else {
            // A trace has no overrides; history is learned as the run goes (`engine::learn`).
            let Ok(first) = first_reservation(None, estimate, |_| None);
            fallbacks += usize::from(first == FirstReservation::WholeGpu);
            first.reservation()
        };
        reservations.push(r);
    }
    let underestimates = tasks
        .iter()
        .zip(&reservations)
        .filter(|(t, r)| matches!(r, Reservation::Mib(m) if *m < t.peak_mib))
        .count();
    let mut sources: Vec<(String, usize)> = sources.into_iter().collect();
    sources.sort();
    let whole_gpu = reservations
        .iter()
        .filter(|r| match r {
            Reservation::WholeGpu => true,
            Reservation::Mib(m) => *m >= gpu_memory_mib,
            Reservation::Unknown => false,
        })
        .count();
    Ok(ReservationPlan {
        kind,
        reservations,
        fallbacks,
        underestimates,
        whole_gpu,
        sources,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::catalog;

    fn task(key: &str) -> Task {
        Task::from_workload(0, catalog::by_key(key).unwrap(), 0)
    }

    #[test]
    fn oracle_recorded_none() {
        let tasks = vec![task("resnet50-b128"), task("gpt2_large-b8")];
        let o = plan(&tasks, EstimatorKind::Oracle, 40_960).unwrap();
        assert_eq!(o.reservations[0], Reservation::Mib(13236));
        let r = plan(&tasks, EstimatorKind::Recorded, 40_960).unwrap();
        assert_eq!(
            r.reservations,
            vec![Reservation::Mib(24000), Reservation::WholeGpu]
        );
        assert_eq!(r.fallbacks, 1);
        let n = plan(&tasks, EstimatorKind::None, 40_960).unwrap();
        assert!(n.reservations.iter().all(|r| *r == Reservation::Unknown));
    }

    #[test]
    fn gpumemnet_estimates_every_catalog_workload() {
        let tasks: Vec<Task> = catalog::CATALOG
            .iter()
            .enumerate()
            .map(|(i, w)| Task::from_workload(i, w, 0))
            .collect();
        let p = plan(&tasks, EstimatorKind::Gpumemnet, 40_960).unwrap();
        assert_eq!(p.fallbacks, 0);
        assert_eq!(p.sources.iter().map(|(_, n)| n).sum::<usize>(), tasks.len());
    }

    #[test]
    fn parse_names() {
        assert_eq!(
            "Oracle".parse::<EstimatorKind>().unwrap(),
            EstimatorKind::Oracle
        );
        assert!("horus".parse::<EstimatorKind>().is_err());
    }
}
