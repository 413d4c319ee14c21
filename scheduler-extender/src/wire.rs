//! The scheduler-extender wire format, exactly as kube-scheduler speaks it.
//!
//! kube-scheduler's Go structs (`k8s.io/kube-scheduler/extender/v1`) carry no
//! JSON tags, so the keys on the wire are the Go field names: `Pod`, `Nodes`,
//! `NodeNames`, `FailedNodes`, … Requests accept those and the lowercase
//! spellings some third-party senders use; answers are always PascalCase.

use std::borrow::Cow;
use std::fmt;
use std::sync::Arc;

use k8s_openapi::api::core::v1::Pod;
use serde::de::{self, Deserializer, MapAccess, Visitor};
use serde::ser::{SerializeMap, Serializer};
use serde::{Deserialize, Serialize};
use serde_json::value::RawValue;

/// Most JSON values (objects, arrays, strings, numbers…) a request's Pod may
/// hold. Decoding multiplies small JSON: `{}` in `spec.containers` is 2 bytes
/// of text and ~2 KiB of `Container`, so 4 MiB of it took 2.9 GB; at this bound
/// such a Pod peaks at ~90 MiB (docs/hostile-input.md). A Pod that
/// etcd can store (1.5 MiB) has far fewer values than this.
pub const MAX_POD_VALUES: usize = 32_768;

/// Most candidate nodes (`NodeNames` or `Nodes.items`) in one request: 13
/// times the 5,000 nodes Kubernetes supports, GKE's 65,000-node clusters
/// included. Each costs ~150 bytes while judged, whatever the name's length.
pub const MAX_CANDIDATES: usize = 100_000;

/// `ExtenderArgs`: the body of `filter` and `prioritize`.
///
/// Node names and node objects borrow from the request body: nothing of the
/// (possibly thousands of) candidates is copied to judge them. A Pod of more
/// than [`MAX_POD_VALUES`] values, or more than [`MAX_CANDIDATES`] candidates,
/// is refused before it is decoded further.
#[derive(Debug, Clone, Deserialize)]
pub struct ExtenderArgs<'a> {
    /// The pod being scheduled.
    #[serde(rename = "Pod", alias = "pod", deserialize_with = "bounded_pod")]
    pub pod: Pod,
    /// Candidate nodes as full objects (`nodeCacheCapable: false`).
    #[serde(rename = "Nodes", alias = "nodes", default, borrow)]
    pub nodes: Option<NodeList<'a>>,
    /// Candidate node names (`nodeCacheCapable: true`).
    #[serde(
        rename = "NodeNames",
        alias = "nodeNames",
        alias = "nodenames",
        default,
        borrow,
        deserialize_with = "borrowed_names"
    )]
    pub node_names: Option<Vec<Cow<'a, str>>>,
}

/// A list of names that borrow from the body (serde's `Cow` inside a `Vec`
/// would copy every one).
fn borrowed_names<'de: 'a, 'a, D: Deserializer<'de>>(
    d: D,
) -> Result<Option<Vec<Cow<'a, str>>>, D::Error> {
    #[derive(Deserialize)]
    #[serde(transparent)]
    struct Name<'n>(#[serde(borrow)] Cow<'n, str>);
    let names: Option<Bounded<Name<'a>>> = Option::deserialize(d)?;
    Ok(names.map(|v| v.0.into_iter().map(|n| n.0).collect()))
}

/// A JSON array of at most [`MAX_CANDIDATES`] items.
struct Bounded<T>(Vec<T>);

impl<'de, T: Deserialize<'de>> Deserialize<'de> for Bounded<T> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V<T>(std::marker::PhantomData<T>);
        impl<'de, T: Deserialize<'de>> Visitor<'de> for V<T> {
            type Value = Bounded<T>;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                write!(f, "a list of at most {MAX_CANDIDATES} nodes")
            }
            fn visit_seq<A: de::SeqAccess<'de>>(self, mut seq: A) -> Result<Bounded<T>, A::Error> {
                let mut out = Vec::new();
                while let Some(item) = seq.next_element()? {
                    if out.len() == MAX_CANDIDATES {
                        return Err(de::Error::custom(format_args!(
                            "more than {MAX_CANDIDATES} candidate nodes"
                        )));
                    }
                    out.push(item);
                }
                Ok(Bounded(out))
            }
        }
        d.deserialize_seq(V(std::marker::PhantomData))
    }
}

/// The Pod, refused when its JSON holds more than [`MAX_POD_VALUES`] values
/// (counted on the text, before anything is allocated for them).
fn bounded_pod<'de, D: Deserializer<'de>>(d: D) -> Result<Pod, D::Error> {
    let raw = <&'de RawValue>::deserialize(d)?;
    let mut count = 0usize;
    serde_json::Deserializer::from_str(raw.get())
        .deserialize_any(CountValues(&mut count))
        .map_err(|e| {
            if count > MAX_POD_VALUES {
                de::Error::custom(format_args!(
                    "the Pod holds more than {MAX_POD_VALUES} JSON values"
                ))
            } else {
                de::Error::custom(e)
            }
        })?;
    serde_json::from_str(raw.get()).map_err(de::Error::custom)
}

/// Counts the JSON values it visits, failing past [`MAX_POD_VALUES`].
struct CountValues<'c>(&'c mut usize);

impl CountValues<'_> {
    fn one<E: de::Error>(&mut self) -> Result<(), E> {
        *self.0 += 1;
        if *self.0 > MAX_POD_VALUES {
            return Err(E::custom("too many values"));
        }
        Ok(())
    }
}

impl<'de> de::DeserializeSeed<'de> for CountValues<'_> {
    type Value = ();
    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<(), D::Error> {
        d.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for CountValues<'_> {
    type Value = ();
    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a JSON value")
    }
    fn visit_bool<E: de::Error>(mut self, _: bool) -> Result<(), E> {
        self.one()
    }
    fn visit_i64<E: de::Error>(mut self, _: i64) -> Result<(), E> {
        self.one()
    }
    fn visit_u64<E: de::Error>(mut self, _: u64) -> Result<(), E> {
        self.one()
    }
    fn visit_f64<E: de::Error>(mut self, _: f64) -> Result<(), E> {
        self.one()
    }
    fn visit_str<E: de::Error>(mut self, _: &str) -> Result<(), E> {
        self.one()
    }
    fn visit_unit<E: de::Error>(mut self) -> Result<(), E> {
        self.one()
    }
    fn visit_seq<A: de::SeqAccess<'de>>(mut self, mut seq: A) -> Result<(), A::Error> {
        self.one()?;
        while seq.next_element_seed(CountValues(self.0))?.is_some() {}
        Ok(())
    }
    fn visit_map<A: MapAccess<'de>>(mut self, mut map: A) -> Result<(), A::Error> {
        self.one()?;
        while map.next_key::<de::IgnoredAny>()?.is_some() {
            map.next_value_seed(CountValues(self.0))?;
        }
        Ok(())
    }
}

impl<'a> ExtenderArgs<'a> {
    /// The candidate node names, whichever way they were sent.
    pub fn candidate_names(&self) -> Vec<&str> {
        match (&self.node_names, &self.nodes) {
            (Some(names), _) => names.iter().map(|n| &**n).collect(),
            (None, Some(list)) => list.items.iter().map(|n| &*n.name).collect(),
            (None, None) => Vec::new(),
        }
    }
}

/// A `v1.NodeList` as sent by kube-scheduler. Each node is kept as the raw JSON
/// it arrived as, so that filter can hand the passing nodes back unchanged
/// without decoding (and re-encoding) every field of every node.
#[derive(Debug, Clone, Default, Deserialize)]
pub struct NodeList<'a> {
    /// The nodes.
    #[serde(default, borrow, deserialize_with = "bounded_nodes")]
    pub items: Vec<RawNode<'a>>,
}

/// At most [`MAX_CANDIDATES`] nodes.
fn bounded_nodes<'de: 'a, 'a, D: Deserializer<'de>>(d: D) -> Result<Vec<RawNode<'a>>, D::Error> {
    Ok(Bounded::<RawNode<'a>>::deserialize(d)?.0)
}

/// One node of a [`NodeList`]: its name and its JSON text.
#[derive(Debug, Clone)]
pub struct RawNode<'a> {
    /// `metadata.name`.
    pub name: Cow<'a, str>,
    /// The node object exactly as received.
    pub raw: &'a RawValue,
}

impl<'de: 'a, 'a> Deserialize<'de> for RawNode<'a> {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        #[derive(Deserialize)]
        struct Meta<'m> {
            #[serde(borrow)]
            name: Cow<'m, str>,
        }
        #[derive(Deserialize)]
        struct NameOnly<'m> {
            #[serde(borrow)]
            metadata: Meta<'m>,
        }
        let raw = <&'a RawValue>::deserialize(deserializer)?;
        let named: NameOnly<'a> = serde_json::from_str(raw.get())
            .map_err(|e| de::Error::custom(format!("node in Nodes.items: {e}")))?;
        Ok(RawNode {
            name: named.metadata.name,
            raw,
        })
    }
}

/// `ExtenderFilterResult`: the answer to `filter`.
///
/// Every field is always written, as Go's encoder would write the struct.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct ExtenderFilterResult<'a> {
    /// Passing nodes as objects (answer to a request that sent `Nodes`).
    #[serde(rename = "Nodes", alias = "nodes", default, borrow)]
    pub nodes: Option<NodeListOut<'a>>,
    /// Passing node names (answer to a request that sent `NodeNames`).
    #[serde(
        rename = "NodeNames",
        alias = "nodeNames",
        alias = "nodenames",
        default,
        borrow
    )]
    pub node_names: Option<Vec<Cow<'a, str>>>,
    /// Nodes that failed, with the reason; preemption might help.
    #[serde(rename = "FailedNodes", alias = "failedNodes", default, borrow)]
    pub failed_nodes: ReasonMap<'a>,
    /// Nodes that failed for a reason preemption cannot fix (takes precedence).
    #[serde(
        rename = "FailedAndUnresolvableNodes",
        alias = "failedAndUnresolvableNodes",
        default,
        borrow
    )]
    pub failed_and_unresolvable_nodes: ReasonMap<'a>,
    /// Set when the extender could not judge the pod at all, or asks kube-scheduler to try it
    /// again soon (`retry`).
    #[serde(rename = "Error", alias = "error", default)]
    pub error: String,
    /// Not on the wire: `error` asks for a retry rather than reporting a failure. kube-scheduler
    /// puts a pod whose extender answered an error in its backoff queue (seconds) instead of
    /// among the unschedulable pods (retried on events its plugins name, else after five
    /// minutes); the metrics count such an answer as `retry`.
    #[serde(skip)]
    pub retry: bool,
}

/// A `v1.NodeList` written back to kube-scheduler: the passing nodes, unchanged.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct NodeListOut<'a> {
    /// List metadata (empty, as kube-scheduler's own lists have).
    #[serde(default)]
    pub metadata: serde_json::Map<String, serde_json::Value>,
    /// The nodes.
    #[serde(default, borrow)]
    pub items: Vec<&'a RawValue>,
}

impl PartialEq for NodeListOut<'_> {
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

/// `map[string]string` of node name → reason, kept in the order nodes were judged.
///
/// Serialises as a JSON object; a `Vec` is cheaper to fill than a map when
/// thousands of nodes are rejected, and the reasons are shared, not copied.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ReasonMap<'a>(pub Vec<(Cow<'a, str>, Arc<str>)>);

impl ReasonMap<'_> {
    /// Number of entries.
    pub fn len(&self) -> usize {
        self.0.len()
    }

    /// Whether the map is empty.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

impl Serialize for ReasonMap<'_> {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let mut map = serializer.serialize_map(Some(self.0.len()))?;
        for (k, v) in &self.0 {
            map.serialize_entry(&**k, &**v)?;
        }
        map.end()
    }
}

impl<'de: 'a, 'a> Deserialize<'de> for ReasonMap<'a> {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct V<'a>(std::marker::PhantomData<&'a ()>);
        impl<'de: 'a, 'a> Visitor<'de> for V<'a> {
            type Value = ReasonMap<'a>;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a map of node name to reason, or null")
            }
            fn visit_unit<E: de::Error>(self) -> Result<ReasonMap<'a>, E> {
                Ok(ReasonMap::default())
            }
            fn visit_none<E: de::Error>(self) -> Result<ReasonMap<'a>, E> {
                Ok(ReasonMap::default())
            }
            fn visit_some<D: Deserializer<'de>>(self, d: D) -> Result<ReasonMap<'a>, D::Error> {
                d.deserialize_map(self)
            }
            fn visit_map<A: MapAccess<'de>>(self, mut m: A) -> Result<ReasonMap<'a>, A::Error> {
                let mut out = Vec::new();
                while let Some((k, v)) = m.next_entry::<String, String>()? {
                    out.push((Cow::Owned(k), Arc::from(v)));
                }
                Ok(ReasonMap(out))
            }
        }
        deserializer.deserialize_option(V(std::marker::PhantomData))
    }
}

/// `HostPriority`: one entry of the answer to `prioritize`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct HostPriority<'a> {
    /// Node name.
    #[serde(rename = "Host", alias = "host", borrow)]
    pub host: Cow<'a, str>,
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
        let text = json!({
            "nodes": null, "nodenames": ["a"], "failedNodes": null, "error": "x"
        })
        .to_string();
        let r: ExtenderFilterResult<'_> = serde_json::from_str(&text).unwrap();
        assert_eq!(r.node_names, Some(vec![Cow::Borrowed("a")]));
        assert!(r.failed_nodes.is_empty());
        assert_eq!(r.error, "x");
        let b: ExtenderBindingArgs = serde_json::from_value(json!({
            "podName": "p", "podNamespace": "ns", "podUID": "u", "node": "n"
        }))
        .unwrap();
        assert_eq!(b.pod_uid, "u");
    }

    #[test]
    fn node_names_borrow_from_the_body() {
        let text = r#"{"Pod": {}, "NodeNames": ["n1", "n\u0032"]}"#;
        let args: ExtenderArgs<'_> = serde_json::from_str(text).unwrap();
        let names = args.node_names.unwrap();
        assert!(matches!(names[0], Cow::Borrowed("n1")));
        assert_eq!(names[1], "n2", "escaped names are decoded");
        let args: ExtenderArgs<'_> =
            serde_json::from_str(r#"{"Pod": {}, "NodeNames": null}"#).unwrap();
        assert!(args.node_names.is_none());
    }

    #[test]
    fn node_list_keeps_each_node_verbatim() {
        let text = json!({
            "Pod": {"metadata": {"name": "p"}},
            "Nodes": {"items": [{"metadata": {"name": "n1", "labels": {"x": "y"}}, "status": {}}]},
        })
        .to_string();
        let args: ExtenderArgs<'_> = serde_json::from_str(&text).unwrap();
        assert_eq!(args.candidate_names(), vec!["n1"]);
        let list = args.nodes.unwrap();
        assert_eq!(
            serde_json::from_str::<serde_json::Value>(list.items[0].raw.get()).unwrap(),
            json!({"metadata": {"name": "n1", "labels": {"x": "y"}}, "status": {}})
        );
        let text = json!({ "Pod": {}, "Nodes": {"items": [{"metadata": {}}]} }).to_string();
        let err = serde_json::from_str::<ExtenderArgs<'_>>(&text).unwrap_err();
        assert!(err.to_string().contains("name"), "{err}");
    }
}
