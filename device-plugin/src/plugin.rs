//! Wiring: backend, telemetry loop, publisher, kubelet link and HTTP server of one node.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use carma_api::GpuNodeSpec;
use carma_api::names::RESOURCE_GPU;
use parking_lot::RwLock;
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tracing::{info, warn};

use crate::Error;
use crate::allocate::Allocator;
use crate::coexistence::CoexistenceProbe;
use crate::config::Config;
use crate::devices::{advertised, device_list};
use crate::http::{Health, router};
use crate::metrics::Metrics;
use crate::pods::{KubePodLookup, PodInfo, PodLookup};
use crate::proto::Device;
use crate::publisher::Publisher;
use crate::registration::KubeletLink;
use carma_gpu::backends::simulated::SimulatedControl;
use carma_gpu::backends::{BackendError, Backends, GpuBackend, open_backend};
use carma_gpu::sampling::{Sampling, ticker};
use carma_gpu::telemetry::{Snapshot, sample_context};

/// What the plugin gets from outside: the API client, and optional replacements (tests).
#[derive(Default)]
pub struct Dependencies {
    /// Kubernetes client; `None`: GpuNode publishing and pod lookup are off.
    pub kube: Option<kube::Client>,
    /// Use this backend instead of the one `Config::backend` names.
    pub backend: Option<Arc<dyn GpuBackend>>,
    /// Use this pod lookup instead of the API server's.
    pub pods: Option<Arc<dyn PodLookup>>,
}

impl std::fmt::Debug for Dependencies {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Dependencies")
            .field("kube", &self.kube.is_some())
            .field("backend", &self.backend)
            .field("pods", &self.pods)
            .finish()
    }
}

/// A running device plugin.
#[derive(Debug)]
pub struct RunningPlugin {
    metrics_addr: SocketAddr,
    socket: PathBuf,
    shutdown: watch::Sender<bool>,
    tasks: Vec<JoinHandle<()>>,
    simulated: Option<SimulatedControl>,
    health: Arc<Health>,
    metrics: Arc<Metrics>,
    snapshots: watch::Receiver<Option<Arc<Snapshot>>>,
}

impl RunningPlugin {
    /// Where `/metrics`, `/healthz` and `/readyz` are served.
    pub fn metrics_addr(&self) -> SocketAddr {
        self.metrics_addr
    }

    /// The plugin's socket.
    pub fn socket(&self) -> &std::path::Path {
        &self.socket
    }

    /// Control of the simulated GPUs (backend `simulated` only).
    pub fn simulated(&self) -> Option<&SimulatedControl> {
        self.simulated.as_ref()
    }

    /// Liveness and readiness.
    pub fn health(&self) -> &Arc<Health> {
        &self.health
    }

    /// The metrics.
    pub fn metrics(&self) -> &Arc<Metrics> {
        &self.metrics
    }

    /// The latest telemetry snapshots.
    pub fn snapshots(&self) -> watch::Receiver<Option<Arc<Snapshot>>> {
        self.snapshots.clone()
    }

    /// Stop everything and remove the plugin socket.
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
        info!("device plugin stopped");
    }
}

/// Build the backend `config` names.
fn build_backend(config: &Config) -> Result<Backends, BackendError> {
    open_backend(&config.backend, &config.node_name)
}

/// Start the device plugin: sample once, then serve kubelet, sample, publish and serve HTTP until
/// [`RunningPlugin::shutdown`].
pub async fn start(config: Config, deps: Dependencies) -> Result<RunningPlugin, Error> {
    config.validate().map_err(Error::Config)?;
    let node = config.node_name.clone();
    let (backend, sim) = match deps.backend {
        Some(b) => (b, None),
        None => build_backend(&config)?,
    };
    let lookup: Option<Arc<dyn PodLookup>> = match (deps.pods, &deps.kube) {
        (Some(p), _) => Some(p),
        (None, Some(client)) => Some(Arc::new(KubePodLookup::new(client.clone(), node.clone()))),
        (None, None) => None,
    };
    let synthetic: Vec<PodInfo> = match &sim {
        Some(sim) => {
            let per_gpu = config
                .simulated_pods
                .unwrap_or(if lookup.is_none() { 2 } else { 0 });
            if per_gpu > 0 {
                info!(
                    per_gpu,
                    "simulated backend: synthetic pods in namespace \"simulated\" carry the scripted load (not real pods)"
                );
            }
            sim.synthetic_pods(&node, per_gpu)
        }
        None => Vec::new(),
    };
    if lookup.is_none() {
        warn!(
            "no Kubernetes API server: GpuNode publishing and pod lookup are off; Allocate will refuse every request with that reason"
        );
    }
    if config.mps.is_none() {
        info!(
            "MPS is off: CARMA_RESERVED_MIB is advisory, nothing limits a container's GPU memory (use --mps with an MPS control daemon to enforce it)"
        );
    } else {
        info!(
            "MPS is on: Allocate sets CUDA_MPS_PINNED_DEVICE_MEM_LIMIT (the reservation per GPU) and CUDA_MPS_ACTIVE_THREAD_PERCENTAGE; an MPS control daemon must run on the node"
        );
    }

    let memory_hook = carma_gpu::enforcement::prepare(
        &config.memory_limits,
        config.cdi_dir.as_deref(),
        backend.cuda_driver_version(),
    )
    .await?;
    let enforcement = carma_gpu::enforcement::enforcement(memory_hook, config.mps.is_some());

    std::fs::create_dir_all(&config.device_plugin_dir).map_err(|source| Error::PluginDir {
        dir: config.device_plugin_dir.clone(),
        source,
    })?;
    let listener = tokio::net::TcpListener::bind(config.metrics_addr)
        .await
        .map_err(|source| Error::MetricsBind {
            addr: config.metrics_addr,
            source,
        })?;
    let metrics_addr = listener.local_addr().map_err(|source| Error::MetricsBind {
        addr: config.metrics_addr,
        source,
    })?;

    let metrics = Arc::new(Metrics::new(node.clone(), config.gate.sm_activity));
    metrics.set_memory_enforcement(enforcement);
    let health = Arc::new(Health::new(config.backend.sample_interval));
    let gpus = Arc::new(RwLock::new(Vec::new()));
    let gpu_memory = Arc::new(RwLock::new(HashMap::new()));
    let (devices_tx, devices_rx) = watch::channel(Vec::<Device>::new());
    let (snap_tx, snap_rx) = watch::channel(None);
    let (shutdown_tx, shutdown_rx) = watch::channel(false);

    let mut sampler = Sampler {
        sampling: Sampling::new(
            backend.clone(),
            node.clone(),
            config.backend.window,
            config.backend.sample_interval,
            config.gate,
        ),
        lookup: lookup.clone(),
        synthetic: Arc::new(synthetic),
        last_pods: Arc::new(Vec::new()),
        devices: devices_tx,
        gpus: gpus.clone(),
        gpu_memory: gpu_memory.clone(),
        metrics: metrics.clone(),
        health: health.clone(),
        snapshots: snap_tx,
        replicas: config.replicas,
        pod_ttl: config.pod_cache_ttl,
        lookup_failing: false,
    };
    // One sample before serving, so kubelet's first ListAndWatch already has the GPUs.
    sampler.tick().await;

    let mut tasks = Vec::new();
    let interval = config.backend.sample_interval;
    let mut stop = shutdown_rx.clone();
    tasks.push(tokio::spawn(async move {
        let mut ticker = ticker(interval).await;
        loop {
            tokio::select! {
                _ = ticker.tick() => sampler.tick().await,
                _ = crate::stopped(&mut stop) => return,
            }
        }
    }));

    if let Some(client) = deps.kube.clone() {
        let spec = GpuNodeSpec {
            backend: backend.name().to_string(),
            replicas_per_gpu: config.replicas,
            mps: config.mps.is_some(),
        };
        let mut publisher =
            Publisher::new(client, node.clone(), spec, config.publish, metrics.clone())
                .with_memory_enforcement(enforcement)
                .with_coexistence(CoexistenceProbe::new(
                    config.device_plugin_dir.clone(),
                    RESOURCE_GPU,
                    &config.socket_name,
                ));
        let mut snaps = snap_rx.clone();
        let mut stop = shutdown_rx.clone();
        tasks.push(tokio::spawn(async move {
            loop {
                let snapshot = snaps.borrow_and_update().clone();
                if let Some(s) = snapshot {
                    publisher.offer(&s).await;
                }
                tokio::select! {
                    changed = snaps.changed() => if changed.is_err() { return },
                    _ = crate::stopped(&mut stop) => return,
                }
            }
        }));
    }

    let allocator = Arc::new(
        Allocator::new(
            node.clone(),
            lookup,
            config.mps.clone(),
            metrics.clone(),
            gpus,
        )
        .with_gpu_memory(gpu_memory)
        .with_memory_hook(memory_hook),
    );
    let link = KubeletLink {
        dir: config.device_plugin_dir.clone(),
        socket_name: config.socket_name.clone(),
        devices: devices_rx,
        allocator,
        metrics: metrics.clone(),
        health: health.clone(),
        watch_interval: config.watch_interval,
    };
    tasks.push(tokio::spawn(link.run(shutdown_rx.clone())));

    let app = router(metrics.clone(), health.clone());
    let mut stop = shutdown_rx.clone();
    tasks.push(tokio::spawn(async move {
        let listener = crate::http::IdleListener::new(listener, crate::http::IDLE_TIMEOUT);
        let serve = axum::serve(listener, app).with_graceful_shutdown(async move {
            crate::stopped(&mut stop).await;
        });
        if let Err(e) = serve.await {
            warn!("metrics server ended: {e}");
        }
    }));
    info!(
        node = %node,
        backend = backend.name(),
        replicas = config.replicas,
        metrics = %metrics_addr,
        dir = %config.device_plugin_dir.display(),
        "carma device plugin started"
    );
    Ok(RunningPlugin {
        metrics_addr,
        socket: config.device_plugin_dir.join(&config.socket_name),
        shutdown: shutdown_tx,
        tasks,
        simulated: sim.map(|s| s.control()),
        health,
        metrics,
        snapshots: snap_rx,
    })
}

/// One telemetry step: pods, sample, windows, device list, metrics, snapshot.
struct Sampler {
    sampling: Sampling,
    lookup: Option<Arc<dyn PodLookup>>,
    synthetic: Arc<Vec<PodInfo>>,
    last_pods: Arc<Vec<PodInfo>>,
    devices: watch::Sender<Vec<Device>>,
    gpus: Arc<RwLock<Vec<String>>>,
    /// Total memory of each GPU (UUID → MiB), for the containers' memory limits.
    gpu_memory: Arc<RwLock<HashMap<String, u64>>>,
    metrics: Arc<Metrics>,
    health: Arc<Health>,
    snapshots: watch::Sender<Option<Arc<Snapshot>>>,
    replicas: u32,
    pod_ttl: Duration,
    lookup_failing: bool,
}

impl Sampler {
    async fn pods(&mut self) -> Arc<Vec<PodInfo>> {
        let Some(lookup) = &self.lookup else {
            return self.synthetic.clone();
        };
        match lookup.pods_on_node(self.pod_ttl).await {
            Ok(p) => {
                if self.lookup_failing {
                    info!("pod lookup works again");
                    self.lookup_failing = false;
                }
                self.last_pods = p.clone();
                p
            }
            Err(e) => {
                if !self.lookup_failing {
                    warn!("pod lookup for telemetry failed ({e}); using the last known pods");
                    self.lookup_failing = true;
                }
                self.last_pods.clone()
            }
        }
    }

    async fn tick(&mut self) {
        let pods = self.pods().await;
        let Some(snapshot) = self.sampling.sample(&sample_context(&pods), &pods).await else {
            return;
        };
        let snapshot = Arc::new(snapshot);
        let advertised = advertised(&snapshot);
        let list = device_list(&advertised, self.replicas);
        self.devices.send_if_modified(|current| {
            if *current == list {
                return false;
            }
            let unhealthy: Vec<String> = snapshot
                .gpus
                .iter()
                .filter(|g| !g.sample.healthy)
                .map(|g| {
                    format!(
                        "{} ({})",
                        g.sample.uuid,
                        g.sample.health_reason.as_deref().unwrap_or("unhealthy")
                    )
                })
                .collect();
            info!(
                gpus = advertised.len(),
                devices = list.len(),
                unhealthy = ?unhealthy,
                "device list changed: sending it to kubelet"
            );
            *current = list;
            true
        });
        *self.gpus.write() = advertised.into_iter().map(|g| g.uuid).collect();
        // The GPUs' total memory for Allocate's limits: it almost never changes, so the map is
        // rebuilt (and write-locked) only when it does, not on every sample.
        let totals = snapshot
            .gpus
            .iter()
            .map(|g| (g.sample.uuid.as_str(), g.sample.memory_total_bytes >> 20));
        let unchanged = {
            let known = self.gpu_memory.read();
            known.len() == snapshot.gpus.len()
                && totals
                    .clone()
                    .all(|(uuid, mib)| known.get(uuid) == Some(&mib))
        };
        if !unchanged {
            *self.gpu_memory.write() = totals.map(|(uuid, mib)| (uuid.to_string(), mib)).collect();
        }
        self.metrics.set_snapshot(snapshot.clone());
        self.health.sampled();
        self.snapshots.send_replace(Some(snapshot));
    }
}
