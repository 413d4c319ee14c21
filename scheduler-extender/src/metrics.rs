//! Prometheus metrics of the extender (prometheus-client, OpenMetrics text).
//!
//! | name | type | labels |
//! |---|---|---|
//! | `carma_extender_requests_total` | counter | `verb`, `outcome` (`success`, `error`, `bad-request`; for `mutate-pods`: `claimed`, `unchanged`, `refused`, `bad-request`) |
//! | `carma_extender_request_duration_seconds` | histogram | `verb` |
//! | `carma_extender_rejections_total` | counter | `reason` (`NodeRejection::code()`, or `invalid-annotation`) |
//! | `carma_extender_reservations_total` | counter | `source` (`override`, `traced`, `gpumemnet-mlp`, `analytic-upper-bound`, `history`, `whole-gpu`, …) |
//! | `carma_extender_placements_in_flight` | gauge | — |
//! | `carma_extender_binds_total` | counter | `result` (`bound`, `recorded`, `conflict`, `error`) |

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;

/// Labels of the request counter.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct RequestLabels {
    /// `filter`, `prioritize` or `bind`.
    pub verb: &'static str,
    /// `success`, `error` (the answer's `Error` is set) or `bad-request` (HTTP 400).
    pub outcome: &'static str,
}

/// Labels of the latency histogram.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct VerbLabels {
    /// `filter`, `prioritize` or `bind`.
    pub verb: &'static str,
}

/// Labels of the rejection counter.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ReasonLabels {
    /// Rejection code.
    pub reason: &'static str,
}

/// Labels of the reservation counter.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct SourceLabels {
    /// Where the reservation came from.
    pub source: String,
}

/// Labels of the bind counter.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ResultLabels {
    /// `bound`, `recorded` (dry run), `conflict` (lost race / no longer fits), `error`.
    pub result: &'static str,
}

/// Every metric of the extender and the registry they are encoded from.
#[derive(Debug)]
pub struct Metrics {
    registry: Registry,
    /// Requests by verb and outcome.
    pub requests: Family<RequestLabels, Counter>,
    /// Request latency by verb.
    pub duration: Family<VerbLabels, Histogram>,
    /// Node rejections by reason.
    pub rejections: Family<ReasonLabels, Counter>,
    /// Reservations computed, by source.
    pub reservations: Family<SourceLabels, Counter>,
    /// Placements not yet visible in telemetry (set at scrape time).
    pub in_flight: Gauge,
    /// Binds by result.
    pub binds: Family<ResultLabels, Counter>,
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

impl Metrics {
    /// Register every metric.
    pub fn new() -> Self {
        let mut registry = Registry::default();
        let requests = Family::<RequestLabels, Counter>::default();
        // 50 µs .. ~6.6 s: a bind may wait seconds for the node's previous pod, up to kube-scheduler's 5 s timeout.
        let duration = Family::<VerbLabels, Histogram>::new_with_constructor(
            (|| Histogram::new(exponential_buckets(0.000_05, 2.0, 18))) as fn() -> Histogram,
        );
        let rejections = Family::<ReasonLabels, Counter>::default();
        let reservations = Family::<SourceLabels, Counter>::default();
        let in_flight = Gauge::default();
        let binds = Family::<ResultLabels, Counter>::default();
        registry.register(
            "carma_extender_requests",
            "Extender requests by verb and outcome",
            requests.clone(),
        );
        registry.register(
            "carma_extender_request_duration_seconds",
            "Extender request latency by verb, body parsing and encoding included",
            duration.clone(),
        );
        registry.register(
            "carma_extender_rejections",
            "Nodes rejected by filter, by reason",
            rejections.clone(),
        );
        registry.register(
            "carma_extender_reservations",
            "Per-pod GPU memory reservations computed, by source",
            reservations.clone(),
        );
        registry.register(
            "carma_extender_placements_in_flight",
            "Placements whose memory does not show in telemetry yet",
            in_flight.clone(),
        );
        registry.register("carma_extender_binds", "Binds by result", binds.clone());
        Self {
            registry,
            requests,
            duration,
            rejections,
            reservations,
            in_flight,
            binds,
        }
    }

    /// The OpenMetrics text of every metric.
    pub fn encode(&self) -> String {
        let mut out = String::new();
        // Writing into a String cannot fail.
        let _ = prometheus_client::encoding::text::encode(&mut out, &self.registry);
        out
    }

    /// Count one request.
    pub fn request(&self, verb: &'static str, outcome: &'static str, seconds: f64) {
        self.requests
            .get_or_create(&RequestLabels { verb, outcome })
            .inc();
        self.duration
            .get_or_create(&VerbLabels { verb })
            .observe(seconds);
    }

    /// Count `n` rejections with `reason`.
    pub fn rejected(&self, reason: &'static str, n: u64) {
        if n > 0 {
            self.rejections
                .get_or_create(&ReasonLabels { reason })
                .inc_by(n);
        }
    }

    /// Count one reservation from `source`.
    pub fn reservation(&self, source: &str) {
        self.reservations
            .get_or_create(&SourceLabels {
                source: source.to_string(),
            })
            .inc();
    }

    /// Count one bind.
    pub fn bind(&self, result: &'static str) {
        self.binds.get_or_create(&ResultLabels { result }).inc();
    }
}
