//! `--out DIR`: a self-contained HTML report (inline CSS and SVG, no scripts, no
//! network) with the comparison table, a makespan chart, and for every policy a
//! timeline per GPU: which jobs ran on it (one lane per concurrent job, crashed
//! attempts in red), memory in use against reserved and capacity, and SM
//! activity.

use std::fmt::Write as _;

use carma_core::Millis;

use crate::Comparison;
use crate::catalog::SizeClass;
use crate::report::table::duration;
use crate::report::{Provenance, change_pct};
use crate::result::{AttemptEnd, AttemptLog, GpuTimeline, RunResult};
use crate::trace::Trace;

const LABEL_W: f64 = 150.0;
const PLOT_W: f64 = 960.0;
const LANE_H: f64 = 13.0;
const CHART_H: f64 = 46.0;
const GPU_GAP: f64 = 16.0;
const MAX_LANES: usize = 12;

fn esc(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}

fn pct(p: Option<f64>) -> String {
    match p {
        None => String::new(),
        Some(p) if p.abs() < 0.5 => "±0%".into(),
        Some(p) if p < 0.0 => format!("−{:.0}%", -p),
        Some(p) => format!("+{p:.0}%"),
    }
}

/// Render the report. Timelines show at most `max_gpus` GPUs per policy.
pub fn render_html(cmp: &Comparison, trace: &Trace, max_gpus: usize) -> String {
    render_html_as(cmp, trace, max_gpus, &Provenance::Simulated)
}

/// [`render_html`] for figures of `provenance`: its title and banner, and for anything but the
/// simulator a closing note on what the figures are instead of the models.
pub fn render_html_as(
    cmp: &Comparison,
    trace: &Trace,
    max_gpus: usize,
    provenance: &Provenance,
) -> String {
    let mut h = String::new();
    let c = &cmp.config.cluster;
    let (title, heading, banner) = match provenance {
        Provenance::Simulated => (
            "carma simulate — simulated policy comparison".to_string(),
            "carma simulate — policy comparison".to_string(),
            "<b>Simulated results.</b> Virtual time on modelled GPUs: run times and peak memory are CARMA's measurements; slowdown while sharing, power and telemetry timing come from the documented models. Nothing here was measured on a GPU.".to_string(),
        ),
        Provenance::Run { title, what, .. } => (
            esc(title),
            esc(title),
            format!("<b>{}.</b> {}", esc(title), esc(what)),
        ),
    };
    let _ = write!(
        h,
        r#"<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8">
<title>{title}</title>
<style>
body {{ font: 14px/1.45 -apple-system, "Segoe UI", Helvetica, Arial, sans-serif; color: #1c2833; margin: 24px 32px; max-width: 1200px; }}
h1 {{ font-size: 22px; margin: 0 0 4px; }}
h2 {{ font-size: 17px; margin: 30px 0 6px; border-bottom: 1px solid #d5d8dc; padding-bottom: 3px; }}
.banner {{ background: #fef5e7; border: 1px solid #f0b27a; border-radius: 4px; padding: 8px 12px; margin: 10px 0 14px; }}
.meta {{ color: #566573; margin: 2px 0; }}
table {{ border-collapse: collapse; margin: 8px 0; }}
th, td {{ padding: 4px 10px; text-align: right; border-bottom: 1px solid #eaecee; white-space: nowrap; }}
th {{ background: #f4f6f7; font-weight: 600; }}
td:first-child, th:first-child {{ text-align: left; font-weight: 600; }}
.chg {{ color: #7b7d7d; font-size: 12px; margin-left: 4px; }}
.good {{ color: #1e8449; }} .bad {{ color: #b03a2e; }}
.legend span {{ display: inline-block; margin-right: 16px; }}
.sw {{ display: inline-block; width: 14px; height: 10px; vertical-align: middle; margin-right: 4px; border: 1px solid #566573; }}
svg text {{ font-family: inherit; }}
.note {{ color: #566573; font-size: 13px; }}
</style></head><body>
<h1>{heading}</h1>
<div class="banner">{banner}</div>
<p class="meta">Trace: {trace} · {work:.1} GPU-h of exclusive work</p>
<p class="meta">Cluster: {nodes} node(s) × {gpn} GPUs × {mem} GiB · utilization gate {gate} · reservations: {est}</p>
"#,
        trace = esc(&cmp.trace),
        work = cmp.exclusive_gpu_s / 3600.0,
        nodes = c.nodes,
        gpn = c.gpus_per_node,
        mem = c.gpu_memory_mib / 1024,
        gate = if cmp.config.gate { "on" } else { "off" },
        est = esc(cmp.plan.kind.as_str()),
    );
    summary_table(&mut h, cmp);
    makespan_chart(&mut h, cmp);
    legend(&mut h);
    let t_end = cmp.runs.iter().map(|r| r.end_ms).max().unwrap_or(0).max(1);
    for run in &cmp.runs {
        policy_section(&mut h, cmp, run, trace, t_end, max_gpus);
    }
    if let Provenance::Run { what, .. } = provenance {
        let _ = write!(
            h,
            "<h2>What this is</h2>\n<p class=\"note\">{}</p>\n</body></html>\n",
            esc(what)
        );
        return h;
    }
    let cfg = &cmp.config;
    let slowdown = match &cfg.slowdown.time_slicing {
        None => format!(
            "Slowdown: a task on a GPU whose summed SM activity D exceeds θ = {:.2} runs at (max(θ, s)/max(θ, D))^{:.1} of its exclusive speed (s = its own activity); below θ sharing is free (CARMA: collocation pays off while summed SM activity ≤ ~0.8).",
            cfg.slowdown.threshold, cfg.slowdown.exponent
        ),
        Some(ts) => format!(
            "Slowdown: time-slicing. A task of SM activity s needs b = min(1, (s/{:.2})^{:.2}) of its GPU's time; a GPU whose tasks need more than η = {:.2} in all hands out η by max-min fair shares, and a task runs at its share ÷ b of its exclusive speed (1 alone). Fitted to training jobs time-sliced on an H100 (docs/slowdown-on-h100.md).",
            ts.full_activity, ts.exponent, ts.efficiency
        ),
    };
    let _ = write!(
        h,
        r#"<h2>Models</h2>
<p class="note">{slowdown}
Power: {idle:.0} W idle to {max:.0} W at full SM activity, linear (A100 SXM4 40 GB). Telemetry: a task's memory and activity show {lag} s after it starts; risk scores over {win} one-second samples (CARMA).
Out of memory: when the summed true peaks on a GPU would exceed its memory, the task that allocates last crashes and is recovered by carma-core's recovery rule.</p>
</body></html>
"#,
        idle = cfg.power.idle_w,
        max = cfg.power.max_w,
        lag = cfg.telemetry.lag_ms / 1000,
        win = cfg.telemetry.window,
    );
    h
}

fn summary_table(h: &mut String, cmp: &Comparison) {
    let base = cmp.baseline().map(|b| b.summary.clone());
    h.push_str("<table><tr><th>policy</th><th>makespan</th><th>mean JCT</th><th>p95 JCT</th><th>mean wait</th><th>OOMs</th><th>lost GPU time</th><th>SM activity</th><th>memory used</th><th>energy kWh</th><th>done</th></tr>\n");
    for r in &cmp.runs {
        let s = &r.summary;
        let cell = |v: f64, b: Option<f64>, shown: String, lower_better: bool| {
            let ch = b
                .and_then(|b| change_pct(v, b))
                .filter(|_| s.policy != carma_core::Policy::Exclusive);
            let class = match ch {
                Some(c) if c.abs() >= 0.5 && (c < 0.0) == lower_better => "chg good",
                Some(c) if c.abs() >= 0.5 => "chg bad",
                _ => "chg",
            };
            format!("<td>{shown}<span class=\"{class}\">{}</span></td>", pct(ch))
        };
        let b = base.as_ref();
        let _ = writeln!(
            h,
            "<tr><td>{}</td>{}{}{}{}<td>{}</td><td>{}</td>{}{}{}<td>{}/{}</td></tr>",
            s.policy,
            cell(
                s.makespan_s,
                b.map(|b| b.makespan_s),
                duration(s.makespan_s),
                true
            ),
            cell(
                s.mean_jct_s,
                b.map(|b| b.mean_jct_s),
                duration(s.mean_jct_s),
                true
            ),
            cell(
                s.p95_jct_s,
                b.map(|b| b.p95_jct_s),
                duration(s.p95_jct_s),
                true
            ),
            cell(
                s.mean_wait_s,
                b.map(|b| b.mean_wait_s),
                duration(s.mean_wait_s),
                true
            ),
            s.ooms,
            duration(s.lost_gpu_s),
            cell(
                s.smact_mean,
                b.map(|b| b.smact_mean),
                format!("{:.0}%", s.smact_mean * 100.0),
                false
            ),
            cell(
                s.mem_used_mean,
                b.map(|b| b.mem_used_mean),
                format!("{:.0}%", s.mem_used_mean * 100.0),
                false
            ),
            cell(
                s.energy_kwh,
                b.map(|b| b.energy_kwh),
                format!("{:.1}", s.energy_kwh),
                true
            ),
            s.finished,
            s.tasks,
        );
    }
    h.push_str("</table>\n");
    if base.is_some() {
        h.push_str("<p class=\"note\">Changes against exclusive; green is better.</p>\n");
    }
    h.push_str("<p class=\"note\">JCT = submission to end (failed attempts and back-off included). SM activity and memory are averaged over every GPU and the whole makespan.</p>\n");
}

fn makespan_chart(h: &mut String, cmp: &Comparison) {
    let max = cmp
        .runs
        .iter()
        .map(|r| r.summary.makespan_s.max(r.summary.mean_jct_s))
        .fold(1.0, f64::max);
    let row_h = 34.0;
    let height = cmp.runs.len() as f64 * row_h + 24.0;
    let w = 560.0;
    let _ = writeln!(
        h,
        "<h2>Makespan and mean JCT</h2><svg width=\"{}\" height=\"{height}\" role=\"img\">",
        w + 200.0
    );
    for (i, r) in cmp.runs.iter().enumerate() {
        let y = i as f64 * row_h + 4.0;
        let mk = r.summary.makespan_s / max * w;
        let jct = r.summary.mean_jct_s / max * w;
        let _ = writeln!(
            h,
            "<text x=\"0\" y=\"{:.1}\" font-size=\"13\" font-weight=\"600\">{}</text>\
<rect x=\"90\" y=\"{y:.1}\" width=\"{mk:.1}\" height=\"13\" fill=\"#5d6d7e\"/>\
<text x=\"{:.1}\" y=\"{:.1}\" font-size=\"11\">{}</text>\
<rect x=\"90\" y=\"{:.1}\" width=\"{jct:.1}\" height=\"9\" fill=\"#aab7b8\"/>\
<text x=\"{:.1}\" y=\"{:.1}\" font-size=\"11\" fill=\"#566573\">{}</text>",
            y + 16.0,
            r.summary.policy,
            96.0 + mk,
            y + 11.0,
            duration(r.summary.makespan_s),
            y + 15.0,
            96.0 + jct,
            y + 23.0,
            duration(r.summary.mean_jct_s),
        );
    }
    let _ = writeln!(
        h,
        "<text x=\"90\" y=\"{:.1}\" font-size=\"11\" fill=\"#566573\">dark: makespan · light: mean job completion time</text></svg>",
        height - 4.0
    );
}

fn legend(h: &mut String) {
    h.push_str(
        r##"<h2>Per-GPU timelines</h2>
<p class="legend"><span><i class="sw" style="background:#aed6f1"></i>light job</span><span><i class="sw" style="background:#f9e79f"></i>medium job</span><span><i class="sw" style="background:#d2b4de"></i>heavy job</span><span><i class="sw" style="background:#f5b7b1;border-color:#c0392b"></i>attempt that crashed out of memory (✕)</span><br>
<span><i class="sw" style="background:#a9dfbf;border-color:#1e8449"></i>memory in use (true peaks)</span><span><i class="sw" style="background:none;border:0;border-top:2px dashed #566573;height:0"></i>memory reserved</span><span><i class="sw" style="background:none;border:0;border-top:2px solid #d35400;height:0"></i>SM activity (0–100 %)</span></p>
"##,
    );
}

fn class_fill(size: Option<SizeClass>) -> (&'static str, &'static str) {
    match size {
        Some(SizeClass::Light) => ("#aed6f1", "#2e86c1"),
        Some(SizeClass::Medium) => ("#f9e79f", "#b7950b"),
        Some(SizeClass::Heavy) => ("#d2b4de", "#7d3c98"),
        None => ("#d5d8dc", "#566573"),
    }
}

/// Lanes for the attempts on one GPU: each attempt gets the first lane free at
/// its start.
fn lanes(attempts: &[&AttemptLog]) -> (Vec<usize>, usize) {
    let mut ends: Vec<Millis> = Vec::new();
    let mut out = Vec::with_capacity(attempts.len());
    for a in attempts {
        let lane = match ends.iter().position(|e| *e <= a.start_ms) {
            Some(l) => l,
            None if ends.len() < MAX_LANES => {
                ends.push(0);
                ends.len() - 1
            }
            None => MAX_LANES - 1,
        };
        ends[lane] = ends[lane].max(a.end_ms);
        out.push(lane);
    }
    (out, ends.len().max(1))
}

fn policy_section(
    h: &mut String,
    cmp: &Comparison,
    run: &RunResult,
    trace: &Trace,
    t_end: Millis,
    max_gpus: usize,
) {
    let s = &run.summary;
    let base = cmp.baseline().map(|b| b.summary.makespan_s);
    let _ = writeln!(
        h,
        "<h2>{} — makespan {} {} · {} OOM crash(es) · SM activity {:.0}% · energy {:.1} kWh</h2>",
        s.policy,
        duration(s.makespan_s),
        match base.and_then(|b| change_pct(s.makespan_s, b)) {
            Some(c) if s.policy != carma_core::Policy::Exclusive => {
                format!("({} against exclusive)", pct(Some(c)))
            }
            _ => String::new(),
        },
        s.ooms,
        s.smact_mean * 100.0,
        s.energy_kwh
    );
    if run.gpus.is_empty() {
        h.push_str("<p class=\"note\">No timeline was recorded for this run.</p>\n");
        return;
    }
    let shown = run.gpus.len().min(max_gpus);
    let x = |t: Millis| LABEL_W + t as f64 / t_end as f64 * PLOT_W;
    let mut body = String::new();
    let mut y = 6.0;
    for (g, tl) in run.gpus.iter().enumerate().take(shown) {
        let mut on: Vec<&AttemptLog> = run
            .attempts
            .iter()
            .filter(|a| a.gpus.contains(&g))
            .collect();
        on.sort_by_key(|a| (a.start_ms, a.task));
        let (lane_of, n_lanes) = lanes(&on);
        let lanes_h = n_lanes as f64 * LANE_H;
        let _ = write!(
            body,
            "<text x=\"0\" y=\"{:.1}\" font-size=\"13\" font-weight=\"600\">{} · GPU {}</text>\
<text x=\"0\" y=\"{:.1}\" font-size=\"11\" fill=\"#566573\">{} attempts · {} GiB</text>",
            y + 12.0,
            esc(&tl.node),
            tl.index,
            y + 26.0,
            on.len(),
            tl.total_mib / 1024
        );
        let _ = write!(
            body,
            "<rect x=\"{LABEL_W}\" y=\"{y:.1}\" width=\"{PLOT_W}\" height=\"{:.1}\" fill=\"#fbfcfc\" stroke=\"#eaecee\"/>",
            lanes_h + CHART_H + 4.0
        );
        for (a, lane) in on.iter().zip(&lane_of) {
            let (x0, x1) = (x(a.start_ms), x(a.end_ms).max(x(a.start_ms) + 1.0));
            let ly = y + *lane as f64 * LANE_H + 1.0;
            let size = trace.tasks.get(a.task).map(|t| t.size);
            let (fill, stroke) = match a.end {
                AttemptEnd::OutOfMemory => ("#f5b7b1", "#c0392b"),
                AttemptEnd::Finished => class_fill(size),
            };
            let _ = write!(
                body,
                "<rect x=\"{x0:.1}\" y=\"{ly:.1}\" width=\"{:.1}\" height=\"{:.1}\" fill=\"{fill}\" stroke=\"{stroke}\" stroke-width=\"0.6\"><title>{} (task {}, attempt {}) {}–{} · reserved {} MiB · peak {} MiB{}</title></rect>",
                x1 - x0,
                LANE_H - 2.0,
                esc(&a.name),
                a.task,
                a.attempt,
                duration(a.start_ms as f64 / 1000.0),
                duration(a.end_ms as f64 / 1000.0),
                a.reserved_mib,
                a.peak_mib,
                if a.end == AttemptEnd::OutOfMemory {
                    " · OUT OF MEMORY"
                } else {
                    ""
                },
            );
            let label = esc(&a.name);
            if x1 - x0 > label.len() as f64 * 5.6 + 6.0 {
                let _ = write!(
                    body,
                    "<text x=\"{:.1}\" y=\"{:.1}\" font-size=\"9\" fill=\"#1c2833\">{label}</text>",
                    x0 + 3.0,
                    ly + LANE_H - 4.5
                );
            }
            if a.end == AttemptEnd::OutOfMemory {
                let _ = write!(
                    body,
                    "<text x=\"{:.1}\" y=\"{:.1}\" font-size=\"11\" font-weight=\"700\" fill=\"#c0392b\">✕</text>",
                    x1 + 1.0,
                    ly + LANE_H - 3.0
                );
            }
        }
        let cy = y + lanes_h + 2.0;
        gpu_chart(&mut body, tl, cy, run.end_ms, &x);
        y += lanes_h + CHART_H + 4.0 + GPU_GAP;
    }
    axis(&mut body, y, t_end, &x);
    let height = y + 24.0;
    let _ = writeln!(
        h,
        "<svg width=\"{:.0}\" height=\"{height:.0}\" role=\"img\" aria-label=\"per-GPU timeline for {}\">{body}</svg>",
        LABEL_W + PLOT_W + 10.0,
        s.policy
    );
    if shown < run.gpus.len() {
        let _ = writeln!(
            h,
            "<p class=\"note\">Showing {shown} of {} GPUs (--report-gpus raises the limit).</p>",
            run.gpus.len()
        );
    }
    let failed: Vec<_> = run.tasks.iter().filter(|t| t.failure.is_some()).collect();
    if !failed.is_empty() {
        h.push_str("<p class=\"note\"><b>Failed tasks:</b></p><ul class=\"note\">");
        for t in failed {
            let _ = write!(
                h,
                "<li>task {} ({}): {}</li>",
                t.id,
                esc(&t.name),
                esc(t.failure.as_deref().unwrap_or(""))
            );
        }
        h.push_str("</ul>\n");
    }
}

/// Memory in use (area), reserved (dashed) and SM activity (line) of one GPU.
fn gpu_chart(
    body: &mut String,
    tl: &GpuTimeline,
    top: f64,
    end: Millis,
    x: &dyn Fn(Millis) -> f64,
) {
    let bottom = top + CHART_H;
    let total = tl.total_mib.max(1) as f64;
    let ym = |mib: u64| bottom - (mib as f64 / total).min(1.0) * CHART_H;
    let ys = |a: f64| bottom - a.clamp(0.0, 1.0) * CHART_H;
    let mut area = format!("M{:.1},{bottom:.1}", x(0));
    let mut reserved = String::new();
    let mut smact = String::new();
    let mut prev: Option<(f64, f64, f64)> = None;
    for p in &tl.points {
        let px = x(p.t_ms);
        let (m, r, a) = (ym(p.mem_used_mib), ym(p.reserved_mib), ys(p.sm_activity));
        match prev {
            None => {
                let _ = write!(area, " L{px:.1},{bottom:.1} L{px:.1},{m:.1}");
                let _ = write!(reserved, "M{px:.1},{r:.1}");
                let _ = write!(smact, "M{px:.1},{a:.1}");
            }
            Some((pm, pr, pa)) => {
                let _ = write!(area, " L{px:.1},{pm:.1} L{px:.1},{m:.1}");
                let _ = write!(reserved, " L{px:.1},{pr:.1} L{px:.1},{r:.1}");
                let _ = write!(smact, " L{px:.1},{pa:.1} L{px:.1},{a:.1}");
            }
        }
        prev = Some((m, r, a));
    }
    if let Some((pm, pr, pa)) = prev {
        let xe = x(end);
        let _ = write!(area, " L{xe:.1},{pm:.1} L{xe:.1},{bottom:.1} Z");
        let _ = write!(reserved, " L{xe:.1},{pr:.1}");
        let _ = write!(smact, " L{xe:.1},{pa:.1}");
    } else {
        area.clear();
    }
    let _ = write!(
        body,
        "<line x1=\"{LABEL_W}\" x2=\"{:.1}\" y1=\"{top:.1}\" y2=\"{top:.1}\" stroke=\"#c0392b\" stroke-width=\"0.6\" stroke-dasharray=\"2,2\"/>\
<text x=\"{:.1}\" y=\"{:.1}\" font-size=\"9\" fill=\"#566573\" text-anchor=\"end\">{} GiB</text>\
<text x=\"{:.1}\" y=\"{:.1}\" font-size=\"9\" fill=\"#566573\" text-anchor=\"end\">0</text>",
        LABEL_W + PLOT_W,
        LABEL_W - 4.0,
        top + 8.0,
        tl.total_mib / 1024,
        LABEL_W - 4.0,
        bottom,
    );
    if !area.is_empty() {
        let _ = write!(
            body,
            "<path d=\"{area}\" fill=\"#a9dfbf\" fill-opacity=\"0.8\" stroke=\"#1e8449\" stroke-width=\"0.6\"/>\
<path d=\"{reserved}\" fill=\"none\" stroke=\"#566573\" stroke-width=\"1\" stroke-dasharray=\"4,3\"/>\
<path d=\"{smact}\" fill=\"none\" stroke=\"#d35400\" stroke-width=\"1.2\"/>"
        );
    }
}

fn axis(body: &mut String, y: f64, t_end: Millis, x: &dyn Fn(Millis) -> f64) {
    let hours = t_end as f64 / 3_600_000.0;
    let step_min: u64 = [
        1, 2, 5, 10, 15, 30, 60, 120, 180, 360, 720, 1440, 2880, 10080,
    ]
    .into_iter()
    .find(|m| hours * 60.0 / *m as f64 <= 12.0)
    .unwrap_or(10080);
    let _ = write!(
        body,
        "<line x1=\"{LABEL_W}\" x2=\"{:.1}\" y1=\"{y:.1}\" y2=\"{y:.1}\" stroke=\"#566573\"/>",
        LABEL_W + PLOT_W
    );
    let mut t = 0;
    while t <= t_end {
        let px = x(t);
        let label = if step_min >= 60 {
            format!("{}h", t / 3_600_000)
        } else {
            duration(t as f64 / 1000.0)
        };
        let _ = write!(
            body,
            "<line x1=\"{px:.1}\" x2=\"{px:.1}\" y1=\"{y:.1}\" y2=\"{:.1}\" stroke=\"#566573\"/>\
<text x=\"{px:.1}\" y=\"{:.1}\" font-size=\"10\" text-anchor=\"middle\" fill=\"#566573\">{label}</text>",
            y + 4.0,
            y + 15.0
        );
        t += step_min * 60_000;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lanes_reuse_free_slots() {
        let mk = |s, e| AttemptLog {
            task: 0,
            name: "t".into(),
            attempt: 1,
            gpus: vec![0],
            start_ms: s,
            end_ms: e,
            end: AttemptEnd::Finished,
            reserved_mib: 0,
            peak_mib: 0,
            exclusive: false,
        };
        let a = [mk(0, 10), mk(5, 20), mk(10, 30), mk(21, 40)];
        let refs: Vec<&AttemptLog> = a.iter().collect();
        let (l, n) = lanes(&refs);
        assert_eq!(l, vec![0, 1, 0, 1]);
        assert_eq!(n, 2);
    }
}
