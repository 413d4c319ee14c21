//! Hostile input and bounded resources: the body limit and its
//! 413, request text cut in answers, bodies on 404/405, connections that send
//! nothing, and TLS files that cannot be used.

mod common;

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use carma_scheduler_extender::clip::LOGGED_INPUT_LIMIT;
use carma_scheduler_extender::server::{
    BIND_BODY_LIMIT, BODY_LIMIT, BODY_READ_TIMEOUT, PLACEMENT_CONCURRENCY, ServeError, TlsFiles,
    TlsSettings, serve_with_timeout,
};
use carma_scheduler_extender::wire::{MAX_CANDIDATES, MAX_POD_VALUES};
use carma_scheduler_extender::{metrics_router, router, router_with_limit};
use common::*;
use http::{Request, StatusCode};
use rcgen::{CertificateParams, KeyPair};
use serde_json::{Value, json};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::sync::oneshot;
use tower::ServiceExt;

#[tokio::test]
async fn a_body_over_the_limit_gets_413_naming_the_limit() {
    let (ext, _) = fixture_extender();
    // Over the default (it used to be 256 MiB) but small enough for a test.
    let body = vec![b' '; BODY_LIMIT + 1];
    let (status, answer) = post_raw(&router(ext.clone()), "/filter", body).await;
    assert_eq!(status, StatusCode::PAYLOAD_TOO_LARGE);
    let error = answer["Error"].as_str().unwrap();
    assert!(
        error.contains(&format!("limit of {BODY_LIMIT} bytes")) && error.contains("/filter"),
        "{error}"
    );
    const { assert!(BODY_LIMIT <= 4 * 1024 * 1024, "see docs/hostile-input.md") };

    let small = router_with_limit(ext, 1000);
    let pod = fixture_pod("resnet-train-1");
    let names: Vec<String> = (0..100).map(|i| format!("node-{i}")).collect();
    let names: Vec<&str> = names.iter().map(|s| s.as_str()).collect();
    let (status, answer) = post(&small, "/filter", &args_names(&pod, &names)).await;
    assert_eq!(status, StatusCode::PAYLOAD_TOO_LARGE, "{answer}");
    assert!(
        answer["Error"]
            .as_str()
            .unwrap()
            .contains("limit of 1000 bytes")
    );
    let (status, _) = post(&small, "/filter", &args_names(&pod, &["gpu-node-a"])).await;
    assert_eq!(status, StatusCode::OK);
}

/// A pod annotation of 1 MB is quoted by the decision error; every candidate
/// node's reason carried all of it (2,000 nodes: a 2 GB answer).
#[tokio::test]
async fn a_huge_annotation_is_cut_in_every_reason() {
    let (ext, _) = fixture_extender();
    let mut pod = fixture_pod("resnet-train-1");
    pod["metadata"]["uid"] = json!("uid-huge-annotation");
    let huge = format!("{}Gi", "9".repeat(1_000_000));
    pod["metadata"]["annotations"]["carma.io/gpu-memory"] = json!(huge);
    let names: Vec<String> = (0..50).map(|i| format!("node-{i}")).collect();
    let mut names: Vec<&str> = names.iter().map(|s| s.as_str()).collect();
    names.push("gpu-node-a");
    let r = router_with_limit(ext, 8 << 20);
    let (status, answer) = post(&r, "/filter", &args_names(&pod, &names)).await;
    assert_eq!(status, StatusCode::OK, "{answer}");
    let reasons = answer["FailedAndUnresolvableNodes"].as_object().unwrap();
    assert_eq!(reasons.len(), names.len(), "{reasons:?}");
    for reason in reasons.values() {
        let reason = reason.as_str().unwrap();
        assert!(
            reason.len() <= LOGGED_INPUT_LIMIT + 32,
            "{} bytes",
            reason.len()
        );
        assert!(reason.ends_with(" bytes)"), "{reason}");
    }

    // serde's message quotes the value: a 1 MB string where a map belongs.
    let body = json!({"Pod": {"metadata": {"labels": huge}}, "NodeNames": ["a"]});
    let (status, answer) = post(&r, "/filter", &body).await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    let error = answer["Error"].as_str().unwrap();
    assert!(
        error.len() <= LOGGED_INPUT_LIMIT + 64,
        "{} bytes",
        error.len()
    );
    assert!(error.contains("malformed /filter request"), "{error}");
}

async fn text(r: &axum::Router, method: &str, path: &str) -> (StatusCode, String, Option<String>) {
    let req = Request::builder()
        .method(method)
        .uri(path)
        .body(axum::body::Body::empty())
        .unwrap();
    let resp = r.clone().oneshot(req).await.unwrap();
    let status = resp.status();
    let allow = resp
        .headers()
        .get("allow")
        .map(|v| v.to_str().unwrap().to_string());
    let bytes = http_body_util::BodyExt::collect(resp.into_body())
        .await
        .unwrap()
        .to_bytes();
    (status, String::from_utf8_lossy(&bytes).into_owned(), allow)
}

#[tokio::test]
async fn wrong_method_and_unknown_path_are_explained() {
    let (ext, _) = fixture_extender();
    let r = router(ext.clone());
    let (status, body, allow) = text(&r, "GET", "/filter").await;
    assert_eq!(status, StatusCode::METHOD_NOT_ALLOWED);
    assert_eq!(allow.as_deref(), Some("POST"));
    assert!(
        body.contains("GET") && body.contains("/filter") && body.contains("POST"),
        "{body}"
    );
    let (status, body, allow) = text(&r, "POST", "/healthz").await;
    assert_eq!(status, StatusCode::METHOD_NOT_ALLOWED);
    assert_eq!(allow.as_deref(), Some("GET"));
    assert!(
        body.starts_with("method POST is not allowed on /healthz; use GET (routes: POST /filter"),
        "{body}"
    );
    let (status, body, _) = text(&r, "GET", "/nope").await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    assert!(
        body.contains("GET /nope") && body.contains("POST /bind"),
        "{body}"
    );

    let long = format!("/{}", "x".repeat(2000));
    let (status, body, _) = text(&r, "GET", &long).await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    assert!(body.contains("… (2001 bytes); routes: "), "{body}");
    assert!(body.len() < 600, "{} bytes", body.len());

    let m = metrics_router(ext.clone());
    let (status, body, _) = text(&m, "POST", "/filter").await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    assert_eq!(
        body,
        "no route POST /filter; routes: GET /healthz, GET /readyz, GET /metrics\n"
    );
    let (status, body, allow) = text(&m, "POST", "/metrics").await;
    assert_eq!(status, StatusCode::METHOD_NOT_ALLOWED);
    assert_eq!(allow.as_deref(), Some("GET"));
    assert!(
        body.starts_with("method POST is not allowed on /metrics; use GET"),
        "{body}"
    );
}

/// Both routers answer the three GETs alike: the same `Endpoints`.
#[tokio::test]
async fn both_routers_answer_health_readiness_and_metrics_alike() {
    let unsynced = std::sync::Arc::new(carma_scheduler_extender::Extender::new(
        std::sync::Arc::new(carma_scheduler_extender::ClusterState::new()),
        carma_scheduler_extender::Decisions::new(
            carma_estimator::Estimator::new().unwrap(),
            carma_core::Policy::Magm,
        ),
        std::sync::Arc::new(Recorder::default()),
        Default::default(),
    ));
    for r in [router(unsynced.clone()), metrics_router(unsynced)] {
        assert_eq!(
            text(&r, "GET", "/readyz").await,
            (
                StatusCode::SERVICE_UNAVAILABLE,
                "cluster caches have not synced yet\n".into(),
                None
            )
        );
    }
    let (ext, _) = fixture_extender();
    for r in [router(ext.clone()), metrics_router(ext.clone())] {
        assert_eq!(
            text(&r, "GET", "/healthz").await,
            (StatusCode::OK, "ok\n".into(), None)
        );
        assert_eq!(
            text(&r, "GET", "/readyz").await,
            (StatusCode::OK, "ready\n".into(), None)
        );
        let req = Request::builder()
            .uri("/metrics")
            .body(axum::body::Body::empty())
            .unwrap();
        let resp = r.clone().oneshot(req).await.unwrap();
        assert_eq!(resp.status(), StatusCode::OK);
        assert_eq!(
            resp.headers()["content-type"],
            carma_http::health::OPENMETRICS_CONTENT_TYPE
        );
    }
}

/// Serve `router` on a loopback port with a short idle timeout.
async fn start(
    router: axum::Router,
    tls: Option<TlsSettings>,
    idle: Duration,
) -> (SocketAddr, oneshot::Sender<()>) {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    let (tx, rx) = oneshot::channel::<()>();
    tokio::spawn(serve_with_timeout(listener, router, tls, idle, async {
        let _ = rx.await;
    }));
    (addr, tx)
}

/// Read until the server closes the connection; how long that took.
async fn closed_after(stream: &mut tokio::net::TcpStream) -> Duration {
    let start = Instant::now();
    let mut buf = [0u8; 4096];
    loop {
        match tokio::time::timeout(Duration::from_secs(10), stream.read(&mut buf)).await {
            Ok(Ok(0)) | Ok(Err(_)) => return start.elapsed(),
            Ok(Ok(_)) => {}
            Err(_) => panic!("the connection is still open after 10 s"),
        }
    }
}

#[tokio::test]
async fn a_connection_that_sends_nothing_is_closed() {
    let (ext, _) = fixture_extender();
    let idle = Duration::from_millis(300);
    let (addr, _stop) = start(router(ext.clone()), None, idle).await;
    let mut silent = tokio::net::TcpStream::connect(addr).await.unwrap();
    let waited = closed_after(&mut silent).await;
    assert!(
        waited >= idle / 2 && waited < Duration::from_secs(3),
        "{waited:?}"
    );

    // A kept-alive connection is served, then let go once idle.
    let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
    s.write_all(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
        .await
        .unwrap();
    let mut buf = [0u8; 1024];
    let n = s.read(&mut buf).await.unwrap();
    assert!(buf[..n].starts_with(b"HTTP/1.1 200"));
    closed_after(&mut s).await;

    // The metrics listener too.
    let (addr, _stop) = start(metrics_router(ext), None, idle).await;
    let mut silent = tokio::net::TcpStream::connect(addr).await.unwrap();
    closed_after(&mut silent).await;
}

#[tokio::test]
async fn a_slow_sender_is_closed_mid_request() {
    // A client that trickles its headers or body a byte at a time, each byte inside the idle
    // timeout, used to hold its connection (and the request's buffers) for ever.
    let (ext, _) = fixture_extender();
    let timeout = Duration::from_millis(400);
    let (addr, _stop) = start(router(ext), None, timeout).await;
    for request in [
        &b"POST /filter HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"[..],
        &b"POST /filter HTTP/1.1\r\nHost: x\r\nContent-Length: 4000\r\n\r\n{\"Pod\":"[..],
    ] {
        let s = tokio::net::TcpStream::connect(addr).await.unwrap();
        let (mut rd, mut wr) = s.into_split();
        let trickle = tokio::spawn(async move {
            // The request, then one more byte every 100 ms for up to 10 s.
            wr.write_all(request).await?;
            for _ in 0..100 {
                tokio::time::sleep(Duration::from_millis(100)).await;
                wr.write_all(b" ").await?;
            }
            Ok::<_, std::io::Error>(())
        });
        let start = Instant::now();
        let mut buf = [0u8; 4096];
        loop {
            match tokio::time::timeout(Duration::from_secs(10), rd.read(&mut buf)).await {
                Ok(Ok(0)) | Ok(Err(_)) => break,
                Ok(Ok(_)) => {}
                Err(_) => panic!("a slow sender still holds its connection after 10 s"),
            }
        }
        let waited = start.elapsed();
        assert!(
            waited >= timeout / 2 && waited < Duration::from_secs(3),
            "{waited:?}"
        );
        trickle.abort();
    }
}

#[tokio::test]
async fn a_bind_body_has_its_own_small_limit() {
    // /bind used to take bodies of up to 4 MiB, like /filter, though a bind names four strings.
    let (ext, _) = fixture_extender();
    let body = vec![b' '; BIND_BODY_LIMIT + 1];
    let (status, answer) = post_raw(&router(ext.clone()), "/bind", body).await;
    assert_eq!(status, StatusCode::PAYLOAD_TOO_LARGE, "{answer}");
    let error = answer["Error"].as_str().unwrap();
    assert!(error.contains(&BIND_BODY_LIMIT.to_string()), "{error}");
    // /filter keeps the larger limit.
    let (status, _) = post_raw(&router(ext), "/filter", vec![b' '; BIND_BODY_LIMIT + 1]).await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
}

#[tokio::test(start_paused = true)]
async fn a_body_that_stops_arriving_gets_408() {
    // A caller that stalls mid-body held its turn (one of PLACEMENT_CONCURRENCY) until the
    // connection's timeout; the body must now arrive within BODY_READ_TIMEOUT.
    let (ext, _) = fixture_extender();
    let (tx, rx) = tokio::sync::mpsc::channel::<Result<Vec<u8>, std::io::Error>>(1);
    tx.send(Ok(b"{\"Pod\": ".to_vec())).await.unwrap();
    let body = axum::body::Body::from_stream(futures::stream::unfold(rx, |mut rx| async move {
        rx.recv().await.map(|chunk| (chunk, rx))
    }));
    let request = Request::post("/filter")
        .header("content-type", "application/json")
        .body(body)
        .unwrap();
    let started = tokio::time::Instant::now();
    let response = tokio::time::timeout(BODY_READ_TIMEOUT * 3, router(ext).oneshot(request))
        .await
        .expect("answered, not left waiting for the body")
        .unwrap();
    assert_eq!(response.status(), StatusCode::REQUEST_TIMEOUT);
    assert!(started.elapsed() >= BODY_READ_TIMEOUT);
    drop(tx);
}

#[tokio::test]
async fn placement_requests_beyond_the_limit_wait_their_turn() {
    // Any number of /filter requests used to be read and decoded at once, each up to 4 MiB
    // of body and its decoded Pod, so concurrent callers could take the extender past its memory
    // limit. PLACEMENT_CONCURRENCY requests still reading their bodies hold every turn: another
    // filter is answered only once one of them finishes.
    let (ext, _) = fixture_extender();
    let (addr, _stop) = start(router(ext), None, Duration::from_secs(20)).await;
    let pod = fixture_pod("pending-override");
    let body = serde_json::to_vec(&args_names(&pod, &["gpu-node-a"])).unwrap();
    let head = format!(
        "POST /filter HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n",
        body.len()
    );
    let mut holders = Vec::new();
    for _ in 0..PLACEMENT_CONCURRENCY {
        let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
        s.write_all(head.as_bytes()).await.unwrap();
        s.write_all(&body[..10]).await.unwrap();
        holders.push(s);
    }
    tokio::time::sleep(Duration::from_millis(200)).await;
    let mut waiting = tokio::net::TcpStream::connect(addr).await.unwrap();
    waiting.write_all(head.as_bytes()).await.unwrap();
    waiting.write_all(&body).await.unwrap();
    let mut buf = [0u8; 4096];
    let early = tokio::time::timeout(Duration::from_millis(500), waiting.read(&mut buf)).await;
    assert!(early.is_err(), "answered while every turn was taken");
    // One holder finishes its body: its answer, then the waiting request's.
    holders[0].write_all(&body[10..]).await.unwrap();
    let n = holders[0].read(&mut buf).await.unwrap();
    assert!(buf[..n].starts_with(b"HTTP/1.1 200"));
    let n = tokio::time::timeout(Duration::from_secs(5), waiting.read(&mut buf))
        .await
        .expect("answered once a turn was free")
        .unwrap();
    assert!(buf[..n].starts_with(b"HTTP/1.1 200"));
}

#[tokio::test]
async fn a_tls_connection_that_sends_nothing_is_closed() {
    let dir = tempfile::tempdir().unwrap();
    let key = KeyPair::generate().unwrap();
    let cert = CertificateParams::new(vec!["localhost".into()])
        .unwrap()
        .self_signed(&key)
        .unwrap();
    std::fs::write(dir.path().join("tls.crt"), cert.pem()).unwrap();
    std::fs::write(dir.path().join("tls.key"), key.serialize_pem()).unwrap();
    let tls = TlsSettings::from(TlsFiles {
        cert: dir.path().join("tls.crt"),
        key: dir.path().join("tls.key"),
    });
    let (ext, _) = fixture_extender();
    let (addr, _stop) = start(router(ext), Some(tls), Duration::from_millis(300)).await;
    let mut silent = tokio::net::TcpStream::connect(addr).await.unwrap();
    let waited = closed_after(&mut silent).await;
    assert!(waited < Duration::from_secs(3), "{waited:?}");
}

/// The error of loading `cert` and `key` (written to files).
fn tls_error(cert: &str, key: &str) -> (String, tempfile::TempDir) {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("tls.crt"), cert).unwrap();
    std::fs::write(dir.path().join("tls.key"), key).unwrap();
    let tls = TlsSettings::from(TlsFiles {
        cert: dir.path().join("tls.crt"),
        key: dir.path().join("tls.key"),
    });
    let err = tls.load().unwrap_err();
    assert!(matches!(err, ServeError::Tls { .. }), "{err:?}");
    (err.to_string(), dir)
}

#[test]
fn unusable_tls_files_are_named_with_what_is_wrong() {
    let key = KeyPair::generate().unwrap();
    let cert = CertificateParams::new(vec!["localhost".into()])
        .unwrap()
        .self_signed(&key)
        .unwrap();
    let (cert, key) = (cert.pem(), key.serialize_pem());
    let other_key = KeyPair::generate().unwrap().serialize_pem();

    let cases: [(&str, &str, &[&str]); 6] = [
        ("hello", &key, &["certificate file", "tls.crt", "not PEM"]),
        ("", &key, &["certificate file", "tls.crt", "empty"]),
        (
            &key,
            &key,
            &["tls.crt", "no CERTIFICATE block", "found: PRIVATE KEY"],
        ),
        (&cert, "hello", &["key file", "tls.key", "not PEM"]),
        (
            &cert,
            &cert,
            &[
                "key file",
                "tls.key",
                "no PRIVATE KEY block",
                "found: CERTIFICATE",
            ],
        ),
        (&cert, &other_key, &["tls.key", "does not match", "tls.crt"]),
    ];
    for (cert, key, expect) in cases {
        let (err, _dir) = tls_error(cert, key);
        for e in expect {
            assert!(err.contains(e), "expected {e:?} in: {err}");
        }
        assert!(!err.contains("peer sent no certificates"), "{err}");
    }
}

/// A well-formed request with the most candidate names allowed is answered.
#[tokio::test]
async fn the_largest_accepted_filter_is_answered() {
    let (ext, _) = fixture_extender();
    let pod = fixture_pod("resnet-train-1");
    let count = MAX_CANDIDATES;
    let names: Vec<String> = (0..count).map(|i| format!("n{i:07}")).collect();
    let names: Vec<&str> = names.iter().map(|s| s.as_str()).collect();
    let body = args_names(&pod, &names);
    assert!(serde_json::to_vec(&body).unwrap().len() <= BODY_LIMIT);
    let (status, answer) = post(&router(ext), "/filter", &body).await;
    assert_eq!(status, StatusCode::OK);
    let failed = answer["FailedNodes"].as_object().map_or(0, |m| m.len())
        + answer["FailedAndUnresolvableNodes"]
            .as_object()
            .map_or(0, |m| m.len());
    assert_eq!(failed, count, "{}", Value::from(failed));
}

/// `VmHWM` (peak resident memory) of this process, in MiB.
fn peak_rss_mib() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap();
    let line = status.lines().find(|l| l.starts_with("VmHWM:")).unwrap();
    line.split_whitespace()
        .nth(1)
        .unwrap()
        .parse::<u64>()
        .unwrap()
        / 1024
}

/// POST `body` (at most [`BODY_LIMIT`] bytes) to `/filter` and print the
/// process's peak RSS before and after. Run one at a time, each in its own
/// process (docs/hostile-input.md):
/// `cargo test --release -p carma-scheduler-extender --test limits peak_ -- --ignored --nocapture --test-threads=1 --exact limits::peak_NAME`
async fn measure(what: &str, body: Vec<u8>) {
    assert!(body.len() <= BODY_LIMIT, "{} bytes", body.len());
    let (ext, _) = fixture_extender();
    let r = router(ext);
    let before = peak_rss_mib();
    let (status, _) = post_raw(&r, "/filter", body.clone()).await;
    let after = peak_rss_mib();
    println!(
        "{what}: {} bytes, HTTP {status}: peak RSS {before} MiB before, {after} MiB after",
        body.len()
    );
}

/// The body: `{"Pod": pod, "NodeNames": [`, then `item` repeated while it fits.
fn filling(pod: &Value, key: &str, item: impl Fn(usize) -> String) -> Vec<u8> {
    let mut body = format!("{{\"Pod\": {pod}, \"{key}\": [").into_bytes();
    let mut i = 0;
    loop {
        let next = item(i);
        if body.len() + next.len() + 16 > BODY_LIMIT {
            break;
        }
        if i > 0 {
            body.push(b',');
        }
        body.extend_from_slice(next.as_bytes());
        i += 1;
    }
    body.extend_from_slice(b"]}");
    body
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "measurement: run alone, see measure()"]
async fn peak_names() {
    let pod = fixture_pod("resnet-train-1");
    // The most names accepted, as long as the body allows.
    let len = (BODY_LIMIT - 8192) / MAX_CANDIDATES - 2;
    let body = filling(&pod, "NodeNames", |i| format!("\"{i:0len$x}\""));
    measure("NodeNames", body).await;
}

/// The worst accepted /filter body: a Pod of empty containers, the most decoded structure per byte.
fn empty_containers_body() -> Vec<u8> {
    let mut body =
        b"{\"Pod\": {\"metadata\": {\"name\": \"p\", \"uid\": \"u\"}, \"spec\": {\"containers\": ["
            .to_vec();
    for _ in 0..MAX_POD_VALUES - 8 {
        body.extend_from_slice(b"{},");
    }
    body.extend_from_slice(b"{}]}}, \"NodeNames\": [\"gpu-node-a\"]}");
    body
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "measurement: run alone, see measure()"]
async fn peak_containers() {
    measure("Pod of empty containers", empty_containers_body()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "measurement: run alone, see measure()"]
async fn peak_concurrent() {
    // 16 of the worst accepted /filter bodies (peak_containers') at once, and 128 binds: the
    // concurrency limits let PLACEMENT_CONCURRENCY of the filters hold their memory at a time.
    let body = empty_containers_body();
    let (ext, _) = fixture_extender();
    let r = router(ext);
    let before = peak_rss_mib();
    let mut calls = Vec::new();
    for _ in 0..16 {
        let (r, body) = (r.clone(), body.clone());
        calls.push(tokio::spawn(async move {
            post_raw(&r, "/filter", body).await.0
        }));
    }
    for i in 0..128 {
        let r = r.clone();
        let bind = json!({"PodName": format!("p{i}"), "PodNamespace": "ml", "PodUID": format!("u{i}"), "Node": "gpu-node-a"});
        calls.push(tokio::spawn(
            async move { post(&r, "/bind", &bind).await.0 },
        ));
    }
    for c in calls {
        c.await.unwrap();
    }
    let after = peak_rss_mib();
    println!(
        "16 concurrent filters of {} bytes and 128 binds: peak RSS {before} MiB before, {after} MiB after",
        body.len()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "measurement: run alone, see measure()"]
async fn peak_slow_bodies() {
    // 32 connections each send a /filter body of BODY_LIMIT bytes but its last byte, and wait:
    // every body being read is buffered in full. The concurrency limit lets PLACEMENT_CONCURRENCY
    // of them be read at a time; the others' bytes wait in the kernel's socket buffers.
    let (ext, _) = fixture_extender();
    let (addr, _stop) = start(router(ext), None, Duration::from_secs(60)).await;
    let head = format!(
        "POST /filter HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: {BODY_LIMIT}\r\n\r\n"
    );
    let before = peak_rss_mib();
    let mut senders = Vec::new();
    for _ in 0..32 {
        let head = head.clone();
        senders.push(tokio::spawn(async move {
            let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
            s.write_all(head.as_bytes()).await.unwrap();
            let chunk = vec![b' '; 64 * 1024];
            let mut sent = 0;
            while sent < BODY_LIMIT - 1 {
                let n = chunk.len().min(BODY_LIMIT - 1 - sent);
                // A full socket buffer blocks the write: the server is not reading this one.
                match tokio::time::timeout(Duration::from_secs(3), s.write_all(&chunk[..n])).await {
                    Ok(r) => r.unwrap(),
                    Err(_) => break,
                }
                sent += n;
            }
            tokio::time::sleep(Duration::from_secs(2)).await;
            sent
        }));
    }
    let mut fully_sent = 0;
    for s in senders {
        fully_sent += usize::from(s.await.unwrap() == BODY_LIMIT - 1);
    }
    let after = peak_rss_mib();
    println!(
        "32 slow /filter bodies of {BODY_LIMIT} bytes ({fully_sent} sent in full, the rest blocked): peak RSS {before} MiB before, {after} MiB after"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "measurement: run alone, see measure()"]
async fn peak_nodes() {
    let pod = fixture_pod("resnet-train-1");
    let len = (BODY_LIMIT - 8192) / MAX_CANDIDATES - 25;
    let mut body = filling(&pod, "Nodes\": {\"items", |i| {
        format!("{{\"metadata\": {{\"name\": \"{i:0len$x}\"}}}}")
    });
    body.push(b'}');
    measure("Nodes", body).await;
}

#[tokio::test]
async fn too_many_candidates_or_pod_values_are_refused() {
    let (ext, _) = fixture_extender();
    let r = router(ext);
    let pod = fixture_pod("resnet-train-1");
    let body = filling(&pod, "NodeNames", |_| "\"a\"".into());
    let (status, answer) = post_raw(&r, "/filter", body).await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    let error = answer["Error"].as_str().unwrap();
    assert!(
        error.contains(&format!("more than {MAX_CANDIDATES} candidate nodes")),
        "{error}"
    );

    let mut body = b"{\"Pod\": {\"spec\": {\"containers\": [".to_vec();
    for _ in 0..MAX_POD_VALUES {
        body.extend_from_slice(b"{},");
    }
    body.extend_from_slice(b"{}]}}, \"NodeNames\": [\"gpu-node-a\"]}");
    let (status, answer) = post_raw(&r, "/filter", body).await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    let error = answer["Error"].as_str().unwrap();
    assert!(
        error.contains(&format!("more than {MAX_POD_VALUES} JSON values")),
        "{error}"
    );
}
