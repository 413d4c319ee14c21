//! The traced reservation against measured peaks.
//!
//! `estimator/tests/data/traced-peaks.csv` holds the traced phase peaks, largest tensor and
//! replayed allocator segments of each of CARMA's jobs (`python -m carma_profile.calibrate`,
//! one GPU's share of the batch); the measured per-GPU peaks are line 8 of the task files in
//! `../shared/traces/carma/v2/workloads/*.rad` (A100s) and `h100-carma-peaks.csv` (carma's
//! H100 run). The constants of `traced.rs` were fitted on both; `traced-heldout.csv` and
//! `h100-heldout-peaks.csv` are architectures they were not fitted on. `python -m
//! carma_profile.report` prints all of it (docs/traced-estimate.md).

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
    let (job, family, model, gpus, fwd, bwd, opt, largest, reserved) = (
        col("job"),
        col("family"),
        col("model"),
        col("gpus"),
        col("forward_mib"),
        col("backward_mib"),
        col("optimizer_step_mib"),
        col("largest_tensor_mib"),
        col("reserved_mib"),
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
                    reserved_mib: Some(num(reserved)),
                },
                measured,
            }
        })
        .collect()
}

/// CARMA's architectures re-measured on an H100 (`python -m carma_profile.measure --set
/// carma`), paired with their traces by model label and batch.
fn h100_jobs(measured: &str, traced_csv: &str) -> Vec<Job> {
    let mut r = reader(traced_csv);
    let th = r.headers().unwrap().clone();
    let traced: Vec<csv::StringRecord> = r.records().map(Result::unwrap).collect();
    let tcol = |name: &str| th.iter().position(|h| h == name).unwrap();
    let mut m = reader(measured);
    let mh = m.headers().unwrap().clone();
    let mcol = |name: &str| mh.iter().position(|h| h == name).unwrap();
    m.records()
        .map(Result::unwrap)
        .filter(|row| !row[mcol("measured_mib")].is_empty())
        .map(|row| {
            let label = &row[mcol("model")];
            let batch = &row[mcol("batch_size")];
            let t = traced
                .iter()
                .find(|t| {
                    let cifar = t[tcol("job")].to_lowercase().contains("cifar");
                    let tl = if cifar {
                        format!("{} (CIFAR-100)", &t[tcol("model")])
                    } else {
                        t[tcol("model")].to_string()
                    };
                    tl == label && &t[tcol("batch_size")] == batch && &t[tcol("gpus")] == "1"
                })
                .unwrap_or_else(|| panic!("{traced_csv} has no trace of {label} at batch {batch}"));
            let num = |s: &str| -> u64 { s.parse().unwrap_or_else(|e| panic!("{s}: {e}")) };
            Job {
                job: format!("{label} b{batch} (H100)"),
                model: t[tcol("model")].to_string(),
                family: t[tcol("family")].parse().unwrap(),
                gpus: 1,
                traced: Traced {
                    forward_mib: num(&t[tcol("forward_mib")]),
                    backward_mib: num(&t[tcol("backward_mib")]),
                    optimizer_step_mib: num(&t[tcol("optimizer_step_mib")]),
                    largest_tensor_mib: Some(num(&t[tcol("largest_tensor_mib")])),
                    reserved_mib: Some(num(&t[tcol("reserved_mib")])),
                },
                measured: num(&row[mcol("measured_mib")]),
            }
        })
        .collect()
}

fn reader(name: &str) -> csv::Reader<std::fs::File> {
    let path = root().join("tests/data").join(name);
    csv::Reader::from_path(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// The largest CUDA context measured on the H100 (MiB), from both measured CSVs.
fn largest_measured_context() -> u64 {
    ["h100-carma-peaks.csv", "h100-heldout-peaks.csv"]
        .iter()
        .flat_map(|name| {
            let mut r = reader(name);
            let col = r
                .headers()
                .unwrap()
                .iter()
                .position(|h| h == "context_mib")
                .unwrap();
            r.records()
                .map(Result::unwrap)
                .filter_map(move |row| row[col].parse::<u64>().ok())
                .collect::<Vec<_>>()
        })
        .max()
        .unwrap()
}

fn over(j: &Job) -> i64 {
    traced_reservation_mib(&j.traced, j.family, j.gpus) as i64 - j.measured as i64
}

fn underestimated(all: &[Job]) -> Vec<String> {
    all.iter()
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
        .collect()
}

fn mean_over(all: &[Job], family: Family) -> i64 {
    let of: Vec<i64> = all
        .iter()
        .filter(|j| j.family == family)
        .map(over)
        .collect();
    of.iter().sum::<i64>() / of.len() as i64
}

#[test]
fn no_job_of_the_fitting_set_is_underestimated_and_the_constants_are_tight() {
    let mut all = jobs();
    assert!(all.len() >= 40, "only {} traced jobs", all.len());
    let h100 = h100_jobs("h100-carma-peaks.csv", "traced-peaks.csv");
    assert!(h100.len() >= 25, "only {} H100 jobs", h100.len());
    all.extend(h100);
    let under = underestimated(&all);
    assert!(under.is_empty(), "underestimated:\n{}", under.join("\n"));
    // docs/traced-estimate.md: the CNN mean within the 1 GiB goal; the Transformer mean above
    // it, because CARMA's A100 jobs carry the H100's larger context, the multi-GPU term is set
    // by XLNet-large, which over-reserves GPT-2 large by 4.6 GiB, and the largest-tensor factor
    // (1.08) by BERT-large on the H100, 514 MiB above its trace, which the other BERT rows are
    // not. (1.6 GiB while the trace counted a tied LM head twice and the factor was 0.34.)
    assert!(
        mean_over(&all, Family::Cnn) <= 1024,
        "CNN mean over {} MiB",
        mean_over(&all, Family::Cnn)
    );
    assert!(
        mean_over(&all, Family::Transformer) <= 1900,
        "Transformer mean over {} MiB",
        mean_over(&all, Family::Transformer)
    );
    // The context is measured, not fitted: it covers every context the H100 runs measured.
    assert!(
        carma_estimator::ALLOCATOR_CONTEXT_MIB >= largest_measured_context(),
        "a process held {} MiB of context",
        largest_measured_context()
    );
    // Each fitted constant is set by a job within 3 % of being underestimated.
    let tight = |pick: &dyn Fn(&Job) -> bool| {
        all.iter()
            .filter(|j| pick(j))
            .map(|j| over(j) as f64 / j.measured as f64)
            .fold(f64::INFINITY, f64::min)
    };
    assert!(
        tight(&|j| j.family == Family::Cnn && j.measured > 2_000) < 0.03,
        "the largest-tensor factor"
    );
    assert!(tight(&|j| j.gpus > 1) < 0.03, "the multi-GPU term");
    assert!(tight(&|j| j.measured < 2_000) < 0.03, "the floor");
}

/// The held-out architectures (never fitted on): the misses docs/traced-estimate.md reports,
/// and no others.
#[test]
fn held_out_jobs_miss_only_where_the_docs_say() {
    let held = h100_jobs("h100-heldout-peaks.csv", "traced-heldout.csv");
    assert_eq!(held.len(), 26);
    let mut missed: Vec<&str> = held
        .iter()
        .filter(|j| over(j) < 0)
        .map(|j| j.model.as_str())
        .collect();
    missed.sort_unstable();
    assert_eq!(
        missed,
        ["t5-small (seq2seq)", "vit_b_16", "wide_resnet50_2"],
        "{}",
        underestimated(&held).join("\n")
    );
    assert!(mean_over(&held, Family::Cnn) <= 1024);
    assert!(mean_over(&held, Family::Transformer) <= 1024);
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
