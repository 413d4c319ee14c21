//! The pods of the extender's pod watch, decoded to what the extender reads of them.
//!
//! The extender watches every pod in the cluster (a GPU pod may be created, bound or re-listed at
//! any time, and nothing marks it with a label or field a selector could match on: its
//! `carma.io/gpu` request lives in its containers). On a busy cluster almost all of those pods are
//! not carma's — 50,000 Deployment pods of 10 to 20 KiB of JSON each, mostly `managedFields`,
//! container `env`, `command`, probes, volumes, and a status of conditions and container statuses.
//! Decoding them as full `Pod`s costs the allocations of every one of those fields on every
//! event, for objects the extender looks at for a few microseconds and drops.
//!
//! [`WatchedPod`] is the watch's object type instead: a [`Pod`] decoded straight from the JSON
//! with only the fields below; everything else is skipped by the parser without being allocated.
//!
//! What is kept, and who reads it (`cluster::feed`, `verbs::Extender::observe_pod`,
//! `recovery_queue`, `handoff`):
//!
//! * `metadata.uid` — the key of the ledger, the handoff, the recovery queue and the decision cache;
//!   `metadata.name` and `namespace` — logs and messages; `metadata.resourceVersion` — the
//!   watcher resumes from it (an object without one is a watch error);
//! * `metadata.annotations` whose key starts with `carma.io/` — the assignment that rebuilds the
//!   ledger after a restart (`assigned-gpus`, `assigned-at`, `assigned-node`, `estimate`), the
//!   device plugin's `allocated` mark (admission), and the request annotations (`sm-activity`,
//!   `model-profile`, `gpu-memory`, `policy`, `exclusive`) a booking reads. No other annotation is
//!   read from a watched pod;
//! * `metadata.creationTimestamp` and `deletionTimestamp` — the recovery queue skips a pod being
//!   deleted;
//! * `spec.nodeName` (bound or not), `spec.priorityClassName` (a recovery attempt), and of each
//!   container and init container its `name` and its `carma.io/gpu` limit and request (how many
//!   GPUs it asks for; a malformed value is kept as it is, so the pod is judged as before). No
//!   other resource, and nothing else of a container, is read;
//! * `status.phase` and `status.startTime` — a pod that ended frees its GPUs; one started, running
//!   or ended has been admitted by its kubelet.
//!
//! A pod that asks for no `carma.io/gpu` in any container and has no `carma.io/` annotation can
//! hold no carma GPUs and be awaited by no handoff or recovery queue (each needs one or the
//! other), so it is kept as a stub: `uid`, `name`, `namespace`, `resourceVersion`, `nodeName` and
//! `phase` — enough for the extender to drop a decision it may have cached for it once it is bound
//! or ended, exactly as for a full pod. Its UID is also left out of the set a re-list
//! collects ([`WatchedPod::carma`]), since nothing keyed by it can exist. Pods that ask only for
//! `nvidia.com/gpu` or through DRA claims are not carma's to place or book and are stubs too.

use std::borrow::Cow;
use std::collections::BTreeMap;

use carma_api::names::{GROUP, RESOURCE_GPU};
use k8s_openapi::NamespaceResourceScope;
use k8s_openapi::api::core::v1::{Container, Pod, PodSpec, PodStatus, ResourceRequirements};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, Time};
use serde::de::{Deserializer, IgnoredAny, MapAccess, Visitor};
use serde::{Deserialize, Serialize};

/// A pod of the extender's pod watch: the fields the extender reads (see the module), or a stub.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct WatchedPod {
    /// The pod, with only the fields kept.
    pub pod: Pod,
    /// Whether the pod asks for `carma.io/gpu` or carries a `carma.io/` annotation (kept whole);
    /// `false` for a stub.
    pub carma: bool,
}

impl WatchedPod {
    /// The pod as the watch keeps it, from a full `Pod` (a snapshot, tests): the same as decoding
    /// the pod's JSON.
    pub fn from_pod(pod: &Pod) -> Self {
        // Serializing a k8s-openapi object cannot fail; this is not on the watch's path.
        let value = serde_json::to_value(pod).unwrap_or_default();
        serde_json::from_value(value).unwrap_or_default()
    }
}

impl kube::Resource for WatchedPod {
    type DynamicType = ();
    type Scope = NamespaceResourceScope;

    fn kind(dt: &()) -> Cow<'_, str> {
        Pod::kind(dt)
    }
    fn group(dt: &()) -> Cow<'_, str> {
        Pod::group(dt)
    }
    fn version(dt: &()) -> Cow<'_, str> {
        Pod::version(dt)
    }
    fn plural(dt: &()) -> Cow<'_, str> {
        Pod::plural(dt)
    }
    fn meta(&self) -> &ObjectMeta {
        &self.pod.metadata
    }
    fn meta_mut(&mut self) -> &mut ObjectMeta {
        &mut self.pod.metadata
    }
}

/// Serialized as the pod it keeps (diagnostics; the watch only decodes).
impl Serialize for WatchedPod {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        self.pod.serialize(s)
    }
}

impl<'de> Deserialize<'de> for WatchedPod {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        Ok(Raw::deserialize(d)?.into_watched())
    }
}

/// Whether an annotation key is carma's (`carma.io/...`).
fn is_carma_key(key: &str) -> bool {
    key.strip_prefix(GROUP)
        .is_some_and(|rest| rest.starts_with('/'))
}

#[derive(Deserialize)]
struct Raw {
    #[serde(default)]
    metadata: RawMeta,
    #[serde(default)]
    spec: Option<RawSpec>,
    #[serde(default)]
    status: Option<RawStatus>,
}

#[derive(Deserialize, Default)]
#[serde(rename_all = "camelCase", default)]
struct RawMeta {
    name: Option<String>,
    namespace: Option<String>,
    uid: Option<String>,
    resource_version: Option<String>,
    creation_timestamp: Option<Time>,
    deletion_timestamp: Option<Time>,
    annotations: Option<CarmaAnnotations>,
}

#[derive(Deserialize, Default)]
#[serde(rename_all = "camelCase", default)]
struct RawSpec {
    node_name: Option<String>,
    priority_class_name: Option<String>,
    containers: Option<Vec<RawContainer>>,
    init_containers: Option<Vec<RawContainer>>,
}

#[derive(Deserialize, Default)]
#[serde(default)]
struct RawContainer {
    name: String,
    resources: Option<RawResources>,
}

#[derive(Deserialize, Default)]
#[serde(default)]
struct RawResources {
    limits: Option<GpuQuantity>,
    requests: Option<GpuQuantity>,
}

#[derive(Deserialize, Default)]
#[serde(rename_all = "camelCase", default)]
struct RawStatus {
    phase: Option<String>,
    start_time: Option<Time>,
}

/// A map key, kept (allocated) only when `keep` says so; other keys are compared where they lie in
/// the input and skipped.
struct KeySeed(fn(&str) -> bool);

impl<'de> serde::de::DeserializeSeed<'de> for KeySeed {
    type Value = Option<String>;
    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<Self::Value, D::Error> {
        d.deserialize_str(self)
    }
}

impl Visitor<'_> for KeySeed {
    type Value = Option<String>;
    fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("a string key")
    }
    fn visit_str<E>(self, v: &str) -> Result<Self::Value, E> {
        Ok((self.0)(v).then(|| v.to_string()))
    }
    fn visit_string<E>(self, v: String) -> Result<Self::Value, E> {
        Ok((self.0)(&v).then_some(v))
    }
}

/// The entries of a JSON object whose key `keep` accepts; the others are skipped unread.
fn kept_entries<'de, A, T>(
    mut map: A,
    keep: fn(&str) -> bool,
) -> Result<BTreeMap<String, T>, A::Error>
where
    A: MapAccess<'de>,
    T: Deserialize<'de>,
{
    let mut kept = BTreeMap::new();
    while let Some(key) = map.next_key_seed(KeySeed(keep))? {
        match key {
            Some(key) => {
                kept.insert(key, map.next_value::<T>()?);
            }
            None => {
                map.next_value::<IgnoredAny>()?;
            }
        }
    }
    Ok(kept)
}

/// The `carma.io/` entries of an annotation map.
#[derive(Default)]
struct CarmaAnnotations(BTreeMap<String, String>);

impl<'de> Deserialize<'de> for CarmaAnnotations {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = CarmaAnnotations;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("a map of annotations")
            }
            fn visit_unit<E>(self) -> Result<Self::Value, E> {
                Ok(CarmaAnnotations::default())
            }
            fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<Self::Value, A::Error> {
                kept_entries(map, is_carma_key).map(CarmaAnnotations)
            }
        }
        d.deserialize_any(V)
    }
}

/// The `carma.io/gpu` entry of a resource list.
#[derive(Default)]
struct GpuQuantity(Option<Quantity>);

impl<'de> Deserialize<'de> for GpuQuantity {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = GpuQuantity;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("a map of resource quantities")
            }
            fn visit_unit<E>(self) -> Result<Self::Value, E> {
                Ok(GpuQuantity(None))
            }
            fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<Self::Value, A::Error> {
                let mut kept = kept_entries::<_, Quantity>(map, |k| k == RESOURCE_GPU)?;
                Ok(GpuQuantity(kept.remove(RESOURCE_GPU)))
            }
        }
        d.deserialize_any(V)
    }
}

impl RawContainer {
    fn asks_for_gpus(&self) -> bool {
        self.resources.as_ref().is_some_and(|r| {
            r.limits.as_ref().is_some_and(|q| q.0.is_some())
                || r.requests.as_ref().is_some_and(|q| q.0.is_some())
        })
    }

    fn into_container(self) -> Container {
        let list = |q: Option<GpuQuantity>| {
            q.and_then(|q| q.0)
                .map(|q| BTreeMap::from([(RESOURCE_GPU.to_string(), q)]))
        };
        Container {
            name: self.name,
            resources: self.resources.map(|r| ResourceRequirements {
                limits: list(r.limits),
                requests: list(r.requests),
                ..Default::default()
            }),
            ..Default::default()
        }
    }
}

impl Raw {
    fn into_watched(self) -> WatchedPod {
        let Raw {
            metadata: m,
            spec,
            status,
        } = self;
        let annotations = m.annotations.map(|a| a.0).filter(|a| !a.is_empty());
        let spec = spec.unwrap_or_default();
        let containers = spec.containers.unwrap_or_default();
        let carma = annotations.is_some()
            || containers
                .iter()
                .chain(spec.init_containers.iter().flatten())
                .any(RawContainer::asks_for_gpus);
        let status = status.map(|s| PodStatus {
            phase: s.phase,
            start_time: s.start_time.filter(|_| carma),
            ..Default::default()
        });
        let mut metadata = ObjectMeta {
            name: m.name,
            namespace: m.namespace,
            uid: m.uid,
            resource_version: m.resource_version,
            ..Default::default()
        };
        let pod = if carma {
            metadata.creation_timestamp = m.creation_timestamp;
            metadata.deletion_timestamp = m.deletion_timestamp;
            metadata.annotations = annotations;
            Pod {
                metadata,
                spec: Some(PodSpec {
                    node_name: spec.node_name,
                    priority_class_name: spec.priority_class_name,
                    containers: containers
                        .into_iter()
                        .map(RawContainer::into_container)
                        .collect(),
                    init_containers: spec
                        .init_containers
                        .map(|cs| cs.into_iter().map(RawContainer::into_container).collect()),
                    ..Default::default()
                }),
                status,
            }
        } else {
            Pod {
                metadata,
                spec: Some(PodSpec {
                    node_name: spec.node_name,
                    ..Default::default()
                }),
                status,
            }
        };
        WatchedPod { pod, carma }
    }
}

#[cfg(test)]
mod tests {
    use carma_api::names::{
        ANNOTATION_ALLOCATED, ANNOTATION_ASSIGNED_AT, ANNOTATION_ASSIGNED_GPUS,
        ANNOTATION_ASSIGNED_NODE, ANNOTATION_ESTIMATE, ANNOTATION_MODEL_PROFILE,
        PRIORITY_CLASS_RECOVERY,
    };
    use carma_core::Policy;
    use carma_estimator::Estimator;
    use serde_json::{Value, json};

    use super::*;
    use crate::ClusterState;
    use crate::cluster::admission_seen;
    use crate::pod_decision::{Decisions, gpu_request, pod_key};
    use crate::recovery_queue::{RecoveryQueue, is_recovery};
    use crate::synthetic::{self, BENCH_PROFILE, deployment_pod_json, pod_json};

    fn decode(v: &Value) -> WatchedPod {
        serde_json::from_slice(&serde_json::to_vec(v).unwrap()).unwrap()
    }

    /// A carma pod bound to node-0 and assigned its first GPU, dressed as the API server shows it:
    /// others' annotations, labels, `managedFields`, env, volumes, other resources, conditions.
    fn assigned(name: &str, extra: &[(&str, &str)]) -> Value {
        let gpu = synthetic::gpu_uuid(0, 0);
        let node = synthetic::node_name(0);
        let mut ann = vec![
            (ANNOTATION_ASSIGNED_GPUS, gpu.as_str()),
            (ANNOTATION_ASSIGNED_AT, "2026-01-01T00:00:01.000Z"),
            (ANNOTATION_ASSIGNED_NODE, node.as_str()),
            (ANNOTATION_ESTIMATE, r#"{"mib":9000,"source":"override"}"#),
            (ANNOTATION_MODEL_PROFILE, BENCH_PROFILE),
            (
                "kubectl.kubernetes.io/last-applied-configuration",
                "{\"a\":1}",
            ),
            ("carma.iox/not-ours", "x"),
        ];
        ann.extend_from_slice(extra);
        let mut v = pod_json("ml", name, &format!("uid-{name}"), 1, &ann);
        v["spec"]["nodeName"] = json!(node);
        v
    }

    /// Pods in every state the extender tells apart, as full JSON.
    fn pods() -> Vec<Value> {
        let mut out = Vec::new();
        // Pending, unbound, with a profile.
        out.push(pod_json(
            "ml",
            "pending",
            "uid-pending",
            1,
            &[(ANNOTATION_MODEL_PROFILE, BENCH_PROFILE)],
        ));
        // Bound and assigned, not admitted yet.
        out.push(assigned("bound", &[]));
        // Admitted by the device plugin; started by the kubelet; running; ended.
        out.push(assigned("allocated", &[(ANNOTATION_ALLOCATED, "true")]));
        let mut started = assigned("started", &[]);
        started["status"]["startTime"] = json!("2026-01-01T00:00:05Z");
        out.push(started);
        let mut running = assigned("running", &[]);
        running["status"]["phase"] = json!("Running");
        out.push(running);
        let mut done = assigned("done", &[]);
        done["status"]["phase"] = json!("Succeeded");
        out.push(done);
        // A recovery attempt waiting for GPUs, and one being deleted.
        let mut recovery = pod_json("ml", "retry", "uid-retry", 2, &[]);
        recovery["spec"]["priorityClassName"] = json!(PRIORITY_CLASS_RECOVERY);
        out.push(recovery.clone());
        recovery["metadata"]["uid"] = json!("uid-retry-deleted");
        recovery["metadata"]["deletionTimestamp"] = json!("2026-01-01T00:01:00Z");
        out.push(recovery);
        // A malformed GPU count in an init container: judged (and rejected) as before.
        let mut bad = pod_json("ml", "bad", "uid-bad", 1, &[]);
        bad["spec"]["initContainers"] =
            json!([{ "name": "warm", "resources": { "requests": { "carma.io/gpu": "500m" } } }]);
        out.push(bad);
        // Not carma's: a Deployment pod, and one asking only for nvidia.com/gpu.
        out.push(deployment_pod_json(7, "node-1"));
        let mut nvidia = deployment_pod_json(8, "node-1");
        nvidia["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpu"] = json!("1");
        out.push(nvidia);
        out
    }

    /// Every reader of a watched pod answers the same for the decoded pod as for the full one.
    #[test]
    fn the_watched_pod_reads_the_same_as_the_full_pod() {
        let decisions = Decisions::new(Estimator::new().unwrap(), Policy::Magm);
        let (full_cluster, slim_cluster) = (ClusterState::new(), ClusterState::new());
        let snapshot = synthetic::cluster(2, 8);
        snapshot.apply(&full_cluster);
        snapshot.apply(&slim_cluster);
        let (full_queue, slim_queue) = (RecoveryQueue::new(), RecoveryQueue::new());
        for v in pods() {
            let full: Pod = serde_json::from_value(v.clone()).unwrap();
            let slim = decode(&v);
            let key = pod_key(&full);
            assert_eq!(pod_key(&slim.pod), key);
            assert_eq!(slim.pod.metadata.uid, full.metadata.uid, "{key}");
            assert_eq!(
                slim.pod.metadata.resource_version, full.metadata.resource_version,
                "{key}"
            );
            assert_eq!(admission_seen(&slim.pod), admission_seen(&full), "{key}");
            assert_eq!(
                slim.pod.spec.as_ref().and_then(|s| s.node_name.as_ref()),
                full.spec.as_ref().and_then(|s| s.node_name.as_ref()),
                "{key}"
            );
            assert_eq!(
                slim.pod.status.as_ref().and_then(|s| s.phase.as_ref()),
                full.status.as_ref().and_then(|s| s.phase.as_ref()),
                "{key}"
            );
            if slim.carma {
                assert_eq!(is_recovery(&slim.pod), is_recovery(&full), "{key}");
                assert_eq!(gpu_request(&slim.pod), gpu_request(&full), "{key}");
                assert_eq!(
                    decisions.compute(&slim.pod),
                    decisions.compute(&full),
                    "{key}"
                );
            } else {
                assert_eq!(gpu_request(&full), Ok(0), "{key} asks for carma GPUs");
            }
            assert_eq!(
                slim_cluster.apply_pod(&slim.pod),
                full_cluster.apply_pod(&full),
                "{key}"
            );
            slim_queue.observe(&slim.pod);
            full_queue.observe(&full);
        }
        let records = |c: &ClusterState| {
            let mut r: Vec<_> = c.ledger_snapshot().records().cloned().collect();
            r.sort_by(|a, b| a.pod.cmp(&b.pod));
            r
        };
        assert_eq!(records(&slim_cluster), records(&full_cluster));
        assert_eq!(
            records(&full_cluster).len(),
            4,
            "bound, allocated, started, running"
        );
        for uid in ["", "uid-retry", "uid-retry-deleted"] {
            assert_eq!(
                slim_queue.waiting_besides(uid),
                full_queue.waiting_besides(uid)
            );
        }
        assert!(full_queue.waiting_besides(""));
    }

    /// What a carma pod keeps: no managedFields, labels, owners, foreign annotations; of its
    /// containers only the name and the `carma.io/gpu` quantities; of its status phase and start.
    #[test]
    fn a_carma_pod_keeps_only_what_the_extender_reads() {
        let mut v = assigned("bound", &[]);
        v["status"]["startTime"] = json!("2026-01-01T00:00:05Z");
        let w = decode(&v);
        assert!(w.carma);
        let m = &w.pod.metadata;
        assert!(m.managed_fields.is_none() && m.labels.is_none() && m.owner_references.is_none());
        let ann = m.annotations.as_ref().unwrap();
        assert!(ann.keys().all(|k| k.starts_with("carma.io/")), "{ann:?}");
        assert_eq!(ann.len(), 5);
        assert!(m.creation_timestamp.is_some());
        let spec = w.pod.spec.as_ref().unwrap();
        assert!(
            spec.volumes.is_none() && spec.tolerations.is_none() && spec.scheduler_name.is_none()
        );
        let c = &spec.containers[0];
        assert_eq!(c.name, "train");
        assert!(c.env.is_none() && c.command.is_none() && c.args.is_none() && c.image.is_none());
        assert!(c.volume_mounts.is_none());
        let r = c.resources.as_ref().unwrap();
        assert_eq!(
            r.limits.as_ref().unwrap().keys().collect::<Vec<_>>(),
            [RESOURCE_GPU]
        );
        assert_eq!(
            r.requests.as_ref().unwrap().keys().collect::<Vec<_>>(),
            [RESOURCE_GPU]
        );
        let status = w.pod.status.as_ref().unwrap();
        assert!(status.start_time.is_some() && status.conditions.is_none());
        // The full pod's JSON is several times the kept one's.
        let kept = serde_json::to_vec(&w).unwrap().len();
        assert!(
            kept * 3 < serde_json::to_vec(&v).unwrap().len(),
            "{kept} bytes kept"
        );
    }

    /// A pod that is not carma's is a stub: UID, name, namespace, resourceVersion, node and phase.
    #[test]
    fn a_pod_that_is_not_carmas_is_a_stub() {
        let v = deployment_pod_json(42, "node-3");
        let w = decode(&v);
        assert!(!w.carma);
        let stub = Pod {
            metadata: ObjectMeta {
                name: v["metadata"]["name"].as_str().map(String::from),
                namespace: v["metadata"]["namespace"].as_str().map(String::from),
                uid: v["metadata"]["uid"].as_str().map(String::from),
                resource_version: v["metadata"]["resourceVersion"].as_str().map(String::from),
                ..Default::default()
            },
            spec: Some(PodSpec {
                node_name: Some("node-3".into()),
                ..Default::default()
            }),
            status: Some(PodStatus {
                phase: Some("Running".into()),
                ..Default::default()
            }),
        };
        assert_eq!(w.pod, stub);
        let full = serde_json::to_vec(&v).unwrap().len();
        assert!(full > 8_000, "a realistic pod: {full} bytes");
        assert!(serde_json::to_vec(&w).unwrap().len() < 300);
        // A full Pod round-trips to the same.
        let pod: Pod = serde_json::from_value(v).unwrap();
        assert_eq!(WatchedPod::from_pod(&pod), w);
    }

    /// Keys are matched however the JSON spells them (an escaped key is still carma's), and
    /// `null` maps are empty.
    #[test]
    fn escaped_keys_and_null_maps_decode() {
        let text = r#"{"metadata":{"uid":"u","resourceVersion":"1","annotations":{"\u0063arma.io/allocated":"true","a\"b":"c"}},
            "spec":{"containers":[{"name":"c","resources":{"limits":null,"requests":{"carma.io\/gpu":"2"}}}]},"status":null}"#;
        let w: WatchedPod = serde_json::from_str(text).unwrap();
        assert!(w.carma);
        assert_eq!(
            w.pod
                .metadata
                .annotations
                .as_ref()
                .unwrap()
                .get(ANNOTATION_ALLOCATED)
                .map(String::as_str),
            Some("true")
        );
        assert_eq!(gpu_request(&w.pod), Ok(2));
        assert!(w.pod.status.is_none());
    }
}
