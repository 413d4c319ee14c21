//! The operator's HTTP server under hostile clients: a connection
//! that sends nothing is closed; unknown paths and methods are explained.

use std::sync::Arc;
use std::time::{Duration, Instant};

use carma_operator::metrics::Metrics;
use carma_operator::server::{Health, bind, serve_with_timeout};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

async fn start(idle: Duration) -> (std::net::SocketAddr, tokio::sync::oneshot::Sender<()>) {
    let listener = bind("127.0.0.1:0".parse().unwrap()).await.unwrap();
    let addr = listener.local_addr().unwrap();
    let (tx, rx) = tokio::sync::oneshot::channel::<()>();
    tokio::spawn(serve_with_timeout(
        listener,
        Arc::new(Metrics::new()),
        Arc::new(Health::default()),
        idle,
        async move {
            let _ = rx.await;
        },
    ));
    (addr, tx)
}

/// Read until the server closes the connection; everything read.
async fn until_closed(s: &mut tokio::net::TcpStream) -> String {
    let mut out = Vec::new();
    let mut buf = [0u8; 4096];
    loop {
        match tokio::time::timeout(Duration::from_secs(10), s.read(&mut buf)).await {
            Ok(Ok(0)) | Ok(Err(_)) => return String::from_utf8_lossy(&out).into_owned(),
            Ok(Ok(n)) => out.extend_from_slice(&buf[..n]),
            Err(_) => panic!("the connection is still open after 10 s"),
        }
    }
}

#[tokio::test]
async fn a_connection_that_sends_nothing_is_closed() {
    let (addr, _stop) = start(Duration::from_millis(300)).await;
    let start = Instant::now();
    let mut silent = tokio::net::TcpStream::connect(addr).await.unwrap();
    assert_eq!(until_closed(&mut silent).await, "");
    assert!(start.elapsed() < Duration::from_secs(3));

    // Served, then let go once idle.
    let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
    s.write_all(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
        .await
        .unwrap();
    let answer = until_closed(&mut s).await;
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
}

#[tokio::test]
async fn unknown_paths_and_methods_are_explained() {
    let (addr, _stop) = start(Duration::from_secs(5)).await;
    for (request, status, text) in [
        ("GET /nope", "HTTP/1.1 404", "no route GET /nope; routes: "),
        (
            "POST /readyz",
            "HTTP/1.1 405",
            "method POST is not allowed on /readyz; use GET (routes: ",
        ),
    ] {
        let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
        s.write_all(
            format!(
                "{request} HTTP/1.1\r\nHost: x\r\nConnection: close\r\nContent-Length: 0\r\n\r\n"
            )
            .as_bytes(),
        )
        .await
        .unwrap();
        let answer = until_closed(&mut s).await;
        assert!(answer.starts_with(status), "{answer}");
        assert!(answer.contains(text), "{answer}");
        assert_eq!(
            answer.to_ascii_lowercase().contains("\r\nallow: get\r\n"),
            status.ends_with("405"),
            "{answer}"
        );
        assert!(answer.contains("GET /metrics"), "{answer}");
    }
}
