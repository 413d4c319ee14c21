use std::time::Instant;
use carma_core::{PlacementConfig, Policy};
use carma_scheduler_extender::synthetic::{extender_args_body, loaded_cluster};
use carma_scheduler_extender::wire::ExtenderArgs;
use carma_scheduler_extender::snapshot_extender;
fn main() {
    let ext = snapshot_extender(&loaded_cluster(5000, 8), Policy::Magm, PlacementConfig::default()).unwrap();
    let body = extender_args_body(5000, true);
    let args: ExtenderArgs = serde_json::from_slice(&body).unwrap();
    ext.filter(&args);
    let n = 300;
    let t = Instant::now();
    for _ in 0..n { let a: ExtenderArgs = serde_json::from_slice(&body).unwrap(); std::hint::black_box(a); }
    println!("parse {:?}", t.elapsed() / n);
    let t = Instant::now();
    for _ in 0..n { std::hint::black_box(ext.filter(&args)); }
    println!("filter {:?}", t.elapsed() / n);
    let out = ext.filter(&args);
    let t = Instant::now();
    for _ in 0..n { std::hint::black_box(serde_json::to_vec(&out).unwrap()); }
    println!("encode {:?}", t.elapsed() / n);
    let t = Instant::now();
    for _ in 0..n { std::hint::black_box(ext.prioritize(&args)); }
    println!("prioritize {:?}", t.elapsed() / n);
    let names = args.candidate_names();
    let t = Instant::now();
    for _ in 0..n { let v = ext.cluster().read(); let mut c = 0; for nm in &names { if v.node(nm).is_some() { c += 1; } } std::hint::black_box(c); }
    println!("lookups {:?}", t.elapsed() / n);
}
