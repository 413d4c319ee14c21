//! The world a whole-system test runs in: carma's three parts with their real
//! code, and small in-memory stand-ins for what they talk to in a cluster.
//!
//! | in a cluster                         | here                                                        |
//! |--------------------------------------|-------------------------------------------------------------|
//! | API server (pods)                    | [`ApiServer`]: a map of pods; UID and creation time on create |
//! | extender's kube watchers and writes  | [`World::sync_pods`], [`World::tick`] and [`ApiBackend`]     |
//! | kube-scheduler                       | [`World::schedule`]: filter → prioritize → bind, as JSON     |
//! | kubelet                              | [`World::admit`], [`World::start`], [`World::terminate`]     |
//! | device plugin (one per node)         | [`NodeAgent`]: simulated GPUs, telemetry, `Allocator`        |
//! | operator's reconcile (I/O part)      | [`World::reconcile`]: list, classify, observe, **plan**, apply |
//!
//! Time is a simulated clock ([`World::now`]) for the operator and the device
//! plugin's telemetry. The extender stamps assignments with the wall clock
//! (`carma_scheduler_extender::cluster::now_ms`), which only matters for its
//! 30 s warm-up lock: every test lets telemetry show a placed pod before the
//! next placement on its GPU, as a real cluster would.

use std::collections::{BTreeMap, HashSet};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use carma_api::names::*;
use carma_api::{
    Assignment, EstimateAnnotation, GpuNode, GpuNodeSpec, GpuNodeStatus, TrainingTask,
};
use carma_core::{PlacementConfig, Policy, RecoveryConfig};
use carma_device_plugin::SimulatedGpus;
use carma_device_plugin::allocate::Allocator;
use carma_device_plugin::config::PublishConfig;
use carma_device_plugin::devices::{advertised, device_list};
use carma_device_plugin::metrics::Metrics as PluginMetrics;
use carma_device_plugin::pods::{LookupError, PodInfo, PodLookup};
use carma_device_plugin::proto::{
    AllocateRequest, ContainerAllocateRequest, ContainerAllocateResponse,
    ContainerPreferredAllocationRequest, PreferredAllocationRequest,
};
use carma_device_plugin::publish_rule::publish_reason;
use carma_estimator::Estimator;
use carma_gpu::backends::GpuBackend;
use carma_gpu::backends::simulated::SimulatedBackend;
use carma_gpu::telemetry::{Snapshot, Telemetry, sample_context};
use carma_operator::attempt::{GpuClaims, is_owned_by, task_label_value};
use carma_operator::observe::{ObservedAttempt, attempt_index, observe, pod_node, to_jiff};
use carma_operator::{OomPatterns, Plan, PlanInput, PodProgress, classify, plan};
use carma_scheduler_extender::backend::{BackendError, BindTarget, ClusterBackend, PodWarning};
use carma_scheduler_extender::cluster::{ClusterState, Kind};
use carma_scheduler_extender::{Decisions, Extender};
use chrono::{DateTime, SecondsFormat, Utc};
use futures::future::BoxFuture;
use k8s_openapi::api::core::v1::{Pod, PodStatus};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use parking_lot::{Mutex, RwLock};
use serde::Deserialize;
use serde_json::{Value, json};

/// Namespace of the tests' objects.
pub const NS: &str = "default";
/// Four 40 GiB GPUs, each already shared by one running job.
pub const NODE_A: &str = "gpu-node-a";
/// Two 24 GiB GPUs, each already shared by one running job.
pub const NODE_B: &str = "gpu-node-b";
/// A node without carma GPUs (no device plugin, no GpuNode).
pub const CPU_NODE: &str = "cpu-node";
/// Every node kube-scheduler considers, in its order.
pub const ALL_NODES: [&str; 3] = [NODE_A, NODE_B, CPU_NODE];
/// Replicas per GPU advertised to kubelet (the device plugin's default).
pub const REPLICAS: u32 = 8;
/// How often the operator looks at a running attempt.
pub const PEAK_POLL: Duration = Duration::from_secs(15);

/// A background job already running on a GPU when the test starts.
#[derive(Debug, Clone, Copy)]
pub struct Background {
    /// Pod name.
    pub name: &'static str,
    /// Node.
    pub node: &'static str,
    /// GPU index on the node.
    pub gpu: u32,
    /// Reservation (MiB).
    pub mib: u64,
}

/// The jobs sharing the cluster's GPUs before the task arrives. The sizes make
/// the extender's choices deterministic whatever the simulated load's phase:
/// GPU 1 of node A always has the most free memory (magm picks it), and node B's
/// smaller GPUs always leave less memory than node A's best (node A scores higher).
pub const BACKGROUND: [Background; 6] = [
    Background {
        name: "bg-a0",
        node: NODE_A,
        gpu: 0,
        mib: 20_000,
    },
    Background {
        name: "bg-a1",
        node: NODE_A,
        gpu: 1,
        mib: 4_000,
    },
    Background {
        name: "bg-a2",
        node: NODE_A,
        gpu: 2,
        mib: 16_000,
    },
    Background {
        name: "bg-a3",
        node: NODE_A,
        gpu: 3,
        mib: 24_000,
    },
    Background {
        name: "bg-b0",
        node: NODE_B,
        gpu: 0,
        mib: 8_000,
    },
    Background {
        name: "bg-b1",
        node: NODE_B,
        gpu: 1,
        mib: 12_000,
    },
];

fn rfc3339(t: DateTime<Utc>) -> String {
    t.to_rfc3339_opts(SecondsFormat::Secs, true)
}

/// `pod`'s annotation `key`.
pub fn annotation<'a>(pod: &'a Pod, key: &str) -> Option<&'a str> {
    pod.metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(key))
        .map(String::as_str)
}

/// `namespace/name` of a pod.
pub fn key(pod: &Pod) -> (String, String) {
    (
        pod.metadata.namespace.clone().unwrap_or_else(|| NS.into()),
        pod.metadata.name.clone().unwrap_or_default(),
    )
}

/// The pod's UID.
pub fn uid(pod: &Pod) -> String {
    pod.metadata
        .uid
        .clone()
        .expect("pods from the API have a UID")
}

// ---------------------------------------------------------------------------
// The API server.
// ---------------------------------------------------------------------------

/// One bind the extender wrote: the annotation patch, then the Binding.
#[derive(Debug, Clone, PartialEq)]
pub struct BindWrite {
    /// The pod and node.
    pub target: BindTarget,
    /// The annotations patched onto the pod before the Binding.
    pub annotations: Option<BTreeMap<String, String>>,
}

/// The pods of the cluster, as the API server keeps them.
#[derive(Debug, Default)]
pub struct ApiServer {
    pods: Mutex<BTreeMap<(String, String), Pod>>,
    next_uid: AtomicU64,
    binds: Mutex<Vec<BindWrite>>,
    warnings: Mutex<Vec<PodWarning>>,
}

impl ApiServer {
    /// Create a pod: namespace defaulted, UID and creation time set, status
    /// `Pending`. Creating an existing name is a conflict (409), here a panic.
    pub fn create_pod(&self, mut pod: Pod, now: DateTime<Utc>) -> Pod {
        let n = self.next_uid.fetch_add(1, Ordering::SeqCst) + 1;
        pod.metadata.namespace.get_or_insert_with(|| NS.to_string());
        pod.metadata.uid = Some(format!("00000000-0000-4000-8000-{n:012x}"));
        pod.metadata.creation_timestamp = Some(Time(to_jiff(now).expect("time in range")));
        pod.metadata.resource_version = Some("1".into());
        pod.status = Some(PodStatus {
            phase: Some("Pending".into()),
            ..PodStatus::default()
        });
        let k = key(&pod);
        let mut pods = self.pods.lock();
        assert!(
            !pods.contains_key(&k),
            "pod {}/{} already exists (409)",
            k.0,
            k.1
        );
        pods.insert(k, pod.clone());
        pod
    }

    /// The pod `namespace/name`.
    pub fn pod(&self, namespace: &str, name: &str) -> Pod {
        self.get(namespace, name)
            .unwrap_or_else(|| panic!("pod {namespace}/{name} does not exist"))
    }

    /// The pod `namespace/name`, if it exists.
    pub fn get(&self, namespace: &str, name: &str) -> Option<Pod> {
        self.pods
            .lock()
            .get(&(namespace.to_string(), name.to_string()))
            .cloned()
    }

    /// Change a pod (an update or a patch); returns the new object.
    pub fn update(&self, namespace: &str, name: &str, f: impl FnOnce(&mut Pod)) -> Pod {
        let mut pods = self.pods.lock();
        let pod = pods
            .get_mut(&(namespace.to_string(), name.to_string()))
            .unwrap_or_else(|| panic!("pod {namespace}/{name} does not exist"));
        f(pod);
        let rv: u64 = pod
            .metadata
            .resource_version
            .as_deref()
            .and_then(|v| v.parse().ok())
            .unwrap_or(0);
        pod.metadata.resource_version = Some((rv + 1).to_string());
        pod.clone()
    }

    /// Every pod.
    pub fn pods(&self) -> Vec<Pod> {
        self.pods.lock().values().cloned().collect()
    }

    /// The writes the extender made at bind, oldest first.
    pub fn binds(&self) -> Vec<BindWrite> {
        self.binds.lock().clone()
    }

    /// The warnings (Events) the extender posted.
    pub fn warnings(&self) -> Vec<PodWarning> {
        self.warnings.lock().clone()
    }
}

/// The extender's [`ClusterBackend`] over [`ApiServer`]: what `KubeBackend`
/// does (merge-patch the output annotations with a UID precondition, then
/// create the Binding), in memory.
#[derive(Debug)]
pub struct ApiBackend(pub Arc<ApiServer>);

impl ClusterBackend for ApiBackend {
    fn dry_run(&self) -> bool {
        false
    }

    fn get_pod<'a>(
        &'a self,
        namespace: &'a str,
        name: &'a str,
    ) -> BoxFuture<'a, Result<Option<Pod>, BackendError>> {
        let pod = self.0.get(namespace, name);
        Box::pin(async move { Ok(pod) })
    }

    fn bind<'a>(
        &'a self,
        target: &'a BindTarget,
        annotations: Option<&'a BTreeMap<String, String>>,
    ) -> BoxFuture<'a, Result<(), BackendError>> {
        let api = &self.0;
        let current = api.pod(&target.namespace, &target.name);
        assert_eq!(
            current.metadata.uid.as_deref(),
            Some(target.uid.as_str()),
            "UID precondition of the bind"
        );
        assert_eq!(
            current.spec.as_ref().and_then(|s| s.node_name.as_deref()),
            None,
            "a pod is bound once"
        );
        api.update(&target.namespace, &target.name, |p| {
            if let Some(ann) = annotations {
                p.metadata
                    .annotations
                    .get_or_insert_with(BTreeMap::new)
                    .extend(ann.clone());
            }
            // The Binding subresource sets spec.nodeName.
            p.spec.get_or_insert_with(Default::default).node_name = Some(target.node.clone());
        });
        api.binds.lock().push(BindWrite {
            target: target.clone(),
            annotations: annotations.cloned(),
        });
        Box::pin(async { Ok(()) })
    }

    fn warn_pod(&self, warning: PodWarning) {
        self.0.warnings.lock().push(warning);
    }
}

/// The device plugin's [`PodLookup`] over [`ApiServer`]: the pods with
/// `spec.nodeName=<node>`, and the `carma.io/allocated` patch.
#[derive(Debug)]
pub struct NodePods {
    api: Arc<ApiServer>,
    node: String,
}

impl NodePods {
    fn list(&self) -> Vec<PodInfo> {
        self.api
            .pods()
            .iter()
            .filter(|p| p.spec.as_ref().and_then(|s| s.node_name.as_deref()) == Some(&self.node))
            .map(PodInfo::from_pod)
            .collect()
    }
}

impl PodLookup for NodePods {
    fn pods_on_node(
        &self,
        _max_age: Duration,
    ) -> BoxFuture<'_, Result<Arc<Vec<PodInfo>>, LookupError>> {
        let pods = Arc::new(self.list());
        Box::pin(async move { Ok(pods) })
    }

    fn mark_allocated<'a>(
        &'a self,
        namespace: &'a str,
        name: &'a str,
    ) -> BoxFuture<'a, Result<(), LookupError>> {
        self.api.update(namespace, name, |p| {
            p.metadata
                .annotations
                .get_or_insert_with(BTreeMap::new)
                .insert(ANNOTATION_ALLOCATED.to_string(), "true".to_string());
        });
        Box::pin(async { Ok(()) })
    }
}

// ---------------------------------------------------------------------------
// The device plugin of one node.
// ---------------------------------------------------------------------------

/// One node's device plugin: simulated GPUs, the telemetry windows, the
/// publisher's write rule, Allocate.
#[derive(Debug)]
pub struct NodeAgent {
    /// Node name.
    pub name: String,
    backend: SimulatedBackend,
    telemetry: Telemetry,
    pods: Arc<NodePods>,
    allocator: Allocator,
    publish: PublishConfig,
    /// The status last written, and when.
    published: Option<(GpuNodeStatus, DateTime<Utc>)>,
    /// The latest snapshot.
    pub snapshot: Option<Snapshot>,
}

impl NodeAgent {
    fn new(api: &Arc<ApiServer>, name: &str, gpus: SimulatedGpus) -> Self {
        let backend = SimulatedBackend::new(name, gpus, 1.0);
        let uuids: Vec<String> = backend.gpus().iter().map(|g| g.uuid.clone()).collect();
        let pods = Arc::new(NodePods {
            api: Arc::clone(api),
            node: name.to_string(),
        });
        let allocator = Allocator::new(
            name,
            Some(Arc::clone(&pods) as Arc<dyn PodLookup>),
            None,
            Arc::new(PluginMetrics::new(name, 0.8)),
            Arc::new(RwLock::new(uuids)),
        );
        Self {
            name: name.to_string(),
            backend,
            telemetry: Telemetry::new(name, carma_core::telemetry::DEFAULT_WINDOW),
            pods,
            allocator,
            publish: PublishConfig::default(),
            published: None,
            snapshot: None,
        }
    }

    /// UUID of GPU `index`.
    pub fn uuid(&self, index: u32) -> String {
        self.backend.gpus()[index as usize].uuid.clone()
    }

    /// One iteration of the telemetry loop: list the node's pods, sample the
    /// GPUs with them, aggregate, and — when the publisher's rule says the
    /// change is worth a write — the `GpuNode` it writes.
    async fn sample(&mut self, now: DateTime<Utc>) -> Option<GpuNode> {
        let pods = self.pods.list();
        let ctx = sample_context(&pods);
        let samples = self.backend.sample(&ctx).await.expect("simulated sample");
        let snapshot = self.telemetry.update(samples, &pods, now);
        let status = snapshot.to_status();
        self.snapshot = Some(snapshot);
        let since = self.published.as_ref().map_or(Duration::MAX, |(_, at)| {
            (now - *at).to_std().unwrap_or_default()
        });
        publish_reason(
            self.published.as_ref().map(|(s, _)| s),
            &status,
            since,
            self.publish.heartbeat,
            &self.publish,
        )?;
        self.published = Some((status.clone(), now));
        let mut gpu_node = GpuNode::new(
            &self.name,
            GpuNodeSpec {
                backend: self.backend.name().to_string(),
                replicas_per_gpu: REPLICAS,
                mps: false,
            },
        );
        gpu_node.status = Some(status);
        Some(gpu_node)
    }

    /// Every replica ID advertised to kubelet.
    pub fn device_ids(&self) -> Vec<String> {
        let advertised = advertised(self.snapshot.as_ref().expect("telemetry has run"));
        device_list(&advertised, REPLICAS)
            .into_iter()
            .map(|d| d.id)
            .collect()
    }
}

/// What kubelet got from the device plugin when it admitted a pod.
#[derive(Debug, Clone)]
pub struct Admission {
    /// The replica IDs GetPreferredAllocation suggested (and kubelet used).
    pub device_ids: Vec<String>,
    /// Allocate's answer for the training container.
    pub response: ContainerAllocateResponse,
}

// ---------------------------------------------------------------------------
// kube-scheduler's side of the extender protocol.
// ---------------------------------------------------------------------------
//
// kube-scheduler speaks JSON over HTTP with its Go structs
// (`k8s.io/kube-scheduler/extender/v1`, no JSON tags: the keys are the Go field
// names). The harness does the same: it encodes the requests as bytes, lets the
// extender decode them with its own wire types, encodes the extender's answers
// and decodes them into the owned structs below — what the Go side reads.

/// `ExtenderFilterResult` as kube-scheduler decodes it.
#[derive(Debug, Clone, Default, Deserialize)]
pub struct FilterAnswer {
    /// Passing node names (the answer to `NodeNames`).
    #[serde(rename = "NodeNames", default)]
    pub node_names: Option<Vec<String>>,
    /// Failed nodes and why; preemption might help.
    #[serde(rename = "FailedNodes", default)]
    pub failed_nodes: BTreeMap<String, String>,
    /// Failed nodes preemption cannot help.
    #[serde(rename = "FailedAndUnresolvableNodes", default)]
    pub failed_and_unresolvable_nodes: BTreeMap<String, String>,
    /// Set when the extender could not judge the pod.
    #[serde(rename = "Error", default)]
    pub error: String,
}

/// One `HostPriority` of prioritize's answer.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
pub struct HostScore {
    /// Node name.
    #[serde(rename = "Host")]
    pub host: String,
    /// Score 0..10.
    #[serde(rename = "Score")]
    pub score: i64,
}

/// `ExtenderBindingResult` as decoded here: kube-scheduler reads only `Error`;
/// carma adds `Decision`.
#[derive(Debug, Clone, Default, Deserialize)]
pub struct BindAnswer {
    /// Empty on success.
    #[serde(rename = "Error", default)]
    pub error: String,
    /// What carma decided.
    #[serde(rename = "Decision", default)]
    pub decision: Option<BindDecisionAnswer>,
}

/// carma's `Decision` in the bind answer.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(rename_all = "PascalCase")]
pub struct BindDecisionAnswer {
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
    /// Whether nothing was written (snapshot mode).
    pub dry_run: bool,
    /// The output annotations written.
    pub annotations: BTreeMap<String, String>,
}

/// The body of a filter or prioritize request to a `nodeCacheCapable` extender.
fn extender_args(pod: &Pod, nodes: &[impl AsRef<str>]) -> Vec<u8> {
    let names: Vec<&str> = nodes.iter().map(AsRef::as_ref).collect();
    serde_json::to_vec(&json!({"Pod": pod, "Nodes": null, "NodeNames": names})).expect("encodes")
}

// ---------------------------------------------------------------------------
// The world.
// ---------------------------------------------------------------------------

/// The result of one scheduling cycle of kube-scheduler's `carma-scheduler` profile.
#[derive(Debug, Clone)]
pub struct Cycle {
    /// filter's answer, as kube-scheduler decodes it.
    pub filter: FilterAnswer,
    /// filter's answer as JSON (Go field names).
    pub filter_json: Value,
    /// prioritize's answer for the nodes that passed filter.
    pub priorities: Vec<HostScore>,
    /// The node kube-scheduler chose, when any passed.
    pub node: Option<String>,
    /// bind's answer, when a node was chosen.
    pub bind: Option<BindAnswer>,
}

impl Cycle {
    /// The reason filter gave for `node` (failed or unresolvable).
    pub fn reason(&self, node: &str) -> Option<&str> {
        self.filter
            .failed_nodes
            .get(node)
            .or_else(|| self.filter.failed_and_unresolvable_nodes.get(node))
            .map(String::as_str)
    }

    /// The score prioritize gave `node`.
    pub fn score(&self, node: &str) -> Option<i64> {
        self.priorities
            .iter()
            .find(|h| h.host == node)
            .map(|h| h.score)
    }
}

/// carma's parts and their stand-ins, with a simulated clock.
#[derive(Debug)]
pub struct World {
    /// The API server.
    pub api: Arc<ApiServer>,
    /// The scheduler extender.
    pub extender: Extender,
    /// The device plugins, one per GPU node.
    pub agents: Vec<NodeAgent>,
    /// The latest published `GpuNode` of each GPU node.
    pub gpu_nodes: BTreeMap<String, GpuNode>,
    /// The clock of the operator and the telemetry.
    pub now: DateTime<Utc>,
    /// The TrainingTask, with the status the operator last wrote.
    pub task: TrainingTask,
    /// The operator's recovery defaults (`spec.recovery` overrides them).
    pub defaults: RecoveryConfig,
    patterns: OomPatterns,
}

impl World {
    /// A cluster of [`NODE_A`] (4 × 40 GiB), [`NODE_B`] (2 × 24 GiB) and
    /// [`CPU_NODE`], the [`BACKGROUND`] jobs running, the extender's caches
    /// synced and 30 s of telemetry behind; `task` is submitted (the API server
    /// gives it a UID) but not yet reconciled.
    pub async fn new(mut task: TrainingTask) -> Self {
        let now: DateTime<Utc> = DateTime::parse_from_rfc3339("2026-03-01T10:00:00Z")
            .expect("time")
            .with_timezone(&Utc);
        let api = Arc::new(ApiServer::default());
        let extender = Extender::new(
            Arc::new(ClusterState::new()),
            Decisions::new(
                Estimator::new().expect("embedded models load"),
                Policy::Magm,
            ),
            Arc::new(ApiBackend(Arc::clone(&api))),
            PlacementConfig::default(),
        );
        let agents = vec![
            NodeAgent::new(
                &api,
                NODE_A,
                SimulatedGpus {
                    count: 4,
                    memory_mib: 40 * 1024,
                },
            ),
            NodeAgent::new(
                &api,
                NODE_B,
                SimulatedGpus {
                    count: 2,
                    memory_mib: 24 * 1024,
                },
            ),
        ];
        task.metadata
            .namespace
            .get_or_insert_with(|| NS.to_string());
        task.metadata.uid = Some("11111111-2222-4333-8444-555555555555".into());
        task.metadata.generation = Some(1);
        task.metadata.creation_timestamp = Some(Time(to_jiff(now).expect("time")));
        let mut world = Self {
            api,
            extender,
            agents,
            gpu_nodes: BTreeMap::new(),
            now,
            task,
            defaults: RecoveryConfig::default(),
            patterns: OomPatterns::default(),
        };
        for bg in BACKGROUND {
            world.start_background(bg);
        }
        // The watchers list Nodes, GpuNodes and Pods once, then the extender answers.
        for n in ALL_NODES {
            world.extender.cluster().apply_node(n);
        }
        world.tick(1).await;
        world.sync_pods();
        for k in [Kind::Nodes, Kind::GpuNodes, Kind::Pods] {
            world.extender.cluster().mark_synced(k);
        }
        // Fill the 30-sample windows: risk scores exist only after that.
        world
            .tick(carma_core::telemetry::DEFAULT_WINDOW as u32)
            .await;
        world
    }

    /// The device plugin of `node`.
    pub fn agent(&self, node: &str) -> &NodeAgent {
        self.agents
            .iter()
            .find(|a| a.name == node)
            .unwrap_or_else(|| panic!("no device plugin on node {node}"))
    }

    /// UUID of GPU `index` of `node`.
    pub fn uuid(&self, node: &str, index: u32) -> String {
        self.agent(node).uuid(index)
    }

    /// A background job: a pod another user submitted earlier, bound, assigned,
    /// allocated and running.
    fn start_background(&mut self, bg: Background) {
        let uuid = self.uuid(bg.node, bg.gpu);
        let assignment = Assignment {
            gpus: vec![uuid],
            assigned_at: Utc::now() - chrono::Duration::hours(1),
            estimate: EstimateAnnotation {
                mib: bg.mib,
                source: "override".into(),
                class: None,
                samples: None,
            },
            exclusive: false,
            allocated: true,
        };
        let mut annotations = assignment.to_annotations(bg.node);
        annotations.insert(ANNOTATION_GPU_MEMORY.into(), format!("{}Mi", bg.mib));
        annotations.insert(ANNOTATION_ALLOCATED.into(), "true".into());
        let pod: Pod = serde_json::from_value(json!({
            "metadata": {"name": bg.name, "namespace": NS, "annotations": annotations},
            "spec": {
                "schedulerName": SCHEDULER_NAME,
                "nodeName": bg.node,
                "containers": [{"name": "train", "image": "pytorch",
                                "resources": {"limits": {RESOURCE_GPU: "1"}}}]
            }
        }))
        .expect("pod");
        self.api
            .create_pod(pod, self.now - chrono::Duration::hours(1));
        self.start(NS, bg.name);
    }

    /// `secs` seconds pass: every device plugin samples once a second and
    /// publishes its `GpuNode` when its write rule says so; the extender's
    /// watcher applies what was published.
    pub async fn tick(&mut self, secs: u32) {
        for _ in 0..secs {
            self.now += chrono::Duration::seconds(1);
            let now = self.now;
            for agent in &mut self.agents {
                if let Some(gpu_node) = agent.sample(now).await {
                    self.extender.cluster().apply_gpu_node(&gpu_node);
                    self.gpu_nodes.insert(agent.name.clone(), gpu_node);
                }
            }
        }
    }

    /// The extender's pod watcher catches up with the API server.
    pub fn sync_pods(&self) {
        for pod in self.api.pods() {
            self.extender.observe_pod(&pod);
        }
    }

    /// The `GpuNode` of `node` as last published.
    pub fn gpu_node(&self, node: &str) -> &GpuNode {
        &self.gpu_nodes[node]
    }

    /// `filter` for the pod, with `ExtenderArgs` exactly as kube-scheduler sends
    /// them to a `nodeCacheCapable` extender.
    pub fn filter(&self, pod: &Pod, nodes: &[&str]) -> (FilterAnswer, Value) {
        let body = extender_args(pod, nodes);
        let answer = serde_json::to_vec(
            &self
                .extender
                .filter(&serde_json::from_slice(&body).expect("ExtenderArgs decode")),
        )
        .expect("filter answer encodes");
        let json: Value = serde_json::from_slice(&answer).expect("JSON");
        let decoded = serde_json::from_slice(&answer).expect("kube-scheduler decodes it");
        (decoded, json)
    }

    /// One scheduling cycle of the `carma-scheduler` profile for pod
    /// `namespace/name`: filter over every node, prioritize the nodes that
    /// passed, choose the best score (ties: first), bind.
    pub async fn schedule(&self, namespace: &str, name: &str) -> Cycle {
        let pod = self.api.pod(namespace, name);
        assert_eq!(
            pod.spec.as_ref().and_then(|s| s.scheduler_name.as_deref()),
            Some(SCHEDULER_NAME),
            "only carma-scheduler's pods reach the extender"
        );
        let (filter, filter_json) = self.filter(&pod, &ALL_NODES);
        assert_eq!(filter.error, "", "filter error");
        let passed = filter.node_names.clone().unwrap_or_default();
        if passed.is_empty() {
            return Cycle {
                filter,
                filter_json,
                priorities: Vec::new(),
                node: None,
                bind: None,
            };
        }
        let body = extender_args(&pod, &passed);
        let answer = serde_json::to_vec(
            &self
                .extender
                .prioritize(&serde_json::from_slice(&body).expect("ExtenderArgs decode")),
        )
        .expect("prioritize answer encodes");
        let priorities: Vec<HostScore> =
            serde_json::from_slice(&answer).expect("kube-scheduler decodes it");
        let mut best: Option<&HostScore> = None;
        for h in &priorities {
            if best.is_none_or(|b| h.score > b.score) {
                best = Some(h);
            }
        }
        let node = best.expect("prioritize scores every node").host.clone();
        let body = serde_json::to_vec(&json!({
            "PodName": name, "PodNamespace": namespace, "PodUID": uid(&pod), "Node": node,
        }))
        .expect("encodes");
        let answer = serde_json::to_vec(
            &self
                .extender
                .bind(&serde_json::from_slice(&body).expect("ExtenderBindingArgs decode"))
                .await,
        )
        .expect("bind answer encodes");
        let bind: BindAnswer = serde_json::from_slice(&answer).expect("decodes");
        Cycle {
            filter,
            filter_json,
            priorities,
            node: Some(node),
            bind: Some(bind),
        }
    }

    /// kubelet admits the bound pod: GetPreferredAllocation over every replica
    /// of the node, then Allocate with the replicas it suggested.
    pub async fn admit(&self, namespace: &str, name: &str) -> Result<Admission, String> {
        let pod = self.api.pod(namespace, name);
        let node = pod_node(&pod).expect("the pod is bound");
        let agent = self.agent(&node);
        let preferred = agent
            .allocator
            .preferred(PreferredAllocationRequest {
                container_requests: vec![ContainerPreferredAllocationRequest {
                    available_device_i_ds: agent.device_ids(),
                    must_include_device_i_ds: Vec::new(),
                    allocation_size: 1,
                }],
            })
            .await;
        let device_ids = preferred.container_responses[0].device_i_ds.clone();
        let mut response = agent
            .allocator
            .allocate(AllocateRequest {
                container_requests: vec![ContainerAllocateRequest {
                    devices_ids: device_ids.clone(),
                }],
            })
            .await?;
        Ok(Admission {
            device_ids,
            response: response.container_responses.remove(0),
        })
    }

    /// Allocate again with the given replica IDs (a second container or a retry).
    pub async fn allocate(&self, node: &str, ids: &[String]) -> Result<(), String> {
        self.agent(node)
            .allocator
            .allocate(AllocateRequest {
                container_requests: vec![ContainerAllocateRequest {
                    devices_ids: ids.to_vec(),
                }],
            })
            .await
            .map(|_| ())
    }

    /// kubelet started the pod's training container.
    pub fn start(&self, namespace: &str, name: &str) -> Pod {
        let at = rfc3339(self.now);
        self.api.update(namespace, name, |p| {
            let container = p.spec.as_ref().expect("spec").containers[0].name.clone();
            p.status = Some(
                serde_json::from_value(json!({
                    "phase": "Running",
                    "startTime": at,
                    "containerStatuses": [{
                        "name": container, "image": "pytorch", "imageID": "", "ready": true,
                        "restartCount": 0, "started": true,
                        "state": {"running": {"startedAt": at}}
                    }]
                }))
                .expect("status"),
            );
        })
    }

    /// The training container ended with `exit_code`; with restartPolicy
    /// Never, kubelet sets the pod's phase from it.
    pub fn terminate(
        &self,
        namespace: &str,
        name: &str,
        exit_code: i32,
        reason: &str,
        message: &str,
    ) -> Pod {
        let at = rfc3339(self.now);
        self.api.update(namespace, name, |p| {
            let container = p.spec.as_ref().expect("spec").containers[0].name.clone();
            let started = p
                .status
                .as_ref()
                .and_then(|s| s.start_time.clone())
                .map(|t| t.0.to_string());
            p.status = Some(
                serde_json::from_value(json!({
                    "phase": if exit_code == 0 { "Succeeded" } else { "Failed" },
                    "startTime": started,
                    "containerStatuses": [{
                        "name": container, "image": "pytorch", "imageID": "", "ready": false,
                        "restartCount": 0, "started": false,
                        "state": {"terminated": {
                            "exitCode": exit_code, "reason": reason, "message": message,
                            "startedAt": started, "finishedAt": at
                        }}
                    }]
                }))
                .expect("status"),
            );
        })
    }

    /// One reconcile of the operator: what `carma_operator::reconcile` does
    /// around the pure planner, against the in-memory API server — list the
    /// task's pods (label and controller owner), classify each, observe it with
    /// its node's `GpuNode` while the attempt is open, **plan**, then create the
    /// planned pod and write the planned status.
    pub fn reconcile(&mut self) -> Plan {
        let task_name = self.task.metadata.name.clone().expect("task name");
        let task_uid = self.task.metadata.uid.clone().expect("task uid");
        let label = task_label_value(&task_name);
        let pods: Vec<Pod> = self
            .api
            .pods()
            .into_iter()
            .filter(|p| {
                p.metadata
                    .labels
                    .as_ref()
                    .and_then(|l| l.get(LABEL_TASK))
                    .is_some_and(|v| *v == label)
            })
            .filter(|p| is_owned_by(p, &task_uid))
            .collect();
        let mut observed: Vec<ObservedAttempt> = Vec::new();
        for pod in &pods {
            let Some(index) = attempt_index(pod) else {
                continue;
            };
            let open = self
                .task
                .status
                .as_ref()
                .and_then(|s| s.attempts.iter().find(|a| a.index == index))
                .is_none_or(|a| a.outcome.is_none());
            let mut progress = classify(pod, None, &self.patterns);
            if let PodProgress::NeedsLogs { .. } = progress {
                // These tests always carry a termination message; no log to read.
                progress = classify(pod, Some(""), &self.patterns);
            }
            let gpu_node = match (&progress, pod_node(pod)) {
                (_, _) if !open => None,
                (PodProgress::Pending, _) | (_, None) => None,
                (_, Some(n)) => self.gpu_nodes.get(&n),
            };
            observed.extend(observe(pod, progress, gpu_node));
        }
        let step = plan(&PlanInput {
            task: &self.task,
            pods: &observed,
            now: self.now,
            defaults: &self.defaults,
            peak_poll: PEAK_POLL,
            scheduler_name: SCHEDULER_NAME,
            gpu_claims: &GpuClaims::DevicePlugin,
            queue_order: carma_core::QueueOrder::ALL[3],
            runtime_class_name: None,
            first_estimate: Ok(None),
        });
        if let Some(pod) = &step.create_pod {
            self.api.create_pod((**pod).clone(), self.now);
        }
        if let Some(status) = &step.status {
            self.task.status = Some((**status).clone());
        }
        step
    }

    /// The pods whose GPUs the extender's ledger holds, by UID.
    pub fn booked(&self) -> HashSet<String> {
        self.extender
            .cluster()
            .ledger_snapshot()
            .records()
            .map(|r| r.pod.clone())
            .collect()
    }
}
