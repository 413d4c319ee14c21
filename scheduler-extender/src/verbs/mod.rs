//! The three verbs: filter, prioritize, bind.

use std::borrow::Cow;
use std::collections::HashSet;
use std::sync::Arc;

use carma_api::{Assignment, EstimateAnnotation};
use carma_core::placement::recovery_first;
use carma_core::{Demand, PlacementConfig};
use chrono::{TimeZone, Utc};
use k8s_openapi::api::core::v1::Pod;
use parking_lot::Mutex;

use crate::backend::{BindTarget, ClusterBackend, PodWarning};
use crate::cluster::{ClusterState, now_ms};
use crate::decision::{Decision, DecisionResult, Decisions, pod_key};
use crate::metrics::Metrics;
use crate::recovery_queue::RecoveryQueue;
use crate::verdict::{Verdict, Verdicts};
use crate::wire::{
    BindDecision, ExtenderArgs, ExtenderBindingArgs, ExtenderBindingResult, ExtenderFilterResult,
    HostPriority, NodeListOut, ReasonMap,
};

/// Rejection code of a pod whose carma inputs are malformed.
pub const REJECT_INVALID: &str = "invalid-annotation";

/// The message answered while the caches have not synced.
pub const NOT_READY: &str =
    "carma scheduler extender: cluster caches have not synced yet; retry shortly";

/// Outcome of a bind, for metrics.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BindResultKind {
    /// Annotated and bound.
    Bound,
    /// Dry run: decision recorded, nothing written.
    Recorded,
    /// Lost a race or no longer fits: the scheduler should retry.
    Conflict,
    /// Anything else (unknown pod, bad input, API failure).
    Error,
}

impl BindResultKind {
    /// Metric label.
    pub fn label(self) -> &'static str {
        match self {
            BindResultKind::Bound => "bound",
            BindResultKind::Recorded => "recorded",
            BindResultKind::Conflict => "conflict",
            BindResultKind::Error => "error",
        }
    }
}

/// The extender: cluster view, decisions, backend, metrics.
#[derive(Debug)]
pub struct Extender {
    cluster: Arc<ClusterState>,
    decisions: Decisions,
    backend: Arc<dyn ClusterBackend>,
    metrics: Arc<Metrics>,
    cfg: PlacementConfig,
    binding: Mutex<HashSet<String>>,
    verdicts: Verdicts,
    recovery: RecoveryQueue,
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

    /// The placement thresholds.
    pub fn config(&self) -> &PlacementConfig {
        &self.cfg
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
                    tracing::warn!(pod = %pod_key(pod), error = %crate::server::clip(&e.to_string()), "pod has invalid carma input");
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
        if !self.cluster.is_ready() {
            return ExtenderFilterResult {
                error: NOT_READY.to_string(),
                ..Default::default()
            };
        }
        let names = args.candidate_names();
        let decision = self.decide(&args.pod);
        let mut passed = vec![false; names.len()];
        let mut failed = Vec::new();
        let mut unresolvable = Vec::new();
        match decision.as_ref() {
            Err(e) => {
                let reason: Arc<str> = Arc::from(format!("pod {}: {e}", pod_key(&args.pod)));
                unresolvable = names
                    .iter()
                    .map(|n| (Cow::Borrowed(*n), Arc::clone(&reason)))
                    .collect();
                self.metrics.rejected(REJECT_INVALID, names.len() as u64);
            }
            Ok(d) if !d.needs_gpus() => passed.iter_mut().for_each(|p| *p = true),
            Ok(d) => {
                let now = now_ms();
                let demand = self.demand_now(d, Self::uid_of(&args.pod), now);
                let verdicts = {
                    let view = self.cluster.read();
                    self.verdicts.judge(&view, &names, &demand, &self.cfg, now)
                };
                let mut counts: Vec<(&'static str, u64)> = Vec::new();
                for (i, v) in verdicts.into_iter().enumerate() {
                    match v {
                        Verdict::Pass { .. } => passed[i] = true,
                        Verdict::Fail {
                            code,
                            unresolvable: u,
                            reason,
                        } => {
                            match counts.iter_mut().find(|(c, _)| *c == code) {
                                Some((_, n)) => *n += 1,
                                None => counts.push((code, 1)),
                            }
                            let entry = (Cow::Borrowed(names[i]), reason);
                            if u {
                                unresolvable.push(entry);
                            } else {
                                failed.push(entry);
                            }
                        }
                    }
                }
                for (code, n) in counts {
                    self.metrics.rejected(code, n);
                }
            }
        }
        let mut out = ExtenderFilterResult {
            failed_nodes: ReasonMap(failed),
            failed_and_unresolvable_nodes: ReasonMap(unresolvable),
            ..Default::default()
        };
        match (&args.node_names, &args.nodes) {
            (None, Some(list)) => {
                out.nodes = Some(NodeListOut {
                    metadata: Default::default(),
                    items: list
                        .items
                        .iter()
                        .zip(&passed)
                        .filter(|(_, p)| **p)
                        .map(|(n, _)| n.raw)
                        .collect(),
                });
            }
            _ => {
                out.node_names = Some(
                    names
                        .iter()
                        .zip(&passed)
                        .filter(|(_, p)| **p)
                        .map(|(n, _)| Cow::Borrowed(*n))
                        .collect(),
                );
            }
        }
        out
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
        names
            .iter()
            .zip(verdicts)
            .map(|(n, v)| HostPriority {
                host: Cow::Borrowed(*n),
                score: i64::from(v.score()),
            })
            .collect()
    }

    /// Forget every cached verdict (benchmarks of the cold path; diagnostics).
    pub fn clear_verdicts(&self) {
        self.verdicts.clear();
    }

    /// `bind`: choose the GPUs on the chosen node, book them, write the output
    /// annotations, then create the Binding. The booking is released when a
    /// write fails. A pod that no longer fits gets an `Error` (the scheduler
    /// retries it).
    pub async fn bind(&self, args: &ExtenderBindingArgs) -> ExtenderBindingResult {
        let (kind, result) = self.bind_inner(args).await;
        self.metrics.bind(kind.label());
        match kind {
            BindResultKind::Bound | BindResultKind::Recorded => tracing::info!(
                pod = %format!("{}/{}", args.pod_namespace, args.pod_name),
                node = %args.node,
                decision = ?result.decision,
                result = kind.label(),
                "bind"
            ),
            _ => tracing::warn!(
                pod = %format!("{}/{}", args.pod_namespace, args.pod_name),
                node = %args.node,
                error = %result.error,
                result = kind.label(),
                "bind refused"
            ),
        }
        result
    }

    async fn bind_inner(
        &self,
        args: &ExtenderBindingArgs,
    ) -> (BindResultKind, ExtenderBindingResult) {
        let fail = |kind: BindResultKind, error: String| {
            (
                kind,
                ExtenderBindingResult {
                    error,
                    decision: None,
                },
            )
        };
        if !self.cluster.is_ready() {
            return fail(BindResultKind::Error, NOT_READY.to_string());
        }
        let uid = args.pod_uid.as_str();
        let _guard = match BindGuard::enter(&self.binding, uid) {
            Some(g) => g,
            None => {
                return fail(
                    BindResultKind::Conflict,
                    format!(
                        "a bind of pod {}/{} is already in progress",
                        args.pod_namespace, args.pod_name
                    ),
                );
            }
        };
        let decision = match self.decision_for_bind(args).await {
            Ok(d) => d,
            Err(e) => return fail(BindResultKind::Error, e),
        };
        let target = BindTarget {
            namespace: args.pod_namespace.clone(),
            name: args.pod_name.clone(),
            uid: uid.to_string(),
            node: args.node.clone(),
        };
        let dry = self.backend.dry_run();
        let ok_kind = if dry {
            BindResultKind::Recorded
        } else {
            BindResultKind::Bound
        };

        if !decision.needs_gpus() {
            return match self.backend.bind(&target, None).await {
                Ok(()) => {
                    self.decisions.forget(uid);
                    (ok_kind, ExtenderBindingResult::default())
                }
                Err(e) => fail(BindResultKind::Error, e.to_string()),
            };
        }

        // One pending admission per node (see crate::handoff); snapshot mode writes nothing.
        let handoff = self.cluster.handoff();
        let _turn = if dry {
            None
        } else {
            match handoff.turn(&args.node).await {
                Some(t) => Some(t),
                None => {
                    return fail(
                        BindResultKind::Conflict,
                        format!(
                            "node {} is still admitting the carma pod bound to it before {}/{}; retry",
                            args.node, args.pod_namespace, args.pod_name
                        ),
                    );
                }
            }
        };
        let now = now_ms();
        let placement = {
            let mut state = self.cluster.write();
            let demand = self.demand_now(&decision, uid, now);
            let placement = match state.place(&args.node, &demand, &self.cfg, now) {
                Ok(p) => p,
                Err(r) => {
                    return fail(
                        BindResultKind::Conflict,
                        format!(
                            "pod {}/{} no longer fits: {r}",
                            args.pod_namespace, args.pod_name
                        ),
                    );
                }
            };
            if let Err(e) = state.book(uid, &placement, &self.cfg, now) {
                return fail(
                    BindResultKind::Conflict,
                    format!("pod {}/{}: {e}", args.pod_namespace, args.pod_name),
                );
            }
            placement
        };

        let assignment = Assignment {
            gpus: placement.gpus.clone(),
            assigned_at: Utc
                .timestamp_millis_opt(i64::try_from(now).unwrap_or(i64::MAX))
                .single()
                .unwrap_or_else(Utc::now),
            estimate: EstimateAnnotation {
                mib: placement.reserved_mib,
                source: decision.source.clone(),
                class: decision.class.clone(),
                samples: decision.samples,
            },
            exclusive: placement.exclusive,
            allocated: false,
        };
        let annotations = assignment.to_annotations(&args.node);
        handoff.expect(uid);
        if let Err(e) = self.backend.bind(&target, Some(&annotations)).await {
            handoff.forget(uid);
            self.cluster.write().unbook(uid);
            let kind = if e.lost_race() {
                BindResultKind::Conflict
            } else {
                BindResultKind::Error
            };
            return fail(kind, e.to_string());
        }
        // Bound: it waits for GPUs no longer (the watch will say so too, a moment later).
        self.recovery.forget(uid);
        if !dry && !handoff.wait_admitted(uid).await {
            tracing::warn!(
                pod = %format!("{}/{}", args.pod_namespace, args.pod_name),
                node = %args.node,
                wait_ms = handoff.admission_wait.as_millis() as u64,
                "the node did not admit the pod in time; letting the next bind to it go ahead"
            );
        }
        self.decisions.forget(uid);
        (
            ok_kind,
            ExtenderBindingResult {
                error: String::new(),
                decision: Some(BindDecision {
                    node: args.node.clone(),
                    gpus: placement.gpus,
                    reserved_mib: placement.reserved_mib,
                    source: decision.source.clone(),
                    exclusive: placement.exclusive,
                    dry_run: dry,
                    annotations,
                }),
            },
        )
    }

    async fn decision_for_bind(&self, args: &ExtenderBindingArgs) -> Result<Decision, String> {
        let key = format!("{}/{}", args.pod_namespace, args.pod_name);
        let result = match self.decisions.cached(&args.pod_uid) {
            // The UID was filtered as another pod: binding it under this name would book and
            // annotate a pod that filter never judged.
            Some((filtered, _)) if filtered != key => {
                return Err(format!(
                    "pod UID {:?} was filtered as {filtered}, the bind names {key}",
                    args.pod_uid
                ));
            }
            Some((_, r)) => r,
            None => {
                let pod = self
                    .backend
                    .get_pod(&args.pod_namespace, &args.pod_name)
                    .await
                    .map_err(|e| e.to_string())?
                    .ok_or_else(|| format!("pod {key} not found"))?;
                if pod.metadata.uid.as_deref() != Some(args.pod_uid.as_str()) {
                    return Err(format!(
                        "pod {key} has UID {:?}, the bind names {:?}",
                        pod.metadata.uid.as_deref().unwrap_or(""),
                        args.pod_uid
                    ));
                }
                self.decide(&pod)
            }
        };
        match result.as_ref() {
            Ok(d) => Ok(d.clone()),
            Err(e) => Err(format!("pod {key}: {e}")),
        }
    }

    /// A pod event from the watcher: book or release its GPUs, and drop its
    /// cached decision once it is bound.
    pub fn observe_pod(&self, pod: &Pod) {
        self.cluster.apply_pod(pod);
        self.recovery.observe(pod);
        let bound = pod.spec.as_ref().is_some_and(|s| s.node_name.is_some());
        if bound && let Some(uid) = &pod.metadata.uid {
            self.decisions.forget(uid);
        }
    }

    /// A pod was deleted.
    pub fn forget_pod(&self, uid: &str) {
        self.cluster.release_pod(uid);
        self.recovery.forget(uid);
        self.decisions.forget(uid);
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

/// Marks a pod as being bound for the guard's lifetime.
struct BindGuard<'a> {
    set: &'a Mutex<HashSet<String>>,
    uid: String,
}

impl<'a> BindGuard<'a> {
    fn enter(set: &'a Mutex<HashSet<String>>, uid: &str) -> Option<Self> {
        set.lock().insert(uid.to_string()).then(|| BindGuard {
            set,
            uid: uid.to_string(),
        })
    }
}

impl Drop for BindGuard<'_> {
    fn drop(&mut self) {
        self.set.lock().remove(&self.uid);
    }
}
