//! Serving gRPC on a Unix socket.

use std::io;
use std::path::{Path, PathBuf};

use futures::Stream;
use tokio::io::{AsyncRead, AsyncWrite, AsyncWriteExt, DuplexStream};
use tokio::net::UnixListener;
use tokio::sync::{mpsc, watch};
use tokio::task::JoinHandle;
use tokio_stream::wrappers::{ReceiverStream, UnixListenerStream};
use tonic::service::Routes;
use tonic::transport::Server;
use tonic::transport::server::Connected;
use tracing::{debug, info, warn};

use crate::authority::forward_fixing_authority;
use crate::driver::stopped;

/// Buffer between a connection and its authority fix, each way.
const DUPLEX_BUFFER: usize = 64 * 1024;

/// Serve `routes` on a new socket at `path` until `stop` turns true, then remove the socket.
pub fn serve_unix(
    path: &Path,
    routes: Routes,
    stop: watch::Receiver<bool>,
) -> io::Result<JoinHandle<()>> {
    let listener = bind(path)?;
    Ok(spawn_server(
        UnixListenerStream::new(listener),
        routes,
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
    stop: watch::Receiver<bool>,
) -> io::Result<JoinHandle<()>> {
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
    Ok(spawn_server(
        ReceiverStream::new(rx),
        routes,
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

fn spawn_server<I, IO>(
    incoming: I,
    routes: Routes,
    mut stop: watch::Receiver<bool>,
    path: PathBuf,
) -> JoinHandle<()>
where
    I: Stream<Item = io::Result<IO>> + Send + 'static,
    IO: AsyncRead + AsyncWrite + Connected + Unpin + Send + 'static,
{
    info!(socket = %path.display(), "serving");
    tokio::spawn(async move {
        let served = Server::builder()
            .add_routes(routes)
            .serve_with_incoming_shutdown(incoming, async move {
                stopped(&mut stop).await;
            })
            .await;
        if let Err(e) = served {
            warn!(socket = %path.display(), "gRPC server ended: {e}");
        }
        let _ = std::fs::remove_file(&path);
    })
}
