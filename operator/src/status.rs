//! TrainingTask status helpers: conditions in the Kubernetes style and the server-side apply that
//! writes the status.
//!
//! **Writing.** The operator owns the whole status and writes all of it by server-side apply on the
//! status subresource, as field manager [`FIELD_MANAGER`] with `force` ([`status_apply`]), as
//! kube-rs's controller-rs does. A field the operator stops writing is dropped by the API server,
//! because its manager no longer applies it. Two replicas writing at once (an old leader that has
//! not yet noticed it lost its Lease) write under the same manager, so the later apply is the whole
//! status, never a mix of two merge patches each computed against its own old status; the write is
//! not conditional, so the later one wins, and the Lease keeps such overlaps short.
//!
//! **Upgrades.** Earlier releases wrote the status by JSON merge patch, an `Update` operation of
//! the same manager name, which server-side apply treats as another manager: the fields it wrote
//! are not dropped when an apply leaves them out (seen against kube-apiserver 1.36: `nextAttemptAt`
//! and `node` outlived an apply without them). While a task still lists that entry in
//! `metadata.managedFields`, the fields a step drops are first removed by a merge patch of `null`s
//! ([`legacy_removals`]), then the status is applied.

use chrono::{DateTime, SecondsFormat, Utc};
use kube::Resource;
use serde_json::{Map, Value, json};

use carma_api::{Condition, TaskPhase, TrainingTask, TrainingTaskStatus};

/// The field manager of the operator's status writes.
pub const FIELD_MANAGER: &str = crate::attempt::MANAGER;

/// Condition: the current attempt's pod is bound to a node. False with reason `Unschedulable`
/// and the scheduler's message while no node fits it.
pub const CONDITION_SCHEDULED: &str = "Scheduled";
/// Condition: the current attempt's training container has started. False while it waits, with
/// kubelet's reason (`ImagePullBackOff`, `CreateContainerConfigError`, …) when a container cannot
/// start; False with reason `AttemptEnded` once it ended.
pub const CONDITION_ATTEMPT_STARTED: &str = "AttemptStarted";
/// Condition: an attempt runs.
pub const CONDITION_RUNNING: &str = "Running";
/// Condition: an attempt crashed and the next one is on its way.
pub const CONDITION_RECOVERING: &str = "Recovering";
/// Condition: the task succeeded.
pub const CONDITION_SUCCEEDED: &str = "Succeeded";
/// Condition: the task failed for good.
pub const CONDITION_FAILED: &str = "Failed";

/// RFC 3339 with second precision, the form status times use.
pub fn rfc3339(t: DateTime<Utc>) -> String {
    t.to_rfc3339_opts(SecondsFormat::Secs, true)
}

/// Parse a status time.
pub fn parse_time(s: &str) -> Option<DateTime<Utc>> {
    DateTime::parse_from_rfc3339(s)
        .ok()
        .map(|t| t.with_timezone(&Utc))
}

/// Set condition `type_`. The transition time changes only when the status flips;
/// reason and message are updated whenever given.
pub fn set_condition(
    conditions: &mut Vec<Condition>,
    type_: &str,
    status: bool,
    reason: &str,
    message: &str,
    now: DateTime<Utc>,
) {
    let status_str = if status { "True" } else { "False" };
    match conditions.iter_mut().find(|c| c.type_ == type_) {
        Some(c) => {
            if c.status != status_str {
                c.status = status_str.to_string();
                c.last_transition_time = Some(rfc3339(now));
            }
            c.reason = Some(reason.to_string());
            c.message = (!message.is_empty()).then(|| message.to_string());
        }
        None => conditions.push(Condition {
            type_: type_.to_string(),
            status: status_str.to_string(),
            reason: Some(reason.to_string()),
            message: (!message.is_empty()).then(|| message.to_string()),
            last_transition_time: Some(rfc3339(now)),
        }),
    }
}

/// Turn condition `type_` False if it exists and is True (absent stays absent).
pub fn clear_condition(
    conditions: &mut [Condition],
    type_: &str,
    reason: &str,
    now: DateTime<Utc>,
) {
    if let Some(c) = conditions.iter_mut().find(|c| c.type_ == type_)
        && c.status != "False"
    {
        c.status = "False".to_string();
        c.reason = Some(reason.to_string());
        c.message = None;
        c.last_transition_time = Some(rfc3339(now));
    }
}

/// Set the phase and the phase conditions (`Running`, `Recovering`, `Succeeded`,
/// `Failed`): the one of this phase True with `reason` and `message`, the others
/// False. Conditions are added when they first become True.
pub fn set_phase(
    status: &mut TrainingTaskStatus,
    phase: TaskPhase,
    reason: &str,
    message: &str,
    now: DateTime<Utc>,
) {
    status.phase = Some(phase);
    status.message = (!message.is_empty()).then(|| message.to_string());
    let active = match phase {
        TaskPhase::Pending => None,
        TaskPhase::Running => Some(CONDITION_RUNNING),
        TaskPhase::Recovering => Some(CONDITION_RECOVERING),
        TaskPhase::Succeeded => Some(CONDITION_SUCCEEDED),
        TaskPhase::Failed => Some(CONDITION_FAILED),
    };
    for t in [
        CONDITION_RUNNING,
        CONDITION_RECOVERING,
        CONDITION_SUCCEEDED,
        CONDITION_FAILED,
    ] {
        if Some(t) == active {
            set_condition(&mut status.conditions, t, true, reason, message, now);
        } else {
            clear_condition(&mut status.conditions, t, phase.as_str(), now);
        }
    }
}

/// The condition `type_`, if present.
pub fn condition<'a>(status: &'a TrainingTaskStatus, type_: &str) -> Option<&'a Condition> {
    status.conditions.iter().find(|c| c.type_ == type_)
}

/// The server-side apply configuration of the status subresource: the whole status the operator
/// owns (fields it leaves out are dropped).
pub fn status_apply(status: &TrainingTaskStatus) -> Result<Value, serde_json::Error> {
    Ok(json!({
        "apiVersion": TrainingTask::api_version(&()),
        "kind": TrainingTask::kind(&()),
        "status": serde_json::to_value(status)?,
    }))
}

/// Whether `task`'s status still has fields written by the merge patches of earlier releases: a
/// `managedFields` entry of [`FIELD_MANAGER`] with operation `Update` on the status subresource.
pub fn has_legacy_status_writer(task: &TrainingTask) -> bool {
    task.metadata.managed_fields.iter().flatten().any(|m| {
        m.manager.as_deref() == Some(FIELD_MANAGER)
            && m.operation.as_deref() == Some("Update")
            && m.subresource.as_deref() == Some("status")
    })
}

/// The JSON merge patch that removes the fields `new` drops from `old` and changes nothing else;
/// `None` when `new` drops nothing. Needed only while [`has_legacy_status_writer`].
pub fn legacy_removals(
    old: &TrainingTaskStatus,
    new: &TrainingTaskStatus,
) -> Result<Option<Value>, serde_json::Error> {
    let patch = status_patch(old, new)?;
    Ok(only_nulls(&patch))
}

/// The `null`s of a merge patch, with the objects that lead to them; `None` when there are none.
fn only_nulls(patch: &Value) -> Option<Value> {
    match patch {
        Value::Null => Some(Value::Null),
        Value::Object(o) => {
            let kept: Map<String, Value> = o
                .iter()
                .filter_map(|(k, v)| only_nulls(v).map(|v| (k.clone(), v)))
                .collect();
            (!kept.is_empty()).then_some(Value::Object(kept))
        }
        _ => None,
    }
}

/// The body of a JSON merge patch (RFC 7386) on the status subresource that
/// turns `old` into `new`: `{"status": new}` with `null` for every field `new`
/// dropped (a plain merge would keep them).
pub fn status_patch(
    old: &TrainingTaskStatus,
    new: &TrainingTaskStatus,
) -> Result<Value, serde_json::Error> {
    let old = serde_json::to_value(old)?;
    let new = serde_json::to_value(new)?;
    let mut body = Map::new();
    body.insert("status".to_string(), with_removals(&old, new));
    Ok(Value::Object(body))
}

/// `new`, with `null` added (recursively through objects) for keys only `old` has.
pub fn with_removals(old: &Value, new: Value) -> Value {
    match (old, new) {
        (Value::Object(o), Value::Object(mut n)) => {
            for (k, ov) in o {
                match n.remove(k) {
                    Some(nv) => {
                        let merged = with_removals(ov, nv);
                        n.insert(k.clone(), merged);
                    }
                    None => {
                        n.insert(k.clone(), Value::Null);
                    }
                }
            }
            Value::Object(n)
        }
        (_, new) => new,
    }
}

/// Apply a JSON merge patch (RFC 7386) to `target`.
pub fn apply_merge_patch(target: &mut Value, patch: &Value) {
    let Value::Object(p) = patch else {
        *target = patch.clone();
        return;
    };
    if !target.is_object() {
        *target = Value::Object(Map::new());
    }
    if let Value::Object(t) = target {
        for (k, v) in p {
            if v.is_null() {
                t.remove(k);
            } else {
                apply_merge_patch(t.entry(k.clone()).or_insert(Value::Null), v);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use carma_api::EstimateStatus;
    use serde_json::json;

    fn at(s: &str) -> DateTime<Utc> {
        parse_time(s).unwrap()
    }

    #[test]
    fn transition_time_moves_only_on_flips() {
        let mut st = TrainingTaskStatus::default();
        set_phase(
            &mut st,
            TaskPhase::Running,
            "AttemptRunning",
            "a1 runs",
            at("2026-01-01T00:00:00Z"),
        );
        assert_eq!(st.conditions.len(), 1);
        set_phase(
            &mut st,
            TaskPhase::Running,
            "AttemptRunning",
            "a1 runs",
            at("2026-01-01T00:01:00Z"),
        );
        let c = condition(&st, CONDITION_RUNNING).unwrap();
        assert_eq!(
            c.last_transition_time.as_deref(),
            Some("2026-01-01T00:00:00Z")
        );
        set_phase(
            &mut st,
            TaskPhase::Recovering,
            "GpuOutOfMemory",
            "a1 OOM",
            at("2026-01-01T00:02:00Z"),
        );
        let c = condition(&st, CONDITION_RUNNING).unwrap();
        assert_eq!(c.status, "False");
        assert_eq!(c.reason.as_deref(), Some("Recovering"));
        assert_eq!(
            c.last_transition_time.as_deref(),
            Some("2026-01-01T00:02:00Z")
        );
        let r = condition(&st, CONDITION_RECOVERING).unwrap();
        assert_eq!(
            (r.status.as_str(), r.reason.as_deref()),
            ("True", Some("GpuOutOfMemory"))
        );
        assert!(condition(&st, CONDITION_FAILED).is_none());
        assert_eq!(st.phase, Some(TaskPhase::Recovering));
        assert_eq!(st.message.as_deref(), Some("a1 OOM"));
    }

    #[test]
    fn patch_nulls_dropped_fields_and_round_trips() {
        let old = TrainingTaskStatus {
            next_attempt_at: Some("2026-01-01T00:00:10Z".into()),
            estimate: Some(EstimateStatus {
                mib: Some(8000),
                source: "gpumemnet-cnn".into(),
                class: Some("(0,8000]".into()),
                ..Default::default()
            }),
            ..Default::default()
        };
        let new = TrainingTaskStatus {
            estimate: Some(EstimateStatus {
                mib: Some(16000),
                source: "recovery".into(),
                ..Default::default()
            }),
            attempt_count: 2,
            ..Default::default()
        };
        let patch = status_patch(&old, &new).unwrap();
        assert_eq!(patch["status"]["nextAttemptAt"], Value::Null);
        assert_eq!(patch["status"]["estimate"]["class"], Value::Null);
        assert_eq!(patch["status"]["estimate"]["mib"], json!(16000));
        let mut doc = json!({"spec": {"gpus": 1}, "status": serde_json::to_value(&old).unwrap()});
        apply_merge_patch(&mut doc, &patch);
        let back: TrainingTaskStatus = serde_json::from_value(doc["status"].clone()).unwrap();
        assert_eq!(back, new);
        assert_eq!(doc["spec"]["gpus"], json!(1));
    }

    #[test]
    fn the_apply_is_the_whole_status_and_the_legacy_removals_only_its_drops() {
        let old = TrainingTaskStatus {
            next_attempt_at: Some("2026-01-01T00:00:10Z".into()),
            node: Some("gpu-1".into()),
            attempt_count: 1,
            ..Default::default()
        };
        let new = TrainingTaskStatus {
            attempt_count: 2,
            ..Default::default()
        };
        let apply = status_apply(&new).unwrap();
        assert_eq!(apply["apiVersion"], "carma.io/v1alpha1");
        assert_eq!(apply["kind"], "TrainingTask");
        assert_eq!(apply["status"], serde_json::to_value(&new).unwrap());
        assert_eq!(
            legacy_removals(&old, &new).unwrap(),
            Some(json!({"status": {"nextAttemptAt": null, "node": null}}))
        );
        assert_eq!(legacy_removals(&new, &old).unwrap(), None);

        let mut task: TrainingTask = serde_json::from_value(json!({
            "apiVersion": "carma.io/v1alpha1", "kind": "TrainingTask",
            "metadata": {"name": "t", "namespace": "ml"},
            "spec": {"gpus": 1, "template": {}}
        }))
        .unwrap();
        assert!(!has_legacy_status_writer(&task));
        let entry = |manager: &str, operation: &str, subresource: Option<&str>| {
            serde_json::from_value(json!({"manager": manager, "operation": operation,
                                          "subresource": subresource}))
            .unwrap()
        };
        task.metadata.managed_fields = Some(vec![
            entry(FIELD_MANAGER, "Apply", Some("status")),
            entry(FIELD_MANAGER, "Update", None),
            entry("kubectl", "Update", Some("status")),
        ]);
        assert!(!has_legacy_status_writer(&task));
        task.metadata.managed_fields.as_mut().unwrap().push(entry(
            FIELD_MANAGER,
            "Update",
            Some("status"),
        ));
        assert!(has_legacy_status_writer(&task));
    }

    #[test]
    fn merge_patch_replaces_scalars_and_lists() {
        let mut doc = json!({"a": [1, 2], "b": {"c": 1, "d": 2}, "e": 1});
        apply_merge_patch(
            &mut doc,
            &json!({"a": [3], "b": {"c": null}, "e": {"f": 1}}),
        );
        assert_eq!(doc, json!({"a": [3], "b": {"d": 2}, "e": {"f": 1}}));
    }
}
