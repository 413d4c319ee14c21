//! The report written by the simulator's own writers, with their "simulated" wording replaced by
//! what this run really is: real processes, and GPU telemetry measured (NVML, DCGM) or simulated
//! (the device plugin's simulated backend).

use std::fs;
use std::path::{Path, PathBuf};

use carma_simulator::report::{render_html, render_json, render_table};
use serde_json::json;

use super::Report;
use crate::error::{LocalError, Result};
use crate::layout::write_atomic;

impl Report {
    fn telemetry_simulated(&self) -> bool {
        self.backend == "simulated"
    }

    fn what(&self) -> String {
        if self.backend == "unknown" {
            "no GPU telemetry recorded (no daemon has served this state directory yet)".to_string()
        } else if self.telemetry_simulated() {
            "real processes; GPU telemetry SIMULATED (the device plugin's simulated backend: memory from what jobs declare, modelled activity, power and energy)".to_string()
        } else {
            format!(
                "MEASURED: real processes, GPU telemetry from {}",
                self.backend
            )
        }
    }

    /// The simulator's table, headed and footed for a local run.
    pub fn table(&self) -> String {
        let text = render_table(&self.comparison);
        let mut lines: Vec<&str> = text.lines().collect();
        // Header: up to the first blank line. Footer: the simulator's model lines.
        let body_from = lines
            .iter()
            .position(|l| l.trim().is_empty())
            .map_or(0, |i| i + 1);
        lines.retain(|l| {
            !l.trim_start().starts_with("Models:") && !l.trim_start().starts_with("by SM activity")
        });
        let body = lines[body_from.min(lines.len())..].join("\n").replace(
            "the task's own exclusive run time",
            "the job's own final run time (measured)",
        );
        format!(
            "carma local — {}\n  run      {}\n  GPUs     {} × {} GiB · queue carma (recovery first, strict FIFO)\n\n{body}\n",
            self.what(),
            self.comparison.trace,
            self.comparison.config.cluster.gpus_per_node,
            self.comparison.config.cluster.gpu_memory_mib / 1024,
        )
    }

    /// The simulator's JSON with `simulated` telling the truth, plus the jobs.
    pub fn json(&self) -> serde_json::Value {
        let mut v = render_json(&self.comparison);
        v["simulated"] = json!(self.telemetry_simulated());
        v["local"] = json!({
            "backend": self.backend,
            "processes": "real",
            "telemetry": match self.backend.as_str() {
                "unknown" => "none",
                "simulated" => "simulated",
                _ => "measured",
            },
            "jobs": self.jobs,
            "gpus": self.gpus,
        });
        v
    }

    /// The simulator's HTML report (banner replaced) and `results.json` into `out`; returns the
    /// HTML file.
    pub fn write(&self, out: &Path) -> Result<PathBuf> {
        fs::create_dir_all(out).map_err(|e| LocalError::io(out, e))?;
        let html = render_html(&self.comparison, &self.trace, 16)
            .replace("carma simulate — simulated policy comparison", "carma local — run report")
            .replace("carma simulate — policy comparison", "carma local — run report")
            .replace(
                "<b>Simulated results.</b> Virtual time on modelled GPUs: run times and peak memory are CARMA's measurements; slowdown while sharing, power and telemetry timing come from the documented models. Nothing here was measured on a GPU.",
                &format!("<b>carma local.</b> {}", self.what()),
            );
        // The simulator's closing "Models" section describes its models, which a local run does
        // not use: it is replaced by what this run is.
        let html = match html.find("<h2>Models</h2>") {
            Some(at) => format!(
                "{}<h2>What this is</h2>\n<p class=\"note\">{}. Jobs ran as real processes under `carma local serve`; \
                 times are wall-clock; per-GPU timelines are the daemon's samples (telemetry.jsonl).</p>\n</body></html>\n",
                &html[..at],
                self.what()
            ),
            None => html,
        };
        let html_path = out.join("report.html");
        write_atomic(&html_path, html.as_bytes())?;
        // As `carma simulate --out`: the whole comparison (with timelines), plus the local detail.
        let mut results = serde_json::to_value(&self.comparison).unwrap_or_default();
        results["local"] = self.json()["local"].clone();
        let json = serde_json::to_vec_pretty(&results).unwrap_or_default();
        write_atomic(&out.join("results.json"), &json)?;
        Ok(html_path)
    }
}
