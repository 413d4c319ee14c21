//! Snapshot mode: serve from a static `List` of Nodes, GpuNodes, Pods and MemoryHistories (the
//! output of `kubectl get nodes,gpunodes,pods,memoryhistories -A -o yaml`), and record binds
//! instead of writing them.

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};

use carma_api::{GpuNode, MemoryHistory};
use futures::future::BoxFuture;
use k8s_openapi::api::core::v1::{Node, Pod};
use serde::Deserialize;
use thiserror::Error;

use crate::backend::{BackendError, BindTarget, ClusterBackend, PodWarning};
use crate::cluster::{ClusterState, Kind};

/// A snapshot that cannot be used.
#[derive(Debug, Error)]
pub enum SnapshotError {
    /// The file cannot be read.
    #[error("reading cluster snapshot {path}: {source}")]
    Read {
        /// File.
        path: PathBuf,
        /// I/O error.
        #[source]
        source: std::io::Error,
    },
    /// The text is neither YAML nor JSON of the expected shape.
    #[error("cluster snapshot {path}: {message}")]
    Parse {
        /// File.
        path: PathBuf,
        /// What is wrong, with the item where known.
        message: String,
    },
}

/// The objects of a snapshot.
#[derive(Debug, Clone, Default)]
pub struct Snapshot {
    /// Kubernetes nodes.
    pub nodes: Vec<Node>,
    /// carma GPU nodes.
    pub gpu_nodes: Vec<GpuNode>,
    /// Pods.
    pub pods: Vec<Pod>,
    /// Observed peaks by model profile (`kubectl get memoryhistories -o yaml`).
    pub memory_histories: Vec<MemoryHistory>,
}

#[derive(Deserialize)]
struct TypeMeta {
    #[serde(default)]
    kind: String,
}

impl Snapshot {
    /// Read a snapshot file: YAML (one or more documents) or JSON, each a `List`
    /// (or a single object). Kinds other than Node, GpuNode, Pod and MemoryHistory are skipped.
    pub fn load(path: &Path) -> Result<Self, SnapshotError> {
        let text = std::fs::read_to_string(path).map_err(|source| SnapshotError::Read {
            path: path.to_path_buf(),
            source,
        })?;
        Self::parse(&text).map_err(|message| SnapshotError::Parse {
            path: path.to_path_buf(),
            message,
        })
    }

    /// Parse snapshot text (see [`Snapshot::load`]).
    pub fn parse(text: &str) -> Result<Self, String> {
        let mut out = Snapshot::default();
        for (i, doc) in serde_yaml_ng::Deserializer::from_str(text).enumerate() {
            let value = serde_json::Value::deserialize(doc)
                .map_err(|e| format!("document {}: {e}", i + 1))?;
            if value.is_null() {
                continue;
            }
            out.add(value, &format!("document {}", i + 1))?;
        }
        Ok(out)
    }

    fn add(&mut self, value: serde_json::Value, at: &str) -> Result<(), String> {
        let kind = TypeMeta::deserialize(&value)
            .map_err(|e| format!("{at}: {e}"))?
            .kind;
        match kind.as_str() {
            "List" | "NodeList" | "PodList" | "GpuNodeList" | "MemoryHistoryList" => {
                let items = match value {
                    serde_json::Value::Object(mut m) => m.remove("items"),
                    _ => None,
                };
                let Some(serde_json::Value::Array(items)) = items else {
                    return Err(format!("{at}: a {kind} needs an `items` array"));
                };
                for (j, item) in items.into_iter().enumerate() {
                    self.add(item, &format!("{at}, item {j}"))?;
                }
            }
            "Node" => self
                .nodes
                .push(serde_json::from_value(value).map_err(|e| format!("{at} (Node): {e}"))?),
            "GpuNode" => self
                .gpu_nodes
                .push(serde_json::from_value(value).map_err(|e| format!("{at} (GpuNode): {e}"))?),
            "Pod" => self
                .pods
                .push(serde_json::from_value(value).map_err(|e| format!("{at} (Pod): {e}"))?),
            "MemoryHistory" => self.memory_histories.push(
                serde_json::from_value(value).map_err(|e| format!("{at} (MemoryHistory): {e}"))?,
            ),
            "" => return Err(format!("{at}: object without `kind`")),
            other => tracing::debug!(
                kind = other,
                "snapshot: skipping an object carma does not use"
            ),
        }
        Ok(())
    }

    /// Feed the MemoryHistory records into `book` as the watcher does.
    pub fn apply_history(&self, book: &crate::history::HistoryBook) {
        for h in &self.memory_histories {
            book.apply(h);
        }
    }

    /// Feed every Node, GpuNode and Pod into `cluster` through the same functions the kube
    /// watchers use, and mark every cache synced.
    pub fn apply(&self, cluster: &ClusterState) {
        for n in &self.nodes {
            if let Some(name) = &n.metadata.name {
                cluster.apply_node(name);
            }
        }
        for g in &self.gpu_nodes {
            cluster.apply_gpu_node_observed(g, None);
        }
        for p in &self.pods {
            cluster.apply_pod(p);
        }
        cluster.mark_synced(Kind::Nodes);
        cluster.mark_synced(Kind::GpuNodes);
        cluster.mark_synced(Kind::Pods);
    }
}

/// The dry-run backend: pods come from the snapshot, binds and warnings are logged.
#[derive(Debug, Default)]
pub struct SnapshotBackend {
    pods: HashMap<(String, String), Pod>,
}

impl SnapshotBackend {
    /// A backend serving the snapshot's pods.
    pub fn new(snapshot: &Snapshot) -> Self {
        let pods = snapshot
            .pods
            .iter()
            .map(|p| {
                (
                    (
                        p.metadata
                            .namespace
                            .clone()
                            .unwrap_or_else(|| "default".into()),
                        p.metadata.name.clone().unwrap_or_default(),
                    ),
                    p.clone(),
                )
            })
            .collect();
        Self { pods }
    }
}

impl ClusterBackend for SnapshotBackend {
    fn dry_run(&self) -> bool {
        true
    }

    fn get_pod<'a>(
        &'a self,
        namespace: &'a str,
        name: &'a str,
    ) -> BoxFuture<'a, Result<Option<Pod>, BackendError>> {
        let pod = self
            .pods
            .get(&(namespace.to_string(), name.to_string()))
            .cloned();
        Box::pin(async move { Ok(pod) })
    }

    fn bind<'a>(
        &'a self,
        target: &'a BindTarget,
        annotations: Option<&'a BTreeMap<String, String>>,
    ) -> BoxFuture<'a, Result<(), BackendError>> {
        tracing::info!(
            pod = %format!("{}/{}", target.namespace, target.name),
            uid = %target.uid,
            node = %target.node,
            annotations = ?annotations,
            "dry run: would annotate the pod and bind it"
        );
        Box::pin(async { Ok(()) })
    }

    fn warn_pod(&self, w: PodWarning) {
        tracing::warn!(
            pod = %format!("{}/{}", w.namespace, w.name),
            uid = %w.uid,
            reason = w.reason,
            "dry run: would post Event: {}",
            crate::clip::clip(&w.note)
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn json_lists_and_yaml_documents_are_read() {
        let json = r#"{"apiVersion":"v1","kind":"List","items":[
            {"apiVersion":"v1","kind":"Node","metadata":{"name":"n1"}},
            {"apiVersion":"v1","kind":"ConfigMap","metadata":{"name":"skipped"}},
            {"apiVersion":"carma.io/v1alpha1","kind":"GpuNode","metadata":{"name":"n1"},"spec":{}}]}"#;
        let s = Snapshot::parse(json).unwrap();
        assert_eq!((s.nodes.len(), s.gpu_nodes.len(), s.pods.len()), (1, 1, 0));
        let yaml = "kind: Pod\napiVersion: v1\nmetadata:\n  name: p\n---\nkind: PodList\nitems:\n- kind: Pod\n  metadata:\n    name: q\n";
        let s = Snapshot::parse(yaml).unwrap();
        assert_eq!(s.pods.len(), 2);
    }

    #[test]
    fn errors_say_where() {
        let err = Snapshot::parse("kind: List\nitems:\n- kind: Pod\n  spec: 3\n").unwrap_err();
        assert!(err.contains("document 1, item 0 (Pod)"), "{err}");
        let err = Snapshot::parse("metadata: {}\n").unwrap_err();
        assert!(err.contains("without `kind`"), "{err}");
        let err = Snapshot::parse("kind: List\n").unwrap_err();
        assert!(err.contains("items"), "{err}");
        let err = Snapshot::load(Path::new("/nonexistent/snapshot.yaml")).unwrap_err();
        assert!(
            err.to_string().contains("/nonexistent/snapshot.yaml"),
            "{err}"
        );
    }
}
