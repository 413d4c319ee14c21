//! `bind`: under the node's admission handoff, place the pod afresh, book its GPUs in the ledger,
//! write the output annotations and create the Binding; a failed write releases the booking.

use std::collections::HashSet;

use carma_api::{Assignment, EstimateAnnotation};
use carma_core::{LedgerError, NodeRejection};
use chrono::{TimeZone, Utc};
use parking_lot::Mutex;
use thiserror::Error;

use super::{Extender, NOT_READY};
use crate::backend::{BackendError, BindTarget};
use crate::cluster::now_ms;
use crate::handoff::TurnRefused;
use crate::pod_decision::{Decision, DecisionError};
use crate::wire::{BindDecision, ExtenderBindingArgs, ExtenderBindingResult};

/// Why a bind did not bind: its text is the answer's `Error`, which kube-scheduler logs and puts in
/// the pod's FailedScheduling event. `pod` is `namespace/name` throughout.
#[derive(Debug, Error)]
pub enum BindError {
    /// The cluster caches have not synced yet.
    #[error("{NOT_READY}")]
    NotReady,
    /// Another bind of the same pod is running.
    #[error("a bind of pod {pod} is already in progress")]
    InProgress {
        /// The pod.
        pod: String,
    },
    /// The UID was filtered as another pod: binding it under this name would book and annotate a
    /// pod that filter never judged.
    #[error("pod UID {uid:?} was filtered as {filtered}, the bind names {pod}")]
    FilteredAsAnother {
        /// The bind's pod UID.
        uid: String,
        /// The pod that UID was filtered as.
        filtered: String,
        /// The pod the bind names.
        pod: String,
    },
    /// Reading the pod (a bind whose filter this process did not see) failed.
    #[error(transparent)]
    Read(BackendError),
    /// The pod does not exist.
    #[error("pod {pod} not found")]
    NotFound {
        /// The pod.
        pod: String,
    },
    /// The pod read back has another UID than the bind names.
    #[error("pod {pod} has UID {found:?}, the bind names {uid:?}")]
    UidMismatch {
        /// The pod.
        pod: String,
        /// Its UID in the cluster.
        found: String,
        /// The bind's.
        uid: String,
    },
    /// The pod's carma inputs are malformed.
    #[error("pod {pod}: {source}")]
    Invalid {
        /// The pod.
        pod: String,
        /// What is wrong.
        #[source]
        source: DecisionError,
    },
    /// The node's turn did not come in time (crate::handoff).
    #[error("pod {pod} not bound: {source}; retry")]
    Turn {
        /// The pod.
        pod: String,
        /// Why.
        #[source]
        source: TurnRefused,
    },
    /// The node can no longer take the pod.
    #[error("pod {pod} no longer fits: {source}")]
    NoLongerFits {
        /// The pod.
        pod: String,
        /// Why.
        #[source]
        source: NodeRejection,
    },
    /// The ledger refused the booking.
    #[error("pod {pod}: {source}")]
    Booking {
        /// The pod.
        pod: String,
        /// Why.
        #[source]
        source: LedgerError,
    },
    /// Writing the Binding failed (the booking was released).
    #[error(transparent)]
    Write(BackendError),
}

impl BindError {
    /// The metric outcome: a conflict is a race or a node that filled up, which kube-scheduler's
    /// retry can resolve; everything else is an error.
    fn kind(&self) -> BindResultKind {
        match self {
            BindError::InProgress { .. }
            | BindError::Turn { .. }
            | BindError::NoLongerFits { .. }
            | BindError::Booking { .. } => BindResultKind::Conflict,
            BindError::Write(e) if e.lost_race() => BindResultKind::Conflict,
            _ => BindResultKind::Error,
        }
    }
}

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
        let outcome = self.bind_inner(args).await;
        // Bound, the node awaits this pod's admission (crate::handoff); refused, it is free again:
        // either way the choice that sent the pod there holds it no longer.
        self.choices.forget(&args.pod_uid);
        let pod = format!("{}/{}", args.pod_namespace, args.pod_name);
        match outcome {
            Ok((kind, decision)) => {
                self.metrics.bind(kind.label());
                tracing::info!(%pod, node = %args.node, ?decision, result = kind.label(), "bind");
                ExtenderBindingResult {
                    error: String::new(),
                    decision,
                }
            }
            Err(e) => {
                let kind = e.kind();
                self.metrics.bind(kind.label());
                tracing::warn!(%pod, node = %args.node, error = %e, result = kind.label(), "bind refused");
                ExtenderBindingResult {
                    error: e.to_string(),
                    decision: None,
                }
            }
        }
    }

    /// The bind itself: how it ended (bound or recorded) and, for a carma pod, its placement.
    async fn bind_inner(
        &self,
        args: &ExtenderBindingArgs,
    ) -> Result<(BindResultKind, Option<BindDecision>), BindError> {
        if !self.cluster.is_ready() {
            return Err(BindError::NotReady);
        }
        let pod = || format!("{}/{}", args.pod_namespace, args.pod_name);
        let uid = args.pod_uid.as_str();
        let _guard = BindGuard::enter(&self.binding, uid)
            .ok_or_else(|| BindError::InProgress { pod: pod() })?;
        let decision = self.decision_for_bind(args).await?;
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
            self.backend
                .bind(&target, None)
                .await
                .map_err(BindError::Write)?;
            self.decisions.forget(uid);
            return Ok((ok_kind, None));
        }

        // One pending admission per node (see crate::handoff); snapshot mode writes nothing.
        let handoff = self.cluster.handoff();
        let turn = if dry {
            None
        } else {
            Some(
                handoff
                    .turn(&args.node)
                    .await
                    .map_err(|source| BindError::Turn { pod: pod(), source })?,
            )
        };
        let now = now_ms();
        let placement = {
            let mut state = self.cluster.write();
            let demand = self.demand_now(&decision, uid, now);
            let placement = state
                .place(&args.node, &demand, &self.cfg, now)
                .map_err(|source| BindError::NoLongerFits { pod: pod(), source })?;
            state
                .book(uid, &placement, &self.cfg, now)
                .map_err(|source| BindError::Booking { pod: pod(), source })?;
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
            return Err(BindError::Write(e));
        }
        // Bound: it waits for GPUs no longer (the watch will say so too, a moment later).
        self.recovery.forget(uid);
        // The Binding is written: the next bind to this node may run, and will wait until the pod
        // watch sees this pod admitted (crate::handoff). kube-scheduler need not wait for that.
        drop(turn);
        self.decisions.forget(uid);
        Ok((
            ok_kind,
            Some(BindDecision {
                node: args.node.clone(),
                gpus: placement.gpus,
                reserved_mib: placement.reserved_mib,
                source: decision.source.clone(),
                exclusive: placement.exclusive,
                dry_run: dry,
                annotations,
            }),
        ))
    }

    async fn decision_for_bind(&self, args: &ExtenderBindingArgs) -> Result<Decision, BindError> {
        let key = format!("{}/{}", args.pod_namespace, args.pod_name);
        let result = match self.decisions.cached(&args.pod_uid) {
            Some((filtered, _)) if filtered != key => {
                return Err(BindError::FilteredAsAnother {
                    uid: args.pod_uid.clone(),
                    filtered,
                    pod: key,
                });
            }
            Some((_, r)) => r,
            None => {
                let pod = self
                    .backend
                    .get_pod(&args.pod_namespace, &args.pod_name)
                    .await
                    .map_err(BindError::Read)?
                    .ok_or_else(|| BindError::NotFound { pod: key.clone() })?;
                if pod.metadata.uid.as_deref() != Some(args.pod_uid.as_str()) {
                    return Err(BindError::UidMismatch {
                        pod: key,
                        found: pod.metadata.uid.clone().unwrap_or_default(),
                        uid: args.pod_uid.clone(),
                    });
                }
                self.decide(&pod)
            }
        };
        match result.as_ref() {
            Ok(d) => Ok(d.clone()),
            Err(e) => Err(BindError::Invalid {
                pod: key,
                source: e.clone(),
            }),
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn races_and_full_nodes_are_conflicts_and_the_rest_errors() {
        let pod = || "ml/p".to_string();
        let turn = BindError::Turn {
            pod: pod(),
            source: TurnRefused::Binding { node: "n".into() },
        };
        assert_eq!(turn.kind(), BindResultKind::Conflict);
        assert_eq!(
            turn.to_string(),
            "pod ml/p not bound: another bind to node n is still in progress; retry"
        );
        assert_eq!(
            BindError::InProgress { pod: pod() }.kind(),
            BindResultKind::Conflict
        );
        assert_eq!(
            BindError::NotFound { pod: pod() }.kind(),
            BindResultKind::Error
        );
        assert_eq!(BindError::NotReady.to_string(), NOT_READY);
        let mismatch = BindError::UidMismatch {
            pod: pod(),
            found: "a".into(),
            uid: "b".into(),
        };
        assert_eq!(mismatch.kind(), BindResultKind::Error);
        assert_eq!(
            mismatch.to_string(),
            r#"pod ml/p has UID "a", the bind names "b""#
        );
    }
}
