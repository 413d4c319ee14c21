//! Writes the node's ResourceSlice by server-side apply when its devices change.
//!
//! Every write carries a new pool `generation` (the scheduler ignores slices of older
//! generations). The first write continues from the generation stored in the API server, so a
//! restarted driver never goes back. Attempts, failed ones included, are at least `min_interval`
//! apart; a change inside the interval is written by a later offer (the driver offers every
//! sample).
//!
//! The kubelet deletes all of its node's ResourceSlices when it starts, and a driver's slices
//! some time after the driver stops being reachable. The driver therefore also re-applies an
//! unchanged slice every `resync` (30 s by default, same generation); an apply that has to create
//! the slice again is logged.
//!
//! An API server with `DRAConsumableCapacity` off silently drops `allowMultipleAllocations` and
//! `requestPolicy`. A device stored that way is whole-only and ignores memory requests, which is
//! not what carma's claims mean, so the driver then publishes the pool with no devices and stops
//! writing until it is restarted (the Go helper reports the same case as `DroppedFieldsError`).
//! Dropped taints (`DRADeviceTaints` off) leave the devices usable but the gate unenforced; that
//! is logged, once.
//!
//! Devices are never withdrawn silently: a write that leaves out devices the slice carried (the
//! GPU backend no longer reports a GPU, or the sharing fields were dropped) emits a Warning Event
//! `DevicesWithdrawn` on the Node naming why and which devices, and counts them in
//! `carma_dra_driver_devices_withdrawn_total` ([`crate::metrics`]).

use std::time::{Duration, Instant};

use std::sync::Arc;

use k8s_openapi::api::core::v1::{Node, ObjectReference};
use k8s_openapi::api::resource::v1::{Device, ResourceSlice};
use kube::api::{Api, Patch, PatchParams};
use kube::runtime::events::{Event, EventType, Recorder, Reporter};
use thiserror::Error;
use tracing::{error, info, warn};

use crate::metrics::Metrics;
use crate::slice::{dropped_fields, resource_slice, slice_name};

/// Reason of the Event emitted on the Node when devices leave the slice.
pub const REASON_DEVICES_WITHDRAWN: &str = "DevicesWithdrawn";

/// Why devices left the slice (label `reason` of `carma_dra_driver_devices_withdrawn_total`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Withdrawal {
    /// The GPU backend no longer reports the GPUs (gone, or no GPU sampled at all).
    GpusGone,
    /// The API server dropped the sharing fields: the whole pool is emptied.
    SharingDropped,
}

impl Withdrawal {
    /// The metric label.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::GpusGone => "gpus_gone",
            Self::SharingDropped => "sharing_dropped",
        }
    }

    fn why(self) -> &'static str {
        match self {
            Self::GpusGone => "the GPU backend no longer reports them",
            Self::SharingDropped => {
                "the API server dropped allowMultipleAllocations/requestPolicy (feature gate DRAConsumableCapacity off); the driver publishes no devices until it restarts"
            }
        }
    }
}

/// How often an unchanged slice is applied again.
pub const DEFAULT_RESYNC: Duration = Duration::from_secs(30);

/// Field manager of the driver's applies.
pub const FIELD_MANAGER: &str = "carma-dra-driver";

/// A slice write failed.
#[derive(Debug, Error)]
pub enum PublishError {
    /// The Node (the slice's owner) cannot be read.
    #[error("reading Node {node}: {source}")]
    Node {
        /// Node name.
        node: String,
        /// Why.
        source: kube::Error,
    },
    /// The stored slice cannot be read.
    #[error("reading ResourceSlice {name}: {source}")]
    Read {
        /// Slice name.
        name: String,
        /// Why.
        source: kube::Error,
    },
    /// The apply failed.
    #[error("applying ResourceSlice {name}: {source}")]
    Apply {
        /// Slice name.
        name: String,
        /// Why.
        source: kube::Error,
    },
    /// The API server dropped the sharing fields.
    #[error(
        "the API server dropped allowMultipleAllocations/requestPolicy from ResourceSlice {name} (feature gate DRAConsumableCapacity is off; it is on by default from Kubernetes 1.36): its devices are withdrawn until the driver restarts"
    )]
    SharingDropped {
        /// Slice name.
        name: String,
    },
}

/// Publishes one node's slice.
pub struct SlicePublisher {
    slices: Api<ResourceSlice>,
    nodes: Api<Node>,
    node: String,
    node_uid: Option<String>,
    generation: Option<i64>,
    last: Option<Vec<Device>>,
    last_attempt: Option<Instant>,
    min_interval: Duration,
    resync: Duration,
    slice_uid: Option<String>,
    withdrawn: bool,
    taints_warned: bool,
    /// Names of the devices the stored slice carries (the last accepted write, or the slice an
    /// earlier run left), to tell which devices a write withdraws.
    carried: Option<Vec<String>>,
    recorder: Recorder,
    metrics: Option<Arc<Metrics>>,
}

impl std::fmt::Debug for SlicePublisher {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SlicePublisher")
            .field("node", &self.node)
            .field("generation", &self.generation)
            .field("withdrawn", &self.withdrawn)
            .finish()
    }
}

impl SlicePublisher {
    /// A publisher for `node`'s slice (needs `get` on nodes and `get`, `create`, `patch` on
    /// resourceslices).
    pub fn new(client: kube::Client, node: impl Into<String>, min_interval: Duration) -> Self {
        let node = node.into();
        let recorder = Recorder::new(
            client.clone(),
            Reporter {
                controller: FIELD_MANAGER.to_string(),
                instance: Some(format!("{FIELD_MANAGER}@{node}")),
            },
        );
        Self {
            slices: Api::all(client.clone()),
            nodes: Api::all(client),
            node,
            node_uid: None,
            generation: None,
            last: None,
            last_attempt: None,
            min_interval,
            resync: DEFAULT_RESYNC,
            slice_uid: None,
            withdrawn: false,
            taints_warned: false,
            carried: None,
            recorder,
            metrics: None,
        }
    }

    /// Record the slice's devices and count withdrawn ones in `metrics`.
    pub fn with_metrics(mut self, metrics: Arc<Metrics>) -> Self {
        self.metrics = Some(metrics);
        self
    }

    /// Re-apply an unchanged slice this often (default [`DEFAULT_RESYNC`]).
    pub fn with_resync(mut self, resync: Duration) -> Self {
        self.resync = resync;
        self
    }

    /// The devices of the last write the API server accepted; `None` before the first.
    pub fn published(&self) -> Option<&[Device]> {
        self.last.as_deref()
    }

    /// The devices of this node's slice as stored now (written by an earlier run of the driver),
    /// `None` when there is no slice.
    pub async fn stored_devices(&self) -> Result<Option<Vec<Device>>, PublishError> {
        let name = slice_name(&self.node);
        let stored = self
            .slices
            .get_opt(&name)
            .await
            .map_err(|source| PublishError::Read { name, source })?;
        Ok(stored.map(|s| s.spec.devices.unwrap_or_default()))
    }

    /// Write `devices` if they differ from the last write and the interval allows, or re-apply
    /// them unchanged once `resync` has passed; returns the new generation written, `None` when
    /// none was. Once the devices are withdrawn every offer fails with
    /// [`PublishError::SharingDropped`] without writing.
    pub async fn offer(&mut self, devices: &[Device]) -> Result<Option<i64>, PublishError> {
        if self.withdrawn {
            return Err(PublishError::SharingDropped {
                name: slice_name(&self.node),
            });
        }
        let since = self.last_attempt.map(|at| at.elapsed());
        let unchanged = self.last.as_deref() == Some(devices);
        if unchanged && since.is_some_and(|s| s < self.resync) {
            return Ok(None);
        }
        if since.is_some_and(|s| s < self.min_interval) {
            return Ok(None);
        }
        // Failed attempts count too, so an unreachable API server is not asked every sample.
        self.last_attempt = Some(Instant::now());
        let name = slice_name(&self.node);
        let generation = match (unchanged, self.generation) {
            (true, Some(g)) => g,
            _ => self.next_generation(&name).await?,
        };
        let stored = self.apply(&name, generation, devices.to_vec()).await?;
        let uid = stored.metadata.uid.clone();
        if unchanged && uid != self.slice_uid {
            warn!(slice = %name, generation, "ResourceSlice was gone (deleted by the kubelet?): created it again");
        }
        self.slice_uid = uid;
        if unchanged {
            return Ok(None);
        }
        let dropped = dropped_fields(devices, stored.spec.devices.as_deref().unwrap_or_default());
        if dropped.sharing {
            self.withdrawn = true;
            let generation = generation + 1;
            self.generation = Some(generation);
            // What the pool offered: the devices just stored (whole-only), or before them the
            // slice's earlier devices.
            self.carried = Some(names(devices));
            self.apply(&name, generation, Vec::new()).await?;
            self.withdraw_gone(&[], Withdrawal::SharingDropped).await;
            let e = PublishError::SharingDropped { name };
            error!("{e}");
            return Err(e);
        }
        if dropped.taints && !self.taints_warned {
            self.taints_warned = true;
            warn!(
                slice = %name,
                "the API server dropped the device taints (feature gate DRADeviceTaints is off; on by default from Kubernetes 1.36): the utilization gate is not enforced by the scheduler"
            );
        }
        self.last = Some(devices.to_vec());
        info!(slice = %name, generation, devices = devices.len(), "ResourceSlice written");
        self.withdraw_gone(devices, Withdrawal::GpusGone).await;
        Ok(Some(generation))
    }

    /// After a write of `now`: the devices the slice carried before and no longer does are
    /// reported (log, Event on the Node, metric); `now` becomes what the slice carries.
    async fn withdraw_gone(&mut self, now: &[Device], why: Withdrawal) {
        if let Some(m) = &self.metrics {
            m.set_slice(now);
        }
        let now = names(now);
        let before = self.carried.replace(now.clone()).unwrap_or_default();
        let gone: Vec<&str> = before
            .iter()
            .filter(|d| !now.contains(d))
            .map(String::as_str)
            .collect();
        if gone.is_empty() {
            return;
        }
        let note = format!(
            "{} of {} devices withdrawn from ResourceSlice {} ({}): {}",
            gone.len(),
            before.len(),
            slice_name(&self.node),
            gone.join(", "),
            why.why()
        );
        warn!(node = %self.node, reason = why.as_str(), "{note}");
        if let Some(m) = &self.metrics {
            m.devices_withdrawn(why.as_str(), gone.len() as u64);
        }
        let reference = ObjectReference {
            api_version: Some("v1".to_string()),
            kind: Some("Node".to_string()),
            name: Some(self.node.clone()),
            uid: self.node_uid.clone(),
            ..ObjectReference::default()
        };
        let event = Event {
            type_: EventType::Warning,
            reason: REASON_DEVICES_WITHDRAWN.to_string(),
            note: Some(clip_note(note)),
            action: "PublishResourceSlice".to_string(),
            secondary: None,
        };
        if let Err(e) = self.recorder.publish(&event, &reference).await {
            warn!(node = %self.node, "publishing the DevicesWithdrawn Event failed: {e}");
        }
    }

    async fn next_generation(&mut self, name: &str) -> Result<i64, PublishError> {
        let next = match self.generation {
            Some(g) => g + 1,
            None => {
                let stored =
                    self.slices
                        .get_opt(name)
                        .await
                        .map_err(|source| PublishError::Read {
                            name: name.to_string(),
                            source,
                        })?;
                if self.carried.is_none() {
                    self.carried = Some(
                        stored
                            .as_ref()
                            .map(|s| names(s.spec.devices.as_deref().unwrap_or_default()))
                            .unwrap_or_default(),
                    );
                }
                stored.map_or(0, |s| s.spec.pool.generation) + 1
            }
        };
        self.generation = Some(next);
        Ok(next)
    }

    async fn apply(
        &mut self,
        name: &str,
        generation: i64,
        devices: Vec<Device>,
    ) -> Result<ResourceSlice, PublishError> {
        if self.node_uid.is_none() {
            let node = self
                .nodes
                .get(&self.node)
                .await
                .map_err(|source| PublishError::Node {
                    node: self.node.clone(),
                    source,
                })?;
            self.node_uid = node.metadata.uid;
        }
        let mut slice = resource_slice(&self.node, self.node_uid.as_deref(), generation, devices);
        // Server-side apply needs the type in the body.
        slice.metadata.name = Some(name.to_string());
        let body = serde_json::json!({
            "apiVersion": "resource.k8s.io/v1",
            "kind": "ResourceSlice",
            "metadata": slice.metadata,
            "spec": slice.spec,
        });
        self.slices
            .patch(
                name,
                &PatchParams::apply(FIELD_MANAGER).force(),
                &Patch::Apply(&body),
            )
            .await
            .map_err(|source| PublishError::Apply {
                name: name.to_string(),
                source,
            })
    }
}

fn names(devices: &[Device]) -> Vec<String> {
    devices.iter().map(|d| d.name.clone()).collect()
}

/// The API server refuses an Event note over 1 KiB.
fn clip_note(note: String) -> String {
    const LIMIT: usize = 1024;
    carma_core::text::truncate_with_marker(&note, LIMIT, "...").into_owned()
}
