//! `bind`: under the node's admission handoff, place the pod afresh, book its GPUs in the ledger,
//! write the output annotations and create the Binding; a failed write releases the booking.

use std::collections::HashSet;

use carma_api::{Assignment, EstimateAnnotation};
use chrono::{TimeZone, Utc};
use parking_lot::Mutex;

use super::{Extender, NOT_READY};
use crate::backend::BindTarget;
use crate::cluster::now_ms;
use crate::pod_decision::Decision;
use crate::wire::{BindDecision, ExtenderBindingArgs, ExtenderBindingResult};

/// Outcome of a bind, for metrics.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum BindResultKind {
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
    fn label(self) -> &'static str {
        match self {
            BindResultKind::Bound => "bound",
            BindResultKind::Recorded => "recorded",
            BindResultKind::Conflict => "conflict",
            BindResultKind::Error => "error",
        }
    }
}

impl Extender {
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
        let turn = if dry {
            None
        } else {
            match handoff.turn(&args.node).await {
                Ok(t) => Some(t),
                Err(refused) => {
                    return fail(
                        BindResultKind::Conflict,
                        format!(
                            "pod {}/{} not bound: {refused}; retry",
                            args.pod_namespace, args.pod_name
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
        if turn.is_some() {
            // The node takes no other carma pod until this one is admitted (a dry run binds nothing).
            handoff.await_admission(&args.node, uid);
        }
        if let Err(e) = self.backend.bind(&target, Some(&annotations)).await {
            handoff.admitted(uid);
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
        // The Binding is written: the next bind to this node may run, and will wait until the pod
        // watch sees this pod admitted (crate::handoff). kube-scheduler need not wait for that.
        drop(turn);
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
