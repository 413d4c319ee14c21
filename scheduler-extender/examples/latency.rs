//! p50 / p99 latency of filter and prioritize over HTTP on loopback
//! (`nodeCacheCapable: true`), one pod against 1,000 and 5,000 nodes × 8 GPUs.
//!
//! ```text
//! cargo run --release -p carma-scheduler-extender --example latency [-- REQUESTS]
//! ```
//!
//! Each verb is called REQUESTS times (default 2,000) in sequence, as
//! kube-scheduler does for consecutive pods; every call is timed on the client
//! from request sent to last body byte received, and the sorted timings give
//! the percentiles.

use std::time::{Duration, Instant};

use carma_core::{PlacementConfig, Policy};
use carma_scheduler_extender::synthetic::{extender_args_body, loaded_cluster};
use carma_scheduler_extender::{router, serve, snapshot_extender};
use http_body_util::{BodyExt, Full};
use hyper::body::Bytes;
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;

fn pct(sorted: &[Duration], p: f64) -> f64 {
    let i = ((sorted.len() as f64 * p).ceil() as usize).clamp(1, sorted.len()) - 1;
    sorted[i].as_secs_f64() * 1e3
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let requests: usize = std::env::args()
        .nth(1)
        .and_then(|a| a.parse().ok())
        .unwrap_or(2_000);
    let client: Client<HttpConnector, Full<Bytes>> =
        Client::builder(TokioExecutor::new()).build_http();
    println!(
        "| nodes × GPUs | verb | requests | mean ms | p50 ms | p90 ms | p99 ms | max ms | answer bytes |"
    );
    println!("|---|---|---|---|---|---|---|---|---|");
    for nodes in [1_000, 5_000] {
        let ext = snapshot_extender(&loaded_cluster(nodes, 8), Policy::Magm, PlacementConfig::default())
            .expect("estimator loads");
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let server = tokio::spawn(serve(listener, router(ext), None, async {
            let _ = stopped.await;
        }));
        let body = Bytes::from(extender_args_body(nodes, true));
        for verb in ["filter", "prioritize"] {
            let uri: hyper::Uri = format!("http://{addr}/{verb}").parse().unwrap();
            let mut times = Vec::with_capacity(requests);
            let mut answer = 0;
            for i in 0..requests + 50 {
                let req = hyper::Request::post(uri.clone())
                    .header("content-type", "application/json")
                    .body(Full::new(body.clone()))
                    .unwrap();
                let start = Instant::now();
                let resp = client.request(req).await.unwrap();
                assert!(resp.status().is_success());
                let bytes = resp.into_body().collect().await.unwrap().to_bytes();
                let took = start.elapsed();
                answer = bytes.len();
                if i >= 50 {
                    times.push(took); // the first 50 warm up connections and caches
                }
            }
            times.sort();
            let mean = times.iter().sum::<Duration>().as_secs_f64() * 1e3 / times.len() as f64;
            println!(
                "| {nodes} × 8 | {verb} | {requests} | {mean:.2} | {:.2} | {:.2} | {:.2} | {:.2} | {answer} |",
                pct(&times, 0.50),
                pct(&times, 0.90),
                pct(&times, 0.99),
                times.last().unwrap().as_secs_f64() * 1e3,
            );
        }
        let _ = stop.send(());
        let _ = server.await;
    }
}
