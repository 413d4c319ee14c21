//! The report written by `carma simulate`'s own writers (`carma_workload::report`), labelled
//! ([`Provenance::Run`]) with what this run really is: real processes, and GPU telemetry measured
//! (NVML, DCGM) or simulated (the GPU layer's simulated backend).

use std::fs;
use std::path::{Path, PathBuf};

use carma_workload::report::{Provenance, render_html_as, render_json, render_table_body};
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
            "real processes; GPU telemetry SIMULATED (the GPU layer's simulated backend: memory from what jobs declare, modelled activity, power and energy)".to_string()
        } else {
            format!(
                "MEASURED: real processes, GPU telemetry from {}",
                self.backend
            )
        }
    }

    /// How the simulator's writers label this run.
    fn provenance(&self) -> Provenance {
        Provenance::Run {
            title: "carma local — run report".to_string(),
            what: format!(
                "{}. Jobs ran as real processes under `carma local serve`; times are wall-clock; per-GPU timelines are the daemon's samples (telemetry.jsonl)",
                self.what()
            ),
            run_time: "the job's own final run time (measured)".to_string(),
        }
    }

    /// The simulator's table below a header for a local run.
    pub fn table(&self) -> String {
        let body = render_table_body(&self.comparison, &self.provenance());
        format!(
            "carma local — {}\n  run      {}\n  GPUs     {} × {} GiB · queue carma (recovery first, strict FIFO)\n\n{body}",
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
        let html = render_html_as(&self.comparison, &self.trace, 16, &self.provenance());
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
