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

mod response;
mod select;

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::{Duration, Instant};

use carma_core::memory_limit::{GpuMemory, container_memory_limit_mib};
use parking_lot::Mutex;
use tracing::{info, warn};

use crate::config::MpsConfig;
use crate::devices::distinct_gpus;
use crate::metrics::Metrics;
use crate::pods::{LookupError, PodInfo, PodLookup};
use crate::proto::{
    AllocateRequest, AllocateResponse, ContainerAllocateResponse,
    ContainerPreferredAllocationRequest, ContainerPreferredAllocationResponse,
    PreferredAllocationRequest, PreferredAllocationResponse,
};

pub use response::{container_response, preferred_ids, with_memory_hook};
pub use select::{NoMatch, Progress, Selected, select_container, select_pod};

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
    /// Total memory of the GPUs (UUID → MiB), for the containers' memory limits.
    gpu_memory: Arc<parking_lot::RwLock<HashMap<String, u64>>>,
    /// Whether every container also gets the memory-limit hook's CDI name
    /// ([`carma_gpu::enforcement::HOOK_CDI_NAME`]).
    memory_hook: bool,
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
            gpu_memory: Arc::default(),
            memory_hook: false,
        }
    }

    /// Name the memory-limit hook's CDI device in every container response, so the runtime runs
    /// NVIDIA's `apply-cuda-memory-limits` hook on it (the device plugin's spec must be written).
    pub fn with_memory_hook(mut self, on: bool) -> Self {
        self.memory_hook = on;
        self
    }

    /// Read the GPUs' total memory (UUID → MiB) from `gpu_memory`, kept current by the sampler,
    /// to bound each container's memory limit ([`carma_core::memory_limit`]). Without it (or
    /// for a GPU not in it) a container's limit is its reservation.
    pub fn with_gpu_memory(
        mut self,
        gpu_memory: Arc<parking_lot::RwLock<HashMap<String, u64>>>,
    ) -> Self {
        self.gpu_memory = gpu_memory;
        self
    }

    /// The memory limit of `pod`'s container on `gpus` ([`carma_core::memory_limit`]): the
    /// others on each GPU are every other pod of this node assigned to it that has not ended,
    /// admitted or not.
    fn memory_limit_mib(
        &self,
        pods: &[PodInfo],
        pod: &PodInfo,
        reservation_mib: u64,
        gpus: &[String],
    ) -> u64 {
        let totals = self.gpu_memory.read();
        container_memory_limit_mib(
            reservation_mib,
            gpus.iter().map(|gpu| GpuMemory {
                // Unknown total: nothing to bound the reservation by.
                total_mib: totals.get(gpu).copied().unwrap_or(u64::MAX),
                others_reserved_mib: pods
                    .iter()
                    .filter(|p| {
                        p.uid != pod.uid && p.node_name.as_deref() == Some(self.node.as_str())
                    })
                    .filter(|p| p.occupies_gpus())
                    .filter_map(|p| p.assignment())
                    .filter(|a| a.gpus.contains(gpu))
                    .map(|a| a.estimate.mib)
                    .sum(),
            }),
        )
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
        let limit_mib = self.memory_limit_mib(&pods, &pod, assignment.estimate.mib, &gpus);
        if limit_mib < assignment.estimate.mib {
            warn!(pod = %pod.key(), reserved_mib = assignment.estimate.mib, limit_mib,
                "the other pods on its GPUs reserve so much that this container's memory limit is below its reservation");
        }
        info!(
            pod = %pod.key(),
            container = selected.container,
            of = pod.gpu_containers.len(),
            gpus = %gpus.join(","),
            reserved_mib = assignment.estimate.mib,
            limit_mib,
            requested = ?ids,
            mps = self.mps.is_some(),
            "Allocate: exposing the container's assigned GPUs"
        );
        let response = container_response(&assignment, &gpus, self.mps.as_ref(), limit_mib);
        Ok(if self.memory_hook {
            with_memory_hook(response)
        } else {
            response
        })
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
