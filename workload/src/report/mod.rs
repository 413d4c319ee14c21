//! Output: a comparison table for people, JSON for scripts, and a
//! self-contained HTML report with per-GPU timelines.

pub mod html;
pub mod json;
pub mod table;

pub use html::{render_html, render_html_as};
pub use json::render_json;
pub use table::{render_table, render_table_body};

/// What a comparison's figures are, for the writers' title, banner and closing notes.
#[derive(Debug, Clone, PartialEq)]
pub enum Provenance {
    /// `carma simulate`: virtual time on modelled GPUs, with the models' notes.
    Simulated,
    /// Another run rendered by the same writers (`carma local`).
    Run {
        /// Heads the report.
        title: String,
        /// What the figures are; replaces the simulator's banner and models' notes.
        what: String,
        /// What worst waits are measured against, e.g. "the job's own final run time (measured)".
        run_time: String,
    },
}

/// Relative change of `value` against `base` in percent (`None` when the base is 0).
pub fn change_pct(value: f64, base: f64) -> Option<f64> {
    (base.abs() > f64::EPSILON).then(|| (value - base) / base * 100.0)
}
