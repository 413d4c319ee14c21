//! The time-slicing form (`carma_core::slowdown::TimeSlicing`) against the rates measured on
//! an H100 (`tests/data/h100-interference*.csv`).

use carma_workload::model::slowdown::TimeSlicing;

/// One measured file's rows: (scenario, job, steps per second, activity).
fn measured(name: &str) -> Vec<(String, String, f64, f64)> {
    let path = format!("{}/tests/data/{name}", env!("CARGO_MANIFEST_DIR"));
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{path}: {e}"));
    let mut lines = text.lines();
    let head: Vec<&str> = lines.next().unwrap().split(',').collect();
    let col = |c: &str| head.iter().position(|h| *h == c).unwrap();
    let (sc, job, sps, act) = (
        col("scenario"),
        col("job"),
        col("steps_per_s"),
        col("activity"),
    );
    lines
        .filter(|l| !l.trim().is_empty())
        .map(|l| {
            let f: Vec<&str> = l.split(',').collect();
            (
                f[sc].to_string(),
                f[job].to_string(),
                f[sps].parse().unwrap(),
                f[act].parse().unwrap(),
            )
        })
        .collect()
}

/// Measured and predicted rate of every job of every shared scenario of a file, as
/// `tools/fit-slowdown.py` computes them: rate = steps/s shared ÷ steps/s alone,
/// activities alone.
fn rates(name: &str) -> Vec<(String, String, f64, f64)> {
    let rows = measured(name);
    let alone = |j: &str| {
        rows.iter()
            .find(|r| r.0 == j && r.1 == j)
            .map(|r| (r.2, r.3))
            .unwrap()
    };
    let m = TimeSlicing::default();
    rows.iter()
        .filter(|r| r.0.contains('+'))
        .map(|(sc, job, sps, _)| {
            let acts: Vec<f64> = sc.split('+').map(|j| alone(j).1).collect();
            let (alone_sps, s) = alone(job);
            (
                sc.clone(),
                job.clone(),
                sps / alone_sps,
                m.rate(s, acts.iter().copied()),
            )
        })
        .collect()
}

#[test]
fn the_h100_fit_reproduces_measured_rates() {
    let rows = rates("h100-interference.csv");
    // A saturating pair, a light job beside a saturating one, and a saturating triple.
    for (scenario, job) in [
        ("resnet50-b64+bert-base-b8", "bert-base-b8"),
        ("resnet50-b64+mobilenet_v2-b32", "mobilenet_v2-b32"),
        ("resnet50-b64+bert-base-b8+gpt2-b8", "gpt2-b8"),
    ] {
        let (_, _, got, want) = rows.iter().find(|r| r.0 == scenario && r.1 == job).unwrap();
        assert!(
            (got - want).abs() <= 0.025,
            "{scenario} / {job}: measured {got}, predicted {want}"
        );
    }
    // Over both runs, the fit's mean absolute error (0.025 in docs/slowdown-on-h100.md).
    let all: Vec<_> = rows
        .into_iter()
        .chain(rates("h100-interference-repeat.csv"))
        .collect();
    assert_eq!(all.len(), 52);
    let mae = all.iter().map(|r| (r.2 - r.3).abs()).sum::<f64>() / all.len() as f64;
    assert!((mae - 0.025).abs() < 0.0005, "{mae}");
}
