//! Serving gRPC on a Unix socket.

use std::io;
use std::path::{Path, PathBuf};

use tokio::net::UnixListener;
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tokio_stream::wrappers::UnixListenerStream;
use tonic::service::Routes;
use tonic::transport::Server;
use tracing::{info, warn};

/// Serve `routes` on a new socket at `path` until `stop` turns true, then remove the socket.
///
/// A file left at `path` by an earlier run is removed first (a socket nobody serves would make
/// the kubelet's dial fail); the directory is created when missing.
pub fn serve_unix(
    path: &Path,
    routes: Routes,
    mut stop: watch::Receiver<bool>,
) -> io::Result<JoinHandle<()>> {
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir)?;
    }
    match std::fs::remove_file(path) {
        Ok(()) => {}
        Err(e) if e.kind() == io::ErrorKind::NotFound => {}
        Err(e) => return Err(e),
    }
    let listener = UnixListener::bind(path)?;
    let path: PathBuf = path.to_path_buf();
    info!(socket = %path.display(), "serving");
    Ok(tokio::spawn(async move {
        let served = Server::builder()
            .add_routes(routes)
            .serve_with_incoming_shutdown(UnixListenerStream::new(listener), async move {
                crate::driver::stopped(&mut stop).await;
            })
            .await;
        if let Err(e) = served {
            warn!(socket = %path.display(), "gRPC server ended: {e}");
        }
        let _ = std::fs::remove_file(&path);
    }))
}
