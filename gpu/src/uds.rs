//! A gRPC client over a Unix socket: how a node agent reaches the kubelet's sockets and checks its
//! own.

use std::io;
use std::path::Path;

use hyper_util::rt::TokioIo;
use tokio::net::UnixStream;
use tonic::transport::{Channel, Endpoint, Uri};
use tower::service_fn;

/// A tonic channel over the Unix socket at `path` (any URI works; the socket is what counts).
pub async fn uds_channel(path: impl AsRef<Path>) -> Result<Channel, tonic::transport::Error> {
    let path = path.as_ref().to_path_buf();
    Endpoint::from_static("http://[::]:50051")
        .connect_with_connector(service_fn(move |_: Uri| {
            let path = path.clone();
            async move { Ok::<_, io::Error>(TokioIo::new(UnixStream::connect(path).await?)) }
        }))
        .await
}
