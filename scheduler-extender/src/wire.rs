//! The scheduler-extender wire format, exactly as kube-scheduler speaks it.
//!
//! kube-scheduler's Go structs (`k8s.io/kube-scheduler/extender/v1`) carry no
//! JSON tags, so the keys on the wire are the Go field names: `Pod`, `Nodes`,
//! `NodeNames`, `FailedNodes`, … Requests accept those and the lowercase
//! spellings some third-party senders use; answers are always PascalCase.

use std::fmt;

use k8s_openapi::api::core::v1::Pod;
use serde::de::{self, Deserializer, MapAccess, Visitor};
use serde::ser::{SerializeMap, Serializer};
use serde::{Deserialize, Serialize};
use serde_json::value::RawValue;

/// `ExtenderArgs`: the body of `filter` and `prioritize`.
#[derive(Debug, Clone, Deserialize)]
pub struct ExtenderArgs {
    /// The pod being scheduled.
    #[serde(rename = "Pod", alias = "pod")]
    pub pod: Pod,
    /// Candidate nodes as full objects (`nodeCacheCapable: false`).
    #[serde(rename = "Nodes", alias = "nodes", default)]
    pub nodes: Option<NodeList>,
    /// Candidate node names (`nodeCacheCapable: true`).
    #[serde(
        rename = "NodeNames",
        alias = "nodeNames",
        alias = "nodenames",
        default
    )]
    pub node_names: Option<Vec<String>>,
}

impl ExtenderArgs {
    /// The candidate node names, whichever way they were sent.
    pub fn candidate_names(&self) -> Vec<&str> {
        match (&self.node_names, &self.nodes) {
            (Some(names), _) => names.iter().map(String::as_str).collect(),
            (None, Some(list)) => list.items.iter().map(|n| n.name.as_str()).collect(),
            (None, None) => Vec::new(),
        }
    }
}

/// A `v1.NodeList` as sent by kube-scheduler. Each node is kept as the raw JSON
/// it arrived as, so that filter can hand the passing nodes back unchanged
/// without decoding (and re-encoding) every field of every node.
#[derive(Debug, Clone, Default, Deserialize, Serialize)]
pub struct NodeList {
    /// The nodes.
    #[serde(default)]
    pub items: Vec<RawNode>,
}

/// One node of a [`NodeList`]: its name and its JSON text.
#[derive(Debug, Clone)]
pub struct RawNode {
    /// `metadata.name`.
    pub name: String,
    /// The node object exactly as received.
    pub raw: Box<RawValue>,
}

impl<'de> Deserialize<'de> for RawNode {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        #[derive(Deserialize)]
        struct Meta {
            name: String,
        }
        #[derive(Deserialize)]
        struct NameOnly {
            metadata: Meta,
        }
        let raw = Box::<RawValue>::deserialize(deserializer)?;
        let named: NameOnly = serde_json::from_str(raw.get())
            .map_err(|e| de::Error::custom(format!("node in Nodes.items: {e}")))?;
        Ok(RawNode {
            name: named.metadata.name,
            raw,
        })
    }
}

impl Serialize for RawNode {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        self.raw.serialize(serializer)
    }
}

/// `ExtenderFilterResult`: the answer to `filter`.
///
/// Every field is always written, as Go's encoder would write the struct.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct ExtenderFilterResult {
    /// Passing nodes as objects (answer to a request that sent `Nodes`).
    #[serde(rename = "Nodes", alias = "nodes", default)]
    pub nodes: Option<NodeListOut>,
    /// Passing node names (answer to a request that sent `NodeNames`).
    #[serde(
        rename = "NodeNames",
        alias = "nodeNames",
        alias = "nodenames",
        default
    )]
    pub node_names: Option<Vec<String>>,
    /// Nodes that failed, with the reason; preemption might help.
    #[serde(rename = "FailedNodes", alias = "failedNodes", default)]
    pub failed_nodes: ReasonMap,
    /// Nodes that failed for a reason preemption cannot fix (takes precedence).
    #[serde(
        rename = "FailedAndUnresolvableNodes",
        alias = "failedAndUnresolvableNodes",
        default
    )]
    pub failed_and_unresolvable_nodes: ReasonMap,
    /// Set when the extender could not judge the pod at all.
    #[serde(rename = "Error", alias = "error", default)]
    pub error: String,
}

/// A `v1.NodeList` written back to kube-scheduler: the passing nodes, unchanged.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct NodeListOut {
    /// List metadata (empty, as kube-scheduler's own lists have).
    #[serde(default)]
    pub metadata: serde_json::Map<String, serde_json::Value>,
    /// The nodes.
    #[serde(default)]
    pub items: Vec<Box<RawValue>>,
}

impl PartialEq for NodeListOut {
    fn eq(&self, other: &Self) -> bool {
        self.metadata == other.metadata
            && self.items.len() == other.items.len()
            && self
                .items
                .iter()
                .zip(&other.items)
                .all(|(a, b)| a.get() == b.get())
    }
}

impl NodeListOut {
    /// Names of the nodes in the list (`metadata.name`, empty when absent).
    pub fn names(&self) -> Vec<String> {
        #[derive(Deserialize)]
        struct Meta {
            #[serde(default)]
            name: String,
        }
        #[derive(Deserialize)]
        struct NameOnly {
            metadata: Meta,
        }
        self.items
            .iter()
            .map(|raw| {
                serde_json::from_str::<NameOnly>(raw.get())
                    .map(|n| n.metadata.name)
                    .unwrap_or_default()
            })
            .collect()
    }
}

/// `map[string]string` of node name → reason, kept in the order nodes were judged.
///
/// Serialises as a JSON object; a `Vec` is cheaper to fill than a map when
/// thousands of nodes are rejected.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ReasonMap(pub Vec<(String, std::sync::Arc<str>)>);

impl ReasonMap {
    /// Number of entries.
    pub fn len(&self) -> usize {
        self.0.len()
    }

    /// Whether the map is empty.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// The reason given for `node`.
    pub fn get(&self, node: &str) -> Option<&str> {
        self.0.iter().find(|(n, _)| n == node).map(|(_, r)| &**r)
    }
}

impl Serialize for ReasonMap {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let mut map = serializer.serialize_map(Some(self.0.len()))?;
        for (k, v) in &self.0 {
            map.serialize_entry(k, &**v)?;
        }
        map.end()
    }
}

impl<'de> Deserialize<'de> for ReasonMap {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = ReasonMap;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a map of node name to reason, or null")
            }
            fn visit_unit<E: de::Error>(self) -> Result<ReasonMap, E> {
                Ok(ReasonMap::default())
            }
            fn visit_none<E: de::Error>(self) -> Result<ReasonMap, E> {
                Ok(ReasonMap::default())
            }
            fn visit_some<D: Deserializer<'de>>(self, d: D) -> Result<ReasonMap, D::Error> {
                d.deserialize_map(V)
            }
            fn visit_map<A: MapAccess<'de>>(self, mut m: A) -> Result<ReasonMap, A::Error> {
                let mut out = Vec::new();
                while let Some((k, v)) = m.next_entry::<String, String>()? {
                    out.push((k, std::sync::Arc::from(v)));
                }
                Ok(ReasonMap(out))
            }
        }
        deserializer.deserialize_option(V)
    }
}

/// `HostPriority`: one entry of the answer to `prioritize`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct HostPriority {
    /// Node name.
    #[serde(rename = "Host", alias = "host")]
    pub host: String,
    /// Score 0..10 (`MaxExtenderPriority`).
    #[serde(rename = "Score", alias = "score")]
    pub score: i64,
}

/// `ExtenderBindingArgs`: the body of `bind`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ExtenderBindingArgs {
    /// Pod name.
    #[serde(rename = "PodName", alias = "podName", alias = "podname")]
    pub pod_name: String,
    /// Pod namespace.
    #[serde(
        rename = "PodNamespace",
        alias = "podNamespace",
        alias = "podnamespace"
    )]
    pub pod_namespace: String,
    /// Pod UID.
    #[serde(
        rename = "PodUID",
        alias = "podUID",
        alias = "podUid",
        alias = "poduid"
    )]
    pub pod_uid: String,
    /// The node kube-scheduler chose.
    #[serde(rename = "Node", alias = "node")]
    pub node: String,
}

/// `ExtenderBindingResult`: the answer to `bind`.
///
/// kube-scheduler reads only `Error`; carma adds `Decision` (ignored by Go's
/// decoder) so that a dry run against a snapshot shows what it would do.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct ExtenderBindingResult {
    /// Empty on success.
    #[serde(rename = "Error", alias = "error", default)]
    pub error: String,
    /// What carma decided (absent when it decided nothing).
    #[serde(rename = "Decision", default, skip_serializing_if = "Option::is_none")]
    pub decision: Option<BindDecision>,
}

/// The placement made at bind.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "PascalCase")]
pub struct BindDecision {
    /// Node.
    pub node: String,
    /// GPU UUIDs.
    #[serde(rename = "GPUs")]
    pub gpus: Vec<String>,
    /// Reserved MiB per GPU.
    #[serde(rename = "ReservedMiB")]
    pub reserved_mib: u64,
    /// Where the reservation comes from.
    pub source: String,
    /// Whether the pod holds its GPUs alone.
    pub exclusive: bool,
    /// `true` in snapshot mode: nothing was written to a cluster.
    pub dry_run: bool,
    /// The output annotations written (or, in a dry run, that would be written).
    pub annotations: std::collections::BTreeMap<String, String>,
}

/// The body of an HTTP 400 answer.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct BadRequest {
    /// What is wrong with the request.
    #[serde(rename = "Error")]
    pub error: String,
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn filter_result_is_written_like_go_writes_it() {
        let r = ExtenderFilterResult {
            node_names: Some(vec!["a".into()]),
            failed_nodes: ReasonMap(vec![("b".into(), "why".into())]),
            ..Default::default()
        };
        assert_eq!(
            serde_json::to_value(&r).unwrap(),
            json!({
                "Nodes": null, "NodeNames": ["a"], "FailedNodes": {"b": "why"},
                "FailedAndUnresolvableNodes": {}, "Error": ""
            })
        );
    }

    #[test]
    fn go_nulls_and_lowercase_keys_are_read() {
        let r: ExtenderFilterResult = serde_json::from_value(json!({
            "nodes": null, "nodenames": ["a"], "failedNodes": null, "error": "x"
        }))
        .unwrap();
        assert_eq!(r.node_names, Some(vec!["a".to_string()]));
        assert!(r.failed_nodes.is_empty());
        assert_eq!(r.error, "x");
        let b: ExtenderBindingArgs = serde_json::from_value(json!({
            "podName": "p", "podNamespace": "ns", "podUID": "u", "node": "n"
        }))
        .unwrap();
        assert_eq!(b.pod_uid, "u");
    }

    #[test]
    fn node_list_keeps_each_node_verbatim() {
        let args: ExtenderArgs = serde_json::from_value(json!({
            "Pod": {"metadata": {"name": "p"}},
            "Nodes": {"items": [{"metadata": {"name": "n1", "labels": {"x": "y"}}, "status": {}}]},
        }))
        .unwrap();
        assert_eq!(args.candidate_names(), vec!["n1"]);
        let list = args.nodes.unwrap();
        assert_eq!(
            serde_json::from_str::<serde_json::Value>(list.items[0].raw.get()).unwrap(),
            json!({"metadata": {"name": "n1", "labels": {"x": "y"}}, "status": {}})
        );
        let err = serde_json::from_value::<ExtenderArgs>(json!({
            "Pod": {}, "Nodes": {"items": [{"metadata": {}}]}
        }))
        .unwrap_err();
        assert!(err.to_string().contains("name"), "{err}");
    }
}
