//! Wiring: backend and telemetry (the device plugin's), taints and the ResourceSlice, the
//! registration and DRA sockets.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use carma_device_plugin::backends::GpuBackend;
use carma_device_plugin::backends::simulated::SimulatedControl;
use carma_device_plugin::plugin::{BackendSpec, open_backend, stale_after};
use carma_device_plugin::telemetry::{Snapshot, Telemetry};
use chrono::Utc;
use k8s_openapi::api::resource::v1::Device;
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tonic::service::Routes;
use tracing::{info, warn};

use crate::Error;
use crate::checkpoint::{self, PreparedClaims, checkpoint_path};
use crate::claims::{ClaimSource, GpuInfo, Inventory, KubeClaims, Published};
use crate::config::Config;
use crate::node::{DraNodeService, NodeServiceParts, Prepared};
use crate::proto::dra::dra_plugin_server::DraPluginServer;
use crate::proto::registration::registration_server::RegistrationServer;
use crate::publisher::SlicePublisher;
use crate::registration::{RegistrationService, RegistrationState};
use crate::server::{serve_unix, serve_unix_fixing_authority};
use crate::slice::{CapacityPolicy, devices};
use crate::taints::Tainter;

const MIB: u64 = 1024 * 1024;

/// What the driver gets from outside: the API client and replacements for tests.
#[derive(Default)]
pub struct Dependencies {
    /// Kubernetes client: claims are read and the slice is written with it.
    pub kube: Option<kube::Client>,
    /// Use this backend instead of the one the config names.
    pub backend: Option<Arc<dyn GpuBackend>>,
    /// Read claims here instead of from the API server.
    pub claims: Option<Arc<dyn ClaimSource>>,
}

impl std::fmt::Debug for Dependencies {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Dependencies")
            .field("kube", &self.kube.is_some())
            .field("backend", &self.backend)
            .field("claims", &self.claims)
            .finish()
    }
}

/// A running driver.
#[derive(Debug)]
pub struct RunningDriver {
    registration_socket: PathBuf,
    dra_socket: PathBuf,
    registration: watch::Receiver<RegistrationState>,
    snapshots: watch::Receiver<Option<Arc<Snapshot>>>,
    devices: watch::Receiver<Vec<Device>>,
    prepared: Prepared,
    simulated: Option<SimulatedControl>,
    shutdown: watch::Sender<bool>,
    tasks: Vec<JoinHandle<()>>,
}

impl RunningDriver {
    /// The registration socket (in the kubelet's plugin registry).
    pub fn registration_socket(&self) -> &std::path::Path {
        &self.registration_socket
    }

    /// The DRA service socket.
    pub fn dra_socket(&self) -> &std::path::Path {
        &self.dra_socket
    }

    /// What the kubelet said about the registration.
    pub fn registration(&self) -> watch::Receiver<RegistrationState> {
        self.registration.clone()
    }

    /// The latest telemetry snapshots.
    pub fn snapshots(&self) -> watch::Receiver<Option<Arc<Snapshot>>> {
        self.snapshots.clone()
    }

    /// The devices the slice should hold now (what is offered to the API server).
    pub fn devices(&self) -> watch::Receiver<Vec<Device>> {
        self.devices.clone()
    }

    /// The claims prepared by this process.
    pub fn prepared(&self) -> &Prepared {
        &self.prepared
    }

    /// Control of the simulated GPUs (backend `simulated` only).
    pub fn simulated(&self) -> Option<&SimulatedControl> {
        self.simulated.as_ref()
    }

    /// Stop serving and sampling; the sockets are removed. The ResourceSlice stays: the kubelet
    /// wipes a gone driver's slices itself, and a restarted driver takes over the same one.
    pub async fn shutdown(self) {
        let _ = self.shutdown.send(true);
        for task in self.tasks {
            let abort = task.abort_handle();
            if tokio::time::timeout(Duration::from_secs(10), task)
                .await
                .is_err()
            {
                abort.abort();
            }
        }
        info!("DRA driver stopped");
    }
}

/// Start the driver: sample once, then serve the sockets, sample and publish until
/// [`RunningDriver::shutdown`].
pub async fn start(config: Config, deps: Dependencies) -> Result<RunningDriver, Error> {
    config.validate().map_err(Error::Config)?;
    let node = config.node_name.clone();
    let (backend, sim) = match deps.backend {
        Some(b) => (b, None),
        None => open_backend(BackendSpec {
            kind: config.backend,
            node: &node,
            dcgm_endpoint: config.dcgm_endpoint.as_deref(),
            simulated: (config.simulated_gpus, config.simulated_metrics),
            interval: config.sample_interval,
        })?,
    };
    let claims: Arc<dyn ClaimSource> = match (deps.claims, &deps.kube) {
        (Some(c), _) => c,
        (None, Some(client)) => Arc::new(KubeClaims::new(client.clone())),
        (None, None) => return Err(Error::NoApiServer),
    };
    let stale = stale_after(config.sample_interval);
    let inventory = Inventory::default();
    let prepared = Prepared::default();
    let checkpoint_file = checkpoint_path(&config.plugin_dir);
    prepared.restore(restore_prepared(&checkpoint_file, &config.cdi_dir).await);
    let (snap_tx, snap_rx) = watch::channel(None);
    let (dev_tx, dev_rx) = watch::channel(Vec::new());
    let (shutdown_tx, shutdown_rx) = watch::channel(false);

    let mut sampler = Sampler {
        backend: backend.clone(),
        telemetry: Telemetry::new(node.clone(), config.window)
            .with_stale_after(stale)
            .with_caps(
                config.sm_activity_cap,
                config.sm_occupancy_cap,
                config.dram_activity_cap,
            ),
        prepared: prepared.clone(),
        inventory: inventory.clone(),
        snapshots: snap_tx,
        failing: false,
    };
    // One sample before serving, so the first prepare already knows the GPUs.
    sampler.tick().await;
    let published = Published::default();
    let publisher = deps
        .kube
        .clone()
        .map(|c| SlicePublisher::new(c, node.clone(), config.slice_min_interval));
    match &publisher {
        // What allocations made before this start were made against: the slice as stored.
        Some(p) => match p.stored_devices().await {
            Ok(Some(devices)) => published.set_from_devices(&devices),
            Ok(None) => {}
            Err(e) => warn!(
                "cannot read the stored ResourceSlice: claims are prepared once it is written: {e}"
            ),
        },
        // Nothing is published: the GPUs as sampled are what the devices are.
        None => published.set_from_gpus(&inventory.all()),
    }

    let mut tasks = Vec::new();
    let interval = config.sample_interval;
    let mut stop = shutdown_rx.clone();
    tasks.push(tokio::spawn(async move {
        let mut ticker = tokio::time::interval(interval);
        ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        ticker.tick().await;
        loop {
            tokio::select! {
                _ = ticker.tick() => sampler.tick().await,
                _ = stopped(&mut stop) => return,
            }
        }
    }));

    let slices = SliceLoop {
        tainter: Tainter::new(
            (
                config.sm_activity_cap,
                config.sm_occupancy_cap,
                config.dram_activity_cap,
            ),
            config.gate_reopen_margin,
            stale,
        ),
        policy: CapacityPolicy {
            slots: config.slots,
            min_share_mib: config.min_share_mib,
        },
        snapshots: snap_rx.clone(),
        devices: dev_tx,
        publisher,
        published: published.clone(),
        interval,
    };
    tasks.push(tokio::spawn(slices.run(shutdown_rx.clone())));

    let dra_socket = config.dra_socket();
    let node_service = Arc::new(DraNodeService::new(NodeServiceParts {
        node: node.clone(),
        claims,
        inventory,
        published,
        cdi_dir: config.cdi_dir.clone(),
        checkpoint: checkpoint_file,
        mps: config.mps.clone(),
        nvidia_cdi: config.nvidia_cdi,
        prepared: prepared.clone(),
    }));
    // Once before serving, then periodically.
    sweep(&node_service).await;
    let sweeper = node_service.clone();
    let sweep_every = config.cdi_sweep_interval;
    let mut stop = shutdown_rx.clone();
    tasks.push(tokio::spawn(async move {
        let mut ticker = tokio::time::interval(sweep_every);
        ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        ticker.tick().await;
        loop {
            tokio::select! {
                _ = ticker.tick() => sweep(&sweeper).await,
                _ = stopped(&mut stop) => return,
            }
        }
    }));
    let socket_error = |path: &std::path::Path| {
        let path = path.to_path_buf();
        move |source| Error::Socket { path, source }
    };
    // The DRA socket first: the kubelet dials it as soon as registration succeeds.
    tasks.push(
        serve_unix(
            &dra_socket,
            Routes::new(DraPluginServer::from_arc(node_service)),
            shutdown_rx.clone(),
        )
        .map_err(socket_error(&dra_socket))?,
    );
    let registration_socket = config.registration_socket();
    let (registration, registration_rx) = RegistrationService::new(&dra_socket);
    tasks.push(
        serve_unix_fixing_authority(
            &registration_socket,
            Routes::new(RegistrationServer::new(registration)),
            shutdown_rx.clone(),
        )
        .map_err(socket_error(&registration_socket))?,
    );
    info!(
        node = %node,
        backend = backend.name(),
        registration = %registration_socket.display(),
        dra = %dra_socket.display(),
        cdi = %config.cdi_dir.display(),
        publishing = deps.kube.is_some(),
        "carma DRA driver started"
    );
    Ok(RunningDriver {
        registration_socket,
        dra_socket,
        registration: registration_rx,
        snapshots: snap_rx,
        devices: dev_rx,
        prepared,
        simulated: sim.map(|s| s.control()),
        shutdown: shutdown_tx,
        tasks,
    })
}

/// The prepared claims to start with: the checkpoint's. Without a usable checkpoint (a first
/// start, an upgrade from a version that kept none, a damaged file) every spec of carma's already
/// in the CDI directory is adopted as a prepared claim (without devices: nothing is known of them
/// but the UID), since the kubelet may still restart containers that use it and unprepares it
/// once its pods are gone; only specs written later without being recorded count as orphans.
async fn restore_prepared(
    checkpoint_file: &std::path::Path,
    cdi_dir: &std::path::Path,
) -> PreparedClaims {
    let (file, dir) = (checkpoint_file.to_path_buf(), cdi_dir.to_path_buf());
    let read = tokio::task::spawn_blocking(move || {
        let loaded = checkpoint::load(&file);
        let adopt = match &loaded {
            Ok(Some(_)) => Ok(Vec::new()),
            _ => checkpoint::carma_specs(&dir),
        };
        (loaded, adopt)
    })
    .await;
    let (loaded, adopt) = match read {
        Ok(r) => r,
        Err(e) => {
            warn!("reading the checkpoint failed: {e}");
            return PreparedClaims::new();
        }
    };
    match loaded {
        Ok(Some(claims)) => {
            info!(claims = claims.len(), checkpoint = %checkpoint_file.display(), "prepared claims restored from the checkpoint");
            return claims;
        }
        Ok(None) => {}
        Err(e) => warn!("{e}; adopting the CDI specs present instead"),
    }
    match adopt {
        Ok(specs) => {
            let claims: PreparedClaims = specs
                .into_iter()
                .filter(|(path, _)| path.extension().is_some_and(|e| e == "json"))
                .map(|(_, uid)| (uid, Vec::new()))
                .collect();
            if !claims.is_empty() {
                info!(
                    claims = claims.len(),
                    "no checkpoint: the CDI specs present are taken as prepared claims"
                );
            }
            let (file, record) = (checkpoint_file.to_path_buf(), claims.clone());
            match tokio::task::spawn_blocking(move || checkpoint::save(&file, &record)).await {
                Ok(Ok(())) => {}
                Ok(Err(e)) => {
                    warn!(checkpoint = %checkpoint_file.display(), "cannot write the checkpoint: {e}")
                }
                Err(e) => warn!("writing the checkpoint failed: {e}"),
            }
            claims
        }
        Err(e) => {
            warn!(cdi = %cdi_dir.display(), "cannot list the CDI directory: {e}");
            PreparedClaims::new()
        }
    }
}

/// One sweep of orphaned CDI specs; a failure is logged and retried at the next one.
async fn sweep(service: &DraNodeService) {
    if let Err(e) = service.sweep_orphaned_specs().await {
        warn!("sweeping orphaned CDI specs failed: {e}");
    }
}

/// Resolves once `stop` turns true (or its sender is gone).
pub(crate) async fn stopped(stop: &mut watch::Receiver<bool>) {
    let _ = stop.wait_for(|s| *s).await;
}

/// One telemetry step: the prepared claims as load context, a sample, the windows, the inventory.
struct Sampler {
    backend: Arc<dyn GpuBackend>,
    telemetry: Telemetry,
    prepared: Prepared,
    inventory: Inventory,
    snapshots: watch::Sender<Option<Arc<Snapshot>>>,
    failing: bool,
}

impl Sampler {
    async fn tick(&mut self) {
        let ctx = self.prepared.sample_context();
        let samples = match self.backend.sample(&ctx).await {
            Ok(s) => {
                if self.failing {
                    info!("GPU sampling works again");
                    self.failing = false;
                }
                s
            }
            Err(e) => {
                if !self.failing {
                    warn!("GPU sampling failed: {e}");
                    self.failing = true;
                }
                return;
            }
        };
        // Pods are not looked up: on the DRA path the claims, not pod annotations, say what runs
        // where.
        let snapshot = Arc::new(self.telemetry.update(samples, &[], Utc::now()));
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
struct SliceLoop {
    tainter: Tainter,
    policy: CapacityPolicy,
    snapshots: watch::Receiver<Option<Arc<Snapshot>>>,
    devices: watch::Sender<Vec<Device>>,
    publisher: Option<SlicePublisher>,
    /// Follows what the slice carries: the publisher's last write, or without a publisher the
    /// devices as offered.
    published: Published,
    interval: Duration,
}

impl SliceLoop {
    async fn run(mut self, mut stop: watch::Receiver<bool>) {
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
                }
            }
            tokio::select! {
                _ = ticker.tick() => {}
                changed = self.snapshots.changed() => if changed.is_err() { return },
                _ = stopped(&mut stop) => return,
            }
        }
    }
}
