//! filter + prioritize for one pod against 1,000 and 5,000 nodes × 8 GPUs (half
//! the GPUs already hold a pod): in process (decode, decide, encode) and over
//! HTTP on loopback (`nodeCacheCapable: true`).
//!
//! `warm` repeats one pod, so verdicts are reused; `cold` forgets every verdict
//! first, so every node is judged by `carma-core` again (the worst case). p50 /
//! p99 under churn: `cargo run --release -p carma-scheduler-extender --example latency`.

use std::hint::black_box;
use std::sync::Arc;

use carma_core::{PlacementConfig, Policy};
use carma_scheduler_extender::synthetic::{extender_args_body, loaded_cluster};
use carma_scheduler_extender::wire::ExtenderArgs;
use carma_scheduler_extender::{Extender, router, serve, snapshot_extender};
use criterion::{BenchmarkId, Criterion, criterion_group, criterion_main};
use http_body_util::{BodyExt, Full};
use hyper::body::Bytes;
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;

fn extender(nodes: usize) -> Arc<Extender> {
    snapshot_extender(
        &loaded_cluster(nodes, 8),
        Policy::Magm,
        PlacementConfig::default(),
        Default::default(),
    )
    .expect("estimator loads")
}

fn in_process(c: &mut Criterion) {
    let mut g = c.benchmark_group("in-process");
    g.sample_size(30);
    for nodes in [1_000, 5_000] {
        let ext = extender(nodes);
        let body = extender_args_body(nodes, true);
        g.bench_with_input(BenchmarkId::new("filter-warm", nodes), &body, |b, body| {
            b.iter(|| {
                let args: ExtenderArgs = serde_json::from_slice(body).unwrap();
                black_box(serde_json::to_vec(&ext.filter(&args)).unwrap())
            })
        });
        g.bench_with_input(BenchmarkId::new("filter-cold", nodes), &body, |b, body| {
            b.iter(|| {
                ext.clear_verdicts();
                let args: ExtenderArgs = serde_json::from_slice(body).unwrap();
                black_box(serde_json::to_vec(&ext.filter(&args)).unwrap())
            })
        });
        g.bench_with_input(
            BenchmarkId::new("prioritize-warm", nodes),
            &body,
            |b, body| {
                b.iter(|| {
                    let args: ExtenderArgs = serde_json::from_slice(body).unwrap();
                    black_box(serde_json::to_vec(&ext.prioritize(&args)).unwrap())
                })
            },
        );
    }
    g.finish();
}

fn over_http(c: &mut Criterion) {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let client: Client<HttpConnector, Full<Bytes>> =
        Client::builder(TokioExecutor::new()).build_http();
    let mut g = c.benchmark_group("http-loopback");
    g.sample_size(30);
    for nodes in [1_000, 5_000] {
        let ext = extender(nodes);
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let server = rt.spawn(serve(listener, router(ext), None, async {
            let _ = stopped.await;
        }));
        let body = Bytes::from(extender_args_body(nodes, true));
        for verb in ["filter", "prioritize"] {
            let uri: hyper::Uri = format!("http://{addr}/{verb}").parse().unwrap();
            g.bench_function(BenchmarkId::new(verb, nodes), |b| {
                b.iter(|| {
                    rt.block_on(async {
                        let req = hyper::Request::post(uri.clone())
                            .header("content-type", "application/json")
                            .body(Full::new(body.clone()))
                            .unwrap();
                        let resp = client.request(req).await.unwrap();
                        assert!(resp.status().is_success());
                        black_box(resp.into_body().collect().await.unwrap().to_bytes())
                    })
                })
            });
        }
        let _ = stop.send(());
        let _ = rt.block_on(server);
    }
    g.finish();
}

criterion_group!(benches, in_process, over_http);
criterion_main!(benches);
