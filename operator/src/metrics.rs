//! Prometheus metrics of the operator (prometheus-client). The names are a
//! contract with the dashboards and alert rules:
//!
//! | metric | type | labels |
//! |---|---|---|
//! | `carma_operator_tasks` | gauge | `phase` (`Pending`, `Running`, `Recovering`, `Succeeded`, `Failed`) |
//! | `carma_operator_attempts_total` | counter | `outcome` (`Succeeded`, `GpuOutOfMemory`, `Failed`, `Evicted`, `HostOOMKilled`) |
//! | `carma_operator_oom_recoveries_total` | counter | — recovery attempts created after a GPU OOM crash |
//! | `carma_operator_expected_duration_exceeded_total` | counter | — attempts that ran longer than their task's `expectedDurationSeconds` |
//! | `carma_operator_recovery_duration_seconds` | histogram | — from the OOM crash to the next attempt running |
//! | `carma_operator_reconcile_errors_total` | counter | `kind` (see [`crate::Error::kind`]) |
//! | `carma_operator_leader` | gauge | — 1 while this replica leads |
//! | `carma_operator_attempt_peak_ratio` | histogram | `source` — observed peak ÷ reservation per GPU of attempts that succeeded or ran out of GPU memory |
//! | `carma_operator_underestimates_total` | counter | `source` — such attempts that ran out of GPU memory or peaked above their reservation |
//! | `carma_operator_history_writes_total` | counter | `result` (`added`, `unchanged`, `error`) — `MemoryHistory` samples |

use std::sync::atomic::AtomicI64;
use std::time::Duration;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;

use carma_api::{AttemptOutcomeKind, TaskPhase};

use crate::plan::Observation;

/// Every phase, in lifecycle order.
pub const PHASES: [TaskPhase; 5] = [
    TaskPhase::Pending,
    TaskPhase::Running,
    TaskPhase::Recovering,
    TaskPhase::Succeeded,
    TaskPhase::Failed,
];

/// Buckets of the recovery duration (seconds): from seconds to an hour.
const RECOVERY_BUCKETS: [f64; 12] = [
    1.0, 5.0, 10.0, 20.0, 30.0, 60.0, 120.0, 300.0, 600.0, 1200.0, 1800.0, 3600.0,
];

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct PhaseLabels {
    phase: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct OutcomeLabels {
    outcome: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct KindLabels {
    kind: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct SourceLabels {
    source: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ResultLabels {
    result: String,
}

/// Buckets of peak ÷ reservation: well under, near, and over 1 (an underestimate).
const PEAK_RATIO_BUCKETS: [f64; 11] = [0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 1.0, 1.25];

/// Every reservation source an attempt can report, created at zero so that `increase()` sees the
/// first underestimate of each: the estimator's sources, then the extender's own (`history`,
/// `override`, `whole-gpu`) and `unknown` (an attempt that ended before it was bound).
const SOURCES: [&str; 10] = [
    "traced",
    "gpumemnet-mlp",
    "gpumemnet-cnn",
    "gpumemnet-transformer",
    "analytic-upper-bound",
    "analytic-fallback",
    "history",
    "override",
    "whole-gpu",
    "unknown",
];

/// The operator's metrics and their registry.
#[derive(Debug)]
pub struct Metrics {
    registry: Registry,
    tasks: Family<PhaseLabels, Gauge>,
    attempts: Family<OutcomeLabels, Counter>,
    oom_recoveries: Counter,
    expected_duration_exceeded: Counter,
    recovery_duration: Histogram,
    reconcile_errors: Family<KindLabels, Counter>,
    leader: Gauge<i64, AtomicI64>,
    peak_ratio: Family<SourceLabels, Histogram>,
    underestimates: Family<SourceLabels, Counter>,
    history_writes: Family<ResultLabels, Counter>,
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

impl Metrics {
    /// Register every metric (each label value starts at zero, so dashboards see
    /// a series before the first event).
    pub fn new() -> Self {
        let mut registry = Registry::default();
        let tasks = Family::<PhaseLabels, Gauge>::default();
        let attempts = Family::<OutcomeLabels, Counter>::default();
        let oom_recoveries = Counter::default();
        let expected_duration_exceeded = Counter::default();
        let recovery_duration = Histogram::new(RECOVERY_BUCKETS);
        let reconcile_errors = Family::<KindLabels, Counter>::default();
        let leader = Gauge::<i64, AtomicI64>::default();
        let peak_ratio = Family::<SourceLabels, Histogram>::new_with_constructor(
            (|| Histogram::new(PEAK_RATIO_BUCKETS)) as fn() -> Histogram,
        );
        let underestimates = Family::<SourceLabels, Counter>::default();
        let history_writes = Family::<ResultLabels, Counter>::default();
        registry.register(
            "carma_operator_attempt_peak_ratio",
            "Observed GPU memory peak divided by the reservation, per GPU, of attempts that succeeded or ran out of GPU memory, by reservation source",
            peak_ratio.clone(),
        );
        registry.register(
            "carma_operator_underestimates",
            "Attempts that ran out of GPU memory or peaked above their reservation, by reservation source",
            underestimates.clone(),
        );
        registry.register(
            "carma_operator_history_writes",
            "MemoryHistory samples written, by result",
            history_writes.clone(),
        );
        for source in SOURCES {
            let labels = SourceLabels {
                source: source.to_string(),
            };
            underestimates.get_or_create(&labels).inc_by(0);
            let _ = peak_ratio.get_or_create(&labels);
        }
        for result in ["added", "unchanged", "error"] {
            history_writes
                .get_or_create(&ResultLabels {
                    result: result.to_string(),
                })
                .inc_by(0);
        }
        registry.register(
            "carma_operator_tasks",
            "TrainingTasks by phase",
            tasks.clone(),
        );
        registry.register(
            "carma_operator_attempts",
            "Attempts ended, by outcome",
            attempts.clone(),
        );
        registry.register(
            "carma_operator_oom_recoveries",
            "Recovery attempts created after a GPU out-of-memory crash",
            oom_recoveries.clone(),
        );
        registry.register(
            "carma_operator_expected_duration_exceeded",
            "Attempts that ran longer than their task's expectedDurationSeconds",
            expected_duration_exceeded.clone(),
        );
        registry.register(
            "carma_operator_recovery_duration_seconds",
            "Time from a GPU out-of-memory crash to the next attempt running",
            recovery_duration.clone(),
        );
        registry.register(
            "carma_operator_reconcile_errors",
            "Failed reconciles, by error kind",
            reconcile_errors.clone(),
        );
        registry.register(
            "carma_operator_leader",
            "1 while this replica holds the leader lease",
            leader.clone(),
        );
        for phase in PHASES {
            tasks
                .get_or_create(&PhaseLabels {
                    phase: phase.as_str().to_string(),
                })
                .set(0);
        }
        for outcome in [
            AttemptOutcomeKind::Succeeded,
            AttemptOutcomeKind::GpuOutOfMemory,
            AttemptOutcomeKind::Failed,
            AttemptOutcomeKind::Evicted,
            AttemptOutcomeKind::HostOomKilled,
        ] {
            attempts
                .get_or_create(&OutcomeLabels {
                    outcome: outcome_label(outcome).to_string(),
                })
                .inc_by(0);
        }
        Self {
            registry,
            tasks,
            attempts,
            oom_recoveries,
            expected_duration_exceeded,
            recovery_duration,
            reconcile_errors,
            leader,
            peak_ratio,
            underestimates,
            history_writes,
        }
    }

    /// Set the task gauge from counts per phase (phases absent count zero).
    pub fn set_tasks(&self, counts: &[(TaskPhase, i64)]) {
        for phase in PHASES {
            let n = counts
                .iter()
                .filter(|(p, _)| *p == phase)
                .map(|(_, n)| *n)
                .sum();
            self.tasks
                .get_or_create(&PhaseLabels {
                    phase: phase.as_str().to_string(),
                })
                .set(n);
        }
    }

    /// Record what a reconcile step did.
    pub fn observe(&self, observation: &Observation) {
        match observation {
            Observation::AttemptFinished(kind) => {
                self.attempts
                    .get_or_create(&OutcomeLabels {
                        outcome: outcome_label(*kind).to_string(),
                    })
                    .inc();
            }
            Observation::OomRecoveryStarted => {
                self.oom_recoveries.inc();
            }
            Observation::ExpectedDurationExceeded => {
                self.expected_duration_exceeded.inc();
            }
            Observation::RecoveryDuration(d) => self.observe_recovery(*d),
            Observation::AttemptMemory {
                source,
                reserved_mib,
                peak_mib,
                out_of_memory,
            } => {
                let labels = SourceLabels {
                    source: source.clone(),
                };
                if let (Some(r), Some(p)) = (reserved_mib, peak_mib)
                    && *r > 0
                {
                    self.peak_ratio
                        .get_or_create(&labels)
                        .observe(*p as f64 / *r as f64);
                }
                let over = matches!((reserved_mib, peak_mib), (Some(r), Some(p)) if p > r);
                if *out_of_memory || over {
                    self.underestimates.get_or_create(&labels).inc();
                }
            }
        }
    }

    /// Count a `MemoryHistory` write by `result`.
    pub fn history_write(&self, result: &str) {
        self.history_writes
            .get_or_create(&ResultLabels {
                result: result.to_string(),
            })
            .inc();
    }

    fn observe_recovery(&self, d: Duration) {
        self.recovery_duration.observe(d.as_secs_f64());
    }

    /// Count a failed reconcile.
    pub fn reconcile_error(&self, kind: &str) {
        self.reconcile_errors
            .get_or_create(&KindLabels {
                kind: kind.to_string(),
            })
            .inc();
    }

    /// Whether this replica leads.
    pub fn set_leader(&self, leading: bool) {
        self.leader.set(i64::from(leading));
    }

    /// The OpenMetrics text exposition.
    pub fn encode(&self) -> String {
        let mut out = String::new();
        if let Err(e) = prometheus_client::encoding::text::encode(&mut out, &self.registry) {
            tracing::warn!(error = %e, "encoding metrics failed");
        }
        out
    }
}

/// The `outcome` label value of an attempt outcome (the status enum's name).
pub fn outcome_label(kind: AttemptOutcomeKind) -> &'static str {
    match kind {
        AttemptOutcomeKind::Succeeded => "Succeeded",
        AttemptOutcomeKind::GpuOutOfMemory => "GpuOutOfMemory",
        AttemptOutcomeKind::Failed => "Failed",
        AttemptOutcomeKind::Evicted => "Evicted",
        AttemptOutcomeKind::HostOomKilled => "HostOOMKilled",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_estimator_source_starts_at_zero() {
        use carma_estimator::EstimateSource as S;
        // A new source fails to compile here until it is listed (and then must be in SOURCES).
        let listed = |s: S| match s {
            S::GpumemnetMlp
            | S::GpumemnetCnn
            | S::GpumemnetTransformer
            | S::AnalyticUpperBound
            | S::Traced
            | S::AnalyticFallback => s,
        };
        for source in [
            S::GpumemnetMlp,
            S::GpumemnetCnn,
            S::GpumemnetTransformer,
            S::AnalyticUpperBound,
            S::Traced,
            S::AnalyticFallback,
        ]
        .map(listed)
        {
            assert!(SOURCES.contains(&source.as_str()), "{source}");
        }
        let text = Metrics::new().encode();
        for source in SOURCES {
            assert!(
                text.contains(&format!(
                    "carma_operator_underestimates_total{{source=\"{source}\"}} 0"
                )),
                "{source}: {text}"
            );
        }
    }

    #[test]
    fn exact_names_and_labels() {
        let m = Metrics::new();
        m.set_tasks(&[(TaskPhase::Running, 2), (TaskPhase::Failed, 1)]);
        m.observe(&Observation::AttemptFinished(
            AttemptOutcomeKind::GpuOutOfMemory,
        ));
        m.observe(&Observation::OomRecoveryStarted);
        m.observe(&Observation::ExpectedDurationExceeded);
        m.observe(&Observation::RecoveryDuration(Duration::from_secs(42)));
        m.reconcile_error("conflict");
        m.set_leader(true);
        let text = m.encode();
        for line in [
            "carma_operator_tasks{phase=\"Running\"} 2",
            "carma_operator_tasks{phase=\"Failed\"} 1",
            "carma_operator_tasks{phase=\"Pending\"} 0",
            "carma_operator_attempts_total{outcome=\"GpuOutOfMemory\"} 1",
            "carma_operator_attempts_total{outcome=\"Succeeded\"} 0",
            "carma_operator_attempts_total{outcome=\"HostOOMKilled\"} 0",
            "carma_operator_oom_recoveries_total 1",
            "carma_operator_expected_duration_exceeded_total 1",
            "carma_operator_recovery_duration_seconds_count 1",
            "carma_operator_recovery_duration_seconds_sum 42.0",
            "carma_operator_recovery_duration_seconds_bucket{le=\"60.0\"} 1",
            "carma_operator_reconcile_errors_total{kind=\"conflict\"} 1",
            "carma_operator_leader 1",
            "# TYPE carma_operator_tasks gauge",
            "# TYPE carma_operator_attempts counter",
            "# TYPE carma_operator_recovery_duration_seconds histogram",
        ] {
            assert!(
                text.lines().any(|l| l == line),
                "missing {line:?} in\n{text}"
            );
        }
    }
}
