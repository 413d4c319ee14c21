//! The live cluster: watchers that feed [`ClusterState`], and the writes of bind.

use std::collections::{BTreeMap, HashSet};
use std::sync::Arc;

use carma_api::{GpuNode, MemoryHistory};
use futures::future::BoxFuture;
use futures::{Stream, StreamExt};
use k8s_openapi::api::core::v1::{Binding, Node, ObjectReference, Pod};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::api::PostParams;
use kube::core::PartialObjectMeta;
use kube::runtime::events::{Event as KubeEvent, EventType, Recorder, Reporter};
use kube::runtime::watcher::Event;
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Api, Client};

use crate::backend::{BackendError, BindTarget, ClusterBackend, PodWarning};
use crate::cluster::{ClusterState, Kind};
use crate::verbs::Extender;
use crate::watched_pod::WatchedPod;

/// Name under which carma posts Events.
pub const REPORTER: &str = "carma-scheduler-extender";

/// Writes to and reads from the Kubernetes API.
#[derive(Clone)]
pub struct KubeBackend {
    client: Client,
    recorder: Recorder,
    runtime: tokio::runtime::Handle,
}

impl std::fmt::Debug for KubeBackend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KubeBackend").finish_non_exhaustive()
    }
}

impl KubeBackend {
    /// A backend over `client`. Must be called inside a tokio runtime (Events
    /// are posted from tasks spawned on it).
    pub fn new(client: Client) -> Self {
        let reporter = Reporter {
            controller: REPORTER.to_string(),
            instance: std::env::var("POD_NAME").ok(),
        };
        Self {
            recorder: Recorder::new(client.clone(), reporter),
            client,
            runtime: tokio::runtime::Handle::current(),
        }
    }
}

impl ClusterBackend for KubeBackend {
    fn dry_run(&self) -> bool {
        false
    }

    fn get_pod<'a>(
        &'a self,
        namespace: &'a str,
        name: &'a str,
    ) -> BoxFuture<'a, Result<Option<Pod>, BackendError>> {
        Box::pin(async move {
            Api::<Pod>::namespaced(self.client.clone(), namespace)
                .get_opt(name)
                .await
                .map_err(|source| BackendError::Get {
                    pod: format!("{namespace}/{name}"),
                    source,
                })
        })
    }

    fn bind<'a>(
        &'a self,
        target: &'a BindTarget,
        annotations: Option<&'a BTreeMap<String, String>>,
    ) -> BoxFuture<'a, Result<(), BackendError>> {
        Box::pin(async move {
            let pods = Api::<Pod>::namespaced(self.client.clone(), &target.namespace);
            let key = format!("{}/{}", target.namespace, target.name);
            // The API server merges a Binding's annotations into the pod in the same update that
            // sets its node, under the Binding's UID as a precondition: a pod is never annotated
            // without being bound, nor bound without its annotations, and one write is one round
            // trip.
            let binding = Binding {
                metadata: ObjectMeta {
                    name: Some(target.name.clone()),
                    namespace: Some(target.namespace.clone()),
                    uid: Some(target.uid.clone()),
                    annotations: annotations.cloned(),
                    ..Default::default()
                },
                target: ObjectReference {
                    api_version: Some("v1".into()),
                    kind: Some("Node".into()),
                    name: Some(target.node.clone()),
                    ..Default::default()
                },
            };
            pods.create_subresource::<_, serde_json::Value>(
                "binding",
                &target.name,
                &PostParams::default(),
                &binding,
            )
            .await
            .map_err(|source| BackendError::Binding {
                pod: key,
                node: target.node.clone(),
                source,
            })?;
            Ok(())
        })
    }

    fn warn_pod(&self, w: PodWarning) {
        let recorder = self.recorder.clone();
        self.runtime.spawn(async move {
            let reference = ObjectReference {
                api_version: Some("v1".into()),
                kind: Some("Pod".into()),
                name: Some(w.name.clone()),
                namespace: Some(w.namespace.clone()),
                uid: Some(w.uid.clone()),
                ..Default::default()
            };
            let event = KubeEvent {
                type_: EventType::Warning,
                reason: w.reason.to_string(),
                note: Some(truncate(&w.note, 1024)),
                action: "Scheduling".into(),
                secondary: None,
            };
            if let Err(e) = recorder.publish(&event, &reference).await {
                tracing::warn!(pod = %format!("{}/{}", w.namespace, w.name), error = %e, "posting Event failed");
            }
        });
    }
}

fn truncate(s: &str, max: usize) -> String {
    carma_core::text::truncate_with_marker(s, max, "...").into_owned()
}

/// A change seen by a watcher.
enum Change<'a, K> {
    Apply(&'a K),
    Delete(&'a K),
    /// A (re-)list finished; these keys exist.
    Relisted(HashSet<String>),
}

async fn drive<K, S>(
    stream: S,
    kind: Kind,
    cluster: Arc<ClusterState>,
    key: fn(&K) -> Option<String>,
    mut on: impl FnMut(Change<'_, K>),
) where
    S: Stream<Item = Result<Event<K>, watcher::Error>>,
{
    let mut stream = std::pin::pin!(stream);
    let mut seen: Option<HashSet<String>> = None;
    while let Some(event) = stream.next().await {
        match event {
            Ok(Event::Init) => seen = Some(HashSet::new()),
            Ok(Event::InitApply(o)) => {
                if let (Some(s), Some(k)) = (seen.as_mut(), key(&o)) {
                    s.insert(k);
                }
                on(Change::Apply(&o));
            }
            Ok(Event::InitDone) => {
                if let Some(s) = seen.take() {
                    on(Change::Relisted(s));
                }
                cluster.mark_synced(kind);
            }
            Ok(Event::Apply(o)) => on(Change::Apply(&o)),
            Ok(Event::Delete(o)) => on(Change::Delete(&o)),
            Err(e) => tracing::warn!(?kind, error = %e, "watch failed; retrying"),
        }
    }
}

/// Watch Nodes, GpuNodes and Pods into the extender's cluster state, and MemoryHistories into
/// its history book. The returned tasks run until aborted; `/readyz` turns ready once Nodes,
/// GpuNodes and Pods are listed (until the records are, pods are reserved by their estimates:
/// never less than history would give).
pub fn spawn_watchers(client: Client, extender: Arc<Extender>) -> Vec<tokio::task::JoinHandle<()>> {
    let cluster = Arc::clone(extender.cluster());
    let cfg = watcher::Config::default();

    let nodes = {
        let cluster = Arc::clone(&cluster);
        let stream = watcher(
            Api::<PartialObjectMeta<Node>>::all(client.clone()),
            cfg.clone(),
        )
        .default_backoff();
        tokio::spawn(drive(
            stream,
            Kind::Nodes,
            Arc::clone(&cluster),
            |n: &PartialObjectMeta<Node>| n.metadata.name.clone(),
            move |c| match c {
                Change::Apply(n) => {
                    if let Some(name) = &n.metadata.name {
                        cluster.apply_node(name);
                    }
                }
                Change::Delete(n) => {
                    if let Some(name) = &n.metadata.name {
                        cluster.delete_node(name);
                    }
                }
                Change::Relisted(names) => cluster.retain_nodes(&names),
            },
        ))
    };

    let gpu_nodes = {
        let cluster = Arc::clone(&cluster);
        let stream = watcher(Api::<GpuNode>::all(client.clone()), cfg.clone()).default_backoff();
        tokio::spawn(drive(
            stream,
            Kind::GpuNodes,
            Arc::clone(&cluster),
            |n: &GpuNode| n.metadata.name.clone(),
            move |c| match c {
                Change::Apply(g) => cluster.apply_gpu_node(g),
                Change::Delete(g) => {
                    if let Some(name) = &g.metadata.name {
                        cluster.delete_gpu_node(name);
                    }
                }
                Change::Relisted(names) => cluster.retain_gpu_nodes(&names),
            },
        ))
    };

    let histories = {
        let ext = Arc::clone(&extender);
        let stream =
            watcher(Api::<MemoryHistory>::all(client.clone()), cfg.clone()).default_backoff();
        tokio::spawn(drive(
            stream,
            Kind::MemoryHistories,
            Arc::clone(&cluster),
            |h: &MemoryHistory| h.metadata.name.clone(),
            move |c| {
                let book = ext.decisions().history();
                match c {
                    Change::Apply(h) => book.apply(h),
                    Change::Delete(h) => {
                        if let Some(name) = &h.metadata.name {
                            book.delete(name);
                        }
                    }
                    Change::Relisted(names) => book.retain(&names),
                }
            },
        ))
    };

    // Every pod of the cluster, with no selector: nothing a label or field selector can match
    // tells a carma pod from another before it is bound (its `carma.io/gpu` request is in its
    // containers). Each is decoded as a `WatchedPod` — the few fields the extender reads, or a
    // stub for a pod that is not carma's (crate::watched_pod says which and why) — never as a
    // full `Pod`; only carma pods' UIDs are collected at a re-list, as only they can be held.
    let pods = {
        let stream = watcher(Api::<WatchedPod>::all(client), cfg).default_backoff();
        let ext = Arc::clone(&extender);
        tokio::spawn(drive(
            stream,
            Kind::Pods,
            Arc::clone(&cluster),
            |p: &WatchedPod| p.carma.then(|| p.pod.metadata.uid.clone()).flatten(),
            move |c| match c {
                Change::Apply(p) => ext.observe_pod(&p.pod),
                Change::Delete(p) => {
                    if let Some(uid) = &p.pod.metadata.uid {
                        ext.forget_pod(uid);
                    }
                }
                Change::Relisted(uids) => ext.retain_pods(&uids),
            },
        ))
    };

    vec![nodes, gpu_nodes, histories, pods]
}
