//! Serve the `DevicePlugin` service on the plugin's socket, register with kubelet, and start over
//! when kubelet restarts.
//!
//! Kubelet deletes the sockets in its device-plugin directory when it restarts and creates a new
//! `kubelet.sock`. The directory is polled every `watch_interval` (1 s): when the plugin's socket is
//! gone or replaced, or `kubelet.sock` is a different file than the one registered with, the plugin
//! stops serving, binds a new socket and registers again.

use std::io;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use carma_api::names::RESOURCE_GPU;
use tokio::net::UnixListener;
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tokio_stream::wrappers::UnixListenerStream;
use tonic::transport::Server;
use tracing::{error, info, warn};

use crate::allocate::Allocator;
use crate::http::Health;
use crate::kubelet::{DevicePluginService, plugin_options};
use crate::metrics::Metrics;
use crate::proto::device_plugin_server::DevicePluginServer;
use crate::proto::registration_client::RegistrationClient;
use crate::proto::{self, Device, RegisterRequest};

/// Registration failed.
#[derive(Debug, thiserror::Error)]
pub enum RegisterError {
    /// kubelet.sock cannot be reached.
    #[error("cannot connect to {path}: {source}")]
    Connect {
        /// The socket.
        path: PathBuf,
        /// Why.
        source: tonic::transport::Error,
    },
    /// Kubelet refused or the call failed.
    #[error("Register: {0}")]
    Rpc(#[from] tonic::Status),
    /// No answer in time.
    #[error("Register: no answer within {0:?}")]
    Timeout(Duration),
}

use carma_gpu::uds::uds_channel;

const REGISTER_TIMEOUT: Duration = Duration::from_secs(10);

/// Call kubelet's `Register` for resource `carma.io/gpu` with the plugin socket `socket_name`.
pub async fn register(dir: &Path, socket_name: &str) -> Result<(), RegisterError> {
    let path = dir.join(proto::KUBELET_SOCKET);
    let call = async {
        let channel = uds_channel(&path)
            .await
            .map_err(|source| RegisterError::Connect {
                path: path.clone(),
                source,
            })?;
        let mut client = RegistrationClient::new(channel);
        client
            .register(RegisterRequest {
                version: proto::VERSION.to_string(),
                endpoint: socket_name.to_string(),
                resource_name: RESOURCE_GPU.to_string(),
                options: Some(plugin_options()),
            })
            .await?;
        Ok(())
    };
    tokio::time::timeout(REGISTER_TIMEOUT, call)
        .await
        .map_err(|_| RegisterError::Timeout(REGISTER_TIMEOUT))?
}

/// Identity of a file: device, inode and change time (a re-created file differs).
type FileId = (u64, u64, i64, i64);

fn file_id(path: &Path) -> Option<FileId> {
    std::fs::metadata(path)
        .ok()
        .map(|m| (m.dev(), m.ino(), m.ctime(), m.ctime_nsec()))
}

/// One serving generation: a bound socket and the gRPC server on it.
struct Generation {
    socket: PathBuf,
    socket_id: Option<FileId>,
    stop: watch::Sender<bool>,
    server: JoinHandle<Result<(), tonic::transport::Error>>,
}

impl Generation {
    async fn stop(self, remove_socket: bool) {
        let _ = self.stop.send(true);
        let mut server = self.server;
        match tokio::time::timeout(Duration::from_secs(5), &mut server).await {
            Ok(Ok(Ok(()))) => {}
            Ok(Ok(Err(e))) => warn!("plugin gRPC server ended with an error: {e}"),
            Ok(Err(e)) => warn!("plugin gRPC server task failed: {e}"),
            Err(_) => {
                warn!("plugin gRPC server did not stop within 5 s; aborting it");
                server.abort();
            }
        }
        if remove_socket && file_id(&self.socket) == self.socket_id && self.socket_id.is_some() {
            let _ = std::fs::remove_file(&self.socket);
        }
    }
}

enum Outcome {
    Restart,
    Shutdown,
}

/// Keeps the plugin served and registered with kubelet.
#[derive(Debug, Clone)]
pub struct KubeletLink {
    /// Device-plugin directory.
    pub dir: PathBuf,
    /// Plugin socket file name.
    pub socket_name: String,
    /// Device list (updated by the telemetry loop).
    pub devices: watch::Receiver<Vec<Device>>,
    /// Allocate and GetPreferredAllocation.
    pub allocator: Arc<Allocator>,
    /// Registration counter.
    pub metrics: Arc<Metrics>,
    /// Serving and registration flags.
    pub health: Arc<Health>,
    /// Poll interval of the directory.
    pub watch_interval: Duration,
}

impl KubeletLink {
    fn serve(&self) -> io::Result<Generation> {
        let socket = self.dir.join(&self.socket_name);
        match std::fs::remove_file(&socket) {
            Ok(()) => {}
            Err(e) if e.kind() == io::ErrorKind::NotFound => {}
            Err(e) => return Err(e),
        }
        let listener = UnixListener::bind(&socket)?;
        let socket_id = file_id(&socket);
        let (stop, stop_rx) = watch::channel(false);
        let svc = DevicePluginService::new(
            self.devices.clone(),
            self.allocator.clone(),
            stop_rx.clone(),
        );
        let mut shutdown = stop_rx;
        let incoming = UnixListenerStream::new(listener);
        let server = tokio::spawn(async move {
            Server::builder()
                .add_service(DevicePluginServer::new(svc))
                .serve_with_incoming_shutdown(incoming, async move {
                    crate::stopped(&mut shutdown).await;
                })
                .await
        });
        info!(socket = %socket.display(), "serving the kubelet device-plugin API");
        Ok(Generation {
            socket,
            socket_id,
            stop,
            server,
        })
    }

    /// Serve, register and watch until `shutdown` turns true; the socket is removed on the way out.
    pub async fn run(self, mut shutdown: watch::Receiver<bool>) {
        let mut bind_backoff = self.watch_interval;
        loop {
            if *shutdown.borrow() {
                return;
            }
            let generation = match self.serve() {
                Ok(g) => g,
                Err(e) => {
                    error!(
                        dir = %self.dir.display(),
                        "cannot serve on {}: {e}; retrying in {bind_backoff:?}",
                        self.socket_name
                    );
                    tokio::select! {
                        _ = tokio::time::sleep(bind_backoff) => {}
                        _ = crate::stopped(&mut shutdown) => return,
                    }
                    bind_backoff = (bind_backoff * 2).min(Duration::from_secs(30));
                    continue;
                }
            };
            bind_backoff = self.watch_interval;
            self.health.set_serving(true);
            let outcome = self.register_and_watch(&generation, &mut shutdown).await;
            self.health.set_serving(false);
            self.health.set_registered(false);
            match outcome {
                Outcome::Shutdown => {
                    generation.stop(true).await;
                    info!("stopped serving kubelet; plugin socket removed");
                    return;
                }
                Outcome::Restart => generation.stop(true).await,
            }
        }
    }

    async fn register_and_watch(
        &self,
        generation: &Generation,
        shutdown: &mut watch::Receiver<bool>,
    ) -> Outcome {
        let kubelet = self.dir.join(proto::KUBELET_SOCKET);
        let mut registered_with: Option<FileId> = None;
        let mut backoff = self.watch_interval;
        let mut next_attempt = Instant::now();
        let mut waiting_logged = false;
        loop {
            if file_id(&generation.socket) != generation.socket_id {
                info!(socket = %generation.socket.display(), "plugin socket removed or replaced (kubelet restarted?): serving and registering again");
                return Outcome::Restart;
            }
            let kubelet_id = file_id(&kubelet);
            match (registered_with, kubelet_id) {
                (Some(a), Some(b)) if a == b => {}
                (Some(_), _) => {
                    info!(
                        "kubelet.sock re-created or removed (kubelet restarted): serving and registering again"
                    );
                    return Outcome::Restart;
                }
                (None, Some(id)) if Instant::now() >= next_attempt => {
                    match register(&self.dir, &self.socket_name).await {
                        Ok(()) => {
                            info!(resource = RESOURCE_GPU, endpoint = %self.socket_name, "registered with kubelet");
                            self.metrics.registration("ok");
                            self.health.set_registered(true);
                            registered_with = Some(id);
                            backoff = self.watch_interval;
                        }
                        Err(e) => {
                            warn!("registration with kubelet failed: {e}; retrying in {backoff:?}");
                            self.metrics.registration("error");
                            next_attempt = Instant::now() + backoff;
                            backoff = (backoff * 2).min(Duration::from_secs(30));
                        }
                    }
                }
                (None, None) if !waiting_logged => {
                    info!(path = %kubelet.display(), "waiting for kubelet's registration socket");
                    waiting_logged = true;
                }
                _ => {}
            }
            tokio::select! {
                _ = tokio::time::sleep(self.watch_interval) => {}
                _ = crate::stopped(shutdown) => return Outcome::Shutdown,
            }
        }
    }
}
