//! The traced reservation against CARMA's measured peaks.
//!
//! `estimator/tests/data/traced-peaks.csv` holds the traced phase peaks and largest tensor of
//! each of CARMA's jobs (`python -m carma_profile.calibrate`, one GPU's share of the batch);
//! the measured per-GPU peaks (A100, MiB) are line 8 of the task files in
//! `../shared/traces/carma/v2/workloads/*.rad`. The constants of `traced.rs` were fitted on
//! all of them; `python -m carma_profile.report` refits them without each architecture in
//! turn (docs/traced-estimate.md).

use std::path::{Path, PathBuf};

use carma_estimator::{Family, Traced, parse_profile, traced_reservation_mib};

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
    let (job, family, model, gpus, fwd, bwd, opt, largest) = (
        col("job"),
        col("family"),
        col("model"),
        col("gpus"),
        col("forward_mib"),
        col("backward_mib"),
        col("optimizer_step_mib"),
        col("largest_tensor_mib"),
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
                    largest_tensor_mib: Some(num(largest)),
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
fn no_job_is_underestimated_and_the_constants_are_tight() {
    let all = jobs();
    assert!(all.len() >= 40, "only {} traced jobs", all.len());
    let under: Vec<String> = all
        .iter()
        .filter(|j| over(j) < 0)
        .map(|j| {
            format!(
                "{} ({}): measured {} MiB, traced reservation {} MiB",
                j.job,
                j.model,
                j.measured,
                traced_reservation_mib(&j.traced, j.family, j.gpus)
            )
        })
        .collect();
    assert!(under.is_empty(), "underestimated:\n{}", under.join("\n"));
    let mean = |family: Family| {
        let of: Vec<i64> = all
            .iter()
            .filter(|j| j.family == family)
            .map(over)
            .collect();
        of.iter().sum::<i64>() / of.len() as i64
    };
    // Both within the 1 GiB goal (docs/traced-estimate.md). The Transformer mean was 3.7 GiB
    // while a second GPU multiplied the traced peak by 1.7 (GPT-2 large 11.3 GiB over).
    assert!(
        mean(Family::Cnn) <= 1024,
        "CNN mean over {} MiB",
        mean(Family::Cnn)
    );
    assert!(
        mean(Family::Transformer) <= 1024,
        "Transformer mean over {} MiB",
        mean(Family::Transformer)
    );
    // Each constant is set by a job within 3 % of being underestimated.
    let tight = |pick: &dyn Fn(&Job) -> bool| {
        all.iter()
            .filter(|j| pick(j))
            .map(|j| over(j) as f64 / j.measured as f64)
            .fold(f64::INFINITY, f64::min)
    };
    assert!(
        tight(&|j| j.model == "vgg16") < 0.03,
        "the largest-tensor factor"
    );
    assert!(tight(&|j| j.gpus > 1) < 0.03, "the multi-GPU term");
    assert!(tight(&|j| j.measured < 2_000) < 0.03, "the floor");
    assert!(
        tight(&|j| j.family == Family::Cnn && j.measured > 2_000) < 0.03,
        "the context"
    );
}

#[test]
fn a_traced_profile_parses_and_bad_figures_name_their_key() {
    let base = r#"{"family":"cnn","batchSize":32,"parameters":25557032,"activations":37560000,"depth":107"#;
    let p = parse_profile(&format!(
        r#"{base},"traced":{{"forwardMiB":2930,"backwardMiB":2947,"optimizerStepMiB":507,"largestTensorMiB":98}}}}"#
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
    assert!(json.contains(r#""largestTensorMiB":98}"#), "{json}");

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
        (
            r#"{"forwardMiB":10,"backwardMiB":10,"optimizerStepMiB":1,"largestTensorMiB":0}"#,
            "traced.largestTensorMiB",
        ),
        (
            r#"{"forwardMiB":10,"backwardMiB":10,"optimizerStepMiB":1,"largestTensorMiB":11}"#,
            "traced.largestTensorMiB",
        ),
        (r#"[1,1,1]"#, "traced"),
        (r#"null"#, "traced"),
    ] {
        let err = parse_profile(&format!(r#"{base},"traced":{traced}}}"#)).unwrap_err();
        assert!(err.to_string().contains(key), "{traced}: {err}");
    }
}
