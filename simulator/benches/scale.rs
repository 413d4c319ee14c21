//! Scale: 10,000 generated tasks on 1,000 GPUs (125 nodes × 8), one policy per
//! measurement. Run with `cargo bench -p carma-simulator --bench scale`.

use carma_core::Policy;
use carma_simulator::trace::{GeneratorConfig, generate};
use carma_simulator::{EstimatorKind, SimConfig, plan, simulate};
use criterion::{Criterion, criterion_group, criterion_main};

fn scale(c: &mut Criterion) {
    let mut cfg = SimConfig::default();
    cfg.cluster.nodes = 125;
    cfg.cluster.gpus_per_node = 8;
    let trace = generate(&GeneratorConfig {
        tasks: 10_000,
        seed: 1,
        cluster_gpus: cfg.cluster.total_gpus(),
        ..GeneratorConfig::default()
    })
    .expect("trace");
    let plan = plan(
        &trace.tasks,
        EstimatorKind::Gpumemnet,
        cfg.cluster.gpu_memory_mib,
    )
    .expect("plan");
    // One timed run per policy first, so a single `cargo bench` prints the figure.
    for policy in Policy::ALL {
        let t = std::time::Instant::now();
        let run = simulate(&trace.tasks, &plan.reservations, "gpumemnet", policy, &cfg)
            .expect("simulate");
        eprintln!(
            "once: {:<9} {:>6.2} s wall for 10,000 tasks on 1,000 GPUs ({} events, {} ticks, makespan {:.1} h)",
            policy.as_str(),
            t.elapsed().as_secs_f64(),
            run.events,
            run.ticks,
            run.summary.makespan_s / 3600.0
        );
    }
    let mut group = c.benchmark_group("10k_tasks_1000_gpus");
    group.sample_size(10);
    for policy in [Policy::Exclusive, Policy::Magm, Policy::Lug, Policy::Rr] {
        group.bench_function(policy.as_str(), |b| {
            b.iter(|| {
                let run = simulate(&trace.tasks, &plan.reservations, "gpumemnet", policy, &cfg)
                    .expect("simulate");
                assert_eq!(run.summary.finished + run.summary.failed, 10_000);
                run.summary.makespan_s
            });
        });
    }
    group.finish();
}

criterion_group!(benches, scale);
criterion_main!(benches);
