//! The pods on this node as the device plugin sees them, and the lookup behind a trait.
//!
//! Allocate and the telemetry loop both need "the pods bound to this node with their carma
//! assignment". [`PodLookup`] hides where that comes from: the API server ([`KubePodLookup`], a
//! field-selected watch, with a consistent list when a fresher view is needed) or a test double.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use carma_api::names::{ANNOTATION_ALLOCATED, LABEL_TASK, RESOURCE_GPU};
use futures::future::BoxFuture;
use futures::{FutureExt, StreamExt};
use k8s_openapi::api::core::v1::{Container, Pod, PodSpec, PodStatus, ResourceRequirements};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use kube::api::{Api, ListParams, Patch, PatchParams};
use kube::runtime::{WatchStreamExt, reflector, watcher};
use thiserror::Error;
use tracing::warn;

pub use carma_gpu::pod::PodInfo;

/// The pod lookup failed.
#[derive(Debug, Clone, Error)]
pub enum LookupError {
    /// No API server is configured: pod lookup is off.
    #[error(
        "pod lookup is off: no Kubernetes API server is reachable (no kubeconfig and not in a cluster), so the device plugin cannot tell which pod is being admitted"
    )]
    Off,
    /// The API call failed.
    #[error("Kubernetes API: {0}")]
    Api(String),
}

/// Where the pods on this node come from.
pub trait PodLookup: Send + Sync + std::fmt::Debug {
    /// The pods bound to this node, from a cache no older than `max_age`.
    fn pods_on_node(
        &self,
        max_age: Duration,
    ) -> BoxFuture<'_, Result<Arc<Vec<PodInfo>>, LookupError>>;

    /// Annotate a pod with `carma.io/allocated: "true"`.
    fn mark_allocated<'a>(
        &'a self,
        namespace: &'a str,
        name: &'a str,
    ) -> BoxFuture<'a, Result<(), LookupError>>;
}

/// Longest wait for one API call (kube's own read timeout is minutes).
const API_TIMEOUT: Duration = Duration::from_secs(10);

/// Pod lookup through the API server: a watch of the pods with `spec.nodeName=<node>` (kube's
/// reflector) answers every lookup from memory; a request for a list younger than the watch can
/// promise (Allocate's second look, when a pod bound a moment ago is not in the store yet) and the
/// time before the watch has synced are served by one consistent LIST.
pub struct KubePodLookup {
    client: kube::Client,
    node: String,
    store: reflector::Store<Pod>,
    /// Bumped by the watch on every pod added, changed or deleted.
    changes: Arc<AtomicU64>,
    /// The store as [`PodInfo`]s and the change count it was built at: the telemetry loop asks every
    /// sample, and parsing every pod's annotations each time is work the watch makes unnecessary.
    converted: parking_lot::Mutex<Option<(u64, Arc<Vec<PodInfo>>)>>,
    /// The last direct LIST, shared by concurrent callers.
    cache: tokio::sync::Mutex<Option<(Instant, Arc<Vec<PodInfo>>)>>,
}

impl std::fmt::Debug for KubePodLookup {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KubePodLookup")
            .field("node", &self.node)
            .finish_non_exhaustive()
    }
}

/// A list requested at most this old is read from the API server rather than the watch.
const WATCH_FRESHNESS: Duration = Duration::from_millis(100);

impl KubePodLookup {
    /// Lookup of the pods on `node`; starts the watch (on the current Tokio runtime).
    pub fn new(client: kube::Client, node: impl Into<String>) -> Self {
        let node = node.into();
        let api: Api<Pod> = Api::all(client.clone());
        let (store, writer) = reflector::store();
        let config = watcher::Config::default().fields(&format!("spec.nodeName={node}"));
        let stream = watcher(api, config)
            .default_backoff()
            .modify(keep_what_pod_info_reads)
            .reflect(writer)
            .touched_objects();
        let watched = node.clone();
        let changes = Arc::new(AtomicU64::new(0));
        let bump = changes.clone();
        tokio::spawn(async move {
            futures::pin_mut!(stream);
            while let Some(event) = stream.next().await {
                match event {
                    Ok(_) => {
                        bump.fetch_add(1, Ordering::Release);
                    }
                    Err(e) => {
                        warn!(node = %watched, "watching the node's pods: {e} (retrying with backoff)")
                    }
                }
            }
        });
        Self {
            client,
            node,
            store,
            changes,
            converted: parking_lot::Mutex::new(None),
            cache: tokio::sync::Mutex::new(None),
        }
    }

    async fn list(&self) -> Result<Vec<PodInfo>, LookupError> {
        let api: Api<Pod> = Api::all(self.client.clone());
        let params = ListParams::default().fields(&format!("spec.nodeName={}", self.node));
        let list = tokio::time::timeout(API_TIMEOUT, api.list(&params))
            .await
            .map_err(|_| {
                LookupError::Api(format!(
                    "list pods on node {}: no answer within {API_TIMEOUT:?}",
                    self.node
                ))
            })?
            .map_err(|e| LookupError::Api(format!("list pods on node {}: {e}", self.node)))?;
        Ok(list.items.iter().map(PodInfo::from_pod).collect())
    }

    /// The watched pods, once the watch has listed them all; converted again only after a change.
    fn watched(&self) -> Option<Arc<Vec<PodInfo>>> {
        if !matches!(self.store.wait_until_ready().now_or_never(), Some(Ok(()))) {
            return None;
        }
        // Read the count before the store: a change racing with the conversion bumps it past the
        // cached value, so the next call converts again.
        let seen = self.changes.load(Ordering::Acquire);
        let mut converted = self.converted.lock();
        if let Some((at, pods)) = converted.as_ref()
            && *at == seen
        {
            return Some(pods.clone());
        }
        let pods: Arc<Vec<PodInfo>> = Arc::new(
            self.store
                .state()
                .iter()
                .map(|p| PodInfo::from_pod(p))
                .collect(),
        );
        *converted = Some((seen, pods.clone()));
        Some(pods)
    }
}

/// Strips a watched pod down to what [`PodInfo::from_pod`] reads, before the store keeps it: the
/// store holds every pod of the node for as long as it exists, and most of a pod's JSON is
/// `managedFields`, container `env`, `command`, `args`, probes and mounts, volumes and status
/// conditions, none of which the device plugin reads.
///
/// Kept: `metadata` name, namespace, UID, resourceVersion (the watch resumes from it), the
/// creation and deletion timestamps (`terminating`), the `carma.io/` annotations (the assignment
/// and the `allocated` mark) and the `carma.io/task` label; `spec` nodeName, schedulerName, and
/// of each container and init container its name and `carma.io/gpu` limit and request;
/// `status.phase`. Every other field is dropped.
pub(crate) fn keep_what_pod_info_reads(pod: &mut Pod) {
    let m = &mut pod.metadata;
    m.managed_fields = None;
    m.owner_references = None;
    m.finalizers = None;
    m.generate_name = None;
    if let Some(a) = m.annotations.as_mut() {
        a.retain(|k, _| k.starts_with("carma.io/"));
    }
    if let Some(l) = m.labels.as_mut() {
        l.retain(|k, _| k == LABEL_TASK);
    }
    fn gpu_only(list: &mut BTreeMap<String, Quantity>) {
        list.retain(|k, _| k == RESOURCE_GPU);
    }
    let slim = |c: Container| Container {
        name: c.name,
        resources: c.resources.map(|mut r| {
            r.limits.as_mut().map(gpu_only);
            r.requests.as_mut().map(gpu_only);
            ResourceRequirements {
                limits: r.limits,
                requests: r.requests,
                ..Default::default()
            }
        }),
        ..Default::default()
    };
    if let Some(spec) = pod.spec.take() {
        pod.spec = Some(PodSpec {
            node_name: spec.node_name,
            scheduler_name: spec.scheduler_name,
            containers: spec.containers.into_iter().map(slim).collect(),
            init_containers: spec
                .init_containers
                .map(|cs| cs.into_iter().map(slim).collect()),
            ..Default::default()
        });
    }
    if let Some(status) = pod.status.take() {
        pod.status = Some(PodStatus {
            phase: status.phase,
            ..Default::default()
        });
    }
}

impl PodLookup for KubePodLookup {
    fn pods_on_node(
        &self,
        max_age: Duration,
    ) -> BoxFuture<'_, Result<Arc<Vec<PodInfo>>, LookupError>> {
        Box::pin(async move {
            if max_age >= WATCH_FRESHNESS
                && let Some(pods) = self.watched()
            {
                return Ok(pods);
            }
            // One list at a time: concurrent callers wait and then share the fresh result.
            let mut cache = self.cache.lock().await;
            if let Some((at, pods)) = cache.as_ref()
                && at.elapsed() <= max_age
            {
                return Ok(pods.clone());
            }
            let pods = Arc::new(self.list().await?);
            *cache = Some((Instant::now(), pods.clone()));
            Ok(pods)
        })
    }

    fn mark_allocated<'a>(
        &'a self,
        namespace: &'a str,
        name: &'a str,
    ) -> BoxFuture<'a, Result<(), LookupError>> {
        Box::pin(async move {
            let api: Api<Pod> = Api::namespaced(self.client.clone(), namespace);
            let patch = serde_json::json!({
                "metadata": { "annotations": { ANNOTATION_ALLOCATED: "true" } }
            });
            tokio::time::timeout(
                API_TIMEOUT,
                api.patch(name, &PatchParams::default(), &Patch::Merge(&patch)),
            )
            .await
            .map_err(|_| {
                LookupError::Api(format!(
                    "annotate pod {namespace}/{name}: no answer within {API_TIMEOUT:?}"
                ))
            })?
            .map_err(|e| LookupError::Api(format!("annotate pod {namespace}/{name}: {e}")))?;
            // Keep the cache in step so the pod is not offered again before the next list.
            let mut cache = self.cache.lock().await;
            if let Some((_, pods)) = cache.as_mut() {
                let mut updated: Vec<PodInfo> = pods.as_ref().clone();
                for p in updated.iter_mut() {
                    if p.namespace == namespace
                        && p.name == name
                        && let Ok(Some(a)) = p.assignment.as_mut()
                    {
                        a.allocated = true;
                    }
                }
                *pods = Arc::new(updated);
            }
            Ok(())
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The store keeps a node's pods stripped to what `PodInfo` reads: the same `PodInfo`, a
    /// fraction of the object.
    #[test]
    fn the_stored_pod_reads_the_same_and_drops_the_rest() {
        let full = pod(serde_json::json!({
            "metadata": {
                "name": "train-1", "namespace": "ml", "uid": "u-1", "resourceVersion": "7",
                "generateName": "train-", "creationTimestamp": "2026-01-01T00:00:00Z",
                "deletionTimestamp": "2026-01-01T00:10:00Z",
                "labels": { "carma.io/task": "resnet", "app": "train" },
                "annotations": {
                    "carma.io/assigned-gpus": "GPU-a,GPU-b",
                    "carma.io/assigned-at": "2026-01-01T00:00:00Z",
                    "carma.io/estimate": "{\"mib\":8000,\"source\":\"override\"}",
                    "carma.io/allocated": "true",
                    "kubectl.kubernetes.io/last-applied-configuration": "{}"
                },
                "ownerReferences": [{ "apiVersion": "v1", "kind": "Job", "name": "j", "uid": "o" }],
                "managedFields": [{ "manager": "kubelet", "operation": "Update", "fieldsType": "FieldsV1",
                                    "fieldsV1": { "f:status": { "f:phase": {} } } }]
            },
            "spec": {
                "nodeName": "n1",
                "schedulerName": "carma-scheduler",
                "initContainers": [{ "name": "warm", "command": ["sh"],
                    "resources": { "requests": { "carma.io/gpu": "1", "cpu": "1" } } }],
                "containers": [
                    { "name": "a", "image": "pytorch", "env": [{ "name": "X", "value": "1" }],
                      "volumeMounts": [{ "name": "data", "mountPath": "/data" }],
                      "resources": { "limits": { "carma.io/gpu": "2", "memory": "1Gi" } } },
                    { "name": "sidecar", "args": ["--v=2"] }
                ],
                "volumes": [{ "name": "data", "emptyDir": {} }],
                "tolerations": [{ "key": "k", "operator": "Exists" }]
            },
            "status": { "phase": "Running", "podIP": "10.0.0.1",
                        "conditions": [{ "type": "Ready", "status": "True" }] }
        }));
        let mut kept = full.clone();
        keep_what_pod_info_reads(&mut kept);
        assert_eq!(PodInfo::from_pod(&kept), PodInfo::from_pod(&full));
        let m = &kept.metadata;
        assert!(m.managed_fields.is_none() && m.owner_references.is_none());
        assert_eq!(m.labels.as_ref().unwrap().len(), 1);
        assert_eq!(m.annotations.as_ref().unwrap().len(), 4);
        assert_eq!(m.resource_version.as_deref(), Some("7"));
        let spec = kept.spec.as_ref().unwrap();
        assert!(spec.volumes.is_none() && spec.tolerations.is_none());
        let a = &spec.containers[0];
        assert!(a.env.is_none() && a.volume_mounts.is_none() && a.image.is_none());
        assert_eq!(
            a.resources.as_ref().unwrap().limits.as_ref().unwrap().len(),
            1
        );
        assert!(spec.init_containers.as_ref().unwrap()[0].command.is_none());
        let status = kept.status.as_ref().unwrap();
        assert!(status.pod_ip.is_none() && status.conditions.is_none());
    }

    fn pod(json: serde_json::Value) -> Pod {
        serde_json::from_value(json).unwrap()
    }

    #[test]
    fn reads_assignment_request_and_scheduler() {
        let p = PodInfo::from_pod(&pod(serde_json::json!({
            "metadata": {
                "name": "train-1", "namespace": "ml", "uid": "u-1",
                "labels": { "carma.io/task": "resnet" },
                "annotations": {
                    "carma.io/assigned-gpus": "GPU-a,GPU-b",
                    "carma.io/assigned-at": "2026-01-01T00:00:00Z",
                    "carma.io/estimate": "{\"mib\":8000,\"source\":\"override\"}"
                }
            },
            "spec": {
                "nodeName": "n1",
                "schedulerName": "carma-scheduler",
                "containers": [
                    { "name": "a", "resources": { "limits": { "carma.io/gpu": "2" } } },
                    { "name": "sidecar" }
                ]
            },
            "status": { "phase": "Pending" }
        })));
        assert_eq!(p.key(), "ml/train-1");
        assert_eq!(p.gpu_request, 2);
        assert_eq!(p.task.as_deref(), Some("resnet"));
        let a = p.assignment().unwrap();
        assert_eq!(a.gpus, ["GPU-a", "GPU-b"]);
        assert_eq!(a.estimate.mib, 8000);
        assert!(!a.allocated);
        assert!(p.occupies_gpus());
    }

    #[test]
    fn plain_pod_has_no_assignment_and_default_scheduler() {
        let p = PodInfo::from_pod(&pod(serde_json::json!({
            "metadata": { "name": "web", "namespace": "default" },
            "spec": { "containers": [ { "name": "c", "resources": { "requests": { "carma.io/gpu": "1" } } } ] },
            "status": { "phase": "Succeeded" }
        })));
        assert_eq!(p.scheduler_name, "default-scheduler");
        assert_eq!(p.gpu_request, 1);
        assert!(p.assignment().is_none());
        assert!(p.finished());
        assert!(!p.occupies_gpus());
    }

    #[test]
    fn malformed_assignment_is_kept_as_an_error() {
        let p = PodInfo::from_pod(&pod(serde_json::json!({
            "metadata": { "name": "x", "namespace": "d", "annotations": { "carma.io/assigned-gpus": "GPU-a", "carma.io/assigned-at": "soon" } },
            "spec": { "containers": [] }
        })));
        assert!(p.assignment.is_err());
        assert!(p.assignment().is_none());
    }
}
