//! What the watchers and a snapshot deliver, applied to the cluster state: Nodes and `GpuNode`s
//! (telemetry), and pods, whose assignment annotations rebuild the ledger after a restart.

use std::collections::HashSet;

use carma_api::{Assignment, GpuNode, PodRequest};
use carma_core::{Millis, PlacementRecord};
use k8s_openapi::api::core::v1::Pod;

use super::{ClusterState, now_ms};
use crate::pod_decision::pod_key;

impl ClusterState {
    /// A Kubernetes `Node` exists.
    pub fn apply_node(&self, name: &str) {
        let mut inner = self.inner.write();
        let e = inner.entry(name);
        if !e.has_node {
            e.has_node = true;
            inner.bump(name);
        }
    }

    /// A Kubernetes `Node` is gone.
    pub fn delete_node(&self, name: &str) {
        let mut inner = self.inner.write();
        if let Some(e) = inner.nodes.get_mut(name) {
            e.has_node = false;
            inner.bump(name);
        }
        inner.drop_if_empty(name);
    }

    /// Keep only the `Node`s named in `names` (after a re-list).
    pub fn retain_nodes(&self, names: &HashSet<String>) {
        let gone: Vec<String> = {
            let inner = self.inner.read();
            inner
                .nodes
                .iter()
                .filter(|(n, e)| e.has_node && !names.contains(*n))
                .map(|(n, _)| n.clone())
                .collect()
        };
        for n in gone {
            self.delete_node(&n);
        }
    }

    /// A `GpuNode` was published or updated: new telemetry, and the pods whose
    /// memory now shows leave the in-flight set. Its telemetry ages from now.
    pub fn apply_gpu_node(&self, gpu_node: &GpuNode) {
        self.apply_gpu_node_observed(gpu_node, Some(now_ms()));
    }

    /// As [`Self::apply_gpu_node`], with the local time the publication was observed, or `None`
    /// for telemetry that never ages (a static snapshot).
    ///
    /// Staleness is judged on this clock, never on the `updatedAt` the device plugin wrote with
    /// its own: a publication is fresh when it is first seen (a new `updatedAt`), as the node
    /// lifecycle controller judges kubelet heartbeats, so clock skew between nodes cannot make a
    /// live node stale or a dead one fresh.
    pub fn apply_gpu_node_observed(&self, gpu_node: &GpuNode, observed_at: Option<Millis>) {
        let mut core = gpu_node.to_core();
        let published = gpu_node.status.as_ref().and_then(|s| s.updated_at.clone());
        let observed: HashSet<String> = gpu_node
            .status
            .iter()
            .flat_map(|s| &s.gpus)
            .flat_map(|g| &g.pods)
            .filter(|p| p.observed_mib.is_some() && !p.uid.is_empty())
            .map(|p| p.uid.clone())
            .collect();
        let mut inner = self.inner.write();
        for uid in &observed {
            let newly = inner.ledger.get(uid).is_some_and(|r| !r.visible);
            if newly
                && inner.ledger.confirm(uid)
                && let Some(r) = inner.ledger.get(uid).cloned()
            {
                inner.touch(&r);
            }
        }
        let name = core.name.clone();
        let old: Vec<String> = inner
            .nodes
            .get(&name)
            .map(|e| e.node.gpus.iter().map(|g| g.uuid.clone()).collect())
            .unwrap_or_default();
        for uuid in old {
            inner.disown(&uuid, &name);
        }
        for g in &core.gpus {
            let owners = inner.gpu_owner.entry(g.uuid.clone()).or_default();
            if !owners.contains(&name) {
                owners.push(name.clone());
            }
        }
        let e = inner.entry(&name);
        // A re-list delivers the same publication again: it keeps its first observation time.
        let telemetry_at = match e.node.gpus.first() {
            Some(g) if e.published.is_some() && e.published == published => g.telemetry_at,
            _ => observed_at,
        };
        for g in &mut core.gpus {
            g.telemetry_at = telemetry_at;
        }
        // Power, energy and the publication time change every publication without changing
        // what placement reads; the observation time does (staleness), so a new publication
        // counts as a change.
        let changed = !e.has_gpu_node || e.node != core || e.observed != observed;
        e.node = core;
        e.has_gpu_node = true;
        e.observed = observed;
        e.published = published;
        if changed {
            inner.bump(&name);
        }
    }

    /// A `GpuNode` is gone: the node has no carma GPUs any more.
    pub fn delete_gpu_node(&self, name: &str) {
        let mut inner = self.inner.write();
        let Some(e) = inner.nodes.get_mut(name) else {
            return;
        };
        e.has_gpu_node = false;
        let gpus = std::mem::take(&mut e.node.gpus);
        e.observed.clear();
        for g in gpus {
            inner.disown(&g.uuid, name);
        }
        inner.bump(name);
        inner.drop_if_empty(name);
    }

    /// Keep only the `GpuNode`s named in `names` (after a re-list).
    pub fn retain_gpu_nodes(&self, names: &HashSet<String>) {
        let gone: Vec<String> = {
            let inner = self.inner.read();
            inner
                .nodes
                .iter()
                .filter(|(n, e)| e.has_gpu_node && !names.contains(*n))
                .map(|(n, _)| n.clone())
                .collect()
        };
        for n in gone {
            self.delete_gpu_node(&n);
        }
    }

    /// A pod was seen. A pod bound to a node with carma's assignment annotations
    /// holds its GPUs (this is how the ledger is rebuilt after a restart); a
    /// pod that has terminated frees them. Returns whether the ledger changed.
    pub fn apply_pod(&self, pod: &Pod) -> bool {
        let Some(uid) = pod.metadata.uid.as_deref() else {
            return false;
        };
        let phase = pod.status.as_ref().and_then(|s| s.phase.as_deref());
        if admission_seen(pod) {
            self.handoff.admitted(uid);
        }
        if matches!(phase, Some("Succeeded" | "Failed")) {
            return self.release_pod(uid);
        }
        let Some(node) = pod.spec.as_ref().and_then(|s| s.node_name.as_deref()) else {
            // Not bound yet: a bind in progress books it itself.
            return false;
        };
        let empty = Default::default();
        let annotations = pod.metadata.annotations.as_ref().unwrap_or(&empty);
        let assignment = match Assignment::from_annotations(annotations) {
            Ok(Some(a)) => a,
            Ok(None) => return false,
            Err(e) => {
                tracing::warn!(pod = %pod_key(pod), error = %e, "ignoring a pod with a broken carma assignment");
                return false;
            }
        };
        if self.inner.read().ledger.get(uid).is_some() {
            return false;
        }
        if let Some(assigned) = annotations.get(carma_api::names::ANNOTATION_ASSIGNED_NODE)
            && assigned != node
        {
            tracing::warn!(
                pod = %pod_key(pod),
                assigned_node = %assigned,
                node,
                "pod is bound to another node than carma assigned; booking its GPUs on the bound node"
            );
        }
        // As bind booked it: from the pod's own annotations (1 when unknown). Parsed before the
        // write lock is taken.
        let expected_sm_activity = carma_core::placement::pack::booked(
            PodRequest::from_annotations(annotations)
                .ok()
                .as_ref()
                .and_then(crate::pod_decision::expected_sm_activity),
        );
        let mut inner = self.inner.write();
        if inner.ledger.get(uid).is_some() {
            return false;
        }
        let visible = inner
            .nodes
            .get(node)
            .is_some_and(|e| e.observed.contains(uid));
        let record = PlacementRecord {
            pod: uid.to_string(),
            node: node.to_string(),
            gpus: assignment.gpus,
            reserved_mib: assignment.estimate.mib,
            exclusive: assignment.exclusive,
            assigned_at: u64::try_from(assignment.assigned_at.timestamp_millis()).unwrap_or(0),
            visible,
            expected_sm_activity,
        };
        tracing::debug!(pod = %pod_key(pod), node, visible, "pod holds GPUs");
        inner.ledger.insert_unchecked(record.clone());
        inner.touch(&record);
        true
    }

    /// A pod is gone (deleted or terminated): its GPUs are free of it.
    pub fn release_pod(&self, uid: &str) -> bool {
        self.handoff.admitted(uid);
        if self.inner.read().ledger.get(uid).is_none() {
            return false;
        }
        self.inner.write().unbook(uid)
    }

    /// Release every placement whose pod is not in `uids` and for which
    /// `keep(uid)` is false (after a re-list of pods).
    pub fn retain_pods(&self, uids: &HashSet<String>, keep: impl Fn(&str) -> bool) {
        let mut inner = self.inner.write();
        let gone: Vec<String> = inner
            .ledger
            .records()
            .filter(|r| !uids.contains(&r.pod) && !keep(&r.pod))
            .map(|r| r.pod.clone())
            .collect();
        for uid in gone {
            inner.unbook(&uid);
        }
        drop(inner);
        self.handoff
            .retain_pods(|uid| uids.contains(uid) || keep(uid));
    }
}

/// Whether the kubelet has admitted `pod` (or it no longer needs admitting): the device plugin
/// marked it allocated, the kubelet started it (`status.startTime` is set only after admission,
/// device Allocate included), or it runs or ended.
pub(crate) fn admission_seen(pod: &Pod) -> bool {
    let allocated = pod
        .metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(carma_api::names::ANNOTATION_ALLOCATED))
        .is_some_and(|v| v.trim() == "true");
    let status = pod.status.as_ref();
    allocated
        || status.is_some_and(|s| s.start_time.is_some())
        || matches!(
            status.and_then(|s| s.phase.as_deref()),
            Some("Running" | "Succeeded" | "Failed")
        )
}
