//! The driver's two loops: sampling the GPUs into snapshots and the inventory, and turning each
//! snapshot into the ResourceSlice's devices.

use std::sync::Arc;
use std::time::Duration;

use carma_gpu::sampling::Sampling;
use carma_gpu::telemetry::Snapshot;
use chrono::Utc;
use k8s_openapi::api::resource::v1::Device;
use tokio::sync::watch;
use tracing::{info, warn};

use crate::claims::{GpuInfo, Inventory, Published};
use crate::metrics::Metrics;
use crate::node::Prepared;
use crate::publisher::{PublishError, SlicePublisher};
use crate::server::ServerEnd;
use crate::slice::{CapacityPolicy, devices};
use crate::stopped;
use crate::taints::Tainter;

const MIB: u64 = 1024 * 1024;

/// One telemetry step: the prepared claims as load context, a sample, the windows, the inventory.
pub(crate) struct Sampler {
    pub(crate) sampling: Sampling,
    pub(crate) prepared: Prepared,
    pub(crate) inventory: Inventory,
    pub(crate) snapshots: watch::Sender<Option<Arc<Snapshot>>>,
}

impl Sampler {
    pub(crate) async fn tick(&mut self) {
        // Pods are not looked up: on the DRA path the claims, not pod annotations, say what runs
        // where.
        let ctx = self.prepared.sample_context();
        let Some(snapshot) = self.sampling.sample(&ctx, &[]).await else {
            return;
        };
        let snapshot = Arc::new(snapshot);
        self.inventory.set(
            snapshot
                .gpus
                .iter()
                .map(|g| GpuInfo {
                    index: g.sample.index,
                    uuid: g.sample.uuid.clone(),
                    memory_mib: g.sample.memory_total_bytes / MIB,
                })
                .collect(),
        );
        self.snapshots.send_replace(Some(snapshot));
    }
}

/// Turns each snapshot (and, without new ones, the passing time: telemetry turns stale) into the
/// slice's devices and offers them to the publisher.
pub(crate) struct SliceLoop {
    pub(crate) tainter: Tainter,
    pub(crate) policy: CapacityPolicy,
    pub(crate) snapshots: watch::Receiver<Option<Arc<Snapshot>>>,
    pub(crate) devices: watch::Sender<Vec<Device>>,
    pub(crate) publisher: Option<SlicePublisher>,
    /// Follows what the slice carries: the publisher's last write, or without a publisher the
    /// devices as offered.
    pub(crate) published: Published,
    pub(crate) metrics: Arc<Metrics>,
    pub(crate) interval: Duration,
}

impl SliceLoop {
    pub(crate) async fn run(mut self, mut stop: watch::Receiver<bool>) -> ServerEnd {
        let mut ticker = tokio::time::interval(self.interval);
        ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut failing = false;
        loop {
            let snapshot = self.snapshots.borrow_and_update().clone();
            if let Some(snap) = snapshot {
                let taints = self.tainter.taints(&snap, Utc::now());
                let wanted = devices(&snap, &taints, self.policy);
                self.devices.send_if_modified(|current| {
                    let changed = *current != wanted;
                    if changed {
                        *current = wanted.clone();
                    }
                    changed
                });
                if let Some(p) = self.publisher.as_mut() {
                    let offered = p.offer(&wanted).await;
                    if let Some(written) = p.published() {
                        self.published.set_from_devices(written);
                    }
                    match &offered {
                        Ok(Some(_)) => self.metrics.publication("ok"),
                        Ok(None) => {}
                        // Counted as withdrawn devices when it happened; later offers write nothing.
                        Err(PublishError::SharingDropped { .. }) => {}
                        Err(_) => self.metrics.publication("error"),
                    }
                    match offered {
                        Ok(_) if failing => {
                            info!("ResourceSlice publishing works again");
                            failing = false;
                        }
                        Ok(_) => {}
                        Err(e) if !failing => {
                            warn!("ResourceSlice not written: {e}");
                            failing = true;
                        }
                        Err(_) => {}
                    }
                } else {
                    self.published.set_from_devices(&wanted);
                    self.metrics.set_slice(&wanted);
                }
            }
            tokio::select! {
                _ = ticker.tick() => {}
                changed = self.snapshots.changed() => if changed.is_err() {
                    return Err("the telemetry snapshots ended".to_string());
                },
                _ = stopped(&mut stop) => return Ok(()),
            }
        }
    }
}
