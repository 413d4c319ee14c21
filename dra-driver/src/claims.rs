//! From a claim the kubelet names to the GPUs it holds on this node.
//!
//! The kubelet passes only namespace, name and UID. The allocation is read from the
//! ResourceClaim itself (`status.allocation.devices.results`), as the Go helper does: only results
//! of this driver count, each must be in this node's pool and name one of this node's GPUs, and
//! the claim must still be the one the kubelet means (same UID; a claim deleted and re-created
//! under the same name is another claim).

use std::collections::BTreeMap;
use std::sync::Arc;

use futures::future::BoxFuture;
use k8s_openapi::api::resource::v1::ResourceClaim;
use parking_lot::RwLock;
use serde::{Deserialize, Serialize};
use thiserror::Error;

use crate::DRIVER_NAME;
use crate::slice::{ATTRIBUTE_UUID, CAPACITY_MEMORY, device_index, device_name};

/// A claim could not be read from the API server.
#[derive(Debug, Clone, Error)]
pub enum ClaimError {
    /// No such claim.
    #[error("ResourceClaim {namespace}/{name} not found")]
    NotFound {
        /// Namespace.
        namespace: String,
        /// Name.
        name: String,
    },
    /// The API call failed.
    #[error("reading ResourceClaim {namespace}/{name}: {message}")]
    Api {
        /// Namespace.
        namespace: String,
        /// Name.
        name: String,
        /// Why.
        message: String,
    },
}

/// Where claims are read from: the API server, or a map in tests.
pub trait ClaimSource: Send + Sync + std::fmt::Debug {
    /// The claim `namespace/name` as stored now.
    fn get<'a>(
        &'a self,
        namespace: &'a str,
        name: &'a str,
    ) -> BoxFuture<'a, Result<ResourceClaim, ClaimError>>;
}

/// Claims from the API server (needs `get` on `resourceclaims`).
#[derive(Clone)]
pub struct KubeClaims {
    client: kube::Client,
}

impl std::fmt::Debug for KubeClaims {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("KubeClaims")
    }
}

impl KubeClaims {
    /// Read claims with `client`.
    pub fn new(client: kube::Client) -> Self {
        Self { client }
    }
}

impl ClaimSource for KubeClaims {
    fn get<'a>(
        &'a self,
        namespace: &'a str,
        name: &'a str,
    ) -> BoxFuture<'a, Result<ResourceClaim, ClaimError>> {
        Box::pin(async move {
            let api: kube::Api<ResourceClaim> =
                kube::Api::namespaced(self.client.clone(), namespace);
            match api.get_opt(name).await {
                Ok(Some(c)) => Ok(c),
                Ok(None) => Err(ClaimError::NotFound {
                    namespace: namespace.to_string(),
                    name: name.to_string(),
                }),
                Err(e) => Err(ClaimError::Api {
                    namespace: namespace.to_string(),
                    name: name.to_string(),
                    message: e.to_string(),
                }),
            }
        })
    }
}

/// Claims kept in memory, keyed by `namespace/name` (tests, demos).
#[derive(Debug, Clone, Default)]
pub struct StaticClaims {
    claims: Arc<RwLock<BTreeMap<String, ResourceClaim>>>,
}

impl StaticClaims {
    /// Store `claim` under its namespace and name.
    pub fn insert(&self, claim: ResourceClaim) {
        let key = format!(
            "{}/{}",
            claim.metadata.namespace.as_deref().unwrap_or_default(),
            claim.metadata.name.as_deref().unwrap_or_default()
        );
        self.claims.write().insert(key, claim);
    }
}

impl ClaimSource for StaticClaims {
    fn get<'a>(
        &'a self,
        namespace: &'a str,
        name: &'a str,
    ) -> BoxFuture<'a, Result<ResourceClaim, ClaimError>> {
        let found = self
            .claims
            .read()
            .get(&format!("{namespace}/{name}"))
            .cloned();
        Box::pin(async move {
            found.ok_or_else(|| ClaimError::NotFound {
                namespace: namespace.to_string(),
                name: name.to_string(),
            })
        })
    }
}

/// One of this node's GPUs, as far as preparing a claim needs it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct GpuInfo {
    /// Index on the node (device `gpu-<index>`).
    pub index: u32,
    /// NVIDIA UUID.
    pub uuid: String,
    /// Total memory, MiB.
    pub memory_mib: u64,
}

/// The GPUs of this node, kept current by the telemetry loop.
#[derive(Debug, Clone, Default)]
pub struct Inventory(Arc<RwLock<Vec<GpuInfo>>>);

impl Inventory {
    /// Replace the GPU list.
    pub fn set(&self, gpus: Vec<GpuInfo>) {
        *self.0.write() = gpus;
    }

    /// Every GPU.
    pub fn all(&self) -> Vec<GpuInfo> {
        self.0.read().clone()
    }

    /// The GPU with `index`.
    pub fn by_index(&self, index: u32) -> Option<GpuInfo> {
        self.0.read().iter().find(|g| g.index == index).cloned()
    }
}

/// The GPU UUID each device name (`gpu-<index>`) carries in the node's ResourceSlice as last
/// published: what an allocation of that name was made against. Devices are named by NVML index,
/// and indices move (a GPU falls off the bus, the driver is reloaded), so a prepare checks the
/// GPU now at the index against this before exposing it.
#[derive(Debug, Clone, Default)]
pub struct Published(Arc<RwLock<BTreeMap<String, String>>>);

impl Published {
    /// Record the `uuid` attributes of `devices`, the slice's devices as written.
    pub fn set_from_devices(&self, devices: &[k8s_openapi::api::resource::v1::Device]) {
        *self.0.write() = devices
            .iter()
            .filter_map(|d| {
                let uuid = d.attributes.as_ref()?.get(ATTRIBUTE_UUID)?.string.clone()?;
                Some((d.name.clone(), uuid))
            })
            .collect();
    }

    /// Record the GPUs as the slice names them (for a driver that writes no slice, as in tests).
    pub fn set_from_gpus(&self, gpus: &[GpuInfo]) {
        *self.0.write() = gpus
            .iter()
            .map(|g| (device_name(g.index), g.uuid.clone()))
            .collect();
    }

    /// The UUID published for `device`.
    pub fn uuid(&self, device: &str) -> Option<String> {
        self.0.read().get(device).cloned()
    }
}

/// One allocated device of a claim on this node (also the checkpoint's record of it).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PreparedDevice {
    /// The claim's request (for a `firstAvailable` request, `<request>/<subrequest>`).
    pub request: String,
    /// Pool (this node's name).
    pub pool: String,
    /// Device name (`gpu-<index>`).
    pub device: String,
    /// The GPU.
    pub gpu: GpuInfo,
    /// Booked memory, MiB: the allocation's `consumedCapacity.memory`; without it (a cluster where
    /// consumable capacity is off) the whole GPU.
    pub reserved_mib: u64,
    /// `shareID` of the allocation, when the device is shared.
    pub share_id: Option<String>,
}

impl PreparedDevice {
    /// The claim's top-level request this device was allocated for: [`Self::request`] without
    /// its `/<subrequest>` part. This is the name the kubelet knows: it matches the request names
    /// of a prepare answer exactly against the claim's `spec.devices.requests[].name` (what a
    /// container's `resources.claims[].request` names), never against subrequests, as the Go
    /// helper's `BaseRequestRef` does.
    pub fn parent_request(&self) -> &str {
        parent_request(&self.request)
    }

    /// Whether the claim books the whole GPU (nobody else can share it).
    pub fn whole(&self) -> bool {
        self.reserved_mib >= self.gpu.memory_mib
    }
}

/// `request` without a `/<subrequest>` suffix (`train/big` → `train`; `train` stays).
pub fn parent_request(request: &str) -> &str {
    request
        .split_once('/')
        .map_or(request, |(parent, _)| parent)
}

/// Why a claim cannot be prepared on this node.
#[derive(Debug, Clone, Error)]
pub enum PrepareError {
    /// The claim could not be read.
    #[error(transparent)]
    Claim(#[from] ClaimError),
    /// The stored claim has another UID than the one the kubelet asked for.
    #[error("ResourceClaim {namespace}/{name} has UID {found}, the kubelet asked for {expected}")]
    UidMismatch {
        /// Namespace.
        namespace: String,
        /// Name.
        name: String,
        /// The kubelet's UID.
        expected: String,
        /// The stored UID.
        found: String,
    },
    /// The claim is not allocated.
    #[error("ResourceClaim {namespace}/{name} is not allocated")]
    NotAllocated {
        /// Namespace.
        namespace: String,
        /// Name.
        name: String,
    },
    /// A result of this driver names another node's pool.
    #[error(
        "device {device} of request {request} is in pool {pool}, not in this node's pool {node}"
    )]
    WrongPool {
        /// Request.
        request: String,
        /// Device.
        device: String,
        /// Its pool.
        pool: String,
        /// This node.
        node: String,
    },
    /// A result names a device this node does not have.
    #[error("device {device} of request {request} is not a GPU of this node")]
    UnknownDevice {
        /// Request.
        request: String,
        /// Device.
        device: String,
    },
    /// The GPU at the device's index is not the one the slice published under its name.
    #[error(
        "device {device} of request {request} was published as GPU {published}, but index {index} is now GPU {found}: the node's GPUs were renumbered since the claim was allocated; refusing to expose another GPU than the one allocated (delete the claim's pod so that it is allocated again)"
    )]
    UuidChanged {
        /// Request.
        request: String,
        /// Device.
        device: String,
        /// Its index.
        index: u32,
        /// The UUID in the slice.
        published: String,
        /// The UUID at the index now.
        found: String,
    },
    /// The slice never carried the device, so the GPU an allocation of it means is unknown.
    #[error(
        "device {device} of request {request} is not in the ResourceSlice this driver published (yet): its GPU cannot be checked"
    )]
    NotPublished {
        /// Request.
        request: String,
        /// Device.
        device: String,
    },
    /// `consumedCapacity.memory` is not a quantity.
    #[error("device {device}: consumedCapacity.memory {value:?} is not a memory quantity")]
    BadCapacity {
        /// Device.
        device: String,
        /// The value.
        value: String,
    },
}

/// This driver's devices in `claim`'s allocation, checked against the kubelet's `uid`, this node
/// (`node`, also the pool name) and its GPUs: each device's index must still hold the GPU whose
/// UUID the slice `published` under the device's name.
pub fn allocated_devices(
    claim: &ResourceClaim,
    uid: &str,
    node: &str,
    inventory: &Inventory,
    published: &Published,
) -> Result<Vec<PreparedDevice>, PrepareError> {
    let namespace = claim.metadata.namespace.clone().unwrap_or_default();
    let name = claim.metadata.name.clone().unwrap_or_default();
    let found = claim.metadata.uid.as_deref().unwrap_or_default();
    if found != uid {
        return Err(PrepareError::UidMismatch {
            namespace,
            name,
            expected: uid.to_string(),
            found: found.to_string(),
        });
    }
    let Some(results) = claim
        .status
        .as_ref()
        .and_then(|s| s.allocation.as_ref())
        .and_then(|a| a.devices.as_ref())
        .and_then(|d| d.results.as_ref())
    else {
        return Err(PrepareError::NotAllocated { namespace, name });
    };
    results
        .iter()
        .filter(|r| r.driver == DRIVER_NAME)
        .map(|r| {
            if r.pool != node {
                return Err(PrepareError::WrongPool {
                    request: r.request.clone(),
                    device: r.device.clone(),
                    pool: r.pool.clone(),
                    node: node.to_string(),
                });
            }
            let gpu = device_index(&r.device)
                .and_then(|i| inventory.by_index(i))
                .ok_or_else(|| PrepareError::UnknownDevice {
                    request: r.request.clone(),
                    device: r.device.clone(),
                })?;
            match published.uuid(&r.device) {
                Some(p) if p == gpu.uuid => {}
                Some(p) => {
                    return Err(PrepareError::UuidChanged {
                        request: r.request.clone(),
                        device: r.device.clone(),
                        index: gpu.index,
                        published: p,
                        found: gpu.uuid,
                    });
                }
                None => {
                    return Err(PrepareError::NotPublished {
                        request: r.request.clone(),
                        device: r.device.clone(),
                    });
                }
            }
            let reserved_mib = match r
                .consumed_capacity
                .as_ref()
                .and_then(|c| c.get(CAPACITY_MEMORY))
            {
                Some(q) => carma_core::quantity::parse_mib(&q.0).map_err(|_| {
                    PrepareError::BadCapacity {
                        device: r.device.clone(),
                        value: q.0.clone(),
                    }
                })?,
                None => gpu.memory_mib,
            };
            Ok(PreparedDevice {
                request: r.request.clone(),
                pool: r.pool.clone(),
                device: r.device.clone(),
                reserved_mib,
                share_id: r.share_id.clone(),
                gpu,
            })
        })
        .collect()
}
