//! Helpers shared by the integration tests: a fake kubelet over real Unix sockets, a fake pod
//! lookup, pod builders and a tiny HTTP client.

#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use carma_device_plugin::pods::{LookupError, PodInfo, PodLookup};
use carma_device_plugin::proto::device_plugin_client::DevicePluginClient;
use carma_device_plugin::proto::registration_server::{Registration, RegistrationServer};
use carma_device_plugin::proto::{Empty, RegisterRequest};
use carma_device_plugin::{BackendKind, Config};
use carma_gpu::uds::uds_channel;
use futures::future::BoxFuture;
use k8s_openapi::api::core::v1::Pod;
use parking_lot::Mutex;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::UnixListener;
use tokio::sync::{mpsc, oneshot};
use tokio_stream::wrappers::UnixListenerStream;
use tonic::transport::{Channel, Server};
use tonic::{Request, Response, Status};

/// A fake kubelet: serves `Registration` on `<dir>/kubelet.sock` and reports each request.
pub struct FakeKubelet {
    stop: Option<oneshot::Sender<()>>,
    task: tokio::task::JoinHandle<()>,
    pub registrations: mpsc::UnboundedReceiver<RegisterRequest>,
}

struct RegistrationService {
    tx: mpsc::UnboundedSender<RegisterRequest>,
}

#[tonic::async_trait]
impl Registration for RegistrationService {
    async fn register(&self, request: Request<RegisterRequest>) -> Result<Response<Empty>, Status> {
        let _ = self.tx.send(request.into_inner());
        Ok(Response::new(Empty {}))
    }
}

impl FakeKubelet {
    /// Start serving on `<dir>/kubelet.sock` (replacing a stale file).
    pub fn start(dir: &Path) -> Self {
        let path = dir.join("kubelet.sock");
        let _ = std::fs::remove_file(&path);
        let listener = UnixListener::bind(&path).expect("bind kubelet.sock");
        let (tx, registrations) = mpsc::unbounded_channel();
        let (stop, stopped) = oneshot::channel::<()>();
        let task = tokio::spawn(async move {
            let _ = Server::builder()
                .add_service(RegistrationServer::new(RegistrationService { tx }))
                .serve_with_incoming_shutdown(UnixListenerStream::new(listener), async {
                    let _ = stopped.await;
                })
                .await;
        });
        Self {
            stop: Some(stop),
            task,
            registrations,
        }
    }

    /// Wait for the next registration.
    pub async fn next_registration(&mut self, within: Duration) -> RegisterRequest {
        tokio::time::timeout(within, self.registrations.recv())
            .await
            .expect("no registration in time")
            .expect("fake kubelet stopped")
    }

    /// Stop serving like a restarting kubelet: the server goes away and every socket in the
    /// directory is deleted.
    pub async fn stop_and_wipe(mut self, dir: &Path) {
        if let Some(s) = self.stop.take() {
            let _ = s.send(());
        }
        let _ = tokio::time::timeout(Duration::from_secs(5), &mut self.task).await;
        for entry in std::fs::read_dir(dir).unwrap().flatten() {
            if entry.path().extension().is_some_and(|e| e == "sock") {
                let _ = std::fs::remove_file(entry.path());
            }
        }
    }
}

/// A DevicePlugin client on the plugin's socket. The socket file exists from `bind` on, but a
/// connect is refused until `listen` follows, so a loaded machine can land in between: retry a
/// refused connect for up to 10 s (the kubelet never sees this, as it connects only after
/// `Register`, which comes after both).
pub async fn plugin_client(socket: &Path) -> DevicePluginClient<Channel> {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    loop {
        match uds_channel(socket).await {
            Ok(channel) => return DevicePluginClient::new(channel),
            Err(_) if tokio::time::Instant::now() < deadline => {
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            Err(e) => panic!("connect to the plugin socket: {e:?}"),
        }
    }
}

/// A pod lookup over a fixed, mutable list; `mark_allocated` flips the assignment's flag.
#[derive(Debug, Default)]
pub struct FakePods {
    pub pods: Mutex<Vec<PodInfo>>,
    pub annotated: Mutex<Vec<String>>,
    /// The next this many lists that Allocate asks for (at most 1 s old; the telemetry loop's
    /// may be older) fail with an API error: a transient outage.
    pub fail_next: Mutex<u32>,
}

impl PodLookup for FakePods {
    fn pods_on_node(
        &self,
        max_age: Duration,
    ) -> BoxFuture<'_, Result<Arc<Vec<PodInfo>>, LookupError>> {
        let pods = Arc::new(self.pods.lock().clone());
        let fail = {
            let mut n = self.fail_next.lock();
            let fail = *n > 0 && max_age <= Duration::from_secs(1);
            if fail {
                *n -= 1;
            }
            fail
        };
        Box::pin(async move {
            if fail {
                Err(LookupError::Api("etcdserver: request timed out".into()))
            } else {
                Ok(pods)
            }
        })
    }

    fn mark_allocated<'a>(
        &'a self,
        namespace: &'a str,
        name: &'a str,
    ) -> BoxFuture<'a, Result<(), LookupError>> {
        Box::pin(async move {
            self.annotated.lock().push(format!("{namespace}/{name}"));
            for p in self.pods.lock().iter_mut() {
                if p.namespace == namespace
                    && p.name == name
                    && let Ok(Some(a)) = p.assignment.as_mut()
                {
                    a.allocated = true;
                }
            }
            Ok(())
        })
    }
}

/// A test pod in namespace `ml`.
#[derive(Debug, Clone)]
pub struct TestPod<'a> {
    pub name: &'a str,
    pub node: &'a str,
    pub scheduler: &'a str,
    /// Assigned GPUs; empty: no carma assignment (requests one carma.io/gpu anyway).
    pub gpus: &'a [&'a str],
    pub assigned_at: &'a str,
    pub mib: u64,
    pub allocated: bool,
    pub phase: &'a str,
}

impl<'a> TestPod<'a> {
    /// A pending pod of carma-scheduler assigned `gpus` at `assigned_at`, reserving `mib`.
    pub fn new(
        name: &'a str,
        node: &'a str,
        gpus: &'a [&'a str],
        assigned_at: &'a str,
        mib: u64,
    ) -> Self {
        Self {
            name,
            node,
            scheduler: "carma-scheduler",
            gpus,
            assigned_at,
            mib,
            allocated: false,
            phase: "Pending",
        }
    }

    /// The pod as the API server returns it.
    pub fn json(&self) -> serde_json::Value {
        let mut annotations = serde_json::Map::new();
        if !self.gpus.is_empty() {
            annotations.insert("carma.io/assigned-gpus".into(), self.gpus.join(",").into());
            annotations.insert("carma.io/assigned-at".into(), self.assigned_at.into());
            annotations.insert(
                "carma.io/estimate".into(),
                format!("{{\"mib\":{},\"source\":\"override\"}}", self.mib).into(),
            );
        }
        if self.allocated {
            annotations.insert("carma.io/allocated".into(), "true".into());
        }
        let request = self.gpus.len().max(1);
        let uid = self
            .name
            .bytes()
            .fold(0u64, |h, b| h.wrapping_mul(31).wrapping_add(u64::from(b)))
            & 0xffff_ffff_ffff;
        serde_json::json!({
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {
                "name": self.name,
                "namespace": "ml",
                "uid": format!("00000000-0000-4000-8000-{uid:012x}"),
                "labels": { "carma.io/task": format!("task-{}", self.name) },
                "annotations": annotations,
            },
            "spec": {
                "nodeName": self.node,
                "schedulerName": self.scheduler,
                "containers": [{
                    "name": "train",
                    "image": "pytorch",
                    "resources": { "limits": { "carma.io/gpu": request.to_string() } }
                }]
            },
            "status": { "phase": self.phase }
        })
    }

    /// The pod read as a [`PodInfo`].
    pub fn info(&self) -> PodInfo {
        let pod: Pod = serde_json::from_value(self.json()).unwrap();
        PodInfo::from_pod(&pod)
    }
}

/// A simulated-backend configuration for tests: fast sampling and directory polling, an ephemeral
/// metrics port, the given device-plugin directory.
pub fn test_config(node: &str, dir: &Path) -> Config {
    let mut c = Config::new(node, BackendKind::Simulated);
    c.device_plugin_dir = PathBuf::from(dir);
    c.metrics_addr = "127.0.0.1:0".parse().unwrap();
    c.backend.sample_interval = Duration::from_millis(20);
    c.watch_interval = Duration::from_millis(50);
    c.replicas = 4;
    c
}

/// GET `path` from `addr` over HTTP/1.1; returns (status code, body).
pub async fn http_get(addr: std::net::SocketAddr, path: &str) -> (u16, String) {
    let mut stream = tokio::net::TcpStream::connect(addr).await.expect("connect");
    let req = format!("GET {path} HTTP/1.1\r\nHost: test\r\nConnection: close\r\n\r\n");
    stream.write_all(req.as_bytes()).await.unwrap();
    let mut raw = Vec::new();
    stream.read_to_end(&mut raw).await.unwrap();
    let text = String::from_utf8_lossy(&raw).to_string();
    let (head, body) = text.split_once("\r\n\r\n").unwrap_or((&text, ""));
    let code = head
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or(0);
    (code, body.to_string())
}

/// Poll `f` until it returns `Some` or `within` passes.
pub async fn eventually<T, F, Fut>(within: Duration, mut f: F) -> T
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<T>>,
{
    let deadline = tokio::time::Instant::now() + within;
    loop {
        if let Some(v) = f().await {
            return v;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "condition not met within {within:?}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}
