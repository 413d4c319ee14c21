//! `--format json`: `{"queue", "policies": [{"policy", "paper", "estimator", "makespan_s", …, "worst_wait"}]}`.

use serde_json::{Value, json};

use crate::Comparison;
use crate::report::change_pct;

/// The JSON document: one object per policy with the summary's figures, plus
/// `vs_exclusive` (relative changes in percent) when the exclusive run is part
/// of the comparison, and a `simulated` marker.
pub fn render_json(cmp: &Comparison) -> Value {
    let base = cmp.baseline().map(|b| &b.summary);
    let policies: Vec<Value> = cmp
        .runs
        .iter()
        .map(|r| {
            let s = &r.summary;
            let mut v = json!({
                "policy": s.policy.as_str(),
                // CARMA's six policies; carma's own would say false.
                "paper": s.policy.is_carmas(),
                "estimator": s.estimator,
                "makespan_s": s.makespan_s,
                "mean_jct_s": s.mean_jct_s,
                "p95_jct_s": s.p95_jct_s,
                "mean_wait_s": s.mean_wait_s,
                "ooms": s.ooms,
                "lost_gpu_s": s.lost_gpu_s,
                "smact_mean": s.smact_mean,
                "mem_used_mean": s.mem_used_mean,
                "energy_kwh": s.energy_kwh,
                "finished": s.finished,
                "failed": s.failed,
                "tasks": s.tasks,
                "worst_wait": s.worst_wait,
                "events": r.events,
                "ticks": r.ticks,
            });
            let failures: Vec<Value> = r
                .tasks
                .iter()
                .filter_map(|t| {
                    t.failure
                        .as_ref()
                        .map(|why| json!({"task": t.id, "name": t.name, "reason": why}))
                })
                .collect();
            v["failures"] = Value::Array(failures);
            if let Some(b) = base {
                v["vs_exclusive_pct"] = json!({
                    "makespan_s": change_pct(s.makespan_s, b.makespan_s),
                    "mean_jct_s": change_pct(s.mean_jct_s, b.mean_jct_s),
                    "p95_jct_s": change_pct(s.p95_jct_s, b.p95_jct_s),
                    "mean_wait_s": change_pct(s.mean_wait_s, b.mean_wait_s),
                    "smact_mean": change_pct(s.smact_mean, b.smact_mean),
                    "mem_used_mean": change_pct(s.mem_used_mean, b.mem_used_mean),
                    "energy_kwh": change_pct(s.energy_kwh, b.energy_kwh),
                });
            }
            v
        })
        .collect();
    let c = &cmp.config.cluster;
    json!({
        "simulated": true,
        "trace": cmp.trace,
        "cluster": {
            "nodes": c.nodes,
            "gpus_per_node": c.gpus_per_node,
            "gpu_memory_mib": c.gpu_memory_mib,
        },
        "gate": cmp.config.gate,
        "queue": cmp.config.queue.as_str(),
        "makespan_bound_s": cmp.makespan_bound_s,
        "policies": policies,
    })
}
