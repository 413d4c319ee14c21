//! Serving gRPC on a Unix socket, with `grpc.health.v1` next to the socket's service: SERVING
//! (for the whole server, `""`, and for the service's name) while the server runs, NOT_SERVING
//! once it is told to stop. A server task ends only when told to stop; any other end is an
//! [`Err`] the driver ends the process on ([`crate::driver::RunningDriver::run_until`]).

use std::future::Future;
use std::io;
use std::path::{Path, PathBuf};

use futures::Stream;
use tokio::io::{AsyncRead, AsyncWrite, AsyncWriteExt, DuplexStream};
use tokio::net::UnixListener;
use tokio::sync::{mpsc, watch};
use tokio_stream::wrappers::{ReceiverStream, UnixListenerStream};
use tonic::service::Routes;
use tonic::transport::Server;
use tonic::transport::server::Connected;
use tonic_health::ServingStatus;
use tracing::{debug, error, info, warn};

use crate::authority::forward_fixing_authority;
use crate::stopped;

/// Buffer between a connection and its authority fix, each way.
const DUPLEX_BUFFER: usize = 64 * 1024;

/// What a server task ends with: `Ok` when it stopped because it was told to, else why it ended.
pub type ServerEnd = Result<(), String>;

/// Serve `routes` (whose service is named `service`) and the health service on a new socket at
/// `path` until `stop` turns true, then remove the socket.
pub fn serve_unix(
    path: &Path,
    routes: Routes,
    service: &'static str,
    stop: watch::Receiver<bool>,
) -> io::Result<impl Future<Output = ServerEnd> + Send + 'static> {
    let listener = bind(path)?;
    Ok(server(
        UnixListenerStream::new(listener),
        routes,
        service,
        stop,
        path.to_path_buf(),
    ))
}

/// Like [`serve_unix`], but every connection's requests pass through
/// [`forward_fixing_authority`] first: for the kubelet's plugin watcher, whose `:authority` tonic
/// would reject (see [`crate::authority`]).
pub fn serve_unix_fixing_authority(
    path: &Path,
    routes: Routes,
    service: &'static str,
    stop: watch::Receiver<bool>,
) -> io::Result<impl Future<Output = ServerEnd> + Send + 'static> {
    let listener = bind(path)?;
    let (tx, rx) = mpsc::channel::<io::Result<DuplexStream>>(16);
    let mut stop_accepting = stop.clone();
    tokio::spawn(async move {
        loop {
            let accepted = tokio::select! {
                a = listener.accept() => a,
                _ = stopped(&mut stop_accepting) => return,
            };
            let (unix, _) = match accepted {
                Ok(c) => c,
                Err(e) => {
                    warn!("accept failed: {e}");
                    tokio::time::sleep(std::time::Duration::from_millis(100)).await;
                    continue;
                }
            };
            let (client_side, server_side) = tokio::io::duplex(DUPLEX_BUFFER);
            let (unix_read, unix_write) = unix.into_split();
            let (from_server, to_server) = tokio::io::split(client_side);
            tokio::spawn(async move {
                if let Err(e) = forward_fixing_authority(unix_read, to_server).await {
                    debug!("registration connection ended: {e}");
                }
            });
            tokio::spawn(copy_then_shutdown(from_server, unix_write));
            if tx.send(Ok(server_side)).await.is_err() {
                return;
            }
        }
    });
    Ok(server(
        ReceiverStream::new(rx),
        routes,
        service,
        stop,
        path.to_path_buf(),
    ))
}

async fn copy_then_shutdown<R, W>(mut from: R, mut to: W)
where
    R: AsyncRead + Unpin,
    W: AsyncWrite + Unpin,
{
    let _ = tokio::io::copy(&mut from, &mut to).await;
    let _ = to.shutdown().await;
}

/// Bind a new socket at `path`. A file left there by an earlier run is removed first (a socket
/// nobody serves would make the kubelet's dial fail); the directory is created when missing.
fn bind(path: &Path) -> io::Result<UnixListener> {
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir)?;
    }
    match std::fs::remove_file(path) {
        Ok(()) => {}
        Err(e) if e.kind() == io::ErrorKind::NotFound => {}
        Err(e) => return Err(e),
    }
    UnixListener::bind(path)
}

/// Serve `routes` and the health service on `incoming` until `stop`: a future to run as a task,
/// ending with the [`ServerEnd`]. The socket at `path` is removed when it ends.
pub fn server<I, IO>(
    incoming: I,
    routes: Routes,
    service: &'static str,
    mut stop: watch::Receiver<bool>,
    path: PathBuf,
) -> impl Future<Output = ServerEnd> + Send + 'static
where
    I: Stream<Item = io::Result<IO>> + Send + 'static,
    IO: AsyncRead + AsyncWrite + Connected + Unpin + Send + 'static,
{
    info!(socket = %path.display(), "serving");
    let (reporter, health) = tonic_health::server::health_reporter();
    let routes = routes.add_service(health);
    async move {
        for name in ["", service] {
            reporter
                .set_service_status(name, ServingStatus::Serving)
                .await;
        }
        let told = reporter.clone();
        let asked = stop.clone();
        let served = Server::builder()
            .add_routes(routes)
            .serve_with_incoming_shutdown(incoming, async move {
                stopped(&mut stop).await;
                for name in ["", service] {
                    told.set_service_status(name, ServingStatus::NotServing)
                        .await;
                }
            })
            .await;
        let _ = std::fs::remove_file(&path);
        // Told to stop, or the sender (the running driver) is gone.
        let stopping = *asked.borrow() || asked.has_changed().is_err();
        if !stopping {
            for name in ["", service] {
                reporter
                    .set_service_status(name, ServingStatus::NotServing)
                    .await;
            }
        }
        match served {
            Ok(()) if stopping => Ok(()),
            Ok(()) => {
                error!(socket = %path.display(), "gRPC server ended without being told to stop");
                Err(format!(
                    "gRPC server on {} ended without being told to stop",
                    path.display()
                ))
            }
            Err(e) => {
                error!(socket = %path.display(), "gRPC server failed: {e}");
                Err(format!("gRPC server on {} failed: {e}", path.display()))
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_server_whose_connections_stop_coming_ends_with_an_error() {
        let (_stop_tx, stop) = watch::channel(false);
        let dir = tempfile::tempdir().unwrap();
        let end = server(
            futures::stream::empty::<io::Result<DuplexStream>>(),
            Routes::default(),
            "test.Service",
            stop,
            dir.path().join("x.sock"),
        )
        .await;
        let why = end.unwrap_err();
        assert!(why.contains("ended without being told to stop"), "{why}");
    }

    #[tokio::test]
    async fn a_server_told_to_stop_ends_ok() {
        let (stop_tx, stop) = watch::channel(false);
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("x.sock");
        let serving =
            tokio::spawn(serve_unix(&path, Routes::default(), "test.Service", stop).unwrap());
        crate::health::check_socket(&path, std::time::Duration::from_secs(5))
            .await
            .unwrap();
        stop_tx.send_replace(true);
        assert_eq!(serving.await.unwrap(), Ok(()));
        assert!(!path.exists(), "the socket is removed");
    }
}
