//! The DRA v1 `DRAPlugin` service the kubelet calls on the DRA socket before a pod's containers
//! start (`NodePrepareResources`) and after they are gone (`NodeUnprepareResources`).
//!
//! Preparing a claim reads it from the API server, checks it ([`crate::claims`]), writes its CDI
//! spec ([`crate::cdi`]) and answers each device's CDI name. Both calls are idempotent, as the
//! kubelet requires (it retries and repeats calls after restarts): preparing again rewrites the
//! same spec, unpreparing a claim without a spec succeeds. The spec file is also the record of a
//! prepared claim, so unprepare needs nothing but the UID and works after a driver restart or when
//! the claim is already deleted. Calls run one at a time, as the Go helper does by default.

use std::collections::{BTreeMap, HashMap};
use std::path::PathBuf;
use std::sync::Arc;

use carma_device_plugin::backends::{PodOnGpu, SampleContext};
use carma_device_plugin::config::MpsConfig;
use parking_lot::RwLock;
use thiserror::Error;
use tonic::{Request, Response, Status};
use tracing::{info, instrument, warn};

use crate::cdi::{self, NVIDIA_CDI_KIND};
use crate::claims::{ClaimSource, Inventory, PrepareError, PreparedDevice, allocated_devices};
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
}

/// The claims prepared by this process, by claim UID. The simulated backend takes them as the
/// load on each GPU; the kubelet's view of what is prepared is the CDI directory.
#[derive(Debug, Clone, Default)]
pub struct Prepared(Arc<RwLock<BTreeMap<String, Vec<PreparedDevice>>>>);

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
}

/// The DRA node service.
#[derive(Debug)]
pub struct DraNodeService {
    node: String,
    claims: Arc<dyn ClaimSource>,
    inventory: Inventory,
    cdi_dir: PathBuf,
    mps: Option<MpsConfig>,
    nvidia_cdi: bool,
    prepared: Prepared,
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
    /// Where CDI specs are written.
    pub cdi_dir: PathBuf,
    /// MPS settings for the specs.
    pub mps: Option<MpsConfig>,
    /// Also answer `nvidia.com/gpu=<UUID>` per device.
    pub nvidia_cdi: bool,
    /// Record of prepared claims.
    pub prepared: Prepared,
}

impl DraNodeService {
    /// The service.
    pub fn new(parts: NodeServiceParts) -> Self {
        Self {
            node: parts.node,
            claims: parts.claims,
            inventory: parts.inventory,
            cdi_dir: parts.cdi_dir,
            mps: parts.mps,
            nvidia_cdi: parts.nvidia_cdi,
            prepared: parts.prepared,
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
        let devices = allocated_devices(&stored, &claim.uid, &self.node, &self.inventory)?;
        let spec = cdi::claim_spec(&claim.uid, &devices, self.mps.as_ref());
        cdi::write_spec(&self.cdi_dir, &claim.uid, &spec).map_err(|source| ClaimFailure::Cdi {
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
                    request_names: vec![d.request.clone()],
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
        self.prepared.0.write().insert(claim.uid.clone(), devices);
        Ok(answer)
    }

    fn unprepare(&self, claim: &Claim) -> Result<(), ClaimFailure> {
        if claim.uid.is_empty() {
            return Err(ClaimFailure::NoUid {
                namespace: claim.namespace.clone(),
                name: claim.name.clone(),
            });
        }
        let removed =
            cdi::remove_spec(&self.cdi_dir, &claim.uid).map_err(|source| ClaimFailure::Cdi {
                path: cdi::spec_path(&self.cdi_dir, &claim.uid),
                source,
            })?;
        self.prepared.0.write().remove(&claim.uid);
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
            let answer = match self.prepare(&claim).await {
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
            let error = match self.unprepare(&claim) {
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
