//! Latency of carma's GPUMemNet estimates (release build):
//! `cargo bench -p carma-estimator`, then
//! `.venv/bin/python estimator/training/record_latency.py` to put the figures into
//! the model card.

use std::hint::black_box;

use carma_estimator::{
    EMBEDDED_MODELS, Estimator, Family, Profile, parse_profile, parse_torchsummary,
};
use criterion::{Criterion, Throughput, criterion_group, criterion_main};

fn mlp(i: u64) -> Profile {
    parse_profile(&format!(
        r#"{{"family":"mlp","batchSize":{},"parameters":{},"activations":{},"depth":{},
            "activation":"GELU","layers":{{"linear":{},"batchNorm":2,"dropout":1}}}}"#,
        16 + (i * 37) % 1000,
        50_000 + i * 1_234_567 % 100_000_000,
        500 + (i * 911) % 100_000,
        2 + i % 10,
        2 + i % 10,
    ))
    .expect("valid profile")
}

/// A torchsummary table of a ResNet-sized CNN (generated, ~90 rows).
fn summary_table() -> String {
    let mut t = String::from(
        "----------------------------------------------------------------\n        Layer (type)               Output Shape         Param #\n================================================================\n",
    );
    let mut n = 0;
    for block in 0..20 {
        for (kind, params) in [
            ("Conv2d", 36_864),
            ("BatchNorm2d", 128),
            ("ReLU", 0),
            ("Identity", 0),
        ] {
            n += 1;
            let c = 64 << (block / 5);
            let hw = 32 >> (block / 5);
            t.push_str(&format!(
                "{:>20}-{n}  [-1, {c}, {hw}, {hw}]  {params:>14}\n",
                kind
            ));
        }
    }
    t.push_str("            Linear-81                  [-1, 100]          51,300\n================================================================\nTotal params: 11,227,812\n");
    t
}

fn benches(c: &mut Criterion) {
    let est = Estimator::new().expect("embedded models load");
    let one = mlp(7);

    let mut g = c.benchmark_group("estimate");
    g.throughput(Throughput::Elements(1));
    g.bench_function("mlp_single", |b| {
        b.iter(|| est.estimate(black_box(&one)).unwrap())
    });
    let cnn = parse_profile(
        r#"{"family":"cnn","batchSize":64,"parameters":11000000,"activations":2000000,"depth":60}"#,
    )
    .unwrap();
    g.bench_function("cnn_analytic_single", |b| {
        b.iter(|| est.estimate(black_box(&cnn)).unwrap())
    });
    for n in [64u64, 1024] {
        let batch: Vec<Profile> = (0..n).map(mlp).collect();
        g.throughput(Throughput::Elements(n));
        g.bench_function(format!("mlp_batch_{n}"), |b| {
            b.iter(|| est.estimate_batch(black_box(&batch)))
        });
    }
    g.finish();

    let mut g = c.benchmark_group("parse");
    let json = serde_json::to_string(&one).unwrap();
    g.bench_function("profile_json", |b| {
        b.iter(|| parse_profile(black_box(&json)).unwrap())
    });
    let table = summary_table();
    g.bench_function("torchsummary_81_rows", |b| {
        b.iter(|| parse_torchsummary(black_box(&table), Family::Cnn, 64).unwrap())
    });
    g.finish();

    let mut g = c.benchmark_group("load");
    g.sample_size(10);
    g.bench_function("mlp_model", |b| {
        b.iter(|| Estimator::from_parts(black_box(EMBEDDED_MODELS)).unwrap())
    });
    g.finish();
}

criterion_group!(estimator_benches, benches);
criterion_main!(estimator_benches);
