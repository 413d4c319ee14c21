//! Import of CARMA's real traces from `../shared/traces/carma` (read in place,
//! never copied). These tests fail, with a message saying what is missing, when
//! the shared folder is absent.

use std::path::{Path, PathBuf};

use carma_core::Policy;
use carma_simulator::trace::{ImportPaths, import};
use carma_simulator::{EstimatorKind, SimConfig, SimError, compare};

fn shared() -> PathBuf {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../shared/traces/carma");
    assert!(
        dir.join("v2/philly_mix-90-tasks.sh").is_file(),
        "CARMA traces not found at {} (expected ../shared/traces/carma beside the repository, with v2/philly_mix-90-tasks.sh, v2/workloads/ and task-durations.csv)",
        dir.display()
    );
    dir
}

fn paths(trace: &str) -> ImportPaths {
    let d = shared();
    ImportPaths {
        trace: d.join("v2").join(trace),
        workloads: d.join("v2/workloads"),
        durations: d.join("task-durations.csv"),
    }
}

#[test]
fn the_three_traces_import_and_replay() {
    for (name, n) in [
        ("philly_mix-90-tasks.sh", 90),
        ("philly_heavy-60-tasks.sh", 60),
        ("philly_trace-t1.sh", 60),
    ] {
        let trace = import(&paths(name)).unwrap();
        assert_eq!(trace.tasks.len(), n, "{name}");
        assert!(
            trace.tasks.iter().all(|t| t.workload.is_some()),
            "{name}: every task file is in the catalog"
        );
        let cmp = compare(
            &trace,
            EstimatorKind::Recorded,
            &Policy::ALL,
            &SimConfig::default(),
        )
        .unwrap();
        for run in &cmp.runs {
            assert_eq!(run.summary.finished, n, "{name} {}", run.summary.policy);
        }
    }
}

#[test]
fn the_mix_trace_matches_its_published_shape() {
    let trace = import(&paths("philly_mix-90-tasks.sh")).unwrap();
    // 89 gaps summing to 12,514 s.
    assert_eq!(trace.tasks.last().unwrap().arrival_ms, 12_514_000);
    let first = &trace.tasks[0];
    assert_eq!(
        (first.name.as_str(), first.gpus, first.peak_mib),
        ("gpt2_large_2", 2, 28356)
    );
    assert_eq!(first.exclusive_ms, 3_897_600); // 64.96 min
    assert_eq!(first.recorded_mib, None); // 40000 = not available
}

#[test]
fn missing_files_and_bad_lines_are_named() {
    let mut p = paths("philly_mix-90-tasks.sh");
    p.durations = p.durations.with_file_name("no-such-durations.csv");
    let err = import(&p).unwrap_err();
    assert!(matches!(err, SimError::Io { .. }));
    assert!(err.to_string().contains("no-such-durations.csv"), "{err}");

    let dir = tempdir();
    let script = dir.join("bad.sh");
    std::fs::write(
        &script,
        "python src/submit.py --task workloads/resnet.rad\nsleep 5\nwhoami\n",
    )
    .unwrap();
    let mut p = paths("philly_mix-90-tasks.sh");
    p.trace = script.clone();
    let err = import(&p).unwrap_err().to_string();
    assert!(err.contains("bad.sh:3:"), "{err}");

    std::fs::write(&script, "python src/submit.py --task workloads/nope.rad\n").unwrap();
    let err = import(&p).unwrap_err().to_string();
    assert!(
        err.contains("bad.sh") && err.contains("line 1") && err.contains("nope.rad"),
        "{err}"
    );
}

fn tempdir() -> PathBuf {
    let d = std::env::temp_dir().join(format!("carma-sim-test-{}", std::process::id()));
    std::fs::create_dir_all(&d).unwrap();
    d
}
