//! The executor: one reconcile reads the task's attempt pods (and, for the
//! current attempt, its node's `GpuNode` and, when needed, its log), asks the
//! [planner](mod@crate::plan) for the step, and carries it out — create the pod,
//! write the status, publish the Events, record the metrics.

use std::collections::BTreeMap;
use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use chrono::{DateTime, Utc};
use k8s_openapi::api::core::v1::{ObjectReference, Pod};
use k8s_openapi::api::resource::v1::ResourceClaimTemplate;
use kube::api::{ListParams, LogParams, Patch, PatchParams, PostParams};
use kube::runtime::controller::Action;
use kube::runtime::events::{Event, EventType, Recorder, Reporter};
use kube::{Api, Client, Resource, ResourceExt};
use tracing::{debug, info, instrument, warn};

use carma_api::names::LABEL_TASK;
use carma_api::{GpuNode, TrainingTask};
use carma_core::text::truncate_with_marker;
use carma_core::{QueueOrder, RecoveryConfig};

use crate::attempt::{GpuClaims, MANAGER, is_owned_by, task_label_value};
use crate::classify::{OomPatterns, PodProgress, classify};
use crate::error::{Error, Result};
use crate::metrics::Metrics;
use crate::observe::{ObservedAttempt, attempt_index, observe, pod_node};
use crate::plan::{self, Plan, PlanInput, PlannedEvent};
use crate::status;
use carma_api::dra::template::{self as claim_template, Unusable};

/// Tunables of the reconciler.
#[derive(Debug, Clone)]
pub struct Settings {
    /// Recovery defaults (CARMA-based) that each task's `spec.recovery` overrides.
    pub recovery_defaults: RecoveryConfig,
    /// Text that marks a GPU out-of-memory crash.
    pub oom_patterns: OomPatterns,
    /// Log lines read when a failed attempt left no termination message.
    pub log_tail_lines: i64,
    /// How often a running attempt is looked at again to record its memory peak.
    pub peak_poll: Duration,
    /// Requeue delay after a failed reconcile.
    pub error_requeue: Duration,
    /// The kube-scheduler profile whose extender is carma; attempt pods name it.
    pub scheduler_name: String,
    /// How attempt pods get their GPUs: the device plugin's resource or a DRA claim.
    pub gpu_claims: GpuClaims,
    /// The order whose priority classes attempts of tasks that declare a duration get (the
    /// classes must exist: the chart creates them, `carma queue-classes` prints them).
    pub queue_order: QueueOrder,
    /// The RuntimeClass attempt pods get when their template names none (e.g. `nvidia`, where the
    /// NVIDIA container runtime is a RuntimeClass rather than the nodes' default).
    pub runtime_class_name: Option<String>,
}

impl Default for Settings {
    fn default() -> Self {
        Self {
            recovery_defaults: RecoveryConfig::default(),
            oom_patterns: OomPatterns::default(),
            log_tail_lines: 50,
            peak_poll: Duration::from_secs(15),
            error_requeue: Duration::from_secs(15),
            scheduler_name: carma_api::names::SCHEDULER_NAME.to_string(),
            gpu_claims: GpuClaims::DevicePlugin,
            queue_order: QueueOrder::Arrival,
            runtime_class_name: None,
        }
    }
}

/// A clock (replaced by a fixed one in tests).
pub type Clock = Arc<dyn Fn() -> DateTime<Utc> + Send + Sync>;

/// What every reconcile shares.
#[derive(Clone)]
pub struct Context {
    /// The Kubernetes client.
    pub client: Client,
    /// Publishes Events on TrainingTasks.
    pub recorder: Recorder,
    /// The operator's metrics.
    pub metrics: Arc<Metrics>,
    /// Tunables.
    pub settings: Settings,
    /// The clock.
    pub clock: Clock,
}

impl fmt::Debug for Context {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Context")
            .field("settings", &self.settings)
            .finish_non_exhaustive()
    }
}

impl Context {
    /// A context with the wall clock; `instance` names this replica in Events.
    pub fn new(
        client: Client,
        metrics: Arc<Metrics>,
        settings: Settings,
        instance: Option<String>,
    ) -> Self {
        let recorder = Recorder::new(
            client.clone(),
            Reporter {
                controller: MANAGER.to_string(),
                instance,
            },
        );
        Self {
            client,
            recorder,
            metrics,
            settings,
            clock: Arc::new(Utc::now),
        }
    }

    /// The same context with another clock.
    pub fn with_clock(mut self, clock: Clock) -> Self {
        self.clock = clock;
        self
    }
}

/// Reconcile one TrainingTask: one step of its lifecycle.
#[instrument(skip_all, fields(task = %task.name_any(), namespace = task.metadata.namespace.as_deref().unwrap_or("")))]
pub async fn reconcile(task: Arc<TrainingTask>, ctx: Arc<Context>) -> Result<Action> {
    if plan::is_settled(&task) {
        return Ok(Action::await_change());
    }
    let ns = task
        .metadata
        .namespace
        .as_deref()
        .ok_or(Error::MissingMetadata("namespace"))?;
    let name = task
        .metadata
        .name
        .as_deref()
        .ok_or(Error::MissingMetadata("name"))?;
    let uid = task
        .metadata
        .uid
        .as_deref()
        .ok_or(Error::MissingMetadata("uid"))?;
    let pods_api: Api<Pod> = Api::namespaced(ctx.client.clone(), ns);
    let selector = format!("{LABEL_TASK}={}", task_label_value(name));
    let pods: Vec<Pod> = pods_api
        .list(&ListParams::default().labels(&selector))
        .await?
        .items
        .into_iter()
        .filter(|p| is_owned_by(p, uid))
        .collect();
    let observed = observe_pods(&task, &pods, &pods_api, &ctx).await;
    let now = (ctx.clock)();
    let first_estimate = first_dra_estimate(&task, &ctx.settings.gpu_claims);
    let step = plan::plan(&PlanInput {
        task: &task,
        pods: &observed,
        now,
        defaults: &ctx.settings.recovery_defaults,
        peak_poll: ctx.settings.peak_poll,
        scheduler_name: &ctx.settings.scheduler_name,
        gpu_claims: &ctx.settings.gpu_claims,
        queue_order: ctx.settings.queue_order,
        runtime_class_name: ctx.settings.runtime_class_name.as_deref(),
        first_estimate: first_estimate.as_ref().map(Option::as_ref),
    });
    debug!(task = name, namespace = ns, ?step, "planned");
    execute(&task, step, &pods_api, &ctx).await
}

/// The operator's sizing of a DRA task's first attempt; `None` once an attempt exists, on the
/// device-plugin path, or when the estimator is unavailable (the claim then books whole GPUs).
fn first_dra_estimate(
    task: &TrainingTask,
    claims: &GpuClaims,
) -> Result<Option<carma_api::EstimateAnnotation>, crate::attempt::InvalidSpec> {
    let started = task.status.as_ref().is_some_and(|s| !s.attempts.is_empty());
    if started || *claims == GpuClaims::DevicePlugin {
        return Ok(None);
    }
    match carma_estimator::Estimator::new() {
        Ok(estimator) => crate::sizing::first_estimate(task, &estimator),
        Err(error) => {
            warn!(%error, "the estimator did not load; DRA claims book whole GPUs");
            Ok(None)
        }
    }
}

/// What `error_policy` does: count the error and retry later.
pub fn error_policy(task: Arc<TrainingTask>, err: &Error, ctx: Arc<Context>) -> Action {
    ctx.metrics.reconcile_error(err.kind());
    warn!(
        task = %task.name_any(),
        namespace = task.namespace().unwrap_or_default(),
        kind = err.kind(),
        error = %err,
        "reconcile failed"
    );
    Action::requeue(ctx.settings.error_requeue)
}

/// Whether the attempt with this number has not been recorded as ended.
fn is_open(task: &TrainingTask, index: u32) -> bool {
    task.status
        .as_ref()
        .and_then(|s| s.attempts.iter().find(|a| a.index == index))
        .is_none_or(|a| a.outcome.is_none())
}

async fn observe_pods(
    task: &TrainingTask,
    pods: &[Pod],
    pods_api: &Api<Pod>,
    ctx: &Context,
) -> Vec<ObservedAttempt> {
    let patterns = &ctx.settings.oom_patterns;
    let gpu_nodes: Api<GpuNode> = Api::all(ctx.client.clone());
    let mut nodes: BTreeMap<String, Option<GpuNode>> = BTreeMap::new();
    let mut out = Vec::with_capacity(pods.len());
    for pod in pods {
        let Some(index) = attempt_index(pod) else {
            continue;
        };
        let open = is_open(task, index);
        let mut progress = classify(pod, None, patterns);
        if !open {
            // Recorded already: only the number matters to the planner.
            out.extend(observe(pod, progress, None));
            continue;
        }
        if let PodProgress::NeedsLogs { container } = &progress {
            let logs = read_logs(pods_api, pod, container, ctx.settings.log_tail_lines).await;
            progress = classify(pod, Some(&logs), patterns);
        }
        let node = match (&progress, pod_node(pod)) {
            (PodProgress::Pending, _) | (_, None) => None,
            (_, Some(n)) => {
                if !nodes.contains_key(&n) {
                    let got = match gpu_nodes.get_opt(&n).await {
                        Ok(g) => g,
                        Err(e) => {
                            warn!(node = %n, error = %e, "reading GpuNode failed; no memory peak this time");
                            None
                        }
                    };
                    nodes.insert(n.clone(), got);
                }
                nodes.get(&n).and_then(Option::as_ref)
            }
        };
        out.extend(observe(pod, progress, node));
    }
    out
}

async fn read_logs(pods_api: &Api<Pod>, pod: &Pod, container: &str, tail: i64) -> String {
    let name = pod.name_any();
    let params = LogParams {
        container: (!container.is_empty()).then(|| container.to_string()),
        tail_lines: Some(tail),
        ..LogParams::default()
    };
    match pods_api.logs(&name, &params).await {
        Ok(l) => l,
        Err(e) => {
            warn!(pod = %name, error = %e, "reading the log of a failed attempt failed");
            String::new()
        }
    }
}

async fn execute(
    task: &TrainingTask,
    mut step: Plan,
    pods_api: &Api<Pod>,
    ctx: &Context,
) -> Result<Action> {
    let name = task.name_any();
    let ns = task.namespace().unwrap_or_default();
    if let Some(template) = &step.ensure_claim_template
        && let Err(e) = ensure_claim_template(ctx, task, template).await
    {
        let event = PlannedEvent {
            warning: true,
            reason: "ClaimTemplateCreateFailed".into(),
            action: "CreateAttempt".into(),
            note: format!(
                "creating ResourceClaimTemplate {} failed: {e}",
                template.metadata.name.as_deref().unwrap_or("")
            ),
            pod: None,
        };
        publish(task, ctx, &event).await;
        return Err(e);
    }
    if let Some(pod) = &step.create_pod
        && let Err(e) = create_pod(task, pods_api, pod).await
    {
        let note = format!(
            "creating pod {} failed: {e}",
            pod.metadata.name.as_deref().unwrap_or("")
        );
        let event = PlannedEvent {
            warning: true,
            reason: "AttemptCreateFailed".into(),
            action: "CreateAttempt".into(),
            note,
            pod: None,
        };
        publish(task, ctx, &event).await;
        return Err(e);
    }
    let now = crate::status::rfc3339((ctx.clock)());
    let records = std::mem::take(&mut step.peak_records);
    for rec in &records {
        match crate::history::record(&ctx.client, rec, &now).await {
            Ok(done) => ctx.metrics.history_write(match done {
                crate::history::Recorded::Added => "added",
                crate::history::Recorded::Unchanged => "unchanged",
            }),
            Err(e) => {
                // A lost completed run only means the next run of the model keeps its estimate;
                // a lost crash is marked so that a later reconcile writes it again.
                ctx.metrics.history_write("error");
                if rec.sample.outcome == carma_api::AttemptOutcomeKind::GpuOutOfMemory {
                    mark_unrecorded(task, &mut step, rec.sample.attempt);
                    let retry = ctx.settings.error_requeue;
                    step.requeue_after = Some(step.requeue_after.map_or(retry, |r| r.min(retry)));
                }
                warn!(
                    task = %name,
                    namespace = %ns,
                    attempt = rec.sample.attempt,
                    fingerprint = %rec.fingerprint,
                    error = %e,
                    "recording the attempt's memory peak in its MemoryHistory failed"
                );
            }
        }
    }
    if let Some(new) = &step.status {
        let old = task.status.clone().unwrap_or_default();
        let tasks: Api<TrainingTask> = Api::namespaced(ctx.client.clone(), &ns);
        if status::has_legacy_status_writer(task)
            && let Some(removals) = status::legacy_removals(&old, new)?
        {
            let params = PatchParams {
                field_manager: Some(status::FIELD_MANAGER.to_string()),
                ..PatchParams::default()
            };
            tasks
                .patch_status(&name, &params, &Patch::Merge(&removals))
                .await?;
        }
        let params = PatchParams::apply(status::FIELD_MANAGER).force();
        tasks
            .patch_status(&name, &params, &Patch::Apply(status::status_apply(new)?))
            .await?;
        if new.phase != old.phase {
            info!(
                task = %name,
                namespace = %ns,
                from = old.phase.map_or("-", |p| p.as_str()),
                to = new.phase.map_or("-", |p| p.as_str()),
                message = new.message.as_deref().unwrap_or(""),
                "phase changed"
            );
        }
    }
    for ev in &step.events {
        publish(task, ctx, ev).await;
    }
    for o in &step.observations {
        ctx.metrics.observe(o);
    }
    Ok(step
        .requeue_after
        .map_or_else(Action::await_change, Action::requeue))
}

/// Write `historyRecorded: false` for `attempt` into the planned status (planning it when the step
/// changed nothing else).
fn mark_unrecorded(task: &TrainingTask, step: &mut Plan, attempt: u32) {
    let status = step
        .status
        .get_or_insert_with(|| Box::new(task.status.clone().unwrap_or_default()));
    if let Some(a) = status.attempts.iter_mut().find(|a| a.index == attempt) {
        a.history_recorded = Some(false);
    }
}

/// Make sure `template` exists and lists `task` among its owners: create it (with the task as
/// owner), or, when a template of that name exists, check that it says the same
/// ([`claim_template::check_existing`]) and add the task as an owner (a strategic merge patch, so
/// the other owners stay). A template that vanishes in between (its last owner went and the garbage
/// collector took it) is created again.
async fn ensure_claim_template(
    ctx: &Context,
    task: &TrainingTask,
    template: &ResourceClaimTemplate,
) -> Result<()> {
    let ns = template.metadata.namespace.as_deref().unwrap_or_default();
    let name = template.metadata.name.as_deref().unwrap_or_default();
    let uid = task
        .metadata
        .uid
        .as_deref()
        .ok_or(Error::MissingMetadata("uid"))?;
    let unusable = |why| Error::ClaimTemplate {
        namespace: ns.to_string(),
        name: name.to_string(),
        why,
    };
    let api: Api<ResourceClaimTemplate> = Api::namespaced(ctx.client.clone(), ns);
    let post = PostParams {
        field_manager: Some(MANAGER.to_string()),
        ..PostParams::default()
    };
    let patch = PatchParams {
        field_manager: Some(MANAGER.to_string()),
        ..PatchParams::default()
    };
    // Create, else adopt; twice more when the template is collected between the two.
    for _ in 0..3 {
        match api.create(&post, template).await {
            Ok(_) => {
                info!(namespace = ns, template = name, "created claim template");
                return Ok(());
            }
            Err(kube::Error::Api(s)) if s.is_already_exists() || s.code == 409 => {}
            Err(e) => return Err(e.into()),
        }
        let Some(existing) = api.get_opt(name).await? else {
            continue;
        };
        if existing.metadata.deletion_timestamp.is_some() {
            return Err(unusable(Unusable::BeingDeleted));
        }
        claim_template::check_existing(&existing, template).map_err(unusable)?;
        if claim_template::is_owned_by(&existing, uid) {
            return Ok(());
        }
        let Some(owner) = template.metadata.owner_references.iter().flatten().next() else {
            return Err(Error::MissingMetadata("uid"));
        };
        let body = claim_template::add_owner_patch(owner);
        match api.patch(name, &patch, &Patch::Strategic(&body)).await {
            Ok(_) => {
                info!(
                    namespace = ns,
                    template = name,
                    "claim template shared; task added as an owner"
                );
                return Ok(());
            }
            Err(kube::Error::Api(s)) if s.is_not_found() => {}
            Err(e) => return Err(e.into()),
        }
    }
    Err(unusable(Unusable::BeingDeleted))
}

/// Create an attempt pod; an existing pod of the same name that this task owns
/// is adopted (a retried create after a restart), one it does not own is an error.
async fn create_pod(task: &TrainingTask, pods_api: &Api<Pod>, pod: &Pod) -> Result<()> {
    let pod_name = pod.metadata.name.clone().unwrap_or_default();
    let params = PostParams {
        field_manager: Some(MANAGER.to_string()),
        ..PostParams::default()
    };
    match pods_api.create(&params, pod).await {
        Ok(_) => {
            info!(task = %task.name_any(), pod = %pod_name, "created attempt pod");
            Ok(())
        }
        Err(kube::Error::Api(s)) if s.is_already_exists() || s.code == 409 => {
            let uid = task.metadata.uid.as_deref().unwrap_or("");
            match pods_api.get_opt(&pod_name).await? {
                Some(existing) if is_owned_by(&existing, uid) => {
                    info!(task = %task.name_any(), pod = %pod_name, "attempt pod exists already; adopted");
                    Ok(())
                }
                _ => Err(Error::PodConflict {
                    pod: pod_name,
                    task: task.name_any(),
                }),
            }
        }
        Err(e) => Err(e.into()),
    }
}

/// Longest Event note the API server accepts, in bytes (longer ones make the whole Event invalid).
const EVENT_NOTE_MAX_BYTES: usize = 1024;

/// `note` cut to what the API server accepts, on a character boundary, marked with an ellipsis.
/// Notes quoting API errors (an admission policy's message, say) easily run past the limit.
fn event_note(note: &str) -> String {
    truncate_with_marker(note, EVENT_NOTE_MAX_BYTES, "…").into_owned()
}

async fn publish(task: &TrainingTask, ctx: &Context, ev: &PlannedEvent) {
    let secondary = ev.pod.as_ref().map(|p| ObjectReference {
        api_version: Some("v1".to_string()),
        kind: Some("Pod".to_string()),
        name: Some(p.clone()),
        namespace: task.namespace(),
        ..ObjectReference::default()
    });
    let event = Event {
        type_: if ev.warning {
            EventType::Warning
        } else {
            EventType::Normal
        },
        reason: ev.reason.clone(),
        note: Some(event_note(&ev.note)),
        action: ev.action.clone(),
        secondary,
    };
    if let Err(e) = ctx.recorder.publish(&event, &task.object_ref(&())).await {
        warn!(task = %task.name_any(), reason = %ev.reason, error = %e, "publishing an Event failed");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn event_notes_fit_the_api_servers_limit() {
        // An admission policy's rejection quoted in full is longer than 1 KiB (seen against a real
        // kube-apiserver: the Event was refused and nothing explained the failed attempt).
        let long = format!("creating pod x failed: {}", "é".repeat(2000));
        let note = event_note(&long);
        assert!(note.len() <= EVENT_NOTE_MAX_BYTES, "{} bytes", note.len());
        assert!(note.ends_with('…'));
        assert!(long.starts_with(note.trim_end_matches('…')));
        assert_eq!(event_note("short"), "short");
    }
}
