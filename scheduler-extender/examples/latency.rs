//! p50 / p99 latency of filter, prioritize and bind over HTTP on loopback
//! (`nodeCacheCapable: true`), against 1,000 and 5,000 nodes × 8 GPUs of which
//! half already hold a pod.
//!
//! ```text
//! cargo run --release -p carma-scheduler-extender --example latency [-- PODS [NODES...]]
//! ```
//!
//! **steady**: PODS pods (default 1,000) go through filter → prioritize → bind
//! one after another, as kube-scheduler sends them; the pods cycle through four
//! demands (three GPUMemNet classes and an override), and between two pods five
//! nodes publish new telemetry (5,000 nodes publishing every 10 s at 100 pods/s).
//! **cold**: every verdict is forgotten before each call, so every node is
//! judged again (a demand not seen before; the node summaries the judging reads
//! are kept up to date by the changes themselves, see `cluster`). **cold, no
//! node fits**: the same for a pod reserving 36 GiB, which no GPU of the cluster
//! can take, so every node is rejected with its reasons (`place_on_node` on
//! every node: the slow path).
//! Each call is timed on the client, from sending the request to the last byte
//! of the answer; the sorted timings give the percentiles. The output ends with
//! one summary line per cluster size.

use std::time::{Duration, Instant};

use carma_api::names::{ANNOTATION_GPU_MEMORY, ANNOTATION_MODEL_PROFILE};
use carma_core::{PlacementConfig, Policy};
use carma_scheduler_extender::synthetic::{BENCH_PROFILE, args_body, loaded_cluster, pod_json};
use carma_scheduler_extender::{router, serve, snapshot_extender};
use http_body_util::{BodyExt, Full};
use hyper::body::Bytes;
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use serde_json::{Value, json};

type HttpClient = Client<HttpConnector, Full<Bytes>>;

async fn call(client: &HttpClient, uri: &str, body: Vec<u8>) -> (Duration, Value) {
    let req = hyper::Request::post(uri)
        .header("content-type", "application/json")
        .body(Full::new(Bytes::from(body)))
        .unwrap();
    let start = Instant::now();
    let resp = client.request(req).await.unwrap();
    assert!(resp.status().is_success());
    let bytes = resp.into_body().collect().await.unwrap().to_bytes();
    let took = start.elapsed();
    (took, serde_json::from_slice(&bytes).unwrap())
}

/// Prints the table row; returns the p99 in ms.
fn row(nodes: usize, case: &str, verb: &str, mut t: Vec<Duration>) -> f64 {
    t.sort();
    let ms = |d: Duration| d.as_secs_f64() * 1e3;
    let pct = |p: f64| ms(t[((t.len() as f64 * p).ceil() as usize).clamp(1, t.len()) - 1]);
    let mean = t.iter().map(|d| ms(*d)).sum::<f64>() / t.len() as f64;
    println!(
        "| {nodes} × 8 | {case} | {verb} | {} | {mean:.2} | {:.2} | {:.2} | {:.2} |",
        t.len(),
        pct(0.50),
        pct(0.99),
        ms(*t.last().unwrap()),
    );
    pct(0.99)
}

fn pod(i: usize) -> Value {
    let profiles = [
        BENCH_PROFILE.to_string(),
        BENCH_PROFILE.replace("\"batchSize\":256", "\"batchSize\":1024"),
        BENCH_PROFILE.replace("\"batchSize\":256", "\"batchSize\":4096"),
    ];
    let ann = match i % 4 {
        3 => vec![(ANNOTATION_GPU_MEMORY, "6Gi".to_string())],
        k => vec![(ANNOTATION_MODEL_PROFILE, profiles[k].clone())],
    };
    let ann: Vec<(&str, &str)> = ann.iter().map(|(k, v)| (*k, v.as_str())).collect();
    pod_json(
        "ml",
        &format!("p{i}"),
        &format!("beef0000-0000-4000-8000-{i:012}"),
        1,
        &ann,
    )
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let args: Vec<usize> = std::env::args()
        .skip(1)
        .map(|a| a.parse().expect("usage: latency [PODS [NODES...]]"))
        .collect();
    let pods = args.first().copied().unwrap_or(1_000);
    let sizes = match args.get(1..) {
        Some(sizes) if !sizes.is_empty() => sizes.to_vec(),
        _ => vec![1_000, 5_000],
    };
    let client: HttpClient = Client::builder(TokioExecutor::new()).build_http();
    println!("| nodes × GPUs | case | verb | calls | mean ms | p50 ms | p99 ms | max ms |");
    println!("|---|---|---|---|---|---|---|---|");
    let mut summary = Vec::new();
    for nodes in sizes {
        let snap = loaded_cluster(nodes, 8);
        let ext = snapshot_extender(
            &snap,
            Policy::Magm,
            PlacementConfig::default(),
            Default::default(),
        )
        .expect("estimator loads");
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let server = tokio::spawn(serve(listener, router(ext.clone()), None, async {
            let _ = stopped.await;
        }));
        let url = |verb: &str| format!("http://{addr}/{verb}");

        let (mut f, mut p, mut b) = (Vec::new(), Vec::new(), Vec::new());
        let warmup = 20;
        for i in 0..pods + warmup {
            let pod = pod(i);
            let body = args_body(&pod, nodes, true);
            let (tf, out) = call(&client, &url("filter"), body.clone()).await;
            let (tp, scores) = call(&client, &url("prioritize"), body).await;
            let passing: std::collections::HashSet<&str> = out["NodeNames"]
                .as_array()
                .unwrap()
                .iter()
                .filter_map(Value::as_str)
                .collect();
            let best = scores
                .as_array()
                .unwrap()
                .iter()
                .filter(|s| passing.contains(s["Host"].as_str().unwrap()))
                .max_by_key(|s| s["Score"].as_i64().unwrap())
                .map(|s| s["Host"].as_str().unwrap().to_string())
                .expect("a node fits");
            let bind = json!({ "PodName": pod["metadata"]["name"], "PodNamespace": "ml",
                               "PodUID": pod["metadata"]["uid"], "Node": best });
            let (tb, res) = call(&client, &url("bind"), serde_json::to_vec(&bind).unwrap()).await;
            assert_eq!(res["Error"], "", "{res}");
            // Five nodes publish new telemetry.
            for k in 0..5 {
                let mut g = snap.gpu_nodes[(i * 5 + k) * 7919 % nodes].clone();
                for gpu in &mut g.status.as_mut().unwrap().gpus {
                    gpu.memory_free_mib = gpu.memory_free_mib.saturating_sub((i % 3) as u64 * 64);
                }
                ext.cluster().apply_gpu_node(&g);
            }
            if i >= warmup {
                f.push(tf);
                p.push(tp);
                b.push(tb);
            }
        }
        let metrics = ext.metrics().encode();
        for verb in ["filter", "prioritize", "bind"] {
            let get = |what: &str| {
                metrics
                    .lines()
                    .find(|l| {
                        l.starts_with(&format!(
                            "carma_extender_request_duration_seconds_{what}{{verb=\"{verb}\"}}"
                        ))
                    })
                    .and_then(|l| l.rsplit(' ').next())
                    .and_then(|v| v.parse::<f64>().ok())
                    .unwrap_or(0.0)
            };
            eprintln!(
                "{nodes} nodes: server-side mean {verb} {:.3} ms",
                get("sum") * 1e3 / get("count").max(1.0)
            );
        }
        let warm_filter = row(nodes, "steady", "filter", f);
        let prioritize = row(nodes, "steady", "prioritize", p);
        let bind = row(nodes, "steady", "bind", b);

        let calls = (pods / 5).max(20);
        let cold_calls = async |verb: &str, body: &[u8]| {
            let mut t = Vec::new();
            for _ in 0..calls {
                ext.clear_verdicts();
                t.push(call(&client, &url(verb), body.to_vec()).await.0);
            }
            t
        };
        let body = args_body(&pod(0), nodes, true);
        let cold_filter = row(nodes, "cold", "filter", cold_calls("filter", &body).await);
        row(
            nodes,
            "cold",
            "prioritize",
            cold_calls("prioritize", &body).await,
        );
        let huge = pod_json(
            "ml",
            "huge",
            "beef0000-0000-4000-8000-ffffffffffff",
            1,
            &[(ANNOTATION_GPU_MEMORY, "36Gi")],
        );
        let body = args_body(&huge, nodes, true);
        row(
            nodes,
            "cold, no node fits",
            "filter",
            cold_calls("filter", &body).await,
        );
        summary.push(format!(
            "latency {nodes}x8: warm filter p99 {warm_filter:.2} ms, cold filter p99 {cold_filter:.2} ms, \
             prioritize p99 {prioritize:.2} ms, bind p99 {bind:.2} ms"
        ));
        let _ = stop.send(());
        let _ = server.await;
    }
    for line in summary {
        println!("{line}");
    }
}
