//! The traced reservation against CARMA's measured peaks.
//!
//! `estimator/tests/data/traced-peaks.csv` holds the traced phase peaks of each of CARMA's
//! jobs (`python -m carma_profile.calibrate`, one GPU's share of the batch); the measured
//! per-GPU peaks (A100, MiB) are line 8 of the task files in
//! `../shared/traces/carma/v2/workloads/*.rad`. The constants of `traced.rs` were fitted on
//! the jobs of the models in [`FITTED`]; the others are held out.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use carma_estimator::{Family, Traced, parse_profile, traced_reservation_mib};

/// The models whose jobs the constants were fitted on (the CSV's `model` column;
/// `efficientnet_b0` covers its ImageNet and CIFAR-100 jobs).
const FITTED: [&str; 8] = [
    "resnet50",
    "mobilenet_v2",
    "efficientnet_b0",
    "resnet18",
    "mobilenet_v3_small",
    "bert-base (masked LM)",
    "xlnet-base (sequence classification)",
    "gpt2-large (causal LM)",
];

/// Held-out jobs the traced reservation underestimates (docs/traced-estimate.md says why):
/// VGG-16 and Inception-v3 need more than the fitted factor over their traced peak (cuDNN
/// workspaces and cached blocks of their wide convolutions), the MNIST job holds about
/// 1.2 GiB that no training step of its 35 MiB model explains.
const KNOWN_MISSES: [&str; 7] = [
    "Inception",
    "Inception2",
    "Inception3",
    "mnist_train",
    "vgg",
    "vgg2",
    "vgg3",
];

struct Job {
    job: String,
    model: String,
    family: Family,
    gpus: u32,
    traced: Traced,
    measured: u64,
}

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).to_path_buf()
}

fn jobs() -> Vec<Job> {
    let csv = root().join("tests/data/traced-peaks.csv");
    let text = std::fs::read_to_string(&csv)
        .unwrap_or_else(|e| panic!("{} is missing ({e})", csv.display()));
    let workloads = root().join("../../shared/traces/carma/v2/workloads");
    assert!(
        workloads.is_dir(),
        "{} is missing: CARMA's task files (shared/traces/carma/v2/workloads) hold the measured peaks",
        workloads.display()
    );
    let mut lines = text.lines();
    let header: Vec<&str> = lines.next().unwrap().split(',').collect();
    let col = |name: &str| {
        header
            .iter()
            .position(|h| *h == name)
            .unwrap_or_else(|| panic!("traced-peaks.csv has no column {name}"))
    };
    let (job, family, model, gpus, fwd, bwd, opt) = (
        col("job"),
        col("family"),
        col("model"),
        col("gpus"),
        col("forward_mib"),
        col("backward_mib"),
        col("optimizer_step_mib"),
    );
    lines
        .map(|l| {
            let f: Vec<&str> = l.split(',').collect();
            let num = |i: usize| -> u64 { f[i].parse().unwrap_or_else(|e| panic!("{l}: {e}")) };
            let rad = workloads.join(format!("{}.rad", f[job]));
            let rad_text = std::fs::read_to_string(&rad)
                .unwrap_or_else(|e| panic!("{} is missing ({e})", rad.display()));
            let measured = rad_text
                .lines()
                .nth(8)
                .and_then(|m| m.trim().parse().ok())
                .unwrap_or_else(|| panic!("{} has no measured peak on line 8", rad.display()));
            Job {
                job: f[job].to_string(),
                model: f[model].to_string(),
                family: f[family].parse().unwrap(),
                gpus: num(gpus) as u32,
                traced: Traced {
                    forward_mib: num(fwd),
                    backward_mib: num(bwd),
                    optimizer_step_mib: num(opt),
                },
                measured,
            }
        })
        .collect()
}

fn over(j: &Job) -> i64 {
    traced_reservation_mib(&j.traced, j.family, j.gpus) as i64 - j.measured as i64
}

#[test]
fn no_fitted_job_is_underestimated_and_the_mean_over_is_under_a_gib() {
    let all = jobs();
    assert!(all.len() >= 40, "only {} traced jobs", all.len());
    let fitted: Vec<&Job> = all
        .iter()
        .filter(|j| FITTED.contains(&j.model.as_str()))
        .collect();
    assert!(fitted.len() >= 25, "only {} fitted jobs", fitted.len());
    for j in &fitted {
        assert!(
            over(j) >= 0,
            "{} ({}): measured {} MiB, traced reservation {} MiB",
            j.job,
            j.model,
            j.measured,
            traced_reservation_mib(&j.traced, j.family, j.gpus)
        );
    }
    let mean = fitted.iter().map(|j| over(j)).sum::<i64>() / fitted.len() as i64;
    assert!(mean <= 1024, "mean over-reservation {mean} MiB");
    // The constants are tight: each has a fitted job within 10 % of being underestimated.
    let tight = |pick: &dyn Fn(&Job) -> bool| {
        fitted
            .iter()
            .filter(|j| pick(j))
            .map(|j| over(j) as f64 / j.measured as f64)
            .fold(f64::INFINITY, f64::min)
    };
    assert!(tight(&|j| j.family == Family::Cnn) < 0.10);
    assert!(tight(&|j| j.gpus > 1) < 0.10);
    assert!(
        tight(&|j| j.measured < 1_000) < 0.10,
        "the context constant"
    );
}

#[test]
fn only_the_known_misses_are_underestimated() {
    let under: BTreeSet<String> = jobs()
        .iter()
        .filter(|j| over(j) < 0)
        .map(|j| j.job.clone())
        .collect();
    let known: BTreeSet<String> = KNOWN_MISSES.iter().map(|s| s.to_string()).collect();
    assert_eq!(under, known, "underestimated jobs changed");
}

#[test]
fn a_traced_profile_parses_and_bad_figures_name_their_key() {
    let base = r#"{"family":"cnn","batchSize":32,"parameters":25557032,"activations":37560000,"depth":107"#;
    let p = parse_profile(&format!(
        r#"{base},"traced":{{"forwardMiB":2930,"backwardMiB":2947,"optimizerStepMiB":507}}}}"#
    ))
    .unwrap();
    assert_eq!(p.traced.map(|t| t.peak_mib()), Some(2947));
    let e = carma_estimator::Estimator::new()
        .unwrap()
        .estimate(&p)
        .unwrap();
    assert_eq!(e.source, carma_estimator::EstimateSource::Traced);
    assert_eq!(e.source.as_str(), "traced");
    assert_eq!(
        e.mib,
        traced_reservation_mib(&p.traced.unwrap(), Family::Cnn, 1)
    );
    let json = serde_json::to_string(&p).unwrap();
    assert!(json.contains(r#""traced":{"forwardMiB":2930"#), "{json}");

    for (traced, key) in [
        (
            r#"{"forwardMiB":0,"backwardMiB":1,"optimizerStepMiB":1}"#,
            "traced.forwardMiB",
        ),
        (
            r#"{"forwardMiB":1,"backwardMiB":1,"optimizerStepMiB":99999999999}"#,
            "traced.optimizerStepMiB",
        ),
        (
            r#"{"forwardMiB":1,"backwardMiB":-3,"optimizerStepMiB":1}"#,
            "traced.backwardMiB",
        ),
        (r#"{"forwardMiB":1,"backwardMiB":1}"#, "optimizerStepMiB"),
        (
            r#"{"forwardMiB":1,"backwardMiB":1,"optimizerStepMiB":1,"peakMiB":1}"#,
            "peakMiB",
        ),
        (r#"[1,1,1]"#, "traced"),
        (r#"null"#, "traced"),
    ] {
        let err = parse_profile(&format!(r#"{base},"traced":{traced}}}"#)).unwrap_err();
        assert!(err.to_string().contains(key), "{traced}: {err}");
    }
}
