//! Out-of-range input is refused with the flag or file:line and the
//! valid range, instead of overflowing, exhausting memory or spinning.

use std::path::Path;

use carma_workload::SimConfig;
use carma_workload::model::slowdown::TimeSlicing;
use carma_workload::trace::carma::{parse_durations, parse_rad, parse_script};
use carma_workload::trace::{GeneratorConfig, generate};

fn config_error(edit: impl FnOnce(&mut SimConfig)) -> String {
    let mut cfg = SimConfig::default();
    edit(&mut cfg);
    cfg.validate().unwrap_err().to_string()
}

#[test]
fn cluster_size_is_bounded() {
    let err = config_error(|c| c.cluster.gpus_per_node = u32::MAX);
    assert!(
        err.contains("--gpus-per-node is 4294967295; it must be between 1 and 1024"),
        "{err}"
    );
    let err = config_error(|c| c.cluster.nodes = 1_000_000);
    assert!(
        err.contains("--nodes is 1000000; it must be between 1 and 100000"),
        "{err}"
    );
    let err = config_error(|c| {
        c.cluster.nodes = 100_000;
        c.cluster.gpus_per_node = 2;
    });
    assert!(err.contains("200000 GPUs; at most 100000"), "{err}");
    let err = config_error(|c| c.cluster.gpu_memory_mib = u64::MAX);
    assert!(err.contains("--gpu-memory"), "{err}");
    let err = config_error(|c| c.cluster.nodes = 0);
    assert!(err.contains("--nodes is 0"), "{err}");
}

#[test]
fn delays_and_attempts_are_bounded() {
    let err = config_error(|c| c.placement.warmup_ms = u64::MAX);
    assert!(
        err.contains("--warm-up") && err.contains("0 and 86400 s"),
        "{err}"
    );
    let err = config_error(|c| c.telemetry.lag_ms = 86_400_001);
    assert!(err.contains("--telemetry-lag"), "{err}");
    let err = config_error(|c| c.recovery.backoff_base_ms = u64::MAX);
    assert!(err.contains("--recovery-backoff"), "{err}");
    let err = config_error(|c| c.recovery.max_attempts = u32::MAX);
    assert!(
        err.contains("--max-attempts is 4294967295; it must be between 1 and 100"),
        "{err}"
    );
    let mut edge = SimConfig::default();
    edge.placement.warmup_ms = 86_400_000;
    edge.recovery.max_attempts = 100;
    edge.validate().unwrap();
}

#[test]
fn model_flags_are_bounded() {
    let err = config_error(|c| c.slowdown.exponent = 1e300);
    assert!(
        err.contains("--slowdown-exponent is 1e300; it must be between 0 and 10"),
        "{err}"
    );
    let err = config_error(|c| c.slowdown.threshold = 1e300);
    assert!(err.contains("--slowdown-threshold"), "{err}");
    let err = config_error(|c| c.power.max_w = 1e300);
    assert!(err.contains("--max-power ≤ 10000 W"), "{err}");
    let err = config_error(|c| c.activity_scale = f64::MAX);
    assert!(err.contains("--activity-scale"), "{err}");
}

#[test]
fn time_slicing_flags_are_bounded() {
    let slicing = |edit: fn(&mut TimeSlicing)| {
        config_error(move |c| {
            let mut ts = TimeSlicing::default();
            edit(&mut ts);
            c.slowdown.time_slicing = Some(ts);
        })
    };
    let err = slicing(|t| t.full_activity = 0.0);
    assert!(
        err.contains("--slicing-full-activity is 0.0; it must be more than 0"),
        "{err}"
    );
    let err = slicing(|t| t.exponent = f64::NAN);
    assert!(err.contains("--slicing-exponent is NaN"), "{err}");
    let err = slicing(|t| t.efficiency = 1.5);
    assert!(
        err.contains("--slicing-efficiency is 1.5; it must be more than 0 and at most 1"),
        "{err}"
    );
    let mut fitted = SimConfig::default();
    fitted.slowdown.time_slicing = Some(TimeSlicing::default());
    fitted.validate().unwrap();
}

#[test]
fn generator_size_and_load_are_bounded() {
    let gen_err = |cfg: GeneratorConfig| generate(&cfg).unwrap_err().to_string();
    let err = gen_err(GeneratorConfig {
        tasks: 100_001,
        ..GeneratorConfig::default()
    });
    assert!(
        err.contains("--tasks is 100001; it must be between 1 and 100000"),
        "{err}"
    );
    let err = gen_err(GeneratorConfig {
        load: 1e-300,
        ..GeneratorConfig::default()
    });
    assert!(err.contains("between 0.01 and 100"), "{err}");
}

#[test]
fn huge_sleeps_are_refused_with_the_line() {
    let p = Path::new("t.sh");
    let err = parse_script(p, "python submit.py --task a.rad\nsleep 1e99\n")
        .unwrap_err()
        .to_string();
    assert!(
        err.starts_with("t.sh:2:") && err.contains("out of range"),
        "{err}"
    );
    // Each sleep in range, their sum not.
    let many = "sleep 300000000\n".repeat(2);
    let err = parse_script(p, &many).unwrap_err().to_string();
    assert!(
        err.starts_with("t.sh:2:") && err.contains("add up to"),
        "{err}"
    );
    let subs = parse_script(p, "sleep 315360000\npython submit.py --task a.rad\n").unwrap();
    assert_eq!(subs[0].at_ms, 315_360_000_000);
}

#[test]
fn huge_and_duplicate_run_times_are_refused_with_the_line() {
    let p = Path::new("d.csv");
    let err = parse_durations(p, "rad,exclusive_minutes\na.rad,1e15\n")
        .unwrap_err()
        .to_string();
    assert!(
        err.starts_with("d.csv:2:") && err.contains("at most 525600 minutes"),
        "{err}"
    );
    // Not mistaken for a header on line 1 either.
    let err = parse_durations(p, "a.rad,1e15\n").unwrap_err().to_string();
    assert!(err.starts_with("d.csv:1:"), "{err}");
    let err = parse_durations(p, "a.rad,2\nb.rad,3\na.rad,4\n")
        .unwrap_err()
        .to_string();
    assert!(
        err.starts_with("d.csv:3:") && err.contains("first at line 1"),
        "{err}"
    );
}

fn rad(batch: &str, gpus: &str, peak: &str, estimate: &str) -> String {
    format!(
        "# c\nconda\npython x.py\nx.model\nimagenet\n{batch}\nexclusive\n{gpus}\n{peak}\n0\n0\n{estimate}"
    )
}

#[test]
fn out_of_range_task_files_are_refused_with_the_line() {
    let p = Path::new("r.rad");
    parse_rad(p, &rad("64", "1", "7106", "16000")).unwrap();
    let cases = [
        (
            rad("0", "1", "7106", "16000"),
            "r.rad:6:",
            "batch size is 0",
        ),
        (
            rad("1e99", "1", "7106", "16000"),
            "r.rad:6:",
            "from 1 to 1048576",
        ),
        (
            rad("64.5", "1", "7106", "16000"),
            "r.rad:6:",
            "whole number",
        ),
        (
            rad("64", "1e99", "7106", "16000"),
            "r.rad:8:",
            "from 1 to 1024",
        ),
        (
            rad("64", "0", "7106", "16000"),
            "r.rad:8:",
            "number of GPUs is 0",
        ),
        (
            rad("64", "1", "1e99", "16000"),
            "r.rad:9:",
            "at most 1048576 MiB",
        ),
        (
            rad("64", "1", "7106", "1e99"),
            "r.rad:12:",
            "at most 1048576 MiB",
        ),
    ];
    for (text, at, what) in cases {
        let err = parse_rad(p, &text).unwrap_err().to_string();
        assert!(
            err.starts_with(at) && err.contains(what),
            "{at} {what}: {err}"
        );
    }
}
