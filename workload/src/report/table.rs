//! The comparison table `carma simulate` prints by default.

use std::fmt::Write as _;

use crate::Comparison;
use crate::report::{Provenance, change_pct};
use crate::result::Summary;

/// A duration in seconds as `7h05m`, `12m30s` or `45s`.
pub fn duration(secs: f64) -> String {
    let s = secs.max(0.0).round() as u64;
    if s >= 3600 {
        let minutes = (s + 30) / 60;
        format!("{}h{:02}m", minutes / 60, minutes % 60)
    } else if s >= 60 {
        format!("{}m{:02}s", s / 60, s % 60)
    } else {
        format!("{s}s")
    }
}

fn signed_pct(p: Option<f64>) -> String {
    match p {
        None => String::new(),
        Some(p) if p.abs() < 0.5 => "±0%".into(),
        Some(p) if p < 0.0 => format!("−{:.0}%", -p),
        Some(p) => format!("+{p:.0}%"),
    }
}

fn pad_left(s: &str, w: usize) -> String {
    let n = s.chars().count();
    format!("{}{s}", " ".repeat(w.saturating_sub(n)))
}

fn pad_right(s: &str, w: usize) -> String {
    let n = s.chars().count();
    format!("{s}{}", " ".repeat(w.saturating_sub(n)))
}

/// A table row: policy, (value, change) per column, and tasks done.
type Row = (String, Vec<(String, String)>, String);

struct Column {
    title: &'static str,
    value: fn(&Summary) -> f64,
    show: fn(f64) -> String,
    compare: bool,
}

const COLUMNS: [Column; 9] = [
    Column {
        title: "makespan",
        value: |s| s.makespan_s,
        show: duration,
        compare: true,
    },
    Column {
        title: "mean JCT",
        value: |s| s.mean_jct_s,
        show: duration,
        compare: true,
    },
    Column {
        title: "p95 JCT",
        value: |s| s.p95_jct_s,
        show: duration,
        compare: true,
    },
    Column {
        title: "mean wait",
        value: |s| s.mean_wait_s,
        show: duration,
        compare: true,
    },
    Column {
        title: "OOMs",
        value: |s| s.ooms as f64,
        show: |v| format!("{v:.0}"),
        compare: false,
    },
    Column {
        title: "lost GPU",
        value: |s| s.lost_gpu_s,
        show: duration,
        compare: false,
    },
    Column {
        title: "SM act",
        value: |s| s.smact_mean,
        show: |v| format!("{:.0}%", v * 100.0),
        compare: true,
    },
    Column {
        title: "memory",
        value: |s| s.mem_used_mean,
        show: |v| format!("{:.0}%", v * 100.0),
        compare: true,
    },
    Column {
        title: "kWh",
        value: |s| s.energy_kwh,
        show: |v| format!("{v:.1}"),
        compare: true,
    },
];

/// The whole text output: header lines, the table (each figure with its change
/// against exclusive), and a footer naming the models.
pub fn render_table(cmp: &Comparison) -> String {
    let mut out = String::new();
    let c = &cmp.config.cluster;
    let cfg = &cmp.config;
    let _ = writeln!(
        out,
        "carma simulate — SIMULATED results (virtual time, modelled GPUs; not measurements)"
    );
    let _ = writeln!(
        out,
        "  trace    {} · {:.1} GPU-h of exclusive work",
        cmp.trace,
        cmp.exclusive_gpu_s / 3600.0
    );
    if let Some(bound) = cmp.makespan_bound_s {
        let _ = writeln!(
            out,
            "  bound    no policy's makespan can be below {} under these models when every task finishes (SM-activity work ÷ GPUs' capacity)",
            duration(bound)
        );
    }
    let _ = writeln!(
        out,
        "  cluster  {} node{} × {} GPUs × {} GiB · utilization gate {} · queue {} · reservations: {}",
        c.nodes,
        if c.nodes == 1 { "" } else { "s" },
        c.gpus_per_node,
        c.gpu_memory_mib / 1024,
        if cfg.gate { "on" } else { "off" },
        cfg.queue.as_str(),
        describe_plan(cmp),
    );
    let _ = writeln!(out);
    out.push_str(&render_table_body(cmp, &Provenance::Simulated));
    out
}

/// The table below its header: one row per policy, the notes, the worst waits and, for
/// [`Provenance::Simulated`], the models' line (`carma local` writes its own header above it).
pub fn render_table_body(cmp: &Comparison, provenance: &Provenance) -> String {
    let mut out = String::new();
    let cfg = &cmp.config;
    let base = cmp.baseline().map(|b| &b.summary);
    let rows: Vec<Row> = cmp
        .runs
        .iter()
        .map(|r| {
            let s = &r.summary;
            let cells = COLUMNS
                .iter()
                .map(|col| {
                    let v = (col.value)(s);
                    let change = match base {
                        Some(b) if col.compare && s.policy != b.policy => {
                            signed_pct(change_pct(v, (col.value)(b)))
                        }
                        _ => String::new(),
                    };
                    ((col.show)(v), change)
                })
                .collect();
            (
                s.policy.as_str().to_string(),
                cells,
                format!("{}/{}", s.finished, s.tasks),
            )
        })
        .collect();

    let policy_w = rows.iter().map(|r| r.0.len()).max().unwrap_or(6).max(6);
    let widths: Vec<(usize, usize)> = COLUMNS
        .iter()
        .enumerate()
        .map(|(i, col)| {
            let v = rows
                .iter()
                .map(|r| r.1[i].0.chars().count())
                .max()
                .unwrap_or(0);
            let ch = rows
                .iter()
                .map(|r| r.1[i].1.chars().count())
                .max()
                .unwrap_or(0);
            let w = v + if ch > 0 { ch + 1 } else { 0 };
            (v, w.max(col.title.chars().count()))
        })
        .collect();
    let all_done = cmp.runs.iter().all(|r| r.summary.failed == 0);
    let done_w = if all_done {
        0
    } else {
        rows.iter().map(|r| r.2.len()).max().unwrap_or(4).max(4)
    };

    let mut header = format!("  {}", pad_right("policy", policy_w));
    for (col, (_, w)) in COLUMNS.iter().zip(&widths) {
        header.push_str("  ");
        header.push_str(&pad_right(col.title, *w));
    }
    if !all_done {
        header.push_str("  ");
        header.push_str(&pad_left("done", done_w));
    }
    let _ = writeln!(out, "{}", header.trim_end());
    let _ = writeln!(
        out,
        "  {}",
        "─".repeat(header.trim_end().chars().count() - 2)
    );
    for (policy, cells, done) in &rows {
        let mut line = format!("  {}", pad_right(policy, policy_w));
        for ((v, ch), (vw, w)) in cells.iter().zip(&widths) {
            let cell = if ch.is_empty() {
                pad_left(v, *vw)
            } else {
                format!("{} {}", pad_left(v, *vw), ch)
            };
            line.push_str("  ");
            line.push_str(&pad_right(&cell, *w));
        }
        if !all_done {
            line.push_str("  ");
            line.push_str(&pad_left(done, done_w));
        }
        let _ = writeln!(out, "{}", line.trim_end());
    }
    let _ = writeln!(out);
    if base.is_some() && cmp.runs.len() > 1 {
        let _ = writeln!(
            out,
            "  Changes are against exclusive. JCT: submission to end. lost GPU: GPU time in attempts that crashed."
        );
        let _ = writeln!(
            out,
            "  SM act, memory: averaged over all GPUs and the makespan. kWh: GPU energy over the makespan."
        );
        if let Some(best) = cmp
            .runs
            .iter()
            .filter(|r| r.summary.failed == 0)
            .min_by(|a, b| a.summary.makespan_s.total_cmp(&b.summary.makespan_s))
        {
            let b = base.map_or(0.0, |b| b.makespan_s);
            let _ = writeln!(
                out,
                "  Shortest makespan: {} ({} against exclusive, {} OOM crash{}).",
                best.summary.policy,
                signed_pct(change_pct(best.summary.makespan_s, b)),
                best.summary.ooms,
                if best.summary.ooms == 1 { "" } else { "es" },
            );
        }
        default_policy_line(&mut out, cmp);
    }
    let run_time = match provenance {
        Provenance::Simulated => "the task's own exclusive run time",
        Provenance::Run { run_time, .. } => run_time.as_str(),
    };
    let _ = writeln!(
        out,
        "  Longest wait ÷ {run_time}, by GPUs per task (starvation):"
    );
    for r in &cmp.runs {
        let sizes: Vec<String> = r
            .summary
            .worst_wait
            .iter()
            .map(|w| {
                format!(
                    "{} GPU{} {:.2} ({})",
                    w.gpus,
                    if w.gpus == 1 { "" } else { "s" },
                    w.wait_over_run,
                    w.task
                )
            })
            .collect();
        let _ = writeln!(
            out,
            "    {}  {}",
            pad_right(r.summary.policy.as_str(), policy_w),
            sizes.join(" · ")
        );
    }
    if cmp
        .runs
        .iter()
        .any(|r| r.summary.learned_reservations.is_some())
    {
        let learned: Vec<String> = cmp
            .runs
            .iter()
            .map(|r| {
                format!(
                    "{} {}",
                    r.summary.policy.as_str(),
                    r.summary.learned_reservations.unwrap_or(0)
                )
            })
            .collect();
        let _ = writeln!(
            out,
            "  Learned peaks (--learn-peaks): first attempts reserved from earlier tasks' peaks: {}",
            learned.join(" · ")
        );
    }
    if all_done {
        let _ = writeln!(out, "  Every task finished under every policy.");
    } else {
        let _ = writeln!(
            out,
            "  Some tasks failed (done < all); `--format json` or `--out DIR` lists each with its reason."
        );
    }
    if *provenance == Provenance::Simulated {
        match &cfg.slowdown.time_slicing {
            None => {
                let _ = writeln!(
                    out,
                    "  Models: sharing slows tasks once summed SM activity > {:.2} (exponent {:.1}) · power {:.0}–{:.0} W",
                    cfg.slowdown.threshold,
                    cfg.slowdown.exponent,
                    cfg.power.idle_w,
                    cfg.power.max_w,
                );
            }
            Some(ts) => {
                let _ = writeln!(
                    out,
                    "  Models: time-sliced sharing, max-min shares (θ {:.2}, β {:.2}, η {:.2}) · power {:.0}–{:.0} W",
                    ts.full_activity, ts.exponent, ts.efficiency, cfg.power.idle_w, cfg.power.max_w,
                );
            }
        }
        let _ = writeln!(
            out,
            "  by SM activity · memory shows {} s after start. Each model, its source and flags: simulator/README.md.",
            cfg.telemetry.lag_ms / 1000,
        );
    }
    out
}

fn describe_plan(cmp: &Comparison) -> String {
    let p = &cmp.plan;
    let mut s = p.kind.as_str().to_string();
    let mut notes = Vec::new();
    if !p.sources.is_empty() {
        notes.push(
            p.sources
                .iter()
                .map(|(src, n)| format!("{n} {src}"))
                .collect::<Vec<_>>()
                .join(", "),
        );
    }
    let whole = p.whole_gpu;
    if whole > 0 {
        notes.push(format!("{whole} whole-GPU"));
    }
    if p.underestimates > 0 {
        notes.push(format!("{} below true peak", p.underestimates));
    }
    if !notes.is_empty() {
        s.push_str(&format!(" ({})", notes.join("; ")));
    }
    s
}

/// How the default policy did against the best of CARMA's sharing policies (exclusive aside), when
/// both ran and every task finished under it.
fn default_policy_line(out: &mut String, cmp: &Comparison) {
    let default = carma_core::Policy::DEFAULT;
    let Some(ours) = cmp
        .runs
        .iter()
        .find(|r| r.summary.policy == default && r.summary.failed == 0)
    else {
        return;
    };
    let carmas = || {
        cmp.runs.iter().filter(|r| {
            r.summary.policy.is_carmas() && r.summary.policy != carma_core::Policy::Exclusive
        })
    };
    let by =
        |f: fn(&Summary) -> f64| carmas().min_by(|a, b| f(&a.summary).total_cmp(&f(&b.summary)));
    let (Some(makespan), Some(jct)) = (by(|s| s.makespan_s), by(|s| s.mean_jct_s)) else {
        return;
    };
    let _ = writeln!(
        out,
        "  Default policy {default}: makespan {} against CARMA's best ({}), mean JCT {} against CARMA's best ({}).",
        signed_pct(change_pct(
            ours.summary.makespan_s,
            makespan.summary.makespan_s
        )),
        makespan.summary.policy,
        signed_pct(change_pct(ours.summary.mean_jct_s, jct.summary.mean_jct_s)),
        jct.summary.policy,
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations() {
        assert_eq!(duration(45.2), "45s");
        assert_eq!(duration(750.0), "12m30s");
        assert_eq!(duration(7.0 * 3600.0 + 5.0 * 60.0), "7h05m");
        assert_eq!(signed_pct(Some(-25.4)), "−25%");
        assert_eq!(signed_pct(Some(3.0)), "+3%");
    }
}
