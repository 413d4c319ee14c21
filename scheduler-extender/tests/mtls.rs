//! Mutual TLS between kube-scheduler and the extender, over real loopback
//! sockets: with a client CA bundle the extender serves only callers whose
//! certificate chains to it; the bundle and the server certificate are
//! reloaded from disk while serving; health and metrics stay reachable on a
//! separate plain-HTTP listener.
//!
//! Every certificate is made here, per test, with rcgen: a CA that signs the
//! server and the scheduler's client certificate, and a second, unrelated CA.

mod common;

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use carma_scheduler_extender::server::{ServeError, TlsFiles, TlsSettings, serve, serve_with};
use carma_scheduler_extender::{Extender, metrics_router, router};
use common::*;
use http::{Request, StatusCode};
use http_body_util::{BodyExt, Full};
use hyper::body::Bytes;
use hyper_util::rt::TokioIo;
use rcgen::{
    BasicConstraints, CertificateParams, CertifiedIssuer, DnType, ExtendedKeyUsagePurpose, IsCa,
    KeyPair, KeyUsagePurpose,
};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};
use serde_json::Value;
use tokio::sync::oneshot;

/// A certificate authority.
struct Ca {
    issuer: CertifiedIssuer<'static, KeyPair>,
}

impl Ca {
    fn new(name: &str) -> Ca {
        let mut params = CertificateParams::default();
        params.distinguished_name.push(DnType::CommonName, name);
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params.key_usages = vec![
            KeyUsagePurpose::KeyCertSign,
            KeyUsagePurpose::CrlSign,
            KeyUsagePurpose::DigitalSignature,
        ];
        Ca {
            issuer: CertifiedIssuer::self_signed(params, KeyPair::generate().unwrap()).unwrap(),
        }
    }

    fn pem(&self) -> String {
        self.issuer.pem()
    }

    /// A leaf certificate and its key (PEM) for `names`, with one extended key usage.
    fn issue(&self, cn: &str, names: &[&str], usage: ExtendedKeyUsagePurpose) -> Leaf {
        let mut params =
            CertificateParams::new(names.iter().map(|n| n.to_string()).collect::<Vec<_>>())
                .unwrap();
        params.distinguished_name.push(DnType::CommonName, cn);
        params.key_usages = vec![
            KeyUsagePurpose::DigitalSignature,
            KeyUsagePurpose::KeyEncipherment,
        ];
        params.extended_key_usages = vec![usage];
        let key = KeyPair::generate().unwrap();
        let cert = params.signed_by(&key, &self.issuer).unwrap();
        Leaf {
            cert: cert.pem(),
            key: key.serialize_pem(),
        }
    }

    fn server(&self) -> Leaf {
        self.issue(
            "carma-scheduler-extender",
            &["localhost", "127.0.0.1"],
            ExtendedKeyUsagePurpose::ServerAuth,
        )
    }

    fn client(&self, cn: &str) -> Leaf {
        self.issue(cn, &[], ExtendedKeyUsagePurpose::ClientAuth)
    }
}

/// A certificate and its private key, PEM.
struct Leaf {
    cert: String,
    key: String,
}

/// The files the extender reads: server certificate and key, client CA bundle.
struct Files {
    dir: tempfile::TempDir,
}

impl Files {
    fn new(server: &Leaf, client_ca_pem: &str) -> Files {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("tls.crt"), &server.cert).unwrap();
        std::fs::write(dir.path().join("tls.key"), &server.key).unwrap();
        std::fs::write(dir.path().join("client-ca.crt"), client_ca_pem).unwrap();
        Files { dir }
    }

    fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    fn settings(&self, reload_interval: Duration) -> TlsSettings {
        TlsSettings {
            files: TlsFiles {
                cert: self.path("tls.crt"),
                key: self.path("tls.key"),
            },
            client_ca: Some(self.path("client-ca.crt")),
            reload_interval,
        }
    }

    /// Replace a file the way the kubelet updates a mounted Secret: write
    /// aside, then rename over it.
    fn replace(&self, name: &str, content: &str) {
        let aside = self.path(&format!(".{name}.new"));
        std::fs::write(&aside, content).unwrap();
        std::fs::rename(aside, self.path(name)).unwrap();
    }
}

struct Running {
    addr: SocketAddr,
    stop: Option<oneshot::Sender<()>>,
    task: tokio::task::JoinHandle<Result<(), ServeError>>,
}

impl Running {
    async fn stop(mut self) -> Result<(), ServeError> {
        let _ = self.stop.take().unwrap().send(());
        tokio::time::timeout(Duration::from_secs(15), self.task)
            .await
            .expect("server stops")
            .unwrap()
    }
}

fn start(ext: Arc<Extender>, tls: TlsSettings) -> Running {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    let (tx, rx) = oneshot::channel::<()>();
    let task = tokio::spawn(serve_with(listener, router(ext), Some(tls), async {
        let _ = rx.await;
    }));
    Running {
        addr,
        stop: Some(tx),
        task,
    }
}

fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

/// kube-scheduler's side: trusts `server_ca`, presents `client` if given.
fn client_config(server_ca: &Ca, client: Option<&Leaf>) -> Arc<rustls::ClientConfig> {
    client_config_trusting(&[server_ca], client)
}

/// kube-scheduler's side: trusts every CA of `server_cas` for the server's
/// certificate, presents `client` if given.
fn client_config_trusting(server_cas: &[&Ca], client: Option<&Leaf>) -> Arc<rustls::ClientConfig> {
    let mut roots = rustls::RootCertStore::empty();
    for ca in server_cas {
        roots
            .add(CertificateDer::from_pem_slice(ca.pem().as_bytes()).unwrap())
            .unwrap();
    }
    let builder = rustls::ClientConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(roots);
    Arc::new(match client {
        None => builder.with_no_client_auth(),
        Some(leaf) => builder
            .with_client_auth_cert(
                CertificateDer::pem_slice_iter(leaf.cert.as_bytes())
                    .collect::<Result<Vec<_>, _>>()
                    .unwrap(),
                PrivateKeyDer::from_pem_slice(leaf.key.as_bytes()).unwrap(),
            )
            .unwrap(),
    })
}

/// POST /filter over HTTPS with `config`. `Ok`: the status and body of the
/// answer; `Err`: why no answer came (handshake refused, connection closed).
async fn filter(
    addr: SocketAddr,
    config: Arc<rustls::ClientConfig>,
) -> Result<(StatusCode, Value), String> {
    let tcp = tokio::net::TcpStream::connect(addr)
        .await
        .map_err(|e| format!("connect: {e}"))?;
    let tls = tokio_rustls::TlsConnector::from(config)
        .connect(ServerName::try_from("localhost").unwrap(), tcp)
        .await
        .map_err(|e| format!("TLS handshake: {e}"))?;
    let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(tls))
        .await
        .map_err(|e| format!("HTTP handshake: {e}"))?;
    tokio::spawn(conn);
    let pod = fixture_pod("pending-override");
    let req = Request::post("/filter")
        .header("host", "localhost")
        .header("content-type", "application/json")
        .body(Full::new(Bytes::from(
            serde_json::to_vec(&args_names(&pod, &["gpu-node-a"])).unwrap(),
        )))
        .unwrap();
    // TLS 1.3 servers check the client certificate after the client's side of
    // the handshake is done: a refusal shows as an alert on the first read.
    let resp = sender
        .send_request(req)
        .await
        .map_err(|e| format!("request: {}", chain(&e)))?;
    let status = resp.status();
    let body = resp
        .into_body()
        .collect()
        .await
        .map_err(|e| format!("body: {e}"))?
        .to_bytes();
    Ok((status, serde_json::from_slice(&body).unwrap_or(Value::Null)))
}

/// An error and its sources, joined.
fn chain(e: &dyn std::error::Error) -> String {
    let mut text = e.to_string();
    let mut source = e.source();
    while let Some(s) = source {
        text.push_str(&format!(": {s}"));
        source = s.source();
    }
    text
}

/// A call that must be served.
async fn accepted(addr: SocketAddr, config: Arc<rustls::ClientConfig>) {
    let (status, out) = tokio::time::timeout(Duration::from_secs(10), filter(addr, config))
        .await
        .expect("answer within 10 s")
        .expect("the extender serves this client");
    assert_eq!(status, StatusCode::OK);
    assert_eq!(passing(&out), vec!["gpu-node-a"]);
}

/// A call that must get no answer at all, with the reason.
async fn refused(addr: SocketAddr, config: Arc<rustls::ClientConfig>) -> String {
    match tokio::time::timeout(Duration::from_secs(10), filter(addr, config))
        .await
        .expect("outcome within 10 s")
    {
        Ok((status, out)) => panic!("the extender answered {status} {out} to a refused client"),
        Err(why) => why,
    }
}

#[tokio::test]
async fn only_clients_with_a_certificate_from_the_client_ca_are_served() {
    let ca = Ca::new("carma test CA");
    let other = Ca::new("some other CA");
    let files = Files::new(&ca.server(), &ca.pem());
    let (ext, _) = fixture_extender();
    let server = start(Arc::clone(&ext), files.settings(Duration::ZERO));

    // The scheduler's certificate, signed by the client CA: served.
    accepted(
        server.addr,
        client_config(&ca, Some(&ca.client("carma-scheduler"))),
    )
    .await;

    // No certificate at all.
    let why = refused(server.addr, client_config(&ca, None)).await;
    assert!(why.contains("CertificateRequired"), "{why}");
    // A certificate from another CA.
    let why = refused(
        server.addr,
        client_config(&ca, Some(&other.client("carma-scheduler"))),
    )
    .await;
    assert!(why.contains("UnknownCA"), "{why}");
    // A certificate from the right CA but for serving, not for clients.
    let why = refused(
        server.addr,
        client_config(
            &ca,
            Some(&ca.issue(
                "not-a-client",
                &["localhost"],
                ExtendedKeyUsagePurpose::ServerAuth,
            )),
        ),
    )
    .await;
    assert!(why.contains("alert"), "{why}");
    // A self-signed certificate.
    let selfsigned = Ca::new("self");
    let why = refused(
        server.addr,
        client_config(
            &ca,
            Some(&Leaf {
                cert: selfsigned.pem(),
                key: selfsigned.issuer.key().serialize_pem(),
            }),
        ),
    )
    .await;
    assert!(why.contains("alert"), "{why}");

    // Refused callers reached no verb: only the accepted filter was counted.
    let metrics = ext.metrics().encode();
    let filters: Vec<&str> = metrics
        .lines()
        .filter(|l| l.starts_with(r#"carma_extender_requests_total{verb="filter""#))
        .collect();
    assert_eq!(
        filters,
        vec![r#"carma_extender_requests_total{verb="filter",outcome="success"} 1"#],
        "{metrics}"
    );
    server.stop().await.unwrap();
}

#[tokio::test]
async fn every_ca_of_the_bundle_is_trusted() {
    let ca = Ca::new("carma test CA");
    let next = Ca::new("carma next CA");
    let outsider = Ca::new("outsider CA");
    let files = Files::new(&ca.server(), &format!("{}{}", ca.pem(), next.pem()));
    let (ext, _) = fixture_extender();
    let server = start(ext, files.settings(Duration::ZERO));
    accepted(server.addr, client_config(&ca, Some(&ca.client("a")))).await;
    accepted(server.addr, client_config(&ca, Some(&next.client("b")))).await;
    let why = refused(server.addr, client_config(&ca, Some(&outsider.client("c")))).await;
    assert!(why.contains("UnknownCA"), "{why}");
    server.stop().await.unwrap();
}

#[tokio::test]
async fn a_changed_client_ca_bundle_and_certificate_apply_without_a_restart() {
    let old = Ca::new("old CA");
    let new = Ca::new("new CA");
    let files = Files::new(&old.server(), &old.pem());
    let (ext, _) = fixture_extender();
    let server = start(ext, files.settings(Duration::from_millis(100)));
    // Both clients accept the server's certificate from either CA, so that a
    // refusal below is the server's verdict on the client certificate.
    let old_client = client_config_trusting(&[&old, &new], Some(&old.client("carma-scheduler")));
    let new_client = client_config_trusting(&[&old, &new], Some(&new.client("carma-scheduler")));
    accepted(server.addr, Arc::clone(&old_client)).await;
    let why = refused(server.addr, Arc::clone(&new_client)).await;
    assert!(why.contains("UnknownCA"), "{why}");

    // Rotate everything to the new CA, as cert-manager and the kubelet would.
    let cert = new.server();
    files.replace("tls.key", &cert.key);
    files.replace("tls.crt", &cert.cert);
    files.replace("client-ca.crt", &new.pem());
    let mut served = false;
    for _ in 0..100 {
        tokio::time::sleep(Duration::from_millis(100)).await;
        if filter(server.addr, Arc::clone(&new_client)).await.is_ok() {
            served = true;
            break;
        }
    }
    assert!(served, "the new CA's client was not served after 10 s");
    accepted(server.addr, Arc::clone(&new_client)).await;
    let why = refused(server.addr, old_client).await;
    assert!(why.contains("UnknownCA"), "{why}");
    // The server now presents the new certificate: a client trusting only the
    // old CA refuses it.
    let why = refused(
        server.addr,
        client_config(&old, Some(&old.client("carma-scheduler"))),
    )
    .await;
    assert!(why.contains("UnknownIssuer"), "{why}");

    // A broken bundle is not taken: the working configuration stays.
    files.replace("client-ca.crt", "not a certificate\n");
    tokio::time::sleep(Duration::from_millis(400)).await;
    accepted(server.addr, new_client).await;
    server.stop().await.unwrap();
}

#[tokio::test]
async fn an_unusable_client_ca_file_is_reported() {
    let ca = Ca::new("carma test CA");
    for (content, expect) in [
        (None, "absent-ca.crt"),
        (Some("no PEM here\n"), "no CERTIFICATE block"),
        (Some(""), "client-ca.crt"),
    ] {
        let files = Files::new(&ca.server(), content.unwrap_or(""));
        let mut settings = files.settings(Duration::ZERO);
        if content.is_none() {
            settings.client_ca = Some(files.path("absent-ca.crt"));
        }
        let (ext, _) = fixture_extender();
        let server = start(ext, settings);
        let err = tokio::time::timeout(Duration::from_secs(10), server.task)
            .await
            .expect("the server gives up at once")
            .unwrap()
            .unwrap_err();
        assert!(matches!(err, ServeError::ClientCa { .. }), "{err:?}");
        assert!(err.to_string().contains(expect), "{err}");
    }
}

async fn get_plain(addr: SocketAddr, path: &str) -> StatusCode {
    let tcp = tokio::net::TcpStream::connect(addr).await.unwrap();
    let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(tcp))
        .await
        .unwrap();
    tokio::spawn(conn);
    let req = Request::get(path)
        .header("host", "localhost")
        .body(Full::new(Bytes::new()))
        .unwrap();
    sender.send_request(req).await.unwrap().status()
}

#[tokio::test]
async fn health_and_metrics_stay_open_on_the_separate_listener() {
    let ca = Ca::new("carma test CA");
    let files = Files::new(&ca.server(), &ca.pem());
    let (ext, _) = fixture_extender();
    let server = start(Arc::clone(&ext), files.settings(Duration::ZERO));
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let plain = listener.local_addr().unwrap();
    let (tx, rx) = oneshot::channel::<()>();
    let metrics = tokio::spawn(serve(listener, metrics_router(ext), None, async {
        let _ = rx.await;
    }));

    assert_eq!(get_plain(plain, "/healthz").await, StatusCode::OK);
    assert_eq!(get_plain(plain, "/readyz").await, StatusCode::OK);
    assert_eq!(get_plain(plain, "/metrics").await, StatusCode::OK);
    // The verbs are not on the open listener ...
    assert_eq!(get_plain(plain, "/filter").await, StatusCode::NOT_FOUND);
    // ... and the TLS listener wants a client certificate for everything.
    let why = refused(server.addr, client_config(&ca, None)).await;
    assert!(why.contains("CertificateRequired"), "{why}");

    tx.send(()).unwrap();
    metrics.await.unwrap().unwrap();
    server.stop().await.unwrap();
}

#[test]
fn settings_from_plain_files_ask_for_no_client_certificate() {
    let s = TlsSettings::from(TlsFiles {
        cert: Path::new("c").into(),
        key: Path::new("k").into(),
    });
    assert!(s.client_ca.is_none());
    assert!(!s.reload_interval.is_zero());
}
