//! Building the pod of one attempt from a `TrainingTask`.
//!
//! Every attempt is a pod named `<task>-a<N>` (deterministic, so a restarted
//! operator that repeats a create gets `409 AlreadyExists` and adopts the pod
//! instead of running a duplicate), labelled with the task and the attempt
//! number, owned by the task (controller reference with `blockOwnerDeletion`, so
//! deleting the task deletes its attempts through Kubernetes garbage collection),
//! scheduled by `carma-scheduler` and asking for `spec.gpus` of `carma.io/gpu`.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{Pod, PodSpec, ResourceRequirements};
use k8s_openapi::api::resource::v1::ResourceClaimTemplate;
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::{Resource, ResourceExt};
use thiserror::Error;

use carma_api::dra::{GpuBooking, claim_template, move_gpus_to_claim};
use carma_api::names::*;
use carma_api::{EstimateAnnotation, TrainingTask};
use carma_core::quantity::parse_mib;

use crate::naming::{fnv1a, trim_to};

/// Value of the `app.kubernetes.io/managed-by` label on attempt pods, and the
/// Event reporter name.
pub const MANAGER: &str = "carma-operator";

/// Annotations only the extender and the device plugin may write; a template that
/// carries them would confuse both, so they are removed.
const OUTPUT_ANNOTATIONS: &[&str] = &[
    ANNOTATION_ESTIMATE,
    ANNOTATION_ASSIGNED_GPUS,
    ANNOTATION_ASSIGNED_AT,
    ANNOTATION_ASSIGNED_NODE,
    ANNOTATION_ALLOCATED,
];

/// Longest Kubernetes object name.
const MAX_NAME: usize = 253;
/// Longest label value.
const MAX_LABEL_VALUE: usize = 63;

/// What one attempt asks for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AttemptRequest {
    /// Attempt number, from 1.
    pub index: u32,
    /// Per-GPU reservation written as `carma.io/gpu-memory` (`<N>Mi`); `None` lets
    /// the template's annotation or the extender's estimate decide.
    pub gpu_memory_mib: Option<u64>,
    /// Whether the pod must have its GPUs alone (`carma.io/exclusive: "true"`).
    pub exclusive: bool,
    /// Whether it is a recovery attempt (priority class `carma-recovery`).
    pub recovery_priority: bool,
    /// The queue's priority class for the task's declared duration
    /// ([`carma_core::QueueOrder::class`]); set unless the recovery class is, and only when the
    /// template names no priority of its own.
    pub queue_class: Option<String>,
}

/// How attempt pods get their GPUs.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub enum GpuClaims {
    /// `carma.io/gpu` from carma's device plugin; carma-scheduler's extender books the memory
    /// and picks the GPUs.
    #[default]
    DevicePlugin,
    /// A Dynamic Resource Allocation claim of this DeviceClass that books the memory as consumable
    /// capacity. The operator sizes it when it creates the pod, because a claim cannot grow
    /// later, and kube-scheduler's allocator picks the GPUs.
    Dra {
        /// The DeviceClass of carma's GPUs (the chart's `dra.deviceClass.name`).
        device_class: String,
    },
}

/// A `TrainingTask` whose template cannot become a pod.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum InvalidSpec {
    /// `spec.template.spec` is missing.
    #[error("spec.template.spec is missing")]
    NoPodSpec,
    /// The pod template has no container.
    #[error("spec.template.spec.containers is empty")]
    NoContainer,
    /// `spec.gpus` is 0.
    #[error("spec.gpus must be at least 1")]
    NoGpus,
    /// `spec.gpuMemory` is not a quantity.
    #[error("spec.gpuMemory: {0}")]
    GpuMemory(String),
    /// `spec.modelProfile` could not be encoded.
    #[error("spec.modelProfile: {0}")]
    ModelProfile(String),
    /// The claim template could not be encoded to derive its name.
    #[error("claim template: {0}")]
    ClaimTemplate(String),
    /// The task lacks a name or uid (never the case for objects read from the API).
    #[error("TrainingTask metadata has no {0}")]
    Metadata(&'static str),
}

/// The pod name of attempt `index` of task `task`: `<task>-a<index>`, with the task
/// part shortened (and made unique with a hash) when the name would be too long.
pub fn attempt_pod_name(task: &str, index: u32) -> String {
    let suffix = format!("-a{index}");
    if task.len() + suffix.len() <= MAX_NAME {
        return format!("{task}{suffix}");
    }
    let hash = format!("-{:08x}", fnv1a(task.as_bytes()) as u32);
    let keep = MAX_NAME - suffix.len() - hash.len();
    let head = trim_to(task, keep);
    format!("{head}{hash}{suffix}")
}

/// The `carma.io/task` label value of a task: its name, or a shortened name with
/// a hash when the name is longer than a label value may be.
pub fn task_label_value(task: &str) -> String {
    if task.len() <= MAX_LABEL_VALUE {
        return task.to_string();
    }
    let hash = format!("-{:08x}", fnv1a(task.as_bytes()) as u32);
    let head = trim_to(task, MAX_LABEL_VALUE - hash.len());
    format!("{head}{hash}")
}

/// The attempt number in a pod name made by [`attempt_pod_name`].
pub fn attempt_index_from_name(pod: &str) -> Option<u32> {
    let (_, n) = pod.rsplit_once("-a")?;
    n.parse().ok().filter(|i| *i >= 1)
}

/// Build the pod of an attempt.
/// `scheduler_name` is the kube-scheduler profile whose extender is carma (the chart's
/// `scheduler.schedulerName`).
pub fn build_attempt_pod(
    task: &TrainingTask,
    req: &AttemptRequest,
    scheduler_name: &str,
) -> Result<Pod, InvalidSpec> {
    let name = task
        .metadata
        .name
        .as_deref()
        .ok_or(InvalidSpec::Metadata("name"))?;
    if task.spec.gpus == 0 {
        return Err(InvalidSpec::NoGpus);
    }
    let mut owner = task
        .controller_owner_ref(&())
        .ok_or(InvalidSpec::Metadata("uid"))?;
    owner.block_owner_deletion = Some(true);

    let template = &task.spec.template;
    let mut spec: PodSpec = template.spec.clone().ok_or(InvalidSpec::NoPodSpec)?;
    if spec.containers.is_empty() {
        return Err(InvalidSpec::NoContainer);
    }

    let tmeta = template.metadata.clone().unwrap_or_default();
    let mut labels = tmeta.labels.unwrap_or_default();
    labels.insert(LABEL_TASK.to_string(), task_label_value(name));
    labels.insert(LABEL_ATTEMPT.to_string(), req.index.to_string());
    labels.insert(LABEL_MANAGED_BY.to_string(), MANAGER.to_string());

    let mut annotations = tmeta.annotations.unwrap_or_default();
    for key in OUTPUT_ANNOTATIONS {
        annotations.remove(*key);
    }
    if let Some(profile) = &task.spec.model_profile {
        let json =
            serde_json::to_string(profile).map_err(|e| InvalidSpec::ModelProfile(e.to_string()))?;
        annotations.insert(ANNOTATION_MODEL_PROFILE.to_string(), json);
    }
    if let Some(mib) = req.gpu_memory_mib {
        annotations.insert(ANNOTATION_GPU_MEMORY.to_string(), format!("{mib}Mi"));
    }
    if let Some(policy) = task.spec.policy
        && let Ok(serde_json::Value::String(p)) = serde_json::to_value(policy)
    {
        annotations.insert(ANNOTATION_POLICY.to_string(), p);
    }
    if req.exclusive || task.spec.exclusive {
        annotations.insert(ANNOTATION_EXCLUSIVE.to_string(), "true".to_string());
    }

    spec.scheduler_name = Some(scheduler_name.to_string());
    spec.restart_policy = Some("Never".to_string());
    // A template that names a node would bypass carma-scheduler and its GPU choice.
    spec.node_name = None;
    if req.recovery_priority {
        spec.priority_class_name = Some(PRIORITY_CLASS_RECOVERY.to_string());
        // Admission derives the priority from the class; a stale value is rejected.
        spec.priority = None;
    } else if let Some(class) = &req.queue_class
        && spec.priority_class_name.is_none()
        && spec.priority.is_none()
    {
        spec.priority_class_name = Some(class.clone());
    }
    let gpus = Quantity(task.spec.gpus.to_string());
    let training = &mut spec.containers[0];
    training.termination_message_policy = Some("FallbackToLogsOnError".to_string());
    let resources = training
        .resources
        .get_or_insert_with(ResourceRequirements::default);
    resources
        .limits
        .get_or_insert_with(BTreeMap::new)
        .insert(RESOURCE_GPU.to_string(), gpus.clone());
    if let Some(requests) = resources.requests.as_mut() {
        // Extended resources: a request, when present, must equal the limit.
        requests.insert(RESOURCE_GPU.to_string(), gpus);
    }

    Ok(Pod {
        metadata: ObjectMeta {
            name: Some(attempt_pod_name(name, req.index)),
            namespace: task.namespace(),
            labels: Some(labels),
            annotations: Some(annotations),
            owner_references: Some(vec![owner]),
            ..ObjectMeta::default()
        },
        spec: Some(spec),
        status: None,
    })
}

/// The pod of an attempt on DRA GPUs and the claim template it references.
///
/// It is [`build_attempt_pod`]'s pod with the `carma.io/gpu` resource replaced by a claim
/// ([`move_gpus_to_claim`]) that
/// books, on each of `spec.gpus` GPUs, the `carma.io/gpu-memory` the pod ends up with (the
/// request's, else the template's). Without one, or for an exclusive attempt, the claim takes whole
/// GPUs and the pod is marked exclusive, so that recovery knows no larger booking exists. The
/// template is named after its content and owned (not controlled) by the task
/// ([`carma_api::dra::template`]).
/// `estimate` is the operator's own sizing of the attempt, written as `carma.io/estimate` (no
/// extender sees these pods); without it an attempt that books memory says where the figure came
/// from: `override` for the first attempt, `recovery` for later ones.
pub fn build_dra_attempt(
    task: &TrainingTask,
    req: &AttemptRequest,
    scheduler_name: &str,
    device_class: &str,
    estimate: Option<&EstimateAnnotation>,
) -> Result<(Pod, ResourceClaimTemplate), InvalidSpec> {
    let mut pod = build_attempt_pod(task, req, scheduler_name)?;
    let annotations = pod.metadata.annotations.get_or_insert_with(BTreeMap::new);
    let exclusive = annotations
        .get(ANNOTATION_EXCLUSIVE)
        .is_some_and(|v| v.trim() == "true");
    let booked = match annotations.get(ANNOTATION_GPU_MEMORY) {
        Some(v) => Some(parse_mib(v).map_err(|e| InvalidSpec::GpuMemory(e.to_string()))?),
        None => None,
    };
    let booking = match booked {
        Some(mib) if !exclusive => GpuBooking::Mib(mib),
        _ => GpuBooking::Whole,
    };
    match booking {
        GpuBooking::Mib(mib) => {
            let written = estimate.cloned().unwrap_or_else(|| EstimateAnnotation {
                mib,
                source: given_reservation_source(req.index).to_string(),
                class: None,
                samples: None,
            });
            if let Ok(json) = serde_json::to_string(&written) {
                annotations.insert(ANNOTATION_ESTIMATE.to_string(), json);
            }
        }
        GpuBooking::Whole => {
            annotations.insert(ANNOTATION_EXCLUSIVE.to_string(), "true".to_string());
        }
    }
    let namespace = pod.metadata.namespace.clone().unwrap_or_default();
    let spec = pod.spec.as_mut().ok_or(InvalidSpec::NoPodSpec)?;
    let mut template = claim_template(&namespace, device_class, task.spec.gpus, booking);
    let owner = task.owner_ref(&()).ok_or(InvalidSpec::Metadata("uid"))?;
    carma_api::dra::template::finish(&mut template, owner)
        .map_err(|e| InvalidSpec::ClaimTemplate(e.to_string()))?;
    move_gpus_to_claim(spec, template.metadata.name.as_deref().unwrap_or_default());
    Ok((pod, template))
}

/// Where the reservation of attempt `index` comes from when the operator wrote it: the task's
/// `gpuMemory` for the first attempt, recovery's grown reservation for later ones.
pub fn given_reservation_source(index: u32) -> &'static str {
    if index == 1 { "override" } else { "recovery" }
}

/// Whether `pod` is controlled by the object with uid `owner_uid`.
pub fn is_owned_by(pod: &Pod, owner_uid: &str) -> bool {
    pod.metadata
        .owner_references
        .iter()
        .flatten()
        .any(|o| o.uid == owner_uid && o.controller == Some(true))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    pub(crate) fn task() -> TrainingTask {
        serde_json::from_value(json!({
            "apiVersion": "carma.io/v1alpha1",
            "kind": "TrainingTask",
            "metadata": {"name": "bert", "namespace": "ml", "uid": "uid-1", "generation": 1},
            "spec": {
                "gpus": 2,
                "gpuMemory": "12Gi",
                "policy": "magm",
                "modelProfile": {"family": "transformer", "batchSize": 32, "parameters": 110000000, "activations": 5000000},
                "template": {
                    "metadata": {
                        "labels": {"team": "nlp"},
                        "annotations": {"keep": "me", "carma.io/assigned-gpus": "GPU-stale", "carma.io/exclusive": "true"}
                    },
                    "spec": {
                        "restartPolicy": "OnFailure",
                        "nodeName": "pinned",
                        "priority": 5,
                        "containers": [
                            {"name": "train", "image": "pytorch", "resources": {"requests": {"cpu": "1", "carma.io/gpu": "1"}}},
                            {"name": "side", "image": "busybox"}
                        ]
                    }
                }
            }
        }))
        .unwrap()
    }

    fn req(index: u32) -> AttemptRequest {
        AttemptRequest {
            index,
            gpu_memory_mib: Some(12288),
            exclusive: false,
            recovery_priority: false,
            queue_class: None,
        }
    }

    #[test]
    fn first_attempt_pod() {
        let pod = build_attempt_pod(&task(), &req(1), SCHEDULER_NAME).unwrap();
        let m = &pod.metadata;
        assert_eq!(m.name.as_deref(), Some("bert-a1"));
        assert_eq!(m.namespace.as_deref(), Some("ml"));
        let labels = m.labels.as_ref().unwrap();
        assert_eq!(labels[LABEL_TASK], "bert");
        assert_eq!(labels[LABEL_ATTEMPT], "1");
        assert_eq!(labels[LABEL_MANAGED_BY], MANAGER);
        assert_eq!(labels["team"], "nlp");
        let ann = m.annotations.as_ref().unwrap();
        assert_eq!(ann[ANNOTATION_GPU_MEMORY], "12288Mi");
        assert_eq!(ann[ANNOTATION_POLICY], "magm");
        assert_eq!(ann["keep"], "me");
        assert!(!ann.contains_key(ANNOTATION_ASSIGNED_GPUS));
        // The template's own annotation stays (the pod then runs exclusively).
        assert_eq!(ann[ANNOTATION_EXCLUSIVE], "true");
        let profile: serde_json::Value =
            serde_json::from_str(&ann[ANNOTATION_MODEL_PROFILE]).unwrap();
        assert_eq!(profile["family"], "transformer");
        assert_eq!(profile["batchSize"], 32);
        let owner = &m.owner_references.as_ref().unwrap()[0];
        assert_eq!(owner.kind, "TrainingTask");
        assert_eq!(owner.api_version, "carma.io/v1alpha1");
        assert_eq!(owner.uid, "uid-1");
        assert_eq!(owner.controller, Some(true));
        assert_eq!(owner.block_owner_deletion, Some(true));
        assert!(is_owned_by(&pod, "uid-1"));
        assert!(!is_owned_by(&pod, "uid-2"));

        let spec = pod.spec.as_ref().unwrap();
        assert_eq!(spec.scheduler_name.as_deref(), Some(SCHEDULER_NAME));
        // The profile name is the chart's value, not a constant (a real API server with the chart's
        // admission policy rejected attempt pods naming carma-scheduler under another name).
        let renamed = build_attempt_pod(&task(), &req(1), "gpu-share").unwrap();
        assert_eq!(
            renamed.spec.unwrap().scheduler_name.as_deref(),
            Some("gpu-share")
        );
        assert_eq!(spec.restart_policy.as_deref(), Some("Never"));
        assert_eq!(spec.node_name, None);
        assert_eq!(spec.priority_class_name, None);
        assert_eq!(spec.priority, Some(5));
        let c = &spec.containers[0];
        assert_eq!(
            c.termination_message_policy.as_deref(),
            Some("FallbackToLogsOnError")
        );
        let r = c.resources.as_ref().unwrap();
        assert_eq!(r.limits.as_ref().unwrap()[RESOURCE_GPU].0, "2");
        assert_eq!(r.requests.as_ref().unwrap()[RESOURCE_GPU].0, "2");
        assert_eq!(r.requests.as_ref().unwrap()["cpu"].0, "1");
        assert_eq!(spec.containers[1].termination_message_policy, None);
    }

    #[test]
    fn a_traced_profile_reaches_the_annotation_whole() {
        let mut t = task();
        t.spec.model_profile = Some(
            serde_json::from_value(json!({
                "family": "cnn", "batchSize": 64, "parameters": 25557032, "activations": 37560000, "depth": 107,
                "traced": {"forwardMiB": 5500, "backwardMiB": 5594, "optimizerStepMiB": 600,
                           "largestTensorMiB": 196, "reservedMiB": 6626}
            }))
            .unwrap(),
        );
        let pod = build_attempt_pod(&t, &req(1), SCHEDULER_NAME).unwrap();
        let ann = pod.metadata.annotations.unwrap();
        let profile = carma_estimator::parse_profile(&ann[ANNOTATION_MODEL_PROFILE]).unwrap();
        let traced = profile.traced.unwrap();
        assert_eq!(traced.reserved_mib, Some(6626));
        // the estimator reserves from the replayed segments, not from the phase peak
        assert_eq!(
            carma_estimator::traced_reservation_mib(&traced, carma_estimator::Family::Cnn, 1),
            carma_estimator::ALLOCATOR_CONTEXT_MIB
                + 6626
                + (196 * carma_estimator::ALLOCATOR_CNN_LARGEST_FACTOR_MILLI).div_ceil(1000)
        );
    }

    #[test]
    fn a_layer_reading_reaches_the_annotation_whole() {
        let mut t = task();
        let reading = json!({"savedValues": 106340864u64, "keptFp32Values": 153871872u64,
                             "largestValues": 25731584u64, "scoreValues": 0});
        t.spec.model_profile = Some(
            serde_json::from_value(json!({
                "family": "transformer", "batchSize": 16, "parameters": 124439808u64,
                "activations": 211329536u64, "depth": 123, "seqLength": 512,
                "layerReading": reading
            }))
            .unwrap(),
        );
        let pod = build_attempt_pod(&t, &req(1), SCHEDULER_NAME).unwrap();
        let ann = pod.metadata.annotations.unwrap();
        let profile = carma_estimator::parse_profile(&ann[ANNOTATION_MODEL_PROFILE]).unwrap();
        assert_eq!(
            serde_json::to_value(profile.layer_reading.unwrap()).unwrap(),
            reading
        );
    }

    #[test]
    fn recovery_attempt_pod() {
        let pod = build_attempt_pod(
            &task(),
            &AttemptRequest {
                index: 3,
                gpu_memory_mib: None,
                exclusive: true,
                recovery_priority: true,
                queue_class: Some("carma-queue-stl30-under-16m".to_string()),
            },
            SCHEDULER_NAME,
        )
        .unwrap();
        assert_eq!(pod.metadata.name.as_deref(), Some("bert-a3"));
        let ann = pod.metadata.annotations.as_ref().unwrap();
        assert_eq!(ann[ANNOTATION_EXCLUSIVE], "true");
        assert!(!ann.contains_key(ANNOTATION_GPU_MEMORY));
        let spec = pod.spec.as_ref().unwrap();
        assert_eq!(
            spec.priority_class_name.as_deref(),
            Some(PRIORITY_CLASS_RECOVERY)
        );
        assert_eq!(spec.priority, None);
    }

    #[test]
    fn the_queue_class_names_the_pods_priority_unless_the_template_does() {
        let queued = AttemptRequest {
            queue_class: Some("carma-queue-stl30-under-16m".to_string()),
            ..req(1)
        };
        let mut plain = task();
        plain.spec.template.spec.as_mut().unwrap().priority = None;
        let pod = build_attempt_pod(&plain, &queued, SCHEDULER_NAME).unwrap();
        let spec = pod.spec.unwrap();
        assert_eq!(
            spec.priority_class_name.as_deref(),
            Some("carma-queue-stl30-under-16m")
        );
        assert_eq!(spec.priority, None);
        // A template that names a class or a priority keeps it: the user's choice stands.
        let mut own = plain.clone();
        own.spec.template.spec.as_mut().unwrap().priority_class_name = Some("team-a".into());
        let pod = build_attempt_pod(&own, &queued, SCHEDULER_NAME).unwrap();
        assert_eq!(
            pod.spec.unwrap().priority_class_name.as_deref(),
            Some("team-a")
        );
        let pod = build_attempt_pod(&task(), &queued, SCHEDULER_NAME).unwrap();
        let spec = pod.spec.unwrap();
        assert_eq!((spec.priority_class_name, spec.priority), (None, Some(5)));
    }

    #[test]
    fn invalid_templates() {
        let mut t = task();
        t.spec.template.spec.as_mut().unwrap().containers.clear();
        assert_eq!(
            build_attempt_pod(&t, &req(1), SCHEDULER_NAME),
            Err(InvalidSpec::NoContainer)
        );
        t.spec.template.spec = None;
        assert_eq!(
            build_attempt_pod(&t, &req(1), SCHEDULER_NAME),
            Err(InvalidSpec::NoPodSpec)
        );
        let mut t = task();
        t.spec.gpus = 0;
        assert_eq!(
            build_attempt_pod(&t, &req(1), SCHEDULER_NAME),
            Err(InvalidSpec::NoGpus)
        );
        let mut t = task();
        t.metadata.uid = None;
        assert_eq!(
            build_attempt_pod(&t, &req(1), SCHEDULER_NAME),
            Err(InvalidSpec::Metadata("uid"))
        );
    }

    #[test]
    fn names() {
        assert_eq!(attempt_pod_name("t", 12), "t-a12");
        assert_eq!(attempt_index_from_name("t-a12"), Some(12));
        assert_eq!(attempt_index_from_name("my-app-a3"), Some(3));
        assert_eq!(attempt_index_from_name("t-a0"), None);
        assert_eq!(attempt_index_from_name("t-ax"), None);
        assert_eq!(attempt_index_from_name("plain"), None);
        let long = "n".repeat(253);
        let name = attempt_pod_name(&long, 7);
        assert!(name.len() <= 253, "{}", name.len());
        assert!(name.ends_with("-a7"));
        assert_eq!(attempt_index_from_name(&name), Some(7));
        assert_ne!(
            attempt_pod_name(&long, 7),
            attempt_pod_name(&format!("{long}x"), 7)
        );
        assert_eq!(task_label_value("short"), "short");
        let v = task_label_value(&"x".repeat(100));
        assert!(v.len() <= 63);
        assert_eq!(v, task_label_value(&"x".repeat(100)));
    }
}
