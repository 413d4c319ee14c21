//! Output: a comparison table for people, JSON for scripts, and a
//! self-contained HTML report with per-GPU timelines.

pub mod html;
pub mod json;
pub mod table;

pub use html::render_html;
pub use json::render_json;
pub use table::render_table;

/// Relative change of `value` against `base` in percent (`None` when the base is 0).
pub fn change_pct(value: f64, base: f64) -> Option<f64> {
    (base.abs() > f64::EPSILON).then(|| (value - base) / base * 100.0)
}
