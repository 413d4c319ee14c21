//! Allocate and GetPreferredAllocation: find the pod being admitted and expose exactly its GPUs.
//!
//! Kubelet's Allocate carries device IDs but no pod identity (kubernetes#82606), and it comes once
//! per container that asks for `carma.io/gpu` — init containers first, then app containers, one pod
//! at a time. The plugin finds the pod and container itself: a pod bound to this node, assigned by
//! carma's extender (annotations), not yet fully allocated, whose next GPU container asks for as
//! many replicas as requested; the pod already part-way through admission first, then one whose
//! assigned GPUs include the requested replicas' GPUs, then the oldest assignment. Each container
//! sees only GPUs of its pod's assignment: an init container any of them, each app container GPUs of
//! its own. GetPreferredAllocation steers kubelet to replicas of exactly those GPUs, so the devices
//! kubelet records (and PodResources reports) name the GPUs the container uses.

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
    AllocateRequest, AllocateResponse, CdiDevice, ContainerAllocateResponse,
    ContainerPreferredAllocationRequest, ContainerPreferredAllocationResponse, Mount,
    PreferredAllocationRequest, PreferredAllocationResponse,
};

/// CDI device kind of NVIDIA GPUs (devices are named `nvidia.com/gpu=<UUID>`).
pub const CDI_KIND: &str = "nvidia.com/gpu";
/// MPS: per-GPU device memory limit of a client.
pub const ENV_MPS_MEM_LIMIT: &str = "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT";
/// MPS: share of SMs a client may use.
pub const ENV_MPS_THREAD_PERCENTAGE: &str = "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE";
/// MPS: directory of the control daemon's pipes.
pub const ENV_MPS_PIPE_DIRECTORY: &str = "CUDA_MPS_PIPE_DIRECTORY";
/// MPS: directory of the control daemon's logs.
pub const ENV_MPS_LOG_DIRECTORY: &str = "CUDA_MPS_LOG_DIRECTORY";
/// Where a container sees the MPS server's shared memory.
pub const MPS_SHM_MOUNT: &str = "/dev/shm";

/// Why no pod could be matched to an Allocate request (sent to kubelet as the gRPC error message).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct NoMatch(pub String);

/// How far kubelet has got in admitting one pod. Kubelet calls Allocate once per container that
/// asks for `carma.io/gpu` — init containers first, then app containers, one pod at a time — so a
/// pod whose first GPU container was served is the one being admitted until its last is.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Progress {
    /// GPU containers served so far (an index into [`PodInfo::gpu_containers`]).
    pub served: usize,
    /// GPUs already given to the pod's app containers; each app container gets GPUs of its own.
    pub app_gpus: Vec<String>,
}

/// The pod and container an Allocate (or GetPreferredAllocation) request belongs to.
#[derive(Debug, Clone, PartialEq)]
pub struct Selected<'p> {
    /// The pod being admitted.
    pub pod: &'p PodInfo,
    /// Index of the container in the pod's `gpu_containers`.
    pub container: usize,
    /// The assigned GPUs this container may take: all of the pod's for an init container, those not
    /// yet given to an earlier app container otherwise.
    pub pool: Vec<String>,
}

impl Selected<'_> {
    /// Whether the container is an init container (its GPUs are reused by the app containers).
    pub fn is_init(&self) -> bool {
        self.container < self.pod.gpu_init_containers
    }

    /// The GPUs to expose to this container for `n` requested replicas on `requested_gpus`: the
    /// requested GPUs that are in the pool (kubelet followed GetPreferredAllocation), then further
    /// pool GPUs — never a GPU outside the pod's assignment — in the assignment's order.
    pub fn gpus_for(&self, requested_gpus: &[String], n: usize) -> Vec<String> {
        let mut chosen: Vec<&String> = requested_gpus
            .iter()
            .filter(|g| self.pool.contains(g))
            .take(n)
            .collect();
        for g in &self.pool {
            if chosen.len() >= n {
                break;
            }
            if !chosen.contains(&g) {
                chosen.push(g);
            }
        }
        self.pool
            .iter()
            .filter(|g| chosen.contains(g))
            .cloned()
            .collect()
    }
}

/// Choose the pod an Allocate request of `requested` replicas belongs to (`progress` empty).
pub fn select_pod<'p>(
    pods: &'p [PodInfo],
    node: &str,
    requested: &[String],
    skip: &HashSet<String>,
) -> Result<&'p PodInfo, NoMatch> {
    let (requested_gpus, _) = distinct_gpus(requested);
    select_container(
        pods,
        node,
        requested.len(),
        &requested_gpus,
        skip,
        &HashMap::new(),
    )
    .map(|s| s.pod)
}

/// Choose the pod and container a request for `n` replicas on `requested_gpus` (empty for
/// GetPreferredAllocation) belongs to.
///
/// Candidates: bound to `node`, not finished or terminating, with a well-formed carma assignment not
/// yet allocated (and not in `skip`, the pods this process finished allocating), whose next GPU
/// container asks for `n`. Order: the pod kubelet is in the middle of admitting; then a pod whose
/// assigned GPUs include every requested GPU; then the oldest `assigned-at` (the extender binds in
/// that order, and kubelet admits in the order pods are bound to it); then the name.
pub fn select_container<'p>(
    pods: &'p [PodInfo],
    node: &str,
    n: usize,
    requested_gpus: &[String],
    skip: &HashSet<String>,
    progress: &HashMap<String, Progress>,
) -> Result<Selected<'p>, NoMatch> {
    let candidate = pods
        .iter()
        .filter(|p| p.node_name.as_deref() == Some(node))
        .filter(|p| !p.finished() && !p.terminating && !skip.contains(&p.uid))
        .filter_map(|p| p.assignment().map(|a| (p, a)))
        .filter(|(_, a)| !a.allocated)
        .filter_map(|(p, a)| {
            let pr = progress.get(&p.uid);
            let container = pr.map_or(0, |x| x.served);
            let want = *p.gpu_containers.get(container)?;
            if want as usize != n {
                return None;
            }
            let pool: Vec<String> = if container < p.gpu_init_containers {
                a.gpus.clone()
            } else {
                a.gpus
                    .iter()
                    .filter(|g| pr.is_none_or(|x| !x.app_gpus.contains(g)))
                    .cloned()
                    .collect()
            };
            let in_progress = container > 0;
            let covers =
                !requested_gpus.is_empty() && requested_gpus.iter().all(|g| pool.contains(g));
            Some((
                (!in_progress, !covers, a.assigned_at, &p.namespace, &p.name),
                Selected {
                    pod: p,
                    container,
                    pool,
                },
            ))
        })
        .min_by(|(ka, _), (kb, _)| ka.cmp(kb))
        .map(|(_, s)| s);
    candidate.ok_or_else(|| explain_no_match(pods, node, n, skip))
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
    msg.push_str(
        "; pods scheduled by another scheduler cannot use carma.io/gpu: set spec.schedulerName to carma's scheduler profile (the chart's scheduler.schedulerName)",
    );
    NoMatch(msg)
}

/// The container response exposing exactly `assignment`'s GPUs.
///
/// Environment: `NVIDIA_VISIBLE_DEVICES` and `CARMA_ASSIGNED_GPUS` = the UUIDs comma-separated,
/// `CARMA_RESERVED_MIB` = the per-GPU reservation. With MPS: `CUDA_MPS_PINNED_DEVICE_MEM_LIMIT` in
/// the ordinal form `0=<MiB>M,1=<MiB>M,…` (ordinals are the container's own CUDA devices, i.e. the
/// assigned GPUs; every GPU of a pod carries the same per-GPU reservation, so their enumeration order
/// does not matter, and the ordinal form is the one MPS is known to honour), and
/// `CUDA_MPS_ACTIVE_THREAD_PERCENTAGE` only when configured, for shared pods; the pipe, shared-memory
/// and log directories are mounted (and the pipe and log directories exported) when configured.
/// `gpus` are the container's share of the assignment (all of it for a pod with one GPU container).
pub fn container_response(
    assignment: &Assignment,
    gpus: &[String],
    mps: Option<&MpsConfig>,
) -> ContainerAllocateResponse {
    let uuids = gpus.join(",");
    let mut envs = HashMap::new();
    envs.insert(ENV_VISIBLE_DEVICES.to_string(), uuids.clone());
    envs.insert(ENV_ASSIGNED_GPUS.to_string(), uuids);
    envs.insert(
        ENV_RESERVED_MIB.to_string(),
        assignment.estimate.mib.to_string(),
    );
    let mut mounts = Vec::new();
    if let Some(mps) = mps {
        let limit = (0..gpus.len())
            .map(|i| format!("{i}={}M", assignment.estimate.mib))
            .collect::<Vec<_>>()
            .join(",");
        envs.insert(ENV_MPS_MEM_LIMIT.to_string(), limit);
        if let Some(pct) = mps.active_thread_percentage
            && !assignment.exclusive
        {
            envs.insert(ENV_MPS_THREAD_PERCENTAGE.to_string(), pct.to_string());
        }
        let text = |p: &std::path::Path| p.to_string_lossy().to_string();
        if let Some(dir) = mps.pipe_directory.as_deref().map(text) {
            envs.insert(ENV_MPS_PIPE_DIRECTORY.to_string(), dir.clone());
            mounts.push(Mount {
                container_path: dir.clone(),
                host_path: dir,
                read_only: false,
            });
        }
        if let Some(dir) = mps.shm_directory.as_deref().map(text) {
            mounts.push(Mount {
                container_path: MPS_SHM_MOUNT.to_string(),
                host_path: dir,
                read_only: false,
            });
        }
        if let Some(dir) = mps.log_directory.as_deref().map(text) {
            envs.insert(ENV_MPS_LOG_DIRECTORY.to_string(), dir.clone());
            mounts.push(Mount {
                container_path: dir.clone(),
                host_path: dir,
                read_only: true,
            });
        }
    }
    ContainerAllocateResponse {
        envs,
        mounts,
        // CDI names as NVIDIA's container toolkit generates them, for nodes whose runtime ignores
        // NVIDIA_VISIBLE_DEVICES from unprivileged containers (accept-nvidia-visible-devices-envvar-when-unprivileged=false).
        cdi_devices: gpus
            .iter()
            .map(|u| CdiDevice {
                name: format!("{CDI_KIND}={u}"),
            })
            .collect(),
        ..Default::default()
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
    metrics: Arc<Metrics>,
    /// Pods this process has allocated (UID → when), so a stale cache never offers them again.
    allocated: Mutex<HashMap<String, Instant>>,
    /// Pods part-way through admission (UID → containers served), with when they were last served.
    progress: Mutex<HashMap<String, (Progress, Instant)>>,
    /// One Allocate at a time on this node.
    serial: tokio::sync::Mutex<()>,
    /// GPUs present on this node (UUIDs), to reject assignments naming other GPUs.
    gpus: Arc<parking_lot::RwLock<Vec<String>>>,
}

/// How long a locally remembered allocation is kept (long after the annotation is visible).
const REMEMBER_ALLOCATED: Duration = Duration::from_secs(600);
/// Freshness of the pod list that Allocate decides on.
const ALLOCATE_MAX_AGE: Duration = Duration::from_secs(1);
/// Pauses between attempts at a pod list that failed: a transient API error must not fail the
/// admission (terminal for a bare pod); all of them stay far inside kubelet's Allocate deadline.
const LIST_RETRY_BACKOFF: [Duration; 3] = [
    Duration::from_millis(100),
    Duration::from_millis(300),
    Duration::from_millis(900),
];

/// The pods on the node, retrying API errors with [`LIST_RETRY_BACKOFF`].
async fn list_with_retry(
    lookup: &dyn PodLookup,
    max_age: Duration,
) -> Result<Arc<Vec<PodInfo>>, LookupError> {
    let mut attempt = 0;
    loop {
        match lookup.pods_on_node(max_age).await {
            Err(LookupError::Api(e)) if attempt < LIST_RETRY_BACKOFF.len() => {
                warn!(
                    attempt = attempt + 1,
                    "listing the node's pods failed, retrying: {e}"
                );
                tokio::time::sleep(LIST_RETRY_BACKOFF[attempt]).await;
                attempt += 1;
            }
            Err(LookupError::Api(e)) => {
                return Err(LookupError::Api(format!(
                    "{e} (after {} attempts)",
                    attempt + 1
                )));
            }
            other => return other,
        }
    }
}

impl Allocator {
    /// An allocator for `node`; without `pods`, every Allocate fails with the reason.
    pub fn new(
        node: impl Into<String>,
        pods: Option<Arc<dyn PodLookup>>,
        mps: Option<MpsConfig>,
        metrics: Arc<Metrics>,
        gpus: Arc<parking_lot::RwLock<Vec<String>>>,
    ) -> Self {
        Self {
            node: node.into(),
            pods,
            mps,
            metrics,
            allocated: Mutex::new(HashMap::new()),
            progress: Mutex::new(HashMap::new()),
            serial: tokio::sync::Mutex::new(()),
            gpus,
        }
    }

    fn skip_set(&self) -> HashSet<String> {
        let mut map = self.allocated.lock();
        map.retain(|_, at| at.elapsed() < REMEMBER_ALLOCATED);
        map.keys().cloned().collect()
    }

    fn progress_map(&self) -> HashMap<String, Progress> {
        let mut map = self.progress.lock();
        map.retain(|_, (_, at)| at.elapsed() < REMEMBER_ALLOCATED);
        map.iter()
            .map(|(k, (p, _))| (k.clone(), p.clone()))
            .collect()
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
        let progress = self.progress_map();
        let lookup_err = |e: LookupError| {
            (
                "lookup_error",
                format!("cannot find the pod being admitted: {e}"),
            )
        };
        let (requested_gpus, _) = distinct_gpus(ids);
        let n = ids.len();
        let mut pods = list_with_retry(lookup.as_ref(), ALLOCATE_MAX_AGE)
            .await
            .map_err(lookup_err)?;
        if select_container(&pods, &self.node, n, &requested_gpus, &skip, &progress).is_err() {
            // The pod may have been bound a moment ago: look again with a fresh list.
            pods = list_with_retry(lookup.as_ref(), Duration::ZERO)
                .await
                .map_err(lookup_err)?;
        }
        let selected = select_container(&pods, &self.node, n, &requested_gpus, &skip, &progress)
            .map_err(|e| ("no_pod", e.0))?;
        let pod = selected.pod.clone();
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
        let gpus = selected.gpus_for(&requested_gpus, n);
        if gpus.len() < n {
            return Err((
                "bad_assignment",
                format!(
                    "pod {} container {} asks for {n} GPU(s) but only {:?} of its assignment are left",
                    pod.key(),
                    selected.container,
                    selected.pool
                ),
            ));
        }
        if !requested_gpus.iter().all(|g| gpus.contains(g)) {
            warn!(pod = %pod.key(), requested = ?ids, exposed = ?gpus,
                "kubelet chose replicas of GPUs outside the pod's assignment; exposing the assigned GPUs");
        }
        let mut next = progress.get(&pod.uid).cloned().unwrap_or_default();
        next.served += 1;
        if !selected.is_init() {
            next.app_gpus.extend(gpus.iter().cloned());
        }
        let done = next.served >= pod.gpu_containers.len();
        let result = if done {
            self.progress.lock().remove(&pod.uid);
            self.allocated
                .lock()
                .insert(pod.uid.clone(), Instant::now());
            match lookup.mark_allocated(&pod.namespace, &pod.name).await {
                Ok(()) => "ok",
                Err(e) => {
                    warn!(pod = %pod.key(), "allocated, but annotating the pod failed (this process remembers it): {e}");
                    "ok_unannotated"
                }
            }
        } else {
            self.progress
                .lock()
                .insert(pod.uid.clone(), (next, Instant::now()));
            "ok"
        };
        self.metrics.allocation(result);
        info!(
            pod = %pod.key(),
            container = selected.container,
            of = pod.gpu_containers.len(),
            gpus = %gpus.join(","),
            reserved_mib = assignment.estimate.mib,
            requested = ?ids,
            mps = self.mps.is_some(),
            "Allocate: exposing the container's assigned GPUs"
        );
        Ok(container_response(&assignment, &gpus, self.mps.as_ref()))
    }

    /// Serve GetPreferredAllocation: prefer replicas of the GPUs the pending pod's next container
    /// is to get, so that the devices kubelet records are the GPUs the container uses.
    pub async fn preferred(
        &self,
        request: PreferredAllocationRequest,
    ) -> PreferredAllocationResponse {
        let skip = self.skip_set();
        let progress = self.progress_map();
        let sizes: Vec<usize> = request
            .container_requests
            .iter()
            .map(|c| usize::try_from(c.allocation_size).unwrap_or(0))
            .collect();
        let mut pods = None;
        if let Some(lookup) = &self.pods {
            pods = lookup.pods_on_node(ALLOCATE_MAX_AGE).await.ok();
            let found = |pods: &Option<Arc<Vec<PodInfo>>>| {
                pods.as_ref().is_some_and(|p| {
                    sizes
                        .iter()
                        .all(|n| select_container(p, &self.node, *n, &[], &skip, &progress).is_ok())
                })
            };
            if !found(&pods) {
                // A pod bound a moment ago is missing from the cached list: without it kubelet
                // would be steered to replicas of some other GPU.
                pods = lookup.pods_on_node(Duration::ZERO).await.ok().or(pods);
            }
        }
        let container_responses = request
            .container_requests
            .iter()
            .map(|c| {
                self.preferred_container(c, pods.as_deref().map(Vec::as_slice), &skip, &progress)
            })
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
        progress: &HashMap<String, Progress>,
    ) -> ContainerPreferredAllocationResponse {
        let size = usize::try_from(c.allocation_size).unwrap_or(0);
        let preferred_gpus = pods
            .and_then(|pods| select_container(pods, &self.node, size, &[], skip, progress).ok())
            .map(|s| s.pool)
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
            gpu_containers: vec![gpus.len() as u32],
            gpu_init_containers: 0,
            assignment: Ok(Some(Assignment {
                gpus: gpus.iter().map(|s| s.to_string()).collect(),
                assigned_at: at(assigned_at),
                estimate: EstimateAnnotation {
                    mib: 6000,
                    source: "override".into(),
                    class: None,
                    samples: None,
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

    /// A pod with the given GPU containers (init containers first), assigned `gpus`.
    fn shaped(name: &str, gpus: &[&str], init: &[u32], app: &[u32], assigned_at: &str) -> PodInfo {
        let mut p = pod(name, "n1", gpus, assigned_at, false);
        p.gpu_containers = init.iter().chain(app).copied().collect();
        p.gpu_init_containers = init.len();
        p.gpu_request = app.iter().sum();
        p
    }

    /// Serve `n` replicas on `requested` GPUs the way the Allocator does; returns (pod, GPUs).
    fn serve(
        pods: &[PodInfo],
        requested: &[&str],
        n: usize,
        progress: &mut HashMap<String, Progress>,
        done: &mut HashSet<String>,
    ) -> (String, Vec<String>) {
        let req = ids(requested);
        let s = select_container(pods, "n1", n, &req, done, progress).unwrap();
        let gpus = s.gpus_for(&req, n);
        let e = progress.entry(s.pod.uid.clone()).or_default();
        e.served += 1;
        if !s.is_init() {
            e.app_gpus.extend(gpus.iter().cloned());
        }
        if e.served == s.pod.gpu_containers.len() {
            done.insert(s.pod.uid.clone());
            progress.remove(&s.pod.uid);
        }
        (s.pod.name.clone(), gpus)
    }

    #[test]
    fn every_container_of_a_multi_container_pod_gets_gpus_of_its_own() {
        // Seen with the kubelet's own device manager: one Allocate per container. The old plugin
        // matched one container's count against the pod's total and failed admission.
        let pods = vec![shaped(
            "two",
            &["GPU-a", "GPU-b"],
            &[],
            &[1, 1],
            "2026-01-01T00:00:01Z",
        )];
        let (mut progress, mut done) = (HashMap::new(), HashSet::new());
        assert_eq!(
            serve(&pods, &["GPU-b"], 1, &mut progress, &mut done),
            ("two".into(), ids(&["GPU-b"]))
        );
        // The second container: the GPU left, whatever replica kubelet offers.
        assert_eq!(
            serve(&pods, &["GPU-b"], 1, &mut progress, &mut done),
            ("two".into(), ids(&["GPU-a"]))
        );
        assert!(done.contains("uid-two"));
    }

    #[test]
    fn gpu_init_containers_come_first_and_share_the_assignment() {
        let pods = vec![shaped(
            "init",
            &["GPU-a", "GPU-b"],
            &[2],
            &[1, 1],
            "2026-01-01T00:00:01Z",
        )];
        let (mut progress, mut done) = (HashMap::new(), HashSet::new());
        assert_eq!(
            serve(&pods, &["GPU-a", "GPU-b"], 2, &mut progress, &mut done).1,
            ids(&["GPU-a", "GPU-b"])
        );
        // kubelet reuses the init container's devices for the app containers.
        assert_eq!(
            serve(&pods, &["GPU-a"], 1, &mut progress, &mut done).1,
            ids(&["GPU-a"])
        );
        assert_eq!(
            serve(&pods, &["GPU-a"], 1, &mut progress, &mut done).1,
            ids(&["GPU-b"])
        );
        assert!(done.contains("uid-init"));
    }

    #[test]
    fn the_pod_being_admitted_keeps_its_turn() {
        // Two pods of the same shape pending together: once kubelet started admitting one, its next
        // container is not given to the other (older) pod.
        let pods = vec![
            shaped(
                "older",
                &["GPU-a", "GPU-b"],
                &[],
                &[1, 1],
                "2026-01-01T00:00:01Z",
            ),
            shaped(
                "newer",
                &["GPU-c", "GPU-d"],
                &[],
                &[1, 1],
                "2026-01-01T00:00:02Z",
            ),
        ];
        let (mut progress, mut done) = (HashMap::new(), HashSet::new());
        assert_eq!(
            serve(&pods, &["GPU-c"], 1, &mut progress, &mut done),
            ("newer".into(), ids(&["GPU-c"]))
        );
        assert_eq!(
            serve(&pods, &["GPU-a"], 1, &mut progress, &mut done),
            ("newer".into(), ids(&["GPU-d"]))
        );
        assert_eq!(
            serve(&pods, &["GPU-a"], 1, &mut progress, &mut done),
            ("older".into(), ids(&["GPU-a"]))
        );
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
        let r = container_response(a, &a.gpus, None);
        assert_eq!(r.envs[ENV_VISIBLE_DEVICES], "GPU-a,GPU-b");
        assert_eq!(r.envs[ENV_ASSIGNED_GPUS], "GPU-a,GPU-b");
        assert_eq!(r.envs[ENV_RESERVED_MIB], "6000");
        assert!(!r.envs.contains_key(ENV_MPS_MEM_LIMIT));
        let cdi: Vec<&str> = r.cdi_devices.iter().map(|d| d.name.as_str()).collect();
        assert_eq!(cdi, ["nvidia.com/gpu=GPU-a", "nvidia.com/gpu=GPU-b"]);
        let mps = MpsConfig::with_defaults();
        let r = container_response(a, &a.gpus, Some(&mps));
        assert_eq!(r.envs[ENV_MPS_MEM_LIMIT], "0=6000M,1=6000M");
        // SMs unlimited by default: a pod alone on its GPU is not held to 1/replicas of it.
        assert!(!r.envs.contains_key(ENV_MPS_THREAD_PERCENTAGE));
        assert_eq!(r.envs[ENV_MPS_PIPE_DIRECTORY], "/tmp/nvidia-mps");
        assert_eq!(r.envs[ENV_MPS_LOG_DIRECTORY], "/var/log/nvidia-mps");
        // What an MPS client needs: the pipes, the server's shared memory, the logs.
        let mounts: Vec<(&str, &str, bool)> = r
            .mounts
            .iter()
            .map(|m| (m.host_path.as_str(), m.container_path.as_str(), m.read_only))
            .collect();
        assert_eq!(
            mounts,
            [
                ("/tmp/nvidia-mps", "/tmp/nvidia-mps", false),
                ("/dev/shm", "/dev/shm", false),
                ("/var/log/nvidia-mps", "/var/log/nvidia-mps", true),
            ]
        );
        // An explicit limit applies to shared pods only.
        let capped = MpsConfig {
            active_thread_percentage: Some(50),
            ..MpsConfig::with_defaults()
        };
        let r = container_response(a, &a.gpus, Some(&capped));
        assert_eq!(r.envs[ENV_MPS_THREAD_PERCENTAGE], "50");
        let mut alone = a.clone();
        alone.exclusive = true;
        let r = container_response(&alone, &alone.gpus, Some(&capped));
        assert!(!r.envs.contains_key(ENV_MPS_THREAD_PERCENTAGE));
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
