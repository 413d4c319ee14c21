//! `carma local status`: the jobs from the journal (and the spool), the GPUs from the daemon's
//! latest view. Works whether or not the daemon runs.

use std::fmt::Write as _;
use std::fs;

use carma_core::Reservation;
use carma_core::text::truncate_chars as truncate;
use serde_json::{Value, json};

use crate::error::Result;
use crate::jobs::{Job, JobState, JobTable};
use crate::journal::Journal;
use crate::layout::StateDir;
use crate::spec::read_spool;

/// The status document: `{"jobs": [...], "gpus": [...], "daemon": {...}}`.
///
/// Each job: `id`, `name`, `state` (`queued|running|succeeded|failed`), `attempts` (started),
/// `lost_attempts`, `ooms`, `gpus` (indices of the current or last attempt), `exit_reason`,
/// `reservation_mib` (next or current attempt; `null` for a whole GPU), `exclusive`, `recovery`,
/// `submitted_at_ms`, `started_at_ms`, `ended_at_ms`, `peak_mib`, `sm_activity_mean`,
/// `energy_j`, `waiting` (why a queue head waits, from the daemon's last pass).
pub fn status(dir: &StateDir) -> Result<Value> {
    let table = JobTable::from_events(&Journal::new(dir.journal()).read()?);
    let view: Value = fs::read(dir.gpus())
        .ok()
        .and_then(|b| serde_json::from_slice(&b).ok())
        .unwrap_or(Value::Null);
    let waiting = |id: &str| view["waiting"].get(id).cloned().unwrap_or(Value::Null);
    let mut jobs: Vec<Value> = table
        .jobs()
        .into_iter()
        .map(|j| {
            let mut v = job_json(j);
            v["waiting"] = waiting(&j.spec.id);
            v
        })
        .collect();
    for (spec, _) in read_spool(dir)? {
        if !table.contains(&spec.id) {
            jobs.push(json!({
                "id": spec.id, "name": spec.name, "state": "queued", "attempts": 0,
                "lost_attempts": 0, "ooms": 0, "gpus": [], "exit_reason": null,
                "reservation_mib": reservation_mib(spec.reservation), "exclusive": false,
                "recovery": false, "submitted_at_ms": spec.submitted_at_ms,
                "started_at_ms": null, "ended_at_ms": null, "peak_mib": null,
                "sm_activity_mean": null, "energy_j": null,
                "waiting": "in the spool: not yet taken by a daemon",
            }));
        }
    }
    Ok(json!({
        "jobs": jobs,
        "gpus": view.get("gpus").cloned().unwrap_or(json!([])),
        "daemon": {
            "backend": view.get("backend"),
            "simulated": view.get("simulated"),
            "policy": view.get("policy"),
            "pid": view.get("daemon_pid"),
            "updated_at_ms": view.get("taken_at_ms"),
        },
    }))
}

fn reservation_mib(r: Reservation) -> Option<u64> {
    match r {
        Reservation::Mib(m) => Some(m),
        Reservation::WholeGpu | Reservation::Unknown => None,
    }
}

/// One job's status object.
pub fn job_json(j: &Job) -> Value {
    let last = j.attempts.last();
    let lost = j.attempts.iter().filter(|a| a.was_evicted()).count();
    let ooms = j.ooms();
    let usage = last.and_then(|a| a.end.as_ref()).map(|e| &e.usage);
    let peak = j
        .attempts
        .iter()
        .filter_map(|a| a.end.as_ref()?.usage.peak_mib)
        .max();
    let energy: Option<f64> = j
        .attempts
        .iter()
        .filter_map(|a| a.end.as_ref()?.usage.energy_j)
        .reduce(|a, b| a + b);
    let finished = matches!(j.state, JobState::Succeeded | JobState::Failed);
    json!({
        "id": j.spec.id,
        "name": j.spec.name,
        "state": j.state,
        "attempts": j.attempts.len(),
        "lost_attempts": lost,
        "ooms": ooms,
        "gpus": last.map(|a| a.gpus.clone()).unwrap_or_default(),
        "exit_reason": j.exit_reason,
        "reservation_mib": match (j.state, last) {
            (JobState::Running, Some(a)) => reservation_mib(a.reservation),
            _ => reservation_mib(j.reservation),
        },
        "exclusive": j.exclusive,
        "recovery": j.recovery,
        "submitted_at_ms": j.spec.submitted_at_ms,
        "started_at_ms": j.attempts.first().map(|a| a.launched_at_ms),
        "ended_at_ms": if finished { last.and_then(|a| a.end.as_ref()).map(|e| e.at_ms) } else { None },
        "peak_mib": peak,
        "sm_activity_mean": usage.and_then(|u| u.sm_activity_mean),
        "energy_j": energy,
    })
}

/// The status as a table for people.
pub fn render_table(status: &Value) -> String {
    let mut out = String::new();
    let d = &status["daemon"];
    let _ = writeln!(
        out,
        "daemon: {} · backend {} · policy {}",
        d["pid"]
            .as_u64()
            .map_or("not seen".to_string(), |p| format!("pid {p}")),
        d["backend"].as_str().unwrap_or("?"),
        d["policy"].as_str().unwrap_or("?"),
    );
    let _ = writeln!(
        out,
        "{:<34} {:<18} {:<9} {:>3} {:<7} {:>9} {:>8}  REASON",
        "ID", "NAME", "STATE", "ATT", "GPUS", "RESERVED", "PEAK"
    );
    for j in status["jobs"].as_array().into_iter().flatten() {
        let gpus: Vec<String> = j["gpus"]
            .as_array()
            .into_iter()
            .flatten()
            .map(|g| g.to_string())
            .collect();
        let mib = |v: &Value| v.as_u64().map_or("-".to_string(), |m| format!("{m}Mi"));
        let reason = j["waiting"]
            .as_str()
            .filter(|_| j["state"] == "queued")
            .or(j["exit_reason"].as_str())
            .unwrap_or("");
        let _ = writeln!(
            out,
            "{:<34} {:<18} {:<9} {:>3} {:<7} {:>9} {:>8}  {}",
            j["id"].as_str().unwrap_or(""),
            truncate(j["name"].as_str().unwrap_or(""), 18),
            j["state"].as_str().unwrap_or(""),
            j["attempts"].to_string(),
            if gpus.is_empty() {
                "-".to_string()
            } else {
                gpus.join(",")
            },
            if j["reservation_mib"].is_null() {
                "whole".to_string()
            } else {
                mib(&j["reservation_mib"])
            },
            mib(&j["peak_mib"]),
            truncate(reason, 80),
        );
    }
    let _ = writeln!(out);
    let _ = writeln!(
        out,
        "{:<4} {:>9} {:>9} {:>9} {:>6} {:>7}  JOBS   (SMACT: risk score; cold until the window fills)",
        "GPU", "TOTAL", "USED", "RESERVED", "SMACT", "POWER"
    );
    for g in status["gpus"].as_array().into_iter().flatten() {
        let jobs: Vec<&str> = g["jobs"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(Value::as_str)
            .collect();
        let _ = writeln!(
            out,
            "{:<4} {:>7}Mi {:>7}Mi {:>7}Mi {:>6} {:>6}W  {}{}",
            g["index"].to_string(),
            g["memory_total_mib"].to_string(),
            g["memory_used_mib"].to_string(),
            g["reserved_mib"].to_string(),
            g["sm_activity_risk"]
                .as_f64()
                .map_or("cold".to_string(), |v| format!("{v:.2}")),
            g["power_w"]
                .as_f64()
                .map_or("-".to_string(), |v| format!("{v:.0}")),
            jobs.join(","),
            if g["simulated"] == true {
                "  (simulated)"
            } else {
                ""
            },
        );
    }
    out
}
