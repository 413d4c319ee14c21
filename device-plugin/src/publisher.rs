//! Publish the node's `GpuNode` (cluster-scoped, name = node name): created when missing (owned by
//! the Node, so it goes away with it), its status written through the status subresource with a JSON
//! merge patch — only when [`crate::publish_rule::publish_reason`] says so: at the next sample after a
//! change that can move a placement decision, after a move beyond the deadbands, and otherwise once
//! per heartbeat (5 min by default, jittered per node by [`crate::publish_rule::jittered_heartbeat`]).
//! Each successful write is counted in `carma_gpunode_status_writes_total{reason}`.

use std::sync::Arc;
use std::time::{Duration, Instant};

use carma_api::names::LABEL_MANAGED_BY;
use carma_api::{GpuNode, GpuNodeSpec, GpuNodeStatus, MemoryEnforcement};
use k8s_openapi::api::core::v1::Node;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference};
use kube::Resource;
use kube::api::{Api, Patch, PatchParams, PostParams};
use tracing::{debug, info, warn};

use crate::coexistence::CoexistenceProbe;
use crate::config::PublishConfig;
use crate::metrics::Metrics;
use crate::publish_rule::{PublishReason, jittered_heartbeat, publish_reason};
use carma_gpu::telemetry::Snapshot;

/// Longest wait for one publication (its API calls together).
const WRITE_TIMEOUT: Duration = Duration::from_secs(20);
/// Wait after a failed write before trying again.
const RETRY_AFTER: Duration = Duration::from_secs(5);

/// Writes one node's `GpuNode`.
pub struct Publisher {
    client: kube::Client,
    node: String,
    spec: GpuNodeSpec,
    cfg: PublishConfig,
    metrics: Arc<Metrics>,
    last: Option<(GpuNodeStatus, Instant)>,
    /// Successful writes so far (picks each heartbeat's jitter).
    writes: u64,
    /// The interval after which the current status is written unchanged.
    heartbeat: Duration,
    exists: bool,
    retry_at: Option<Instant>,
    /// Sets the `OtherDevicePlugin` condition of each status (none: no condition is written).
    coexistence: Option<CoexistenceProbe>,
    /// Each GPU's `memoryEnforcement` (none: not written).
    enforcement: Option<MemoryEnforcement>,
}

impl std::fmt::Debug for Publisher {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Publisher")
            .field("node", &self.node)
            .field("spec", &self.spec)
            .field("exists", &self.exists)
            .finish_non_exhaustive()
    }
}

impl Publisher {
    /// A publisher of `node`'s GpuNode with `spec`.
    pub fn new(
        client: kube::Client,
        node: impl Into<String>,
        spec: GpuNodeSpec,
        cfg: PublishConfig,
        metrics: Arc<Metrics>,
    ) -> Self {
        let node = node.into();
        Self {
            heartbeat: jittered_heartbeat(cfg.heartbeat, &node, 0),
            client,
            node,
            spec,
            cfg,
            metrics,
            last: None,
            writes: 0,
            exists: false,
            retry_at: None,
            coexistence: None,
            enforcement: None,
        }
    }

    /// Also report how each GPU's memory limits are enforced (decided once at start).
    pub fn with_memory_enforcement(mut self, enforcement: MemoryEnforcement) -> Self {
        self.enforcement = Some(enforcement);
        self
    }

    /// Also report whether another device plugin advertises this node's GPUs, as the status's
    /// `OtherDevicePlugin` condition.
    pub fn with_coexistence(mut self, probe: CoexistenceProbe) -> Self {
        self.coexistence = Some(probe);
        self
    }

    /// Write the snapshot's status if it changed enough (or the heartbeat is due).
    /// Returns the reason when it wrote.
    pub async fn offer(&mut self, snapshot: &Snapshot) -> Option<PublishReason> {
        self.offer_at(snapshot, Instant::now()).await
    }

    /// [`Self::offer`] at `now` (tests drive the clock).
    pub async fn offer_at(&mut self, snapshot: &Snapshot, now: Instant) -> Option<PublishReason> {
        if self.retry_at.is_some_and(|t| now < t) {
            return None;
        }
        let mut status = snapshot.to_status();
        stamp_enforcement(&mut status, self.enforcement);
        if let Some(probe) = &mut self.coexistence {
            let gpus = &status.gpus;
            let uuids = || gpus.iter().map(|g| g.uuid.clone()).collect();
            let condition = probe.condition(uuids, now, snapshot.taken_at);
            status.conditions = vec![condition];
        }
        let since = self
            .last
            .as_ref()
            .map(|(_, t)| now.saturating_duration_since(*t))
            .unwrap_or(Duration::MAX);
        let reason = publish_reason(
            self.last.as_ref().map(|(s, _)| s),
            &status,
            since,
            self.heartbeat,
            &self.cfg,
        )?;
        let written = match tokio::time::timeout(WRITE_TIMEOUT, self.write(&status)).await {
            Ok(r) => r.map_err(|e| e.to_string()),
            Err(_) => Err(format!("no answer within {WRITE_TIMEOUT:?}")),
        };
        match written {
            Ok(()) => {
                self.metrics.publish("ok");
                self.metrics.status_write(reason.kind);
                debug!(node = %self.node, %reason, summary = %status.summary, "GpuNode status published");
                // Timed from the sample, not from the answer: a write that took a while does not
                // hold back the next change by as long.
                self.last = Some((status, now));
                self.writes += 1;
                self.heartbeat = jittered_heartbeat(self.cfg.heartbeat, &self.node, self.writes);
                self.retry_at = None;
                Some(reason)
            }
            Err(e) => {
                self.metrics.publish("error");
                warn!(node = %self.node, "GpuNode status not published: {e}; retrying in {RETRY_AFTER:?}");
                self.retry_at = Some(now + RETRY_AFTER);
                None
            }
        }
    }

    async fn write(&mut self, status: &GpuNodeStatus) -> Result<(), kube::Error> {
        let api: Api<GpuNode> = Api::all(self.client.clone());
        if !self.exists {
            self.ensure(&api).await?;
        }
        let patch = serde_json::json!({ "status": status });
        match api
            .patch_status(&self.node, &PatchParams::default(), &Patch::Merge(&patch))
            .await
        {
            Ok(_) => Ok(()),
            Err(e) => {
                if matches!(&e, kube::Error::Api(s) if s.is_not_found()) {
                    // Deleted meanwhile: create it again next time.
                    self.exists = false;
                }
                Err(e)
            }
        }
    }

    async fn ensure(&mut self, api: &Api<GpuNode>) -> Result<(), kube::Error> {
        match api.get_opt(&self.node).await? {
            Some(existing) => {
                if existing.spec != self.spec {
                    let patch = serde_json::json!({ "spec": self.spec });
                    api.patch(&self.node, &PatchParams::default(), &Patch::Merge(&patch))
                        .await?;
                }
            }
            None => {
                let owner = self.node_owner().await;
                let obj = GpuNode {
                    metadata: ObjectMeta {
                        name: Some(self.node.clone()),
                        labels: Some(
                            [(
                                LABEL_MANAGED_BY.to_string(),
                                "carma-device-plugin".to_string(),
                            )]
                            .into(),
                        ),
                        owner_references: owner.map(|o| vec![o]),
                        ..Default::default()
                    },
                    spec: self.spec.clone(),
                    status: None,
                };
                match api.create(&PostParams::default(), &obj).await {
                    Ok(_) => info!(node = %self.node, "GpuNode created"),
                    Err(kube::Error::Api(s)) if s.code == 409 => {}
                    Err(e) => return Err(e),
                }
            }
        }
        self.exists = true;
        Ok(())
    }

    /// An owner reference to this node's Node object, when it can be read.
    async fn node_owner(&self) -> Option<OwnerReference> {
        let nodes: Api<Node> = Api::all(self.client.clone());
        match nodes.get_opt(&self.node).await {
            Ok(Some(n)) => Some(OwnerReference {
                api_version: Node::api_version(&()).to_string(),
                kind: Node::kind(&()).to_string(),
                name: self.node.clone(),
                uid: n.metadata.uid?,
                ..Default::default()
            }),
            Ok(None) => None,
            Err(e) => {
                debug!(node = %self.node, "Node not readable, GpuNode gets no owner: {e}");
                None
            }
        }
    }
}

/// Set every GPU's `memoryEnforcement` to `enforcement`.
fn stamp_enforcement(status: &mut GpuNodeStatus, enforcement: Option<MemoryEnforcement>) {
    for g in &mut status.gpus {
        g.memory_enforcement = enforcement;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use carma_api::GpuStatus;

    #[test]
    fn every_gpu_says_how_its_memory_limits_are_enforced() {
        let mut status = GpuNodeStatus {
            gpus: vec![GpuStatus::default(), GpuStatus::default()],
            ..GpuNodeStatus::default()
        };
        stamp_enforcement(&mut status, Some(MemoryEnforcement::Driver));
        assert!(
            status
                .gpus
                .iter()
                .all(|g| g.memory_enforcement == Some(MemoryEnforcement::Driver))
        );
        let json = serde_json::to_value(&status).unwrap();
        assert_eq!(json["gpus"][1]["memoryEnforcement"], "driver");
        stamp_enforcement(&mut status, None);
        let json = serde_json::to_value(&status).unwrap();
        assert!(json["gpus"][0].get("memoryEnforcement").is_none());
    }
}
