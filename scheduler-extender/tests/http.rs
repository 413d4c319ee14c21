//! The server over real loopback sockets: plain HTTP, HTTPS, 400s, metrics,
//! graceful shutdown.

mod common;

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;

use carma_scheduler_extender::server::{TlsFiles, install_crypto_provider, serve};
use carma_scheduler_extender::{Extender, router};
use common::*;
use http::{Request, StatusCode};
use http_body_util::{BodyExt, Full};
use hyper::body::Bytes;
use hyper_util::client::legacy::Client;
use hyper_util::rt::{TokioExecutor, TokioIo};
use serde_json::Value;
use tokio::sync::oneshot;

struct Running {
    addr: SocketAddr,
    stop: Option<oneshot::Sender<()>>,
    task: tokio::task::JoinHandle<Result<(), carma_scheduler_extender::server::ServeError>>,
}

fn start(ext: Arc<Extender>, tls: Option<TlsFiles>) -> Running {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    let (tx, rx) = oneshot::channel::<()>();
    let task = tokio::spawn(serve(listener, router(ext), tls, async {
        let _ = rx.await;
    }));
    Running {
        addr,
        stop: Some(tx),
        task,
    }
}

async fn send(addr: SocketAddr, method: &str, path: &str, body: Vec<u8>) -> (StatusCode, Vec<u8>) {
    let client = Client::builder(TokioExecutor::new()).build_http::<Full<Bytes>>();
    let req = Request::builder()
        .method(method)
        .uri(format!("http://{addr}{path}"))
        .header("content-type", "application/json")
        .body(Full::new(Bytes::from(body)))
        .unwrap();
    let resp = client.request(req).await.unwrap();
    let status = resp.status();
    (
        status,
        resp.into_body()
            .collect()
            .await
            .unwrap()
            .to_bytes()
            .to_vec(),
    )
}

#[tokio::test]
async fn verbs_over_a_loopback_socket() {
    let (ext, _) = fixture_extender();
    let mut server = start(ext, None);
    let pod = fixture_pod("pending-override");

    let body = serde_json::to_vec(&args_names(&pod, &["gpu-node-a", "gpu-node-b"])).unwrap();
    let (status, out) = send(server.addr, "POST", "/filter", body.clone()).await;
    assert_eq!(status, StatusCode::OK);
    let out: Value = serde_json::from_slice(&out).unwrap();
    assert_eq!(passing(&out), vec!["gpu-node-a", "gpu-node-b"]);

    let (status, out) = send(server.addr, "POST", "/prioritize", body).await;
    assert_eq!(status, StatusCode::OK);
    let out: Value = serde_json::from_slice(&out).unwrap();
    assert_eq!(out.as_array().unwrap().len(), 2);

    let (status, out) = send(
        server.addr,
        "POST",
        "/bind",
        serde_json::to_vec(&bind_args(&pod, "gpu-node-a")).unwrap(),
    )
    .await;
    assert_eq!(status, StatusCode::OK);
    let out: Value = serde_json::from_slice(&out).unwrap();
    assert_eq!(out["Error"], "");

    let (status, out) = send(server.addr, "POST", "/filter", b"this is not json".to_vec()).await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    let out: Value = serde_json::from_slice(&out).unwrap();
    assert!(
        out["Error"]
            .as_str()
            .unwrap()
            .starts_with("malformed /filter request"),
        "{out}"
    );

    let (status, metrics) = send(server.addr, "GET", "/metrics", Vec::new()).await;
    assert_eq!(status, StatusCode::OK);
    let metrics = String::from_utf8(metrics).unwrap();
    for line in [
        r#"carma_extender_requests_total{verb="filter",outcome="success"} 1"#,
        r#"carma_extender_requests_total{verb="filter",outcome="bad-request"} 1"#,
        r#"carma_extender_requests_total{verb="prioritize",outcome="success"} 1"#,
        r#"carma_extender_requests_total{verb="bind",outcome="success"} 1"#,
        r#"carma_extender_request_duration_seconds_count{verb="filter"} 2"#,
        r#"carma_extender_reservations_total{source="override"} 1"#,
        r#"carma_extender_binds_total{result="recorded"} 1"#,
        "carma_extender_placements_in_flight 2",
    ] {
        assert!(metrics.contains(line), "{line} missing from\n{metrics}");
    }
    assert_eq!(
        send(server.addr, "GET", "/readyz", Vec::new()).await.0,
        StatusCode::OK
    );

    // Graceful shutdown: the server returns once asked to stop.
    server.stop.take().unwrap().send(()).unwrap();
    tokio::time::timeout(std::time::Duration::from_secs(15), server.task)
        .await
        .expect("server stops")
        .unwrap()
        .unwrap();
}

fn tls_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/tls")
}

#[tokio::test]
async fn https_with_the_given_certificate() {
    use rustls::pki_types::pem::PemObject;
    use rustls::pki_types::{CertificateDer, ServerName};

    let (ext, _) = fixture_extender();
    let server = start(
        ext,
        Some(TlsFiles {
            cert: tls_dir().join("cert.pem"),
            key: tls_dir().join("key.pem"),
        }),
    );
    install_crypto_provider();
    let mut roots = rustls::RootCertStore::empty();
    roots
        .add(CertificateDer::from_pem_file(tls_dir().join("cert.pem")).unwrap())
        .unwrap();
    let config = rustls::ClientConfig::builder()
        .with_root_certificates(roots)
        .with_no_client_auth();
    let connector = tokio_rustls::TlsConnector::from(Arc::new(config));
    // The server may still be loading its certificate: retry the connect briefly.
    let mut tls = None;
    for _ in 0..50 {
        if let Ok(tcp) = tokio::net::TcpStream::connect(server.addr).await
            && let Ok(s) = connector
                .connect(ServerName::try_from("localhost").unwrap(), tcp)
                .await
        {
            tls = Some(s);
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    let tls = tls.expect("TLS handshake with the extender");
    let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(tls))
        .await
        .unwrap();
    tokio::spawn(conn);
    let pod = fixture_pod("pending-override");
    let req = Request::post("/filter")
        .header("host", "localhost")
        .header("content-type", "application/json")
        .body(Full::new(Bytes::from(
            serde_json::to_vec(&args_names(&pod, &["gpu-node-a"])).unwrap(),
        )))
        .unwrap();
    let resp = sender.send_request(req).await.unwrap();
    assert_eq!(resp.status(), StatusCode::OK);
    let out: Value =
        serde_json::from_slice(&resp.into_body().collect().await.unwrap().to_bytes()).unwrap();
    assert_eq!(passing(&out), vec!["gpu-node-a"]);
}

#[tokio::test]
async fn missing_certificate_is_reported() {
    let (ext, _) = fixture_extender();
    let server = start(
        ext,
        Some(TlsFiles {
            cert: tls_dir().join("absent.pem"),
            key: tls_dir().join("key.pem"),
        }),
    );
    let err = server.task.await.unwrap().unwrap_err();
    assert!(err.to_string().contains("absent.pem"), "{err}");
}
