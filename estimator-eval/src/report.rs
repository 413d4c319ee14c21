//! `carma estimate eval --peaks`, the report: the rows that [`crate::peaks`] builds,
//! tallied per family and source (rows, underestimates, mean and p95 over-reservation),
//! and rendered as the text table of `--table`.

use carma_estimator::Family;
use serde::Serialize;

use crate::measured::MeasuredReport;
use crate::peaks::PeakRow;
use crate::tally::Tally;

/// A source of reservations the report tallies: which rows it covers and what it
/// reserves for each.
#[derive(Debug)]
pub struct Source {
    /// Name in the report.
    pub name: &'static str,
    /// The reservation for a row, `None` where the source does not apply.
    pub reservation: fn(&PeakRow) -> Option<u64>,
    /// Why the source has no figures, when it has none on any row.
    pub missing: &'static str,
}

/// Every source the report tallies, per family.
pub const SOURCES: &[Source] = &[
    Source {
        name: "detailed bound, summary/printout",
        reservation: |r| (r.profile != "catalog").then_some(r.carma_mib),
        missing: "no table or printout",
    },
    Source {
        name: "totals bound, summary/printout",
        reservation: |r| (r.profile != "catalog").then_some(r.totals_mib),
        missing: "no table or printout",
    },
    Source {
        name: "carma, catalog profile",
        reservation: |r| (r.profile == "catalog").then_some(r.carma_mib),
        missing: "no catalog profile",
    },
    Source {
        name: "GPUMemNet recorded, catalog jobs",
        reservation: |r| {
            (r.profile == "catalog")
                .then_some(r.gpumemnet_mib)
                .flatten()
        },
        missing: "no GPUMemNet estimate in the task files",
    },
    Source {
        name: "traced",
        reservation: |r| r.traced_mib,
        missing: "no traced figures",
    },
];

/// One source's figures on one family's rows.
#[derive(Debug, Clone, Serialize)]
pub struct SourceTally {
    /// The family.
    pub family: Family,
    /// The source's name ([`SOURCES`]).
    pub source: &'static str,
    /// The figures; `None` when the source has no figure on any of the family's rows.
    pub tally: Option<Tally>,
    /// Why there are no figures.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub not_run: Option<&'static str>,
}

/// The whole evaluation.
#[derive(Debug, Clone, Serialize)]
pub struct PeaksReport {
    /// One row per job and profile source.
    pub rows: Vec<PeakRow>,
    /// carma now, every row.
    pub carma: Tally,
    /// The legacy bound, every row.
    pub legacy: Tally,
    /// carma now, on the rows with a GPUMemNet estimate.
    pub carma_where_gpumemnet: Tally,
    /// GPUMemNet's recorded estimates, on those rows.
    pub gpumemnet: Tally,
    /// Every source of [`SOURCES`] per family (families in the rows, in order).
    pub by_source: Vec<SourceTally>,
    /// Task files with a peak that the catalog does not restate (no profile).
    pub skipped: Vec<String>,
    /// The traced reservation against carma's own GPU measurements.
    pub measured: MeasuredReport,
}

/// Tallies the rows: every row, the rows with a GPUMemNet estimate, and every source of
/// [`SOURCES`] per family (families in name order). `rows` must not be empty.
pub fn report(rows: Vec<PeakRow>, skipped: Vec<String>) -> PeaksReport {
    let with_gpumemnet = || rows.iter().filter_map(|r| Some((r, r.gpumemnet_mib?)));
    let mut families: Vec<Family> = Vec::new();
    for r in &rows {
        if !families.contains(&r.family) {
            families.push(r.family);
        }
    }
    families.sort_by_key(|f| f.as_str());
    let by_source = families
        .iter()
        .flat_map(|&family| {
            let rows = &rows;
            SOURCES.iter().map(move |s| {
                let pairs: Vec<(u64, u64)> = rows
                    .iter()
                    .filter(|r| r.family == family)
                    .filter_map(|r| Some(((s.reservation)(r)?, r.peak_mib)))
                    .collect();
                let tally = (!pairs.is_empty()).then(|| Tally::of(pairs.into_iter()));
                SourceTally {
                    family,
                    source: s.name,
                    not_run: tally.is_none().then_some(s.missing),
                    tally,
                }
            })
        })
        .collect();
    PeaksReport {
        carma: Tally::of(rows.iter().map(|r| (r.carma_mib, r.peak_mib))),
        legacy: Tally::of(rows.iter().map(|r| (r.legacy_mib, r.peak_mib))),
        carma_where_gpumemnet: Tally::of(with_gpumemnet().map(|(r, _)| (r.carma_mib, r.peak_mib))),
        gpumemnet: Tally::of(with_gpumemnet().map(|(r, g)| (g, r.peak_mib))),
        by_source,
        rows,
        skipped,
        measured: MeasuredReport::default(),
    }
}

/// The report as text: the rows, the terms of each detailed bound, the summary lines
/// and the per-family, per-source tallies.
pub fn render_table(r: &PeaksReport) -> String {
    let mut out = format!(
        "{:<34} {:<8} {:<11} {:>6} {:>7} {:>7} {:>7} {:>7} {:>9}\n",
        "job", "profile", "family", "batch", "peak", "carma", "totals", "legacy", "gpumemnet"
    );
    for row in &r.rows {
        let g = row
            .gpumemnet_mib
            .map_or_else(|| "-".to_string(), |v| v.to_string());
        out += &format!(
            "{:<34} {:<8} {:<11} {:>6} {:>7} {:>7} {:>7} {:>7} {:>9}\n",
            row.job,
            row.profile,
            row.family.as_str(),
            row.batch_size,
            row.peak_mib,
            row.carma_mib,
            row.totals_mib,
            row.legacy_mib,
            g
        );
    }
    out += "\nterms of the detailed bound (MiB): context, weights, gradients, optimizer state, \
            activations, attention scores, optimizer step beyond activations, GPUs beyond the first\n";
    out += &format!(
        "{:<34} {:>6} {:>7} {:>7} {:>7} {:>7} {:>7} {:>7} {:>5} {:>5} {:>7} {:>7}\n",
        "job",
        "batch",
        "context",
        "weights",
        "grads",
        "optim",
        "activ",
        "scores",
        "step",
        "multi",
        "carma",
        "peak"
    );
    for row in &r.rows {
        let Some(t) = row.terms else { continue };
        out += &format!(
            "{:<34} {:>6} {:>7} {:>7} {:>7} {:>7} {:>7} {:>7} {:>5} {:>5} {:>7} {:>7}\n",
            row.job,
            row.batch_size,
            t.context_mib,
            t.weights_mib,
            t.gradients_mib,
            t.optimizer_mib,
            t.activations_mib,
            t.scores_mib,
            t.step_mib,
            t.multi_gpu_mib,
            t.total_mib,
            row.peak_mib
        );
    }
    out += "\n";
    let line = |name: &str, t: &Tally| {
        format!(
            "{name}: {} rows, {} underestimates, mean over-reservation {:.0} MiB\n",
            t.rows, t.underestimates, t.mean_over_reservation_mib
        )
    };
    out += &line("carma (all rows)", &r.carma);
    out += &line("legacy bound (all rows)", &r.legacy);
    out += &line(
        "carma (rows with a GPUMemNet estimate)",
        &r.carma_where_gpumemnet,
    );
    out += &line("GPUMemNet recorded (same rows)", &r.gpumemnet);
    out += "\nby family and source:\n";
    for s in &r.by_source {
        let figures = match (&s.tally, s.not_run) {
            (Some(t), _) => format!(
                "{} rows, {} underestimates, over-reservation mean {:.0} MiB, p95 {} MiB",
                t.rows, t.underestimates, t.mean_over_reservation_mib, t.p95_over_reservation_mib
            ),
            (None, why) => format!("not run ({})", why.unwrap_or("no figures")),
        };
        out += &format!("{} / {}: {figures}\n", s.family.as_str(), s.source);
    }
    out += &render_measured(&r.measured);
    out
}

/// The traced reservation against carma's own GPU measurements: each row, then per set and
/// family; `not run` when no measured set is present.
fn render_measured(m: &MeasuredReport) -> String {
    let mut out = String::from("\ntraced reservation against carma's GPU measurements:\n");
    if m.rows.is_empty() {
        return out + "not run (no measured peaks beside the traced CSV)\n";
    }
    out += &format!(
        "{:<30} {:<44} {:<11} {:>6} {:>7} {:>7} {:>7}\n",
        "set", "model", "family", "batch", "peak", "traced", "over"
    );
    for r in &m.rows {
        out += &format!(
            "{:<30} {:<44} {:<11} {:>6} {:>7} {:>7} {:>+7}\n",
            r.set,
            r.model,
            r.family.as_str(),
            r.batch_size,
            r.peak_mib,
            r.traced_mib,
            r.traced_mib as i64 - r.peak_mib as i64
        );
    }
    for t in &m.tallies {
        out += &format!(
            "{} / {} / traced: {} rows, {} underestimates, over-reservation mean {:.0} MiB, p95 {} MiB\n",
            t.set,
            t.family.as_str(),
            t.tally.rows,
            t.tally.underestimates,
            t.tally.mean_over_reservation_mib,
            t.tally.p95_over_reservation_mib
        );
    }
    for n in &m.not_measured {
        out += &format!("not measured: {n}\n");
    }
    out
}
