//! Allocate and GetPreferredAllocation: find the pod being admitted and expose exactly its GPUs.
//!
//! Kubelet's Allocate carries device IDs but no pod identity (kubernetes#82606), so the plugin finds
//! the pod itself: a pod bound to this node, assigned by carma's extender (annotations), not yet
//! allocated, whose number of assigned GPUs equals the number of replicas requested; among several,
//! the one whose assigned GPUs are exactly the requested replicas' GPUs first, then the oldest
//! assignment. The container then sees the pod's assigned GPUs — whatever replicas kubelet picked —
//! and never a GPU that carma did not assign.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::{Duration, Instant};

use carma_api::Assignment;
use carma_api::names::{ENV_ASSIGNED_GPUS, ENV_RESERVED_MIB, ENV_VISIBLE_DEVICES};
use parking_lot::Mutex;
use tracing::{info, warn};

use crate::config::MpsConfig;
use crate::devices::{ReplicaId, distinct_gpus};
use crate::metrics::Metrics;
use crate::pods::{LookupError, PodInfo, PodLookup};
use crate::proto::{
    AllocateRequest, AllocateResponse, ContainerAllocateResponse,
    ContainerPreferredAllocationRequest, ContainerPreferredAllocationResponse, Mount,
    PreferredAllocationRequest, PreferredAllocationResponse,
};

/// MPS: per-GPU device memory limit of a client.
pub const ENV_MPS_MEM_LIMIT: &str = "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT";
/// MPS: share of SMs a client may use.
pub const ENV_MPS_THREAD_PERCENTAGE: &str = "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE";
/// MPS: directory of the control daemon's pipes.
pub const ENV_MPS_PIPE_DIRECTORY: &str = "CUDA_MPS_PIPE_DIRECTORY";

/// Why no pod could be matched to an Allocate request (sent to kubelet as the gRPC error message).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct NoMatch(pub String);

/// Choose the pod an Allocate request of `requested` replicas belongs to.
///
/// Candidates: bound to `node`, not finished or terminating, with a well-formed carma assignment
/// that is not yet allocated (and not in `skip`, the pods this process allocated already), and as
/// many assigned GPUs as replicas requested. Order: the pod whose assigned GPUs are exactly the
/// requested replicas' GPUs, then the oldest `assigned-at`, then the name.
pub fn select_pod<'p>(
    pods: &'p [PodInfo],
    node: &str,
    requested: &[String],
    skip: &HashSet<String>,
) -> Result<&'p PodInfo, NoMatch> {
    let (requested_gpus, _) = distinct_gpus(requested);
    select_pod_for(pods, node, requested.len(), &requested_gpus, skip)
}

/// [`select_pod`] by count and (possibly empty) set of requested GPUs.
pub fn select_pod_for<'p>(
    pods: &'p [PodInfo],
    node: &str,
    n: usize,
    requested_gpus: &[String],
    skip: &HashSet<String>,
) -> Result<&'p PodInfo, NoMatch> {
    let requested_set: HashSet<&str> = requested_gpus.iter().map(String::as_str).collect();
    let candidate = pods
        .iter()
        .filter(|p| p.node_name.as_deref() == Some(node))
        .filter(|p| !p.finished() && !p.terminating && !skip.contains(&p.uid))
        .filter_map(|p| p.assignment().map(|a| (p, a)))
        .filter(|(_, a)| !a.allocated && a.gpus.len() == n)
        .min_by(|(pa, a), (pb, b)| {
            let exact = |a: &Assignment| {
                let set: HashSet<&str> = a.gpus.iter().map(String::as_str).collect();
                set != requested_set // false (exact) sorts first
            };
            exact(a)
                .cmp(&exact(b))
                .then(a.assigned_at.cmp(&b.assigned_at))
                .then(pa.namespace.cmp(&pb.namespace))
                .then(pa.name.cmp(&pb.name))
        });
    match candidate {
        Some((p, _)) => Ok(p),
        None => Err(explain_no_match(pods, node, n, skip)),
    }
}

/// The reason no pod matched, naming what was found instead.
fn explain_no_match(pods: &[PodInfo], node: &str, n: usize, skip: &HashSet<String>) -> NoMatch {
    let mut msg = format!(
        "no pod on node {node} with a carma GPU assignment awaits allocation of {n} GPU(s)"
    );
    let on_node: Vec<&PodInfo> = pods
        .iter()
        .filter(|p| p.node_name.as_deref() == Some(node) && !p.finished() && !p.terminating)
        .collect();
    let mut notes: Vec<String> = Vec::new();
    let foreign: Vec<String> = on_node
        .iter()
        .filter(|p| p.gpu_request > 0 && p.assignment().is_none() && p.assignment.is_ok())
        .map(|p| format!("{} (schedulerName {})", p.key(), p.scheduler_name))
        .collect();
    if !foreign.is_empty() {
        notes.push(format!(
            "pods requesting carma.io/gpu without a carma assignment: {}",
            foreign.join(", ")
        ));
    }
    let broken: Vec<String> = on_node
        .iter()
        .filter_map(|p| {
            p.assignment
                .as_ref()
                .err()
                .map(|e| format!("{}: {e}", p.key()))
        })
        .collect();
    if !broken.is_empty() {
        notes.push(format!(
            "pods with malformed assignments: {}",
            broken.join("; ")
        ));
    }
    let other_count: Vec<String> = on_node
        .iter()
        .filter(|p| !skip.contains(&p.uid))
        .filter_map(|p| p.assignment().map(|a| (p, a)))
        .filter(|(_, a)| !a.allocated && a.gpus.len() != n)
        .map(|(p, a)| format!("{} ({} GPU(s))", p.key(), a.gpus.len()))
        .collect();
    if !other_count.is_empty() {
        notes.push(format!(
            "pending carma pods with another GPU count: {}",
            other_count.join(", ")
        ));
    }
    if !notes.is_empty() {
        msg.push_str(" (");
        msg.push_str(&notes.join("; "));
        msg.push(')');
    }
    msg.push_str(&format!(
        "; pods scheduled by another scheduler cannot use carma.io/gpu: set spec.schedulerName to carma's scheduler profile (the chart's scheduler.schedulerName)"
    ));
    NoMatch(msg)
}

/// The container response exposing exactly `assignment`'s GPUs.
///
/// Environment: `NVIDIA_VISIBLE_DEVICES` and `CARMA_ASSIGNED_GPUS` = the UUIDs comma-separated,
/// `CARMA_RESERVED_MIB` = the per-GPU reservation. With MPS: `CUDA_MPS_PINNED_DEVICE_MEM_LIMIT` in
/// the ordinal form `0=<MiB>M,1=<MiB>M,…` (ordinals are the container's own CUDA devices, i.e. the
/// assigned GPUs; every GPU of a pod carries the same per-GPU reservation, so their enumeration order
/// does not matter, and the ordinal form is the one MPS is known to honour), and
/// `CUDA_MPS_ACTIVE_THREAD_PERCENTAGE` = 100 / replicas (100 for exclusive pods); the pipe directory is
/// mounted and exported when configured.
pub fn container_response(
    assignment: &Assignment,
    mps: Option<&MpsConfig>,
    replicas: u32,
) -> ContainerAllocateResponse {
    let uuids = assignment.gpus.join(",");
    let mut envs = HashMap::new();
    envs.insert(ENV_VISIBLE_DEVICES.to_string(), uuids.clone());
    envs.insert(ENV_ASSIGNED_GPUS.to_string(), uuids);
    envs.insert(
        ENV_RESERVED_MIB.to_string(),
        assignment.estimate.mib.to_string(),
    );
    let mut mounts = Vec::new();
    if let Some(mps) = mps {
        let limit = (0..assignment.gpus.len())
            .map(|i| format!("{i}={}M", assignment.estimate.mib))
            .collect::<Vec<_>>()
            .join(",");
        envs.insert(ENV_MPS_MEM_LIMIT.to_string(), limit);
        envs.insert(
            ENV_MPS_THREAD_PERCENTAGE.to_string(),
            mps_thread_percentage(assignment.exclusive, replicas).to_string(),
        );
        if let Some(dir) = &mps.pipe_directory {
            let dir = dir.to_string_lossy().to_string();
            envs.insert(ENV_MPS_PIPE_DIRECTORY.to_string(), dir.clone());
            mounts.push(Mount {
                container_path: dir.clone(),
                host_path: dir,
                read_only: false,
            });
        }
    }
    ContainerAllocateResponse {
        envs,
        mounts,
        ..Default::default()
    }
}

/// `CUDA_MPS_ACTIVE_THREAD_PERCENTAGE`: an even share of the replicas, all for exclusive pods.
pub fn mps_thread_percentage(exclusive: bool, replicas: u32) -> u32 {
    if exclusive {
        100
    } else {
        (100 / replicas.max(1)).max(1)
    }
}

/// Replica IDs kubelet should prefer for one container.
///
/// `must_include` first, then one replica of each of `preferred_gpus` (the pending pod's assigned
/// GPUs), then one replica per further GPU (spreading), then any. Never more than `size`.
pub fn preferred_ids(
    available: &[String],
    must_include: &[String],
    size: usize,
    preferred_gpus: &[String],
) -> Vec<String> {
    let mut out: Vec<String> = Vec::with_capacity(size);
    let mut used_gpus: HashSet<String> = HashSet::new();
    let push = |id: &String, out: &mut Vec<String>, used: &mut HashSet<String>| {
        if out.len() < size && !out.contains(id) {
            if let Some(r) = ReplicaId::parse(id) {
                used.insert(r.uuid);
            }
            out.push(id.clone());
        }
    };
    for id in must_include {
        push(id, &mut out, &mut used_gpus);
    }
    let mut sorted: Vec<(ReplicaId, &String)> = available
        .iter()
        .filter_map(|id| ReplicaId::parse(id).map(|r| (r, id)))
        .collect();
    sorted.sort();
    for gpu in preferred_gpus {
        if used_gpus.contains(gpu) {
            continue;
        }
        if let Some((_, id)) = sorted.iter().find(|(r, _)| &r.uuid == gpu) {
            push(id, &mut out, &mut used_gpus);
        }
    }
    for (r, id) in &sorted {
        if !used_gpus.contains(&r.uuid) {
            push(id, &mut out, &mut used_gpus);
        }
    }
    for id in available {
        push(id, &mut out, &mut used_gpus);
    }
    out
}

/// Serves Allocate and GetPreferredAllocation for one node.
#[derive(Debug)]
pub struct Allocator {
    node: String,
    pods: Option<Arc<dyn PodLookup>>,
    mps: Option<MpsConfig>,
    replicas: u32,
    metrics: Arc<Metrics>,
    /// Pods this process has allocated (UID → when), so a stale cache never offers them again.
    allocated: Mutex<HashMap<String, Instant>>,
    /// One Allocate at a time on this node.
    serial: tokio::sync::Mutex<()>,
    /// GPUs present on this node (UUIDs), to reject assignments naming other GPUs.
    gpus: Arc<parking_lot::RwLock<Vec<String>>>,
}

/// How long a locally remembered allocation is kept (long after the annotation is visible).
const REMEMBER_ALLOCATED: Duration = Duration::from_secs(600);
/// Freshness of the pod list that Allocate decides on.
const ALLOCATE_MAX_AGE: Duration = Duration::from_secs(1);

impl Allocator {
    /// An allocator for `node`; without `pods`, every Allocate fails with the reason.
    pub fn new(
        node: impl Into<String>,
        pods: Option<Arc<dyn PodLookup>>,
        mps: Option<MpsConfig>,
        replicas: u32,
        metrics: Arc<Metrics>,
        gpus: Arc<parking_lot::RwLock<Vec<String>>>,
    ) -> Self {
        Self {
            node: node.into(),
            pods,
            mps,
            replicas,
            metrics,
            allocated: Mutex::new(HashMap::new()),
            serial: tokio::sync::Mutex::new(()),
            gpus,
        }
    }

    fn skip_set(&self) -> HashSet<String> {
        let mut map = self.allocated.lock();
        map.retain(|_, at| at.elapsed() < REMEMBER_ALLOCATED);
        map.keys().cloned().collect()
    }

    /// Serve an Allocate request; the error is the message for kubelet.
    pub async fn allocate(&self, request: AllocateRequest) -> Result<AllocateResponse, String> {
        let _serial = self.serial.lock().await;
        let mut responses = Vec::with_capacity(request.container_requests.len());
        for container in &request.container_requests {
            match self.allocate_container(&container.devices_ids).await {
                Ok(r) => responses.push(r),
                Err((result, msg)) => {
                    self.metrics.allocation(result);
                    warn!(node = %self.node, devices = ?container.devices_ids, "Allocate refused: {msg}");
                    return Err(msg);
                }
            }
        }
        Ok(AllocateResponse {
            container_responses: responses,
        })
    }

    async fn allocate_container(
        &self,
        ids: &[String],
    ) -> Result<ContainerAllocateResponse, (&'static str, String)> {
        let (_, foreign) = distinct_gpus(ids);
        if ids.is_empty() || !foreign.is_empty() {
            return Err((
                "bad_request",
                format!(
                    "Allocate: device IDs {foreign:?} are not carma.io/gpu replicas (<GPU-UUID>::<k>)"
                ),
            ));
        }
        let Some(lookup) = &self.pods else {
            return Err(("lookup_off", LookupError::Off.to_string()));
        };
        let skip = self.skip_set();
        let lookup_err = |e: LookupError| {
            (
                "lookup_error",
                format!("cannot find the pod being admitted: {e}"),
            )
        };
        let mut pods = lookup
            .pods_on_node(ALLOCATE_MAX_AGE)
            .await
            .map_err(lookup_err)?;
        let mut selected = select_pod(&pods, &self.node, ids, &skip).cloned();
        if selected.is_err() {
            // The pod may have been bound a moment ago: look again with a fresh list.
            pods = lookup
                .pods_on_node(Duration::ZERO)
                .await
                .map_err(lookup_err)?;
            selected = select_pod(&pods, &self.node, ids, &skip).cloned();
        }
        let pod = selected.map_err(|e| ("no_pod", e.0))?;
        let Some(assignment) = pod.assignment().cloned() else {
            return Err(("error", format!("pod {} lost its assignment", pod.key())));
        };
        {
            let present = self.gpus.read();
            let missing: Vec<&String> = assignment
                .gpus
                .iter()
                .filter(|g| !present.contains(g))
                .collect();
            if !missing.is_empty() {
                return Err((
                    "bad_assignment",
                    format!(
                        "pod {} is assigned GPU(s) {missing:?} that node {} does not have (its GPUs: {:?})",
                        pod.key(),
                        self.node,
                        *present
                    ),
                ));
            }
        }
        self.allocated
            .lock()
            .insert(pod.uid.clone(), Instant::now());
        let result = match lookup.mark_allocated(&pod.namespace, &pod.name).await {
            Ok(()) => "ok",
            Err(e) => {
                warn!(pod = %pod.key(), "allocated, but annotating the pod failed (this process remembers it): {e}");
                "ok_unannotated"
            }
        };
        self.metrics.allocation(result);
        info!(
            pod = %pod.key(),
            gpus = %assignment.gpus.join(","),
            reserved_mib = assignment.estimate.mib,
            requested = ?ids,
            mps = self.mps.is_some(),
            "Allocate: exposing the pod's assigned GPUs"
        );
        Ok(container_response(
            &assignment,
            self.mps.as_ref(),
            self.replicas,
        ))
    }

    /// Serve GetPreferredAllocation: prefer replicas of the GPUs assigned to the pending pod.
    pub async fn preferred(
        &self,
        request: PreferredAllocationRequest,
    ) -> PreferredAllocationResponse {
        let pods = match &self.pods {
            Some(lookup) => lookup.pods_on_node(ALLOCATE_MAX_AGE).await.ok(),
            None => None,
        };
        let skip = self.skip_set();
        let container_responses = request
            .container_requests
            .iter()
            .map(|c| self.preferred_container(c, pods.as_deref().map(Vec::as_slice), &skip))
            .collect();
        PreferredAllocationResponse {
            container_responses,
        }
    }

    fn preferred_container(
        &self,
        c: &ContainerPreferredAllocationRequest,
        pods: Option<&[PodInfo]>,
        skip: &HashSet<String>,
    ) -> ContainerPreferredAllocationResponse {
        let size = usize::try_from(c.allocation_size).unwrap_or(0);
        // The pending pod whose GPU count matches; its GPUs are what Allocate will expose.
        let preferred_gpus = pods
            .and_then(|pods| select_pod_for(pods, &self.node, size, &[], skip).ok())
            .and_then(|p| p.assignment().map(|a| a.gpus.clone()))
            .unwrap_or_default();
        ContainerPreferredAllocationResponse {
            device_i_ds: preferred_ids(
                &c.available_device_i_ds,
                &c.must_include_device_i_ds,
                size,
                &preferred_gpus,
            ),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use carma_api::EstimateAnnotation;
    use carma_api::names::SCHEDULER_NAME;
    use chrono::{DateTime, Utc};

    fn at(s: &str) -> DateTime<Utc> {
        DateTime::parse_from_rfc3339(s).unwrap().with_timezone(&Utc)
    }

    fn pod(name: &str, node: &str, gpus: &[&str], assigned_at: &str, allocated: bool) -> PodInfo {
        PodInfo {
            namespace: "ml".into(),
            name: name.into(),
            uid: format!("uid-{name}"),
            node_name: Some(node.into()),
            scheduler_name: SCHEDULER_NAME.into(),
            phase: Some("Pending".into()),
            terminating: false,
            gpu_request: gpus.len() as u32,
            assignment: Ok(Some(Assignment {
                gpus: gpus.iter().map(|s| s.to_string()).collect(),
                assigned_at: at(assigned_at),
                estimate: EstimateAnnotation {
                    mib: 6000,
                    source: "override".into(),
                    class: None,
                },
                exclusive: false,
                allocated,
            })),
            task: None,
            simulated: false,
        }
    }

    fn ids(v: &[&str]) -> Vec<String> {
        v.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn oldest_unallocated_pod_with_matching_count_wins() {
        let pods = vec![
            pod("new", "n1", &["GPU-a"], "2026-01-01T00:00:10Z", false),
            pod("old", "n1", &["GPU-b"], "2026-01-01T00:00:01Z", false),
            pod("done", "n1", &["GPU-a"], "2026-01-01T00:00:00Z", true),
            pod(
                "two",
                "n1",
                &["GPU-a", "GPU-b"],
                "2025-01-01T00:00:00Z",
                false,
            ),
            pod("elsewhere", "n2", &["GPU-a"], "2025-01-01T00:00:00Z", false),
        ];
        let got = select_pod(&pods, "n1", &ids(&["GPU-c::0"]), &HashSet::new()).unwrap();
        assert_eq!(got.name, "old");
        let got = select_pod(
            &pods,
            "n1",
            &ids(&["GPU-a::0", "GPU-a::1"]),
            &HashSet::new(),
        )
        .unwrap();
        assert_eq!(got.name, "two");
    }

    #[test]
    fn exact_gpu_match_beats_age_and_skip_is_honoured() {
        let pods = vec![
            pod("old", "n1", &["GPU-b"], "2026-01-01T00:00:01Z", false),
            pod("new", "n1", &["GPU-a"], "2026-01-01T00:00:10Z", false),
        ];
        let got = select_pod(&pods, "n1", &ids(&["GPU-a::3"]), &HashSet::new()).unwrap();
        assert_eq!(got.name, "new");
        let skip: HashSet<String> = ["uid-new".to_string()].into();
        let got = select_pod(&pods, "n1", &ids(&["GPU-a::3"]), &skip).unwrap();
        assert_eq!(got.name, "old");
    }

    #[test]
    fn finished_and_terminating_pods_are_not_candidates() {
        let mut a = pod("a", "n1", &["GPU-a"], "2026-01-01T00:00:01Z", false);
        a.phase = Some("Failed".into());
        let mut b = pod("b", "n1", &["GPU-a"], "2026-01-01T00:00:01Z", false);
        b.terminating = true;
        assert!(select_pod(&[a, b], "n1", &ids(&["GPU-a::0"]), &HashSet::new()).is_err());
    }

    #[test]
    fn no_match_explains_foreign_scheduler() {
        let mut foreign = pod("web", "n1", &[], "2026-01-01T00:00:01Z", false);
        foreign.assignment = Ok(None);
        foreign.scheduler_name = "default-scheduler".into();
        foreign.gpu_request = 1;
        let two = pod(
            "two",
            "n1",
            &["GPU-a", "GPU-b"],
            "2026-01-01T00:00:01Z",
            false,
        );
        let err =
            select_pod(&[foreign, two], "n1", &ids(&["GPU-a::0"]), &HashSet::new()).unwrap_err();
        let msg = err.to_string();
        assert!(
            msg.contains(
                "no pod on node n1 with a carma GPU assignment awaits allocation of 1 GPU(s)"
            ),
            "{msg}"
        );
        assert!(
            msg.contains("ml/web (schedulerName default-scheduler)"),
            "{msg}"
        );
        assert!(msg.contains("ml/two (2 GPU(s))"), "{msg}");
        assert!(
            msg.contains("pods scheduled by another scheduler cannot use carma.io/gpu"),
            "{msg}"
        );
    }

    #[test]
    fn response_exposes_exactly_the_assigned_gpus() {
        let p = pod(
            "p",
            "n1",
            &["GPU-a", "GPU-b"],
            "2026-01-01T00:00:01Z",
            false,
        );
        let a = p.assignment().unwrap();
        let r = container_response(a, None, 8);
        assert_eq!(r.envs[ENV_VISIBLE_DEVICES], "GPU-a,GPU-b");
        assert_eq!(r.envs[ENV_ASSIGNED_GPUS], "GPU-a,GPU-b");
        assert_eq!(r.envs[ENV_RESERVED_MIB], "6000");
        assert!(!r.envs.contains_key(ENV_MPS_MEM_LIMIT));
        let mps = MpsConfig {
            pipe_directory: Some("/tmp/nvidia-mps".into()),
        };
        let r = container_response(a, Some(&mps), 8);
        assert_eq!(r.envs[ENV_MPS_MEM_LIMIT], "0=6000M,1=6000M");
        assert_eq!(r.envs[ENV_MPS_THREAD_PERCENTAGE], "12");
        assert_eq!(r.envs[ENV_MPS_PIPE_DIRECTORY], "/tmp/nvidia-mps");
        assert_eq!(r.mounts.len(), 1);
        assert_eq!(mps_thread_percentage(true, 8), 100);
        assert_eq!(mps_thread_percentage(false, 1000), 1);
    }

    #[test]
    fn preferred_ids_take_the_assigned_gpus_first() {
        let available = ids(&["GPU-a::0", "GPU-a::1", "GPU-b::0", "GPU-b::1", "GPU-c::0"]);
        assert_eq!(
            preferred_ids(&available, &[], 1, &ids(&["GPU-b"])),
            ["GPU-b::0"]
        );
        assert_eq!(
            preferred_ids(&available, &[], 2, &ids(&["GPU-c", "GPU-a"])),
            ["GPU-c::0", "GPU-a::0"]
        );
        // Without a pending pod: spread over GPUs.
        assert_eq!(
            preferred_ids(&available, &[], 3, &[]),
            ["GPU-a::0", "GPU-b::0", "GPU-c::0"]
        );
        assert_eq!(
            preferred_ids(
                &available,
                &ids(&["GPU-b::1"]),
                2,
                &ids(&["GPU-b", "GPU-a"])
            ),
            ["GPU-b::1", "GPU-a::0"]
        );
        // More wanted than GPUs: fill with further replicas.
        assert_eq!(preferred_ids(&available, &[], 4, &[]).len(), 4);
    }
}
