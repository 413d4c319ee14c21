//! The DRA v1 `DRAPlugin` service the kubelet calls on the DRA socket before a pod's containers
//! start (`NodePrepareResources`) and after they are gone (`NodeUnprepareResources`).
//!
//! Preparing a claim reads it from the API server, checks it ([`crate::claims`]), writes its CDI
//! spec ([`crate::cdi`]) and answers each device's CDI name. Both calls are idempotent, as the
//! kubelet requires (it retries and repeats calls after restarts): preparing again rewrites the
//! same spec, unpreparing a claim without a spec succeeds. Unprepare needs nothing but the UID (the
//! spec's name), so it works after a driver restart or when the claim is already deleted. Prepared
//! claims are recorded in a checkpoint ([`crate::checkpoint`]) before the answer, so a restarted
//! driver knows them and the sweep of orphaned specs keeps theirs. Spec and checkpoint writes are
//! fsynced and run on tokio's blocking pool. Calls run one at a time, as the Go helper does by
//! default; the sweep waits for them.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Instant;

use carma_gpu::backends::{PodOnGpu, SampleContext};
use carma_gpu::config::MpsConfig;
use parking_lot::RwLock;
use thiserror::Error;
use tonic::{Request, Response, Status};
use tracing::{info, instrument, warn};

use crate::cdi::{self, CdiHook, NVIDIA_CDI_KIND};
use crate::checkpoint::{self, PreparedClaims};
use crate::claims::{ClaimSource, Inventory, PrepareError, Published, allocated_devices};
use crate::metrics::Metrics;
use crate::proto::dra::dra_plugin_server::DraPlugin;
use crate::proto::dra::{
    Claim, Device, NodePrepareResourceResponse, NodePrepareResourcesRequest,
    NodePrepareResourcesResponse, NodeUnprepareResourceResponse, NodeUnprepareResourcesRequest,
    NodeUnprepareResourcesResponse,
};

/// Why one claim could not be prepared or unprepared (reported per claim, not as a gRPC error).
#[derive(Debug, Error)]
pub enum ClaimFailure {
    /// The kubelet sent a claim without UID.
    #[error("claim {namespace}/{name} has no UID")]
    NoUid {
        /// Namespace.
        namespace: String,
        /// Name.
        name: String,
    },
    /// The claim is not preparable on this node.
    #[error(transparent)]
    Prepare(#[from] PrepareError),
    /// The CDI spec could not be written or removed.
    #[error("CDI spec {}: {source}", path.display())]
    Cdi {
        /// The spec file.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// The checkpoint of prepared claims could not be written.
    #[error("checkpoint {}: {source}", path.display())]
    Checkpoint {
        /// The checkpoint file.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
}

/// The prepared claims, by claim UID: those of this process and those read back from the
/// checkpoint ([`crate::checkpoint`]). The simulated backend takes them as the load on each GPU;
/// the sweep keeps exactly their CDI specs.
#[derive(Debug, Clone, Default)]
pub struct Prepared(Arc<RwLock<PreparedClaims>>);

impl Prepared {
    /// What the GPU backends are told: each prepared claim as a "pod" on its GPUs with its
    /// booked memory.
    pub fn sample_context(&self) -> SampleContext {
        let mut ctx = SampleContext::default();
        for (uid, devs) in self.0.read().iter() {
            for d in devs {
                ctx.pods_by_gpu
                    .entry(d.gpu.uuid.clone())
                    .or_default()
                    .push(PodOnGpu {
                        uid: uid.clone(),
                        reserved_mib: d.reserved_mib,
                    });
            }
        }
        ctx
    }

    /// The UIDs of the prepared claims.
    pub fn claim_uids(&self) -> Vec<String> {
        self.0.read().keys().cloned().collect()
    }

    /// What the prepared claims book on each GPU (UUID → MiB), leaving out claim `except`. Claims
    /// adopted without a checkpoint count nothing: their devices are unknown.
    pub fn reserved_mib_by_gpu(&self, except: Option<&str>) -> BTreeMap<String, u64> {
        let mut out = BTreeMap::new();
        for (uid, devs) in self.0.read().iter() {
            if Some(uid.as_str()) == except {
                continue;
            }
            for d in devs {
                let booked: &mut u64 = out.entry(d.gpu.uuid.clone()).or_default();
                *booked = booked.saturating_add(d.reserved_mib);
            }
        }
        out
    }

    /// Replace the record (at start, with what the checkpoint holds).
    pub fn restore(&self, claims: PreparedClaims) {
        *self.0.write() = claims;
    }
}

/// Run file work (writes with fsync can take long on a busy disk) on tokio's blocking pool, so
/// the runtime's threads keep serving the sockets and sampling meanwhile.
async fn blocking<T: Send + 'static>(
    work: impl FnOnce() -> std::io::Result<T> + Send + 'static,
) -> std::io::Result<T> {
    tokio::task::spawn_blocking(work)
        .await
        .map_err(std::io::Error::other)?
}

/// The DRA node service.
#[derive(Debug)]
pub struct DraNodeService {
    node: String,
    claims: Arc<dyn ClaimSource>,
    inventory: Inventory,
    published: Published,
    cdi_dir: PathBuf,
    checkpoint: PathBuf,
    mps: Option<MpsConfig>,
    nvidia_cdi: bool,
    memory_hook: Option<CdiHook>,
    prepared: Prepared,
    metrics: Arc<Metrics>,
    serial: tokio::sync::Mutex<()>,
}

/// What [`DraNodeService`] works with.
#[derive(Debug, Clone)]
pub struct NodeServiceParts {
    /// This node (also the pool name).
    pub node: String,
    /// Where claims are read.
    pub claims: Arc<dyn ClaimSource>,
    /// This node's GPUs.
    pub inventory: Inventory,
    /// The GPU UUIDs the node's ResourceSlice carries, by device name.
    pub published: Published,
    /// Where CDI specs are written.
    pub cdi_dir: PathBuf,
    /// The checkpoint file of prepared claims ([`crate::checkpoint::checkpoint_path`]).
    pub checkpoint: PathBuf,
    /// MPS settings for the specs.
    pub mps: Option<MpsConfig>,
    /// Also answer `nvidia.com/gpu=<UUID>` per device.
    pub nvidia_cdi: bool,
    /// NVIDIA's memory-limit hook for every spec, when the node runs it.
    pub memory_hook: Option<CdiHook>,
    /// Record of prepared claims.
    pub prepared: Prepared,
    /// Where prepare and unprepare outcomes are counted.
    pub metrics: Arc<Metrics>,
}

impl DraNodeService {
    /// The service.
    pub fn new(parts: NodeServiceParts) -> Self {
        Self {
            node: parts.node,
            claims: parts.claims,
            inventory: parts.inventory,
            published: parts.published,
            cdi_dir: parts.cdi_dir,
            checkpoint: parts.checkpoint,
            mps: parts.mps,
            nvidia_cdi: parts.nvidia_cdi,
            memory_hook: parts.memory_hook,
            prepared: parts.prepared,
            metrics: parts.metrics,
            serial: tokio::sync::Mutex::new(()),
        }
    }

    async fn prepare(&self, claim: &Claim) -> Result<Vec<Device>, ClaimFailure> {
        if claim.uid.is_empty() {
            return Err(ClaimFailure::NoUid {
                namespace: claim.namespace.clone(),
                name: claim.name.clone(),
            });
        }
        let stored = self
            .claims
            .get(&claim.namespace, &claim.name)
            .await
            .map_err(PrepareError::from)?;
        let devices = allocated_devices(
            &stored,
            &claim.uid,
            &self.node,
            &self.inventory,
            &self.published,
        )?;
        let others = self.prepared.reserved_mib_by_gpu(Some(&claim.uid));
        let spec = cdi::claim_spec(
            &claim.uid,
            &devices,
            self.mps.as_ref(),
            &others,
            self.memory_hook.as_ref(),
        );
        let (dir, uid) = (self.cdi_dir.clone(), claim.uid.clone());
        blocking(move || cdi::write_spec(&dir, &uid, &spec))
            .await
            .map_err(|source| ClaimFailure::Cdi {
                path: cdi::spec_path(&self.cdi_dir, &claim.uid),
                source,
            })?;
        let answer = devices
            .iter()
            .map(|d| {
                let mut ids = vec![cdi::qualified_name(&claim.uid, d)];
                if self.nvidia_cdi {
                    ids.push(format!("{NVIDIA_CDI_KIND}={}", d.gpu.uuid));
                }
                Device {
                    // The kubelet matches these against the claim's top-level requests only.
                    request_names: vec![d.parent_request().to_string()],
                    pool_name: d.pool.clone(),
                    device_name: d.device.clone(),
                    cdi_device_ids: ids,
                    share_id: d.share_id.clone(),
                }
            })
            .collect();
        info!(
            claim = %format!("{}/{}", claim.namespace, claim.name),
            uid = %claim.uid,
            devices = ?devices.iter().map(|d| (d.device.as_str(), d.reserved_mib)).collect::<Vec<_>>(),
            "prepared"
        );
        self.record(|claims| {
            claims.insert(claim.uid.clone(), devices);
        })
        .await?;
        Ok(answer)
    }

    /// Change the record of prepared claims and write the checkpoint. Runs under `serial`.
    async fn record(&self, change: impl FnOnce(&mut PreparedClaims)) -> Result<(), ClaimFailure> {
        let claims = {
            let mut claims = self.prepared.0.write();
            change(&mut claims);
            claims.clone()
        };
        let path = self.checkpoint.clone();
        blocking(move || checkpoint::save(&path, &claims))
            .await
            .map_err(|source| ClaimFailure::Checkpoint {
                path: self.checkpoint.clone(),
                source,
            })
    }

    /// Remove carma's CDI specs whose claim is not prepared ([`checkpoint::remove_orphans`]);
    /// returns the removed files. Waits for a prepare or unprepare in progress, so a spec written
    /// but not yet recorded is never taken for an orphan.
    #[instrument(name = "sweep_orphaned_cdi_specs", skip_all)]
    pub async fn sweep_orphaned_specs(&self) -> std::io::Result<Vec<PathBuf>> {
        let _serial = self.serial.lock().await;
        let keep: BTreeSet<String> = self.prepared.0.read().keys().cloned().collect();
        let dir = self.cdi_dir.clone();
        let removed = blocking(move || checkpoint::remove_orphans(&dir, &keep)).await?;
        for path in &removed {
            info!(spec = %path.display(), "removed an orphaned CDI spec (its claim is not prepared)");
        }
        Ok(removed)
    }

    async fn unprepare(&self, claim: &Claim) -> Result<(), ClaimFailure> {
        if claim.uid.is_empty() {
            return Err(ClaimFailure::NoUid {
                namespace: claim.namespace.clone(),
                name: claim.name.clone(),
            });
        }
        let (dir, uid) = (self.cdi_dir.clone(), claim.uid.clone());
        let removed = blocking(move || cdi::remove_spec(&dir, &uid))
            .await
            .map_err(|source| ClaimFailure::Cdi {
                path: cdi::spec_path(&self.cdi_dir, &claim.uid),
                source,
            })?;
        self.record(|claims| {
            claims.remove(&claim.uid);
        })
        .await?;
        info!(
            claim = %format!("{}/{}", claim.namespace, claim.name),
            uid = %claim.uid,
            spec_removed = removed,
            "unprepared"
        );
        Ok(())
    }
}

#[tonic::async_trait]
impl DraPlugin for DraNodeService {
    #[instrument(name = "NodePrepareResources", skip_all, fields(claims = request.get_ref().claims.len()))]
    async fn node_prepare_resources(
        &self,
        request: Request<NodePrepareResourcesRequest>,
    ) -> Result<Response<NodePrepareResourcesResponse>, Status> {
        let _serial = self.serial.lock().await;
        let mut claims = HashMap::new();
        for claim in request.into_inner().claims {
            let began = Instant::now();
            let prepared = self.prepare(&claim).await;
            self.metrics.prepared(
                &prepared.as_ref().map(|_| ()).map_err(|_| ()),
                began.elapsed(),
            );
            let answer = match prepared {
                Ok(devices) => NodePrepareResourceResponse {
                    devices,
                    error: String::new(),
                },
                Err(e) => {
                    warn!(claim = %format!("{}/{}", claim.namespace, claim.name), uid = %claim.uid, "cannot prepare: {e}");
                    NodePrepareResourceResponse {
                        devices: Vec::new(),
                        error: e.to_string(),
                    }
                }
            };
            claims.insert(claim.uid, answer);
        }
        Ok(Response::new(NodePrepareResourcesResponse { claims }))
    }

    #[instrument(name = "NodeUnprepareResources", skip_all, fields(claims = request.get_ref().claims.len()))]
    async fn node_unprepare_resources(
        &self,
        request: Request<NodeUnprepareResourcesRequest>,
    ) -> Result<Response<NodeUnprepareResourcesResponse>, Status> {
        let _serial = self.serial.lock().await;
        let mut claims = HashMap::new();
        for claim in request.into_inner().claims {
            let began = Instant::now();
            let unprepared = self.unprepare(&claim).await;
            self.metrics.unprepared(
                &unprepared.as_ref().map(|_| ()).map_err(|_| ()),
                began.elapsed(),
            );
            let error = match unprepared {
                Ok(()) => String::new(),
                Err(e) => {
                    warn!(uid = %claim.uid, "cannot unprepare: {e}");
                    e.to_string()
                }
            };
            claims.insert(claim.uid, NodeUnprepareResourceResponse { error });
        }
        Ok(Response::new(NodeUnprepareResourcesResponse { claims }))
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;
    use std::io::Read;
    use std::path::Path;
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::time::Duration;

    use k8s_openapi::api::resource::v1::{
        AllocationResult, DeviceAllocationResult, DeviceRequestAllocationResult, ResourceClaim,
        ResourceClaimStatus,
    };
    use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

    use super::*;
    use crate::DRIVER_NAME;
    use crate::claims::{GpuInfo, StaticClaims};

    const NODE: &str = "n1";

    fn uuid(index: u32) -> String {
        format!("GPU-{index}")
    }

    /// Claim `name` (UID `uid-<name>`) with one result per `(device, request, memory)`.
    fn claim(name: &str, results: &[(&str, &str, &str)]) -> ResourceClaim {
        let results = results
            .iter()
            .map(|(device, request, mem)| DeviceRequestAllocationResult {
                driver: DRIVER_NAME.to_string(),
                pool: NODE.to_string(),
                device: device.to_string(),
                request: request.to_string(),
                consumed_capacity: Some(BTreeMap::from([(
                    "memory".to_string(),
                    Quantity(mem.to_string()),
                )])),
                ..Default::default()
            })
            .collect();
        ResourceClaim {
            metadata: ObjectMeta {
                namespace: Some("ml".into()),
                name: Some(name.into()),
                uid: Some(format!("uid-{name}")),
                ..Default::default()
            },
            spec: Default::default(),
            status: Some(ResourceClaimStatus {
                allocation: Some(AllocationResult {
                    devices: Some(DeviceAllocationResult {
                        results: Some(results),
                        config: None,
                    }),
                    ..Default::default()
                }),
                ..Default::default()
            }),
        }
    }

    fn kubelet_claim(name: &str) -> Claim {
        Claim {
            namespace: "ml".into(),
            name: name.into(),
            uid: format!("uid-{name}"),
        }
    }

    fn gpus() -> Vec<GpuInfo> {
        (0..2)
            .map(|index| GpuInfo {
                index,
                uuid: uuid(index),
                memory_mib: 40960,
            })
            .collect()
    }

    /// A service on two 40 GiB GPUs `GPU-0` and `GPU-1`, published as such, writing specs into
    /// `dir/cdi`.
    fn service(dir: &Path, claims: &StaticClaims) -> DraNodeService {
        let inventory = Inventory::default();
        inventory.set(gpus());
        let published = Published::default();
        published.set_from_gpus(&gpus());
        DraNodeService::new(NodeServiceParts {
            node: NODE.to_string(),
            claims: Arc::new(claims.clone()),
            inventory,
            published,
            cdi_dir: dir.join("cdi"),
            checkpoint: checkpoint::checkpoint_path(&dir.join("plugin")),
            mps: None,
            nvidia_cdi: false,
            memory_hook: None,
            prepared: Prepared::default(),
            metrics: Arc::new(Metrics::new()),
        })
    }

    #[tokio::test(flavor = "current_thread")]
    async fn the_spec_is_written_with_fsync_off_the_runtime_thread() {
        let dir = tempfile::tempdir().unwrap();
        let claims = StaticClaims::default();
        claims.insert(claim("a", &[("gpu-0", "gpu", "4Gi")]));
        let svc = service(dir.path(), &claims);
        // A FIFO where the spec's temporary file goes: opening it for writing blocks until a
        // reader comes (a slow disk, exaggerated), and fsync on it fails with EINVAL.
        let cdi_dir = dir.path().join("cdi");
        std::fs::create_dir_all(&cdi_dir).unwrap();
        let tmp = cdi::temp_path(&cdi::spec_path(&cdi_dir, "uid-a"));
        let made = std::process::Command::new("mkfifo")
            .arg(&tmp)
            .status()
            .unwrap();
        assert!(made.success());
        let ticked = Arc::new(AtomicBool::new(false));
        let tick = ticked.clone();
        tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(20)).await;
            tick.store(true, Ordering::SeqCst);
        });
        let fifo = tmp.clone();
        let reader = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(1500));
            let ran_meanwhile = ticked.load(Ordering::SeqCst);
            let mut text = Vec::new();
            std::fs::File::open(&fifo)
                .unwrap()
                .read_to_end(&mut text)
                .unwrap();
            (ran_meanwhile, text)
        });
        let result = svc.prepare(&kubelet_claim("a")).await;
        let (ran_meanwhile, text) = reader.join().unwrap();
        assert!(
            ran_meanwhile,
            "the only runtime thread was blocked while the spec was written"
        );
        assert!(
            String::from_utf8_lossy(&text).contains("gpu.carma.io/claim"),
            "the spec went through the temporary file"
        );
        match result {
            Err(ClaimFailure::Cdi { path, source }) => {
                assert_eq!(path, cdi::spec_path(&cdi_dir, "uid-a"));
                assert_eq!(
                    source.raw_os_error(),
                    Some(22),
                    "fsync was called: {source}"
                );
            }
            other => panic!("expected the fsync to fail on a FIFO, got {other:?}"),
        }
        assert!(
            !tmp.exists(),
            "the temporary file is removed after a failure"
        );
        assert!(!cdi::spec_path(&cdi_dir, "uid-a").exists());
        assert!(svc.prepared.claim_uids().is_empty());
    }

    #[tokio::test]
    async fn a_gpu_that_moved_to_another_index_is_refused_naming_both_uuids() {
        let dir = tempfile::tempdir().unwrap();
        let claims = StaticClaims::default();
        claims.insert(claim("a", &[("gpu-1", "gpu", "4Gi")]));
        let svc = service(dir.path(), &claims);
        // GPU-0 fell off the bus: NVML renumbered, index 1 is now another GPU than the one the
        // slice published (and the claim was allocated) as `gpu-1`.
        let renumbered = vec![GpuInfo {
            index: 1,
            uuid: "GPU-7".into(),
            memory_mib: 40960,
        }];
        svc.inventory.set(renumbered.clone());
        let err = svc.prepare(&kubelet_claim("a")).await.unwrap_err();
        assert!(
            matches!(err, ClaimFailure::Prepare(PrepareError::UuidChanged { .. })),
            "{err:?}"
        );
        let text = err.to_string();
        assert!(text.contains("GPU-1") && text.contains("GPU-7"), "{text}");
        assert!(!cdi::spec_path(&dir.path().join("cdi"), "uid-a").exists());
        assert!(svc.prepared.claim_uids().is_empty());

        // The slice republished: index 1 is GPU-7 there too, so a claim allocated now is fine.
        svc.published.set_from_gpus(&renumbered);
        let devices = svc.prepare(&kubelet_claim("a")).await.unwrap();
        assert_eq!(devices.len(), 1);
        // A device the slice never carried cannot be checked, so it is refused too.
        svc.published.set_from_gpus(&[]);
        let err = svc.prepare(&kubelet_claim("a")).await.unwrap_err();
        assert!(
            matches!(
                err,
                ClaimFailure::Prepare(PrepareError::NotPublished { .. })
            ),
            "{err:?}"
        );
    }
}
