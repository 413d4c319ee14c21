//! What the operator reads off an attempt pod and its node's `GpuNode`: pure
//! extraction into [`ObservedAttempt`], the input of the planner.

use chrono::{DateTime, Utc};
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::jiff::Timestamp;

use carma_api::names::*;
use carma_api::{EstimateAnnotation, GpuNode};
use carma_core::quantity::parse_mib;

use crate::attempt::attempt_index_from_name;
use crate::classify::{PodProgress, training_container_status};
use crate::waiting::{Waiting, waiting};

/// One existing attempt pod, as the planner needs it.
#[derive(Debug, Clone, PartialEq)]
pub struct ObservedAttempt {
    /// Attempt number (label `carma.io/attempt`, else the name suffix).
    pub index: u32,
    /// Pod name.
    pub pod: String,
    /// Pod UID.
    pub uid: Option<String>,
    /// Node it is bound to (or assigned to by the extender).
    pub node: Option<String>,
    /// GPU UUIDs the extender assigned.
    pub gpus: Vec<String>,
    /// Per-GPU reservation the pod asked for (`carma.io/gpu-memory`).
    pub requested_mib: Option<u64>,
    /// The extender's estimate, once bound.
    pub estimate: Option<EstimateAnnotation>,
    /// Whether it asked for its GPUs alone.
    pub exclusive: bool,
    /// When the pod was created.
    pub created_at: Option<DateTime<Utc>>,
    /// When the training container started running (its current run).
    pub running_since: Option<DateTime<Utc>>,
    /// When the training container ended.
    pub finished_at: Option<DateTime<Utc>>,
    /// Where it stands.
    pub progress: PodProgress,
    /// Peak GPU memory telemetry attributes to it now (max over its GPUs), MiB.
    pub peak_mib: Option<u64>,
    /// Memory of its GPUs (the smallest), MiB, when the GpuNode is known.
    pub gpu_memory_mib: Option<u64>,
    /// Its `carma.io/model-profile` annotation (the key its peak is recorded under).
    pub model_profile: Option<String>,
    /// Why it has not started, when its status says (no node fits, an image that cannot be pulled).
    pub waiting: Option<Waiting>,
}

/// The attempt number of a pod: its `carma.io/attempt` label, else its name suffix.
pub fn attempt_index(pod: &Pod) -> Option<u32> {
    pod.metadata
        .labels
        .as_ref()
        .and_then(|l| l.get(LABEL_ATTEMPT))
        .and_then(|v| v.parse().ok())
        .filter(|i| *i >= 1)
        .or_else(|| attempt_index_from_name(pod.metadata.name.as_deref()?))
}

/// The node of a pod: `spec.nodeName`, else the extender's `carma.io/assigned-node`.
pub fn pod_node(pod: &Pod) -> Option<String> {
    pod.spec
        .as_ref()
        .and_then(|s| s.node_name.clone())
        .or_else(|| annotation(pod, ANNOTATION_ASSIGNED_NODE).map(str::to_string))
        .filter(|n| !n.is_empty())
}

/// Read an attempt pod. `None` when it carries no attempt number.
pub fn observe(
    pod: &Pod,
    progress: PodProgress,
    gpu_node: Option<&GpuNode>,
) -> Option<ObservedAttempt> {
    let index = attempt_index(pod)?;
    let gpus: Vec<String> = annotation(pod, ANNOTATION_ASSIGNED_GPUS)
        .map(|v| {
            v.split(',')
                .map(str::trim)
                .filter(|s| !s.is_empty())
                .map(String::from)
                .collect()
        })
        .unwrap_or_default();
    let estimate = annotation(pod, ANNOTATION_ESTIMATE)
        .and_then(|v| serde_json::from_str::<EstimateAnnotation>(v).ok());
    let requested_mib = annotation(pod, ANNOTATION_GPU_MEMORY).and_then(|v| parse_mib(v).ok());
    let exclusive = annotation(pod, ANNOTATION_EXCLUSIVE).is_some_and(|v| v.trim() == "true");
    let (peak_mib, gpu_memory_mib) = match gpu_node {
        Some(n) => (observed_peak(n, pod), gpu_memory(n, &gpus)),
        None => (None, None),
    };
    Some(ObservedAttempt {
        index,
        pod: pod.metadata.name.clone().unwrap_or_default(),
        uid: pod.metadata.uid.clone(),
        node: pod_node(pod),
        gpus,
        requested_mib,
        estimate,
        exclusive,
        created_at: pod
            .metadata
            .creation_timestamp
            .as_ref()
            .and_then(|t| to_chrono(t.0)),
        running_since: running_since(pod),
        finished_at: finished_at(pod),
        progress,
        peak_mib,
        gpu_memory_mib,
        model_profile: annotation(pod, ANNOTATION_MODEL_PROFILE).map(str::to_string),
        waiting: waiting(pod),
    })
}

/// Peak memory telemetry attributes to `pod` on `node`: the largest `peakMiB` (else
/// `observedMiB`) over the GPUs that list it, and the final peaks of its `recentlyEnded` entries
/// (the pod has left its GPUs) — matched by UID, else by namespace and name.
pub fn observed_peak(node: &GpuNode, pod: &Pod) -> Option<u64> {
    let uid = pod.metadata.uid.as_deref().unwrap_or("");
    let name = pod.metadata.name.as_deref().unwrap_or("");
    let ns = pod.metadata.namespace.as_deref().unwrap_or("");
    let is_it = |p_uid: &str, p_ns: &str, p_name: &str| {
        if !uid.is_empty() && !p_uid.is_empty() {
            p_uid == uid
        } else {
            p_name == name && p_ns == ns
        }
    };
    let status = node.status.as_ref()?;
    let running = status
        .gpus
        .iter()
        .flat_map(|g| g.pods.iter())
        .filter(|p| is_it(&p.uid, &p.namespace, &p.name))
        // The device plugin's running peak; its current figure when an older plugin sent none.
        .filter_map(|p| p.peak_mib.max(p.observed_mib));
    let ended = status
        .recently_ended
        .iter()
        .filter(|e| is_it(&e.uid, &e.namespace, &e.name))
        .map(|e| e.peak_mib);
    running.chain(ended).max()
}

/// Memory of the GPUs named by `gpus` on `node` (the smallest); all of the node's
/// GPUs when `gpus` is empty.
pub fn gpu_memory(node: &GpuNode, gpus: &[String]) -> Option<u64> {
    node.status
        .as_ref()?
        .gpus
        .iter()
        .filter(|g| gpus.is_empty() || gpus.contains(&g.uuid))
        .map(|g| g.memory_total_mib)
        .filter(|m| *m > 0)
        .min()
}

fn running_since(pod: &Pod) -> Option<DateTime<Utc>> {
    let state = training_container_status(pod)?.state.as_ref()?;
    to_chrono(state.running.as_ref()?.started_at.as_ref()?.0)
}

fn finished_at(pod: &Pod) -> Option<DateTime<Utc>> {
    let state = training_container_status(pod)?.state.as_ref()?;
    to_chrono(state.terminated.as_ref()?.finished_at.as_ref()?.0)
}

fn annotation<'a>(pod: &'a Pod, key: &str) -> Option<&'a str> {
    pod.metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(key))
        .map(String::as_str)
}

/// A Kubernetes (jiff) timestamp as a chrono time.
pub fn to_chrono(t: Timestamp) -> Option<DateTime<Utc>> {
    DateTime::from_timestamp(t.as_second(), t.subsec_nanosecond().max(0) as u32)
}

/// A chrono time as a Kubernetes (jiff) timestamp.
pub fn to_jiff(t: DateTime<Utc>) -> Option<Timestamp> {
    Timestamp::new(t.timestamp(), t.timestamp_subsec_nanos() as i32).ok()
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn pod() -> Pod {
        serde_json::from_value(json!({
            "metadata": {
                "name": "t-a2", "namespace": "ml", "uid": "p-uid",
                "creationTimestamp": "2026-03-01T10:00:00Z",
                "labels": {"carma.io/attempt": "2"},
                "annotations": {
                    "carma.io/gpu-memory": "16000Mi",
                    "carma.io/assigned-gpus": "GPU-a, GPU-b",
                    "carma.io/assigned-node": "n1",
                    "carma.io/estimate": "{\"mib\":16000,\"source\":\"override\"}"
                }
            },
            "spec": {"containers": [{"name": "train", "image": "x"}]},
            "status": {"phase": "Failed", "containerStatuses": [{
                "name": "train", "image": "x", "imageID": "", "ready": false, "restartCount": 0,
                "state": {"terminated": {"exitCode": 1, "finishedAt": "2026-03-01T10:05:00Z"}}}]}
        }))
        .unwrap()
    }

    fn gpu_node() -> GpuNode {
        serde_json::from_value(json!({
            "metadata": {"name": "n1"},
            "spec": {},
            "status": {"gpus": [
                {"index": 0, "uuid": "GPU-a", "memoryTotalMiB": 40960, "memoryFreeMiB": 1000,
                 "pods": [{"namespace": "ml", "name": "t-a2", "uid": "p-uid", "reservedMiB": 16000, "observedMiB": 15800},
                          {"namespace": "ml", "name": "other", "uid": "o", "reservedMiB": 8000, "observedMiB": 30000}]},
                {"index": 1, "uuid": "GPU-b", "memoryTotalMiB": 81920, "memoryFreeMiB": 1000,
                 "pods": [{"namespace": "ml", "name": "t-a2", "uid": "p-uid", "reservedMiB": 16000, "observedMiB": 17100}]},
                {"index": 2, "uuid": "GPU-c", "memoryTotalMiB": 24576, "memoryFreeMiB": 24576, "pods": []}
            ]}
        }))
        .unwrap()
    }

    #[test]
    fn a_running_container_gives_the_time_it_started() {
        let mut p = pod();
        let cs = &mut p
            .status
            .as_mut()
            .unwrap()
            .container_statuses
            .as_mut()
            .unwrap()[0];
        cs.state =
            serde_json::from_value(json!({"running": {"startedAt": "2026-03-01T10:01:30Z"}}))
                .unwrap();
        let o = observe(&p, PodProgress::Running, None).unwrap();
        assert_eq!(
            o.running_since.map(|t| t.to_rfc3339()).as_deref(),
            Some("2026-03-01T10:01:30+00:00")
        );
        assert_eq!(o.finished_at, None);
        // An ended container has no running time.
        assert_eq!(
            observe(&pod(), PodProgress::Pending, None)
                .unwrap()
                .running_since,
            None
        );
    }

    #[test]
    fn reads_everything_the_planner_needs() {
        let o = observe(&pod(), PodProgress::Pending, Some(&gpu_node())).unwrap();
        assert_eq!(o.index, 2);
        assert_eq!(o.pod, "t-a2");
        assert_eq!(o.node.as_deref(), Some("n1"));
        assert_eq!(o.gpus, vec!["GPU-a", "GPU-b"]);
        assert_eq!(o.requested_mib, Some(16000));
        assert_eq!(o.estimate.as_ref().unwrap().mib, 16000);
        assert!(!o.exclusive);
        assert_eq!(o.peak_mib, Some(17100));
        assert_eq!(o.gpu_memory_mib, Some(40960));
        assert_eq!(
            o.created_at.unwrap().to_rfc3339(),
            "2026-03-01T10:00:00+00:00"
        );
        assert_eq!(
            o.finished_at.unwrap().to_rfc3339(),
            "2026-03-01T10:05:00+00:00"
        );
    }

    #[test]
    fn index_falls_back_to_the_name_and_unknown_pods_are_skipped() {
        let mut p = pod();
        p.metadata.labels = None;
        assert_eq!(attempt_index(&p), Some(2));
        p.metadata.name = Some("stranger".into());
        assert_eq!(observe(&p, PodProgress::Pending, None), None);
    }

    #[test]
    fn peak_by_name_when_uids_are_missing() {
        let mut p = pod();
        p.metadata.uid = None;
        assert_eq!(observed_peak(&gpu_node(), &p), Some(17100));
        p.metadata.name = Some("nobody".into());
        assert_eq!(observed_peak(&gpu_node(), &p), None);
        assert_eq!(gpu_memory(&gpu_node(), &[]), Some(24576));
    }

    #[test]
    fn the_device_plugins_running_peak_beats_the_current_figure() {
        let mut n = gpu_node();
        let st = n.status.as_mut().unwrap();
        st.gpus[1].pods[0].peak_mib = Some(19_900);
        assert_eq!(observed_peak(&n, &pod()), Some(19_900));
        // A peak below the current figure (an older plugin's restart) does not hide it.
        n.status.as_mut().unwrap().gpus[1].pods[0].peak_mib = Some(100);
        assert_eq!(observed_peak(&n, &pod()), Some(17_100));
    }

    #[test]
    fn a_pod_that_left_its_gpus_is_read_from_recently_ended() {
        let mut n = gpu_node();
        let st = n.status.as_mut().unwrap();
        for g in &mut st.gpus {
            g.pods.clear();
        }
        assert_eq!(observed_peak(&n, &pod()), None);
        n.status
            .as_mut()
            .unwrap()
            .recently_ended
            .push(carma_api::EndedPodPeak {
                namespace: "ml".into(),
                name: "t-a2".into(),
                uid: "p-uid".into(),
                gpu: "GPU-1".into(),
                peak_mib: 18_400,
                ended_at: "2026-03-01T10:00:00Z".into(),
            });
        assert_eq!(observed_peak(&n, &pod()), Some(18_400));
    }

    #[test]
    fn time_conversions_round_trip() {
        let t = DateTime::parse_from_rfc3339("2026-03-01T10:00:00.123456789Z")
            .unwrap()
            .with_timezone(&Utc);
        assert_eq!(to_chrono(to_jiff(t).unwrap()), Some(t));
    }
}
