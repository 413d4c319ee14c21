//! The `TrainingTask` custom resource: a training job carma runs, watches and
//! recovers from out-of-memory crashes.

use std::borrow::Cow;

use k8s_openapi::api::core::v1::PodTemplateSpec;
use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::condition::Condition;

mod model_profile;
pub use model_profile::{
    CaveatKind, LayerCounts, LayerReadingValues, ModelFamily, ModelProfile, ProfileCaveat,
    TracedStep, TrainingOptimizer,
};

use carma_core::{Policy, RecoveryConfig};

/// A deep-learning training job that carma places on shared GPUs and reruns with a
/// larger memory reservation when it crashes out of GPU memory.
// Each `printcolumn(...)` repeats the keys `name`, `type_`, …; clippy reads them as duplicates.
#[allow(clippy::duplicated_attributes)]
#[derive(CustomResource, Deserialize, Serialize, Clone, Debug, PartialEq, JsonSchema)]
#[kube(
    group = "carma.io",
    version = "v1alpha1",
    kind = "TrainingTask",
    namespaced,
    status = "TrainingTaskStatus",
    shortname = "tt",
    category = "carma",
    doc = "A training job that carma places on shared GPUs and recovers from out-of-memory crashes.",
    printcolumn(
        name = "Phase",
        type_ = "string",
        json_path = ".status.phase",
        description = "Lifecycle phase"
    ),
    printcolumn(
        name = "GPUs",
        type_ = "integer",
        json_path = ".spec.gpus",
        description = "GPUs per attempt"
    ),
    printcolumn(
        name = "Reserved-MiB",
        type_ = "integer",
        json_path = ".status.reservedMiB",
        description = "Per-GPU reservation of the current attempt"
    ),
    printcolumn(
        name = "Source",
        type_ = "string",
        json_path = ".status.estimate.source",
        description = "Where the reservation came from"
    ),
    printcolumn(
        name = "Attempts",
        type_ = "integer",
        json_path = ".status.attemptCount",
        description = "Attempts so far"
    ),
    printcolumn(
        name = "Node",
        type_ = "string",
        json_path = ".status.node",
        description = "Node of the current attempt"
    ),
    printcolumn(
        name = "Age",
        type_ = "date",
        json_path = ".metadata.creationTimestamp"
    ),
    printcolumn(
        name = "Message",
        type_ = "string",
        json_path = ".status.message",
        description = "What the task does or waits for: why its attempt is not scheduled or cannot start, what it runs, why it failed"
    )
)]
#[serde(rename_all = "camelCase")]
pub struct TrainingTaskSpec {
    /// GPUs each attempt needs, all on one node (1 to 16; default 1). The first container of each
    /// attempt pod gets this many `carma.io/gpu` (or a DRA claim for them); a task that needs more
    /// than one node's GPUs never schedules.
    #[serde(default = "one")]
    #[schemars(range(min = 1, max = 16))]
    pub gpus: u32,
    /// Pod template of each attempt pod (a core/v1 PodTemplateSpec, as in a Deployment, whose
    /// `metadata` holds only `labels` and `annotations`); `spec.containers` must not be empty.
    /// The first container is the training process: its exit code and termination message tell
    /// success, a GPU out-of-memory crash and other failures apart. carma sets `schedulerName`
    /// (carma-scheduler), `restartPolicy: Never`, the `carma.io/gpu` limit and
    /// `terminationMessagePolicy: FallbackToLogsOnError` on the first container, the `carma.io/*`
    /// annotations, the labels `carma.io/task`, `carma.io/attempt` and
    /// `app.kubernetes.io/managed-by`, the owner reference and, for recovery attempts (or with
    /// `expectedDurationSeconds`), the priority class; a `nodeName` is dropped
    /// (the extender chooses the node and GPUs). Set host memory requests and limits here: a
    /// container killed for host memory (OOMKilled) is not a GPU out-of-memory crash.
    #[schemars(schema_with = "pod_template_schema")]
    pub template: PodTemplateSpec,
    /// The model, for the memory estimate the first attempt reserves (GPUMemNet, or the analytic
    /// bound, or a traced step): written to each attempt pod as the `carma.io/model-profile`
    /// annotation, and the key under which finished attempts' memory peaks are recorded so that
    /// later runs of the same model reserve what it used. `python -m carma_profile` prints it from
    /// the model itself. Without it and without `gpuMemory` each attempt reserves whole GPUs.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub model_profile: Option<ModelProfile>,
    /// Per-GPU memory the first attempt reserves, as a Kubernetes quantity (e.g. `12Gi`, `12000Mi`);
    /// when set, no estimate is made. After a GPU out-of-memory crash the next attempt reserves
    /// more (see `recovery`). Written to the pod as `carma.io/gpu-memory`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(regex(pattern = r"^[0-9]+(\.[0-9]+)?(Ki|Mi|Gi|Ti|k|M|G|T)?$"))]
    pub gpu_memory: Option<String>,
    /// How the scheduler extender chooses GPUs for this task's attempt pods (written to them as the
    /// `carma.io/policy` annotation); unset: the extender's default. The CRD describes each value
    /// with `policy_description`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(with = "Option<PolicyName>")]
    pub policy: Option<Policy>,
    /// Run every attempt on GPUs of its own, shared with no other pod (default false): no memory
    /// estimate is needed and an out-of-memory crash is not retried with a larger reservation (the
    /// task fails: the job does not fit the GPU). Without it, attempts share GPUs, and after
    /// `recovery.exclusiveAfterOoms` crashes the next attempt runs alone anyway.
    #[serde(default)]
    pub exclusive: bool,
    /// How crashed attempts are retried; unset fields take the operator's defaults.
    #[serde(default)]
    pub recovery: RecoverySpec,
    /// How long the task runs with its GPUs to itself, in seconds, as its user expects. Under the operator's queue order (the chart's queueOrder) the attempt pods get the matching carma-queue-* priority class, so that kube-scheduler tries them before tasks that declare nothing and, under short-then-longest, short tasks before long ones. Once an attempt has run longer than this, the task's later attempts get no such class (and a Warning Event says so). Unset keeps the pod's priority.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 31_536_000))]
    pub expected_duration_seconds: Option<u64>,
}

fn one() -> u32 {
    1
}

/// The schema of `spec.template`: core/v1's PodTemplateSpec as k8s-openapi describes it, inlined
/// (the generator kube derives CRDs with inlines every subschema), so the API server refuses a
/// malformed pod template when the task is created instead of the operator failing on it later,
/// `kubectl explain` shows its fields, and unknown fields are pruned (the operator reads the
/// template into the same core/v1 types, so pruning drops nothing it reads).
///
/// Two changes to it:
/// * `metadata` lists only `labels` and `annotations`, the only parts of the template's metadata
///   the operator copies to the attempt pods (it names the pod and sets its owner itself);
/// * every description is cut to its first sentence: with the full texts the CRD is about 343 KB
///   of JSON, over the 256 KiB that client-side `kubectl apply` can keep in its
///   last-applied-configuration annotation, so it could not be applied that way (cut, about
///   170 KB; `api/tests/training_task_schema.rs` holds it under the limit).
fn pod_template_schema(generator: &mut schemars::SchemaGenerator) -> schemars::Schema {
    let mut value = generator.subschema_for::<PodTemplateSpec>().to_value();
    first_sentences(&mut value);
    value["properties"]["metadata"] = serde_json::json!({
        "description": "Labels and annotations of each attempt pod, to which carma adds its own; \
                        the operator names the pod and sets its owner itself.",
        "type": "object",
        "properties": {
            "labels": {
                "description": "Labels of each attempt pod, beside carma's.",
                "type": "object",
                "additionalProperties": {"type": "string"},
            },
            "annotations": {
                "description": "Annotations of each attempt pod; carma's own carma.io annotations \
                                are set by the operator.",
                "type": "object",
                "additionalProperties": {"type": "string"},
            },
        },
    });
    value
        .try_into()
        .expect("PodTemplateSpec's schema is an object")
}

/// Cuts every `description` under `schema` to its first sentence.
fn first_sentences(schema: &mut serde_json::Value) {
    match schema {
        serde_json::Value::Object(map) => {
            for (key, value) in map.iter_mut() {
                match value {
                    serde_json::Value::String(text) if key == "description" => {
                        let cut = first_sentence(text).to_string();
                        *text = cut;
                    }
                    _ => first_sentences(value),
                }
            }
        }
        serde_json::Value::Array(items) => items.iter_mut().for_each(first_sentences),
        _ => {}
    }
}

/// The text up to the end of its first sentence, or of as many as make it at least
/// [`SHORTEST_SUMMARY`] long ("Required." alone says little). A sentence ends at a period followed
/// by white space or the end, not one of an abbreviation such as "e.g.", or at a line break.
fn first_sentence(text: &str) -> &str {
    const ABBREVIATIONS: [&str; 6] = ["e.g", "i.e", "etc", "vs", "approx", "ex"];
    let text = text.trim();
    let mut chars = text.char_indices().peekable();
    while let Some((i, c)) = chars.next() {
        if i >= SHORTEST_SUMMARY && c == '\n' {
            return text[..i].trim_end();
        }
        let at_end = chars.peek().is_none_or(|(_, next)| next.is_whitespace());
        if i >= SHORTEST_SUMMARY && c == '.' && at_end {
            let word = text[..i]
                .rsplit(|c: char| c.is_whitespace() || c == '(')
                .next()
                .unwrap_or_default()
                .to_ascii_lowercase();
            if !ABBREVIATIONS.contains(&word.as_str()) {
                return &text[..=i];
            }
        }
    }
    text
}

/// The length, in bytes, a description is cut at no shorter than (see [`first_sentence`]).
const SHORTEST_SUMMARY: usize = 16;

/// The schema of `carma_core::Policy`: its names as it serializes them, so the API server
/// accepts exactly the policies core has (core carries no schemars).
struct PolicyName;

impl JsonSchema for PolicyName {
    fn schema_name() -> Cow<'static, str> {
        "PlacementPolicy".into()
    }

    // One variant per name, as schemars derives a documented enum; the CRD lists them as an
    // `enum` of strings, and its description says what each does (a structural schema keeps no
    // per-value description).
    fn json_schema(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
        let variants: Vec<serde_json::Value> = Policy::ALL
            .iter()
            .map(|p| serde_json::json!({"type": "string", "const": p}))
            .collect();
        schemars::json_schema!({
            "description": policy_description(),
            "oneOf": variants,
        })
    }
}

/// What `spec.policy` accepts and does, one clause per policy in [`Policy::ALL`]'s order.
fn policy_description() -> String {
    let values: Vec<String> = Policy::ALL
        .iter()
        .map(|p| format!("`{p}`: {}", policy_effect(*p)))
        .collect();
    format!(
        "How the scheduler extender chooses GPUs for this task's attempt pods (their \
         carma.io/policy annotation). Except under `pack`, a pod that can have idle GPUs gets them \
         to itself; otherwise it shares GPUs that pass the memory test (free memory minus what is \
         booked covers its reservation plus a margin) and the utilization gate, in the policy's \
         order. {}. Unset: the extender's default, the chart's placement.policy (`{}` unless \
         changed).",
        values.join("; "),
        Policy::DEFAULT
    )
}

/// One policy's effect, for [`policy_description`]. Exhaustive, so a new policy is described.
fn policy_effect(policy: Policy) -> &'static str {
    match policy {
        Policy::Exclusive => "never share, wait for idle GPUs",
        Policy::Ff => "first fit, the lowest GPU index",
        Policy::Bf => "best fit, the GPU with the least free memory that still fits",
        Policy::Magm => "the GPU with the most available memory",
        Policy::Lug => "the least utilized GPU (lowest SM activity)",
        Policy::Rr => {
            "round robin over GPUs, without the memory test or the gate (an attempt that runs out \
             of GPU memory is retried by recovery)"
        }
        Policy::Pack => {
            "carma's own: share first where the pod's expected SM activity fits beside what the GPU \
             already runs, then take idle GPUs, keeping them for pods that cannot share"
        }
    }
}

/// Recovery settings; unset fields take carma's defaults.
#[derive(Deserialize, Serialize, Clone, Debug, PartialEq, Default, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct RecoverySpec {
    /// Attempts in all, the first included, before the task is Failed (1 to 50; default 5).
    /// Evictions and preemptions do not count.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 50))]
    pub max_attempts: Option<u32>,
    /// After this many GPU out-of-memory crashes the next attempt runs on GPUs of its own, at
    /// recovery priority (default 2). A crash on GPUs of its own fails the task.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub exclusive_after_ooms: Option<u32>,
    /// MiB added to the crashed attempt's observed memory peak when the next reservation is
    /// grown (default 1024). The next reservation is the larger of that and the first of
    /// GPUMemNet's class edges (8000, 16000, … 50000 MiB) above the reservation that crashed.
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        rename = "headroomMiB"
    )]
    pub headroom_mib: Option<u64>,
    /// Retries, at the same reservation, after failures that are not GPU out-of-memory crashes or
    /// evictions: a non-zero exit, a container killed for host memory (default 0: such a failure
    /// fails the task).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub retries_on_failure: Option<u32>,
    /// Seconds to wait before the next attempt after a crash or failure, doubled with each attempt
    /// used and capped at 300 (default 10; 0 retries at once).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub backoff_seconds: Option<u64>,
}

impl RecoverySpec {
    /// The core recovery configuration: these settings over `defaults`.
    pub fn to_config(&self, defaults: &RecoveryConfig) -> RecoveryConfig {
        let mut cfg = defaults.clone();
        if let Some(v) = self.max_attempts {
            cfg.max_attempts = v;
        }
        if let Some(v) = self.exclusive_after_ooms {
            cfg.exclusive_after_ooms = v;
        }
        if let Some(v) = self.headroom_mib {
            cfg.headroom_mib = v;
        }
        if let Some(v) = self.retries_on_failure {
            cfg.retries_on_failure = v;
        }
        if let Some(v) = self.backoff_seconds {
            cfg.backoff_base_ms = v.saturating_mul(1000);
        }
        cfg
    }
}

/// Observed state of a TrainingTask.
#[derive(Deserialize, Serialize, Clone, Debug, PartialEq, Default, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct TrainingTaskStatus {
    /// Lifecycle phase.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub phase: Option<TaskPhase>,
    /// Number of attempts created so far.
    #[serde(default)]
    pub attempt_count: u32,
    /// Every attempt, oldest first.
    #[serde(default)]
    pub attempts: Vec<AttemptStatus>,
    /// Reservation of the current attempt and where it came from.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub estimate: Option<EstimateStatus>,
    /// Per-GPU reservation of the current attempt in MiB.
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        rename = "reservedMiB"
    )]
    pub reserved_mib: Option<u64>,
    /// Node of the current attempt.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node: Option<String>,
    /// When the next attempt may be created (RFC 3339), while backing off.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub next_attempt_at: Option<String>,
    /// What the task does or waits for, for a person (the `Message` column of `kubectl get
    /// trainingtasks`): while its attempt is Pending, why — kube-scheduler's reasons when no node
    /// fits (carma's per-node reasons among them, cut to 512 bytes with a count of what was left
    /// out), or the container that cannot start and kubelet's reason (ErrImagePull,
    /// ImagePullBackOff, InvalidImageName, CreateContainerConfigError); then the node it runs on,
    /// or how it ended and what comes next.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
    /// Generation of the spec last acted on.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
    /// Conditions. Of the current attempt: Scheduled (False with reason Unschedulable and the
    /// scheduler's message while no node fits it) and AttemptStarted (False with kubelet's reason,
    /// e.g. ImagePullBackOff, while a container cannot start). Of the task's phase: Running,
    /// Recovering, Succeeded, Failed.
    #[serde(default)]
    pub conditions: Vec<Condition>,
}

/// Lifecycle phase of a TrainingTask.
#[derive(Deserialize, Serialize, Clone, Copy, Debug, PartialEq, Eq, JsonSchema)]
pub enum TaskPhase {
    /// Waiting for its first attempt to run.
    Pending,
    /// An attempt is running.
    Running,
    /// An attempt crashed; the next one is being prepared or waits to be scheduled.
    Recovering,
    /// An attempt succeeded.
    Succeeded,
    /// No attempt succeeded within the limits.
    Failed,
}

impl TaskPhase {
    /// The phase name.
    pub fn as_str(self) -> &'static str {
        match self {
            TaskPhase::Pending => "Pending",
            TaskPhase::Running => "Running",
            TaskPhase::Recovering => "Recovering",
            TaskPhase::Succeeded => "Succeeded",
            TaskPhase::Failed => "Failed",
        }
    }
}

/// One attempt of a TrainingTask.
#[derive(Deserialize, Serialize, Clone, Debug, PartialEq, Default, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct AttemptStatus {
    /// Attempt number, from 1.
    pub index: u32,
    /// Pod of the attempt.
    pub pod: String,
    /// Node it ran on.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node: Option<String>,
    /// GPU UUIDs it was assigned.
    #[serde(default)]
    pub gpus: Vec<String>,
    /// Per-GPU reservation in MiB (absent when it asked for whole GPUs).
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        rename = "reservedMiB"
    )]
    pub reserved_mib: Option<u64>,
    /// Whether it ran on GPUs of its own.
    #[serde(default)]
    pub exclusive: bool,
    /// How it ended; absent while it runs.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub outcome: Option<AttemptOutcomeKind>,
    /// Why it ended that way.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// Peak GPU memory seen by telemetry, in MiB.
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        rename = "observedPeakMiB"
    )]
    pub observed_peak_mib: Option<u64>,
    /// When the attempt was created (RFC 3339).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub started_at: Option<String>,
    /// When it ended (RFC 3339).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub finished_at: Option<String>,
    /// For an attempt that ran out of GPU memory: whether the crash is recorded in its model
    /// profile's MemoryHistory (so later tasks of the model are not reserved at the size that
    /// crashed). `false` after a failed write; the operator retries it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub history_recorded: Option<bool>,
    /// Whether it ran longer than `spec.expectedDurationSeconds`; once one has, the task's later
    /// attempts get no queue priority class.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub exceeded_expected_duration: Option<bool>,
}

/// How an attempt ended.
#[derive(Deserialize, Serialize, Clone, Copy, Debug, PartialEq, Eq, JsonSchema)]
pub enum AttemptOutcomeKind {
    /// Exited 0.
    Succeeded,
    /// Crashed out of GPU memory.
    GpuOutOfMemory,
    /// Failed for another reason.
    Failed,
    /// Evicted or preempted.
    Evicted,
    /// Killed by the kernel for host memory (Kubernetes' `OOMKilled`): the container
    /// exceeded its memory limit or the node ran short. Not a GPU out-of-memory crash:
    /// the GPU reservation stays as it was, and it is retried like any other failure
    /// (`spec.recovery.retriesOnFailure`); raise the pod's memory limit.
    #[serde(rename = "HostOOMKilled")]
    HostOomKilled,
}

/// Reservation of the current attempt.
#[derive(Deserialize, Serialize, Clone, Debug, PartialEq, Default, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct EstimateStatus {
    /// Reserved MiB per GPU (absent for whole GPUs).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mib: Option<u64>,
    /// Where it came from: override, estimator (traced, gpumemnet-…, analytic-upper-bound, analytic-fallback), history (earlier runs of the same model profile), recovery, whole-gpu.
    pub source: String,
    /// Estimator class label, when one applies.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub class: Option<String>,
    /// With source analytic-fallback: what the model profile's reading had no measured rule for
    /// and counted conservatively (its `caveats`), one line each; absent otherwise.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub warnings: Vec<String>,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec_schema() -> serde_json::Value {
        use kube::CustomResourceExt;
        let crd = serde_json::to_value(TrainingTask::crd()).unwrap();
        crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"].clone()
    }

    /// `(path, description)` of every property under `schema`, depth first.
    fn descriptions(schema: &serde_json::Value, path: &str, out: &mut Vec<(String, String)>) {
        let Some(props) = schema["properties"].as_object() else {
            return;
        };
        for (name, prop) in props {
            let here = format!("{path}.{name}");
            let text = prop["description"].as_str().unwrap_or("").to_string();
            out.push((here.clone(), text));
            descriptions(prop, &here, out);
            descriptions(&prop["items"], &format!("{here}[]"), out);
        }
    }

    #[test]
    fn every_spec_field_is_described_and_policy_names_each_value() {
        let spec = spec_schema();
        let mut all = Vec::new();
        descriptions(&spec, "spec", &mut all);
        assert!(all.len() > 20, "{all:?}");
        for (path, text) in &all {
            assert!(
                text.len() >= 10,
                "{path} has no useful description: {text:?}"
            );
        }
        let policy = spec["properties"]["policy"]["description"]
            .as_str()
            .unwrap();
        for p in Policy::ALL {
            assert!(
                policy.contains(&format!("`{p}`: ")),
                "{p} undescribed: {policy}"
            );
        }
        assert!(
            policy.contains(&format!("(`{}` unless changed)", Policy::DEFAULT)),
            "{policy}"
        );
    }

    #[test]
    fn descriptions_are_cut_after_their_first_sentence() {
        assert_eq!(
            first_sentence("Name of the container. Each container must have a unique name."),
            "Name of the container."
        );
        // Too short alone: the next sentence is kept with it.
        assert_eq!(
            first_sentence("Required. A list of node selector terms. The terms are ORed."),
            "Required. A list of node selector terms."
        );
        assert_eq!(
            first_sentence(
                "Shares the host's PID namespace (e.g. to see its processes). Optional."
            ),
            "Shares the host's PID namespace (e.g. to see its processes)."
        );
        assert_eq!(
            first_sentence("The volume's source, one of:\n\n- emptyDir, a scratch directory"),
            "The volume's source, one of:"
        );
        assert_eq!(
            first_sentence("Path within the container at which the volume should be mounted"),
            "Path within the container at which the volume should be mounted"
        );
        assert_eq!(
            first_sentence("  Version 1.2 of it.  "),
            "Version 1.2 of it."
        );
    }

    #[test]
    fn kubectl_get_shows_the_message() {
        use kube::CustomResourceExt;
        let crd = TrainingTask::crd();
        let columns = crd.spec.versions[0]
            .additional_printer_columns
            .clone()
            .unwrap_or_default();
        let message = columns.iter().find(|c| c.name == "Message").unwrap();
        assert_eq!(message.json_path, ".status.message");
        assert_eq!(message.type_, "string");
        // Shown without -o wide.
        assert_eq!(message.priority, None);
    }

    #[test]
    fn the_crd_accepts_exactly_cores_policies() {
        use kube::CustomResourceExt;
        let crd = serde_json::to_value(TrainingTask::crd()).unwrap();
        let schema = &crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"];
        let policy = &schema["properties"]["spec"]["properties"]["policy"];
        let names: Vec<&str> = Policy::ALL.iter().map(|p| p.as_str()).collect();
        assert_eq!(policy["enum"], serde_json::json!(names));
        assert_eq!(policy["nullable"], true);
        for p in Policy::ALL {
            let spec: Option<Policy> =
                serde_json::from_value(serde_json::json!(p.as_str())).unwrap();
            assert_eq!(spec, Some(p));
        }
    }
}
