//! Wiring: backend and telemetry (the GPU layer's, `carma-gpu`), taints and the ResourceSlice, the
//! registration and DRA sockets, health checks and the HTTP listener.
//!
//! Every part runs as a task of one [`Tasks`] set ([`crate::tasks`]; the sampling and slice loops
//! are in `loops.rs`). A task ends only when the driver is told to stop; when one ends otherwise
//! (a gRPC server failed, a loop returned or panicked) [`RunningDriver::run_until`] stops the
//! others and returns [`Error::TaskEnded`], so the process exits and the kubelet restarts the pod
//! instead of keeping a driver that serves nothing.

use std::future::Future;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use carma_gpu::backends::GpuBackend;
use carma_gpu::backends::open_backend;
use carma_gpu::backends::simulated::SimulatedControl;
use carma_gpu::sampling::{Sampling, ticker};
use carma_gpu::telemetry::Snapshot;
use carma_gpu::windows::stale_after;
use k8s_openapi::api::resource::v1::Device;
use tokio::sync::watch;
use tonic::server::NamedService;
use tonic::service::Routes;
use tracing::{info, warn};

use crate::Error;
use crate::checkpoint::{self, PreparedClaims, checkpoint_path};
use crate::claims::{ClaimSource, Inventory, KubeClaims, Published};
use crate::config::Config;
use crate::health::{self, Health, SOCKET_DRA, SOCKET_REGISTRATION};
use crate::loops::{Sampler, SliceLoop};
use crate::metrics::Metrics;
use crate::node::{DraNodeService, NodeServiceParts, Prepared};
use crate::proto::dra::dra_plugin_server::DraPluginServer;
use crate::proto::registration::registration_server::RegistrationServer;
use crate::publisher::SlicePublisher;
use crate::registration::{RegistrationService, RegistrationState};
use crate::server::{serve_unix, serve_unix_fixing_authority};
use crate::slice::CapacityPolicy;
use crate::stopped;
use crate::taints::Tainter;
pub use crate::tasks::{Tasks, supervise};

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
    metrics: Arc<Metrics>,
    health: Arc<Health>,
    metrics_addr: Option<SocketAddr>,
    shutdown: watch::Sender<bool>,
    tasks: Tasks,
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

    /// The driver's metrics.
    pub fn metrics(&self) -> &Arc<Metrics> {
        &self.metrics
    }

    /// What the health checks found (`/healthz`, `/readyz`).
    pub fn health(&self) -> &Arc<Health> {
        &self.health
    }

    /// Where `/metrics`, `/healthz` and `/readyz` are served (the bound address, so port 0 is
    /// resolved); `None` without an HTTP listener.
    pub fn metrics_addr(&self) -> Option<SocketAddr> {
        self.metrics_addr
    }

    /// Run until `signal` resolves, then [`RunningDriver::shutdown`]: `Ok`. When a part of the
    /// driver ends first (a gRPC server failed or stopped, a loop ended or panicked), the others
    /// are stopped too and its [`Error::TaskEnded`] is returned, for the process to exit with.
    pub async fn run_until(mut self, signal: impl Future<Output = ()>) -> Result<(), Error> {
        let ended = supervise(&mut self.tasks, signal).await;
        self.shutdown().await;
        match ended {
            None => Ok(()),
            Some(e) => Err(e),
        }
    }

    /// Stop serving and sampling; the sockets are removed. The ResourceSlice stays: the kubelet
    /// wipes a gone driver's slices itself, and a restarted driver takes over the same one.
    pub async fn shutdown(self) {
        let _ = self.shutdown.send(true);
        self.tasks.join_all(Duration::from_secs(10)).await;
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
        None => open_backend(&config.backend, &node)?,
    };
    let memory_hook =
        carma_gpu::enforcement::prepare(&config.memory_limits, None, backend.cuda_driver_version())
            .await
            .map_err(Error::MemoryHook)?
            .then(|| carma_gpu::enforcement::hook(&config.memory_limits.path));
    let claims: Arc<dyn ClaimSource> = match (deps.claims, &deps.kube) {
        (Some(c), _) => c,
        (None, Some(client)) => Arc::new(KubeClaims::new(client.clone())),
        (None, None) => return Err(Error::NoApiServer),
    };
    let stale = stale_after(config.backend.sample_interval);
    let inventory = Inventory::default();
    let prepared = Prepared::default();
    let checkpoint_file = checkpoint_path(&config.plugin_dir);
    prepared.restore(restore_prepared(&checkpoint_file, &config.cdi_dir).await);
    let (snap_tx, snap_rx) = watch::channel(None);
    let (dev_tx, dev_rx) = watch::channel(Vec::new());
    let (shutdown_tx, shutdown_rx) = watch::channel(false);

    let mut sampler = Sampler {
        sampling: Sampling::new(
            backend.clone(),
            node.clone(),
            config.backend.window,
            config.backend.sample_interval,
            config.gate,
        ),
        prepared: prepared.clone(),
        inventory: inventory.clone(),
        snapshots: snap_tx,
    };
    // One sample before serving, so the first prepare already knows the GPUs.
    sampler.tick().await;
    let published = Published::default();
    let metrics = Arc::new(Metrics::new());
    metrics.set_memory_enforcement(carma_gpu::enforcement::enforcement(
        memory_hook.is_some(),
        config.mps.is_some(),
    ));
    let publisher = deps.kube.clone().map(|c| {
        SlicePublisher::new(c, node.clone(), config.slice_min_interval)
            .with_metrics(metrics.clone())
    });
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

    // Bound before anything is spawned, so a taken port fails the start.
    let http_listener = match config.metrics_addr {
        Some(addr) => Some(
            tokio::net::TcpListener::bind(addr)
                .await
                .map_err(|source| Error::MetricsBind { addr, source })?,
        ),
        None => None,
    };
    let metrics_addr = match &http_listener {
        Some(l) => Some(l.local_addr().map_err(|source| {
            Error::MetricsBind {
                addr: config
                    .metrics_addr
                    .unwrap_or_else(|| ([0, 0, 0, 0], 0).into()),
                source,
            }
        })?),
        None => None,
    };

    let mut tasks = Tasks::default();
    let interval = config.backend.sample_interval;
    let mut stop = shutdown_rx.clone();
    tasks.spawn("telemetry", async move {
        let mut ticker = ticker(interval).await;
        loop {
            tokio::select! {
                _ = ticker.tick() => sampler.tick().await,
                _ = stopped(&mut stop) => return Ok(()),
            }
        }
    });

    let slices = SliceLoop {
        tainter: Tainter::new(config.gate, config.gate_reopen_margin, stale),
        policy: CapacityPolicy {
            slots: config.slots,
            min_share_mib: config.min_share_mib,
        },
        snapshots: snap_rx.clone(),
        devices: dev_tx,
        publisher,
        published: published.clone(),
        metrics: metrics.clone(),
        interval,
    };
    tasks.spawn("resourceslice", slices.run(shutdown_rx.clone()));

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
        memory_hook,
        prepared: prepared.clone(),
        metrics: metrics.clone(),
    }));
    // Once before serving, then periodically.
    sweep(&node_service).await;
    let sweeper = node_service.clone();
    let sweep_every = config.cdi_sweep_interval;
    let mut stop = shutdown_rx.clone();
    tasks.spawn("cdi-sweep", async move {
        let mut ticker = tokio::time::interval(sweep_every);
        ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        ticker.tick().await;
        loop {
            tokio::select! {
                _ = ticker.tick() => sweep(&sweeper).await,
                _ = stopped(&mut stop) => return Ok(()),
            }
        }
    });
    let socket_error = |path: &std::path::Path| {
        let path = path.to_path_buf();
        move |source| Error::Socket { path, source }
    };
    // The DRA socket first: the kubelet dials it as soon as registration succeeds.
    tasks.spawn(
        "dra-grpc",
        serve_unix(
            &dra_socket,
            Routes::new(DraPluginServer::from_arc(node_service)),
            <DraPluginServer<DraNodeService> as NamedService>::NAME,
            shutdown_rx.clone(),
        )
        .map_err(socket_error(&dra_socket))?,
    );
    let registration_socket = config.registration_socket();
    let (registration, registration_rx) = RegistrationService::new(&dra_socket);
    tasks.spawn(
        "registration-grpc",
        serve_unix_fixing_authority(
            &registration_socket,
            Routes::new(RegistrationServer::new(registration)),
            <RegistrationServer<RegistrationService> as NamedService>::NAME,
            shutdown_rx.clone(),
        )
        .map_err(socket_error(&registration_socket))?,
    );

    let health = Arc::new(Health::new(
        config.health_check_interval,
        snap_rx.clone(),
        registration_rx.clone(),
        metrics.clone(),
    ));
    tasks.spawn("health-checks", {
        let (health, stop) = (health.clone(), shutdown_rx.clone());
        let sockets = vec![
            (SOCKET_DRA, dra_socket.clone()),
            (SOCKET_REGISTRATION, registration_socket.clone()),
        ];
        let every = config.health_check_interval;
        async move {
            health::check_loop(health, sockets, every, stop).await;
            Ok(())
        }
    });
    if let Some(listener) = http_listener {
        let app = health::router(health.clone(), metrics.clone());
        let mut stop = shutdown_rx.clone();
        tasks.spawn("http", async move {
            let listener = carma_http::IdleListener::new(listener, carma_http::IDLE_TIMEOUT);
            axum::serve(listener, app)
                .with_graceful_shutdown(async move { stopped(&mut stop).await })
                .await
                .map_err(|e| format!("HTTP listener failed: {e}"))
        });
    }
    info!(
        node = %node,
        backend = backend.name(),
        registration = %registration_socket.display(),
        dra = %dra_socket.display(),
        cdi = %config.cdi_dir.display(),
        http = ?metrics_addr,
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
        metrics,
        health,
        metrics_addr,
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
