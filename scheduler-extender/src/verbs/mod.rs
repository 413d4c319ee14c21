//! The extender's answers to kube-scheduler: `filter` and `prioritize` here, `choose` (both in one
//! round trip) in the `choose` submodule, `bind` in the `bind` submodule (the only verb that
//! writes). The HTTP routes in [`crate::server`] decode the request
//! and call these.

mod bind;
mod choose;

pub use bind::BindError;
pub use choose::{CHOICE_HOLD, Choices};

use std::borrow::Cow;
use std::collections::HashSet;
use std::sync::Arc;

use carma_core::placement::recovery_first;
use carma_core::{Demand, PlacementConfig};
use k8s_openapi::api::core::v1::Pod;
use parking_lot::Mutex;

use crate::backend::{ClusterBackend, PodWarning};
use crate::clip::clip;
use crate::cluster::{ClusterState, now_ms};
use crate::metrics::Metrics;
use crate::node_verdicts::{Verdict, Verdicts};
use crate::pod_decision::{Decision, DecisionResult, Decisions, pod_key};
use crate::recovery_queue::RecoveryQueue;
use crate::wire::{ExtenderArgs, ExtenderFilterResult, HostPriority, NodeListOut, ReasonMap};

/// Rejection code of a pod whose carma inputs are malformed.
pub const REJECT_INVALID: &str = "invalid-annotation";

/// The score of a node that can take the pod but is still admitting the carma pod bound to it
/// before: the lowest a passing node gets.
pub const ADMITTING_SCORE: u8 = 1;

/// How a retry request (see [`ExtenderFilterResult::retry`]) begins.
pub const RETRY_PREFIX: &str = "carma: retry:";

/// Node reasons quoted in a retry request; the answer is cut to 512 bytes anyway.
const RETRY_REASONS_SHOWN: usize = 2;

/// The message answered while the caches have not synced.
pub const NOT_READY: &str =
    "carma scheduler extender: cluster caches have not synced yet; retry shortly";

/// The extender: cluster view, decisions, backend, metrics.
#[derive(Debug)]
pub struct Extender {
    cluster: Arc<ClusterState>,
    decisions: Decisions,
    backend: Arc<dyn ClusterBackend>,
    metrics: Arc<Metrics>,
    cfg: PlacementConfig,
    /// UIDs of the pods being bound right now: a re-list of pods must not release their bookings.
    binding: Mutex<HashSet<String>>,
    verdicts: Verdicts,
    recovery: RecoveryQueue,
    /// Nodes `choose` sent pods to whose binds have not ended.
    choices: Choices,
}

impl Extender {
    /// An extender over `cluster` that writes through `backend`.
    pub fn new(
        cluster: Arc<ClusterState>,
        decisions: Decisions,
        backend: Arc<dyn ClusterBackend>,
        cfg: PlacementConfig,
    ) -> Self {
        cluster.use_placement_config(&cfg);
        Self {
            cluster,
            decisions,
            backend,
            metrics: Arc::new(Metrics::new()),
            cfg,
            binding: Mutex::new(HashSet::new()),
            verdicts: Verdicts::new(),
            recovery: RecoveryQueue::new(),
            choices: Choices::new(),
        }
    }

    /// The cluster state.
    pub fn cluster(&self) -> &Arc<ClusterState> {
        &self.cluster
    }

    /// The per-pod decisions.
    pub fn decisions(&self) -> &Decisions {
        &self.decisions
    }

    /// The metrics.
    pub fn metrics(&self) -> &Arc<Metrics> {
        &self.metrics
    }

    /// The decision for `pod`; counts fresh reservations and warns about
    /// malformed inputs once per pod (and again after they change).
    fn decide(&self, pod: &Pod) -> Arc<DecisionResult> {
        let looked = self.decisions.decide(pod);
        if looked.fresh {
            match looked.result.as_ref() {
                Ok(d) if d.needs_gpus() => self.metrics.reservation(&d.source),
                Ok(_) => {}
                Err(e) => {
                    tracing::warn!(
                        pod = %pod_key(pod),
                        error = %clip(&e.to_string()),
                        "pod has invalid carma input"
                    );
                    self.backend.warn_pod(PodWarning {
                        namespace: pod
                            .metadata
                            .namespace
                            .clone()
                            .unwrap_or_else(|| "default".into()),
                        name: pod.metadata.name.clone().unwrap_or_default(),
                        uid: pod.metadata.uid.clone().unwrap_or_default(),
                        reason: e.event_reason(),
                        note: format!("carma cannot schedule this pod: {e}"),
                    });
                }
            }
        }
        looked.result
    }

    /// The UID of a pod kube-scheduler sent (empty when it has none).
    fn uid_of(pod: &Pod) -> &str {
        pod.metadata.uid.as_deref().unwrap_or("")
    }

    /// The pod's demand under CARMA's recovery-first rule: idle GPUs only while another pod's
    /// recovery attempt waits for GPUs.
    /// `pack` also reads how long the pod has waited since it was created.
    fn demand_now(&self, d: &Decision, uid: &str, now: carma_core::Millis) -> Demand {
        let mut demand = recovery_first(
            d.demand.clone(),
            self.recovery.waiting_besides(uid),
            d.recovery,
        );
        demand.waited_ms = d.created_at_ms.map_or(0, |at| now.saturating_sub(at));
        demand
    }

    /// `filter`: keep the nodes that can take the pod, with a reason for every other.
    pub fn filter<'a>(&self, args: &'a ExtenderArgs<'_>) -> ExtenderFilterResult<'a> {
        match self.judge_candidates(args) {
            Ok(judged) => judged.into_result(args),
            Err(error) => ExtenderFilterResult {
                error,
                ..Default::default()
            },
        }
    }

    /// Every candidate of `args` judged for its pod: which pass (with their scores), and why each
    /// other fails. Rejections are counted in the metrics. `Err` is the answer's `Error` when the
    /// extender cannot judge at all (caches not synced).
    fn judge_candidates<'a>(&self, args: &'a ExtenderArgs<'_>) -> Result<Judged<'a>, String> {
        if !self.cluster.is_ready() {
            return Err(NOT_READY.to_string());
        }
        let names = args.candidate_names();
        let decision = self.decide(&args.pod);
        let mut judged = Judged {
            passed: vec![false; names.len()],
            scores: vec![0; names.len()],
            names,
            failed: Vec::new(),
            unresolvable: Vec::new(),
            lifting_unseen: 0,
            lifting_shown: Vec::new(),
            needs_gpus: false,
        };
        match decision.as_ref() {
            Err(e) => {
                let reason: Arc<str> = Arc::from(format!("pod {}: {e}", pod_key(&args.pod)));
                judged.unresolvable = judged
                    .names
                    .iter()
                    .map(|n| (Cow::Borrowed(*n), Arc::clone(&reason)))
                    .collect();
                self.metrics
                    .rejected(REJECT_INVALID, judged.names.len() as u64);
            }
            Ok(d) if !d.needs_gpus() => judged.passed.iter_mut().for_each(|p| *p = true),
            Ok(d) => {
                judged.needs_gpus = true;
                let now = now_ms();
                let demand = self.demand_now(d, Self::uid_of(&args.pod), now);
                let verdicts = {
                    let view = self.cluster.read();
                    self.verdicts
                        .judge(&view, &judged.names, &demand, &self.cfg, now)
                };
                let mut counts: Vec<(&'static str, u64)> = Vec::new();
                for (i, v) in verdicts.into_iter().enumerate() {
                    match v {
                        Verdict::Pass { score } => {
                            judged.passed[i] = true;
                            judged.scores[i] = score;
                        }
                        Verdict::Fail {
                            code,
                            unresolvable: u,
                            lifts_unseen,
                            reason,
                        } => {
                            match counts.iter_mut().find(|(c, _)| *c == code) {
                                Some((_, n)) => *n += 1,
                                None => counts.push((code, 1)),
                            }
                            if lifts_unseen {
                                judged.lifting_unseen += 1;
                                judged.quote_lifting(judged.names[i], &reason);
                            }
                            let entry = (Cow::Borrowed(judged.names[i]), reason);
                            if u {
                                judged.unresolvable.push(entry);
                            } else {
                                judged.failed.push(entry);
                            }
                        }
                    }
                }
                for (code, n) in counts {
                    self.metrics.rejected(code, n);
                }
            }
        }
        Ok(judged)
    }

    /// `prioritize`: score every candidate 0..10 by the pod's policy (0 where it
    /// cannot go).
    pub fn prioritize<'a>(&self, args: &'a ExtenderArgs<'_>) -> Vec<HostPriority<'a>> {
        let names = args.candidate_names();
        let decision = self.decide(&args.pod);
        let zero = |names: &[&'a str]| -> Vec<HostPriority<'a>> {
            names
                .iter()
                .map(|n| HostPriority {
                    host: Cow::Borrowed(*n),
                    score: 0,
                })
                .collect()
        };
        let Ok(d) = decision.as_ref() else {
            return zero(&names);
        };
        if !d.needs_gpus() || !self.cluster.is_ready() {
            return zero(&names);
        }
        let now = now_ms();
        let demand = self.demand_now(d, Self::uid_of(&args.pod), now);
        let verdicts = {
            let view = self.cluster.read();
            self.verdicts.judge(&view, &names, &demand, &self.cfg, now)
        };
        // A bind to a node still admitting the carma pod bound to it before waits for that
        // admission (crate::handoff): such a node ranks below every node that can take the pod now,
        // so a burst of pods spreads over the best free nodes instead of queueing behind one kubelet.
        let admitting = self.cluster.handoff().admitting();
        names
            .iter()
            .zip(verdicts)
            .map(|(n, v)| {
                let score = match v.score() {
                    0 => 0,
                    s if admitting.contains(*n) => s.min(ADMITTING_SCORE),
                    s => s,
                };
                HostPriority {
                    host: Cow::Borrowed(*n),
                    score: i64::from(score),
                }
            })
            .collect()
    }

    /// Forget every cached verdict (benchmarks of the cold path; diagnostics).
    pub fn clear_verdicts(&self) {
        self.verdicts.clear();
    }

    /// A pod event from the watcher: book or release its GPUs, and drop its
    /// cached decision once it is bound.
    pub fn observe_pod(&self, pod: &Pod) {
        self.cluster.apply_pod(pod);
        self.await_admission_of(pod);
        self.recovery.observe(pod);
        let bound = pod.spec.as_ref().is_some_and(|s| s.node_name.is_some());
        if bound && let Some(uid) = &pod.metadata.uid {
            self.decisions.forget(uid);
            self.choices.forget(uid);
        }
    }

    /// A live extender keeps a pod that carma bound (perhaps before this process started or was
    /// elected) and the kubelet has not admitted yet as its node's awaited pod, so the node takes
    /// no other carma pod meanwhile (crate::handoff). A dry run binds nothing and awaits nothing.
    fn await_admission_of(&self, pod: &Pod) {
        if self.backend.dry_run() || crate::cluster::admission_seen(pod) {
            return;
        }
        let (Some(uid), Some(node)) = (
            pod.metadata.uid.as_deref(),
            pod.spec.as_ref().and_then(|s| s.node_name.as_deref()),
        ) else {
            return;
        };
        let assigned = pod
            .metadata
            .annotations
            .as_ref()
            .is_some_and(|a| matches!(carma_api::Assignment::from_annotations(a), Ok(Some(_))));
        if assigned {
            self.cluster.handoff().await_admission(node, uid);
        }
    }

    /// A pod was deleted.
    pub fn forget_pod(&self, uid: &str) {
        self.cluster.release_pod(uid);
        self.recovery.forget(uid);
        self.decisions.forget(uid);
        self.choices.forget(uid);
    }

    /// After a re-list of pods: release every placement whose pod no longer
    /// exists, except those being bound right now.
    pub fn retain_pods(&self, uids: &HashSet<String>) {
        let binding = self.binding.lock().clone();
        self.cluster.retain_pods(uids, |uid| binding.contains(uid));
        self.recovery.retain(uids);
    }

    /// The in-flight gauge, refreshed (called before each scrape).
    pub fn refresh_gauges(&self) {
        self.metrics
            .in_flight
            .set(i64::try_from(self.cluster.in_flight()).unwrap_or(i64::MAX));
    }
}

/// The candidates of one `filter` or `choose` request, judged (see
/// [`Extender::judge_candidates`]).
struct Judged<'a> {
    /// The candidate names, in the order sent.
    names: Vec<&'a str>,
    /// Whether each candidate can take the pod.
    passed: Vec<bool>,
    /// Each passing candidate's score (0..10; 0 where it fails or the pod needs no GPU).
    scores: Vec<u8>,
    /// Failing candidates that preemption might help, with the reason.
    failed: Vec<(Cow<'a, str>, Arc<str>)>,
    /// Failing candidates that preemption cannot help, with the reason.
    unresolvable: Vec<(Cow<'a, str>, Arc<str>)>,
    /// Failing candidates that only telemetry or the clock can free (`NodeRejection::lifts_unseen`).
    lifting_unseen: usize,
    /// The reasons of the [`RETRY_REASONS_SHOWN`] of them first by name (a busy cluster's filter
    /// passes some node, and then none of them is read).
    lifting_shown: Vec<(&'a str, Arc<str>)>,
    /// Whether the pod asks for carma GPUs (else every candidate passes unscored).
    needs_gpus: bool,
}

impl<'a> Judged<'a> {
    /// Keep `reason` among the quoted ones if `node` is among the first by name. kube-scheduler
    /// sends its candidates from a rotating start and writes the pod's condition again whenever the
    /// message changes, so quoting the first nodes in send order rewrote the status of every
    /// waiting pod on each retry; by name the message changes only when their reasons do.
    fn quote_lifting(&mut self, node: &'a str, reason: &Arc<str>) {
        let at = self.lifting_shown.partition_point(|(n, _)| *n < node);
        if at < RETRY_REASONS_SHOWN {
            self.lifting_shown.insert(at, (node, Arc::clone(reason)));
            self.lifting_shown.truncate(RETRY_REASONS_SHOWN);
        }
    }

    /// The text of a retry request, when no candidate passes and one of them may take the pod
    /// after a change kube-scheduler does not watch (GPU telemetry, a warm-up lock running out).
    /// Answered as failed nodes, such a pod would wait among kube-scheduler's unschedulable pods
    /// until an event its plugins name, at worst five minutes after the GPU freed up.
    fn retry_request(&self, pod: &Pod) -> Option<String> {
        if !self.needs_gpus || self.lifting_unseen == 0 || self.passed.contains(&true) {
            return None;
        }
        // The counts come before the quoted reasons: the answer is cut to 512 bytes.
        let shown: Vec<&str> = self.lifting_shown.iter().map(|(_, r)| r.as_ref()).collect();
        Some(format!(
            "{RETRY_PREFIX} no node takes pod {} yet (0 of {}); on {} only GPU telemetry or time, \
             which kube-scheduler does not watch, can lift the refusal ({} quoted): {}",
            pod_key(pod),
            self.names.len(),
            self.lifting_unseen,
            shown.len(),
            shown.join("; "),
        ))
    }

    /// The answer: the passing candidates in the form they were sent (names, or the node objects
    /// unchanged) and the reasons of the others.
    fn into_result(self, args: &'a ExtenderArgs<'_>) -> ExtenderFilterResult<'a> {
        if let Some(error) = self.retry_request(&args.pod) {
            return ExtenderFilterResult {
                error,
                retry: true,
                ..Default::default()
            };
        }
        let mut out = ExtenderFilterResult {
            failed_nodes: ReasonMap(self.failed),
            failed_and_unresolvable_nodes: ReasonMap(self.unresolvable),
            ..Default::default()
        };
        match (&args.node_names, &args.nodes) {
            (None, Some(list)) => {
                out.nodes = Some(NodeListOut {
                    metadata: Default::default(),
                    items: list
                        .items
                        .iter()
                        .zip(&self.passed)
                        .filter(|(_, p)| **p)
                        .map(|(n, _)| n.raw)
                        .collect(),
                });
            }
            _ => {
                out.node_names = Some(
                    self.names
                        .iter()
                        .zip(&self.passed)
                        .filter(|(_, p)| **p)
                        .map(|(n, _)| Cow::Borrowed(*n))
                        .collect(),
                );
            }
        }
        out
    }
}
