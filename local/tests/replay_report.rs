//! Replaying a CARMA trace script and reporting the run with the simulator's writers.

mod common;

use std::path::Path;
use std::time::{Duration, Instant};

use carma_local::StateDir;
use carma_local::replay::{ReplayOptions, replay};
use common::*;

fn shared_traces() -> std::path::PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../shared/traces/carma/v2")
}

#[test]
fn carmas_90_task_trace_is_submitted_with_its_task_files() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = StateDir::create(state_dir(&tmp)).unwrap();
    let traces = shared_traces();
    let ids = replay(
        &dir,
        &ReplayOptions {
            trace: traces.join("philly_mix-90-tasks.sh"),
            workloads: traces.join("workloads"),
            time_scale: 0.0,
            command: Some("true".into()),
            durations: None,
            cwd: tmp.path().to_path_buf(),
        },
    )
    .unwrap();
    assert_eq!(ids.len(), 90);
    let spool = carma_local::spec::read_spool(&dir).unwrap();
    assert_eq!(spool.len(), 90);
    let order: Vec<&str> = spool.iter().map(|(s, _)| s.id.as_str()).collect();
    assert_eq!(
        order,
        ids.iter().map(String::as_str).collect::<Vec<_>>(),
        "FIFO order kept"
    );
    assert!(spool.iter().all(|(s, _)| s.name.ends_with(".rad")));
    assert!(
        spool.iter().any(|(s, _)| s.gpus == 2),
        "multi-GPU tasks keep their GPU count"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replayed_trace_runs_at_its_gaps_and_reports_like_simulate() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = state_dir(&tmp);
    let state = StateDir::create(&dir).unwrap();
    let work = tmp.path().join("workloads");
    std::fs::create_dir_all(&work).unwrap();
    for rad in ["resnet18_cifar100_20e_1.rad", "BERT_base.rad"] {
        std::fs::copy(shared_traces().join("workloads").join(rad), work.join(rad)).unwrap();
    }
    let trace = tmp.path().join("trace.sh");
    std::fs::write(
        &trace,
        "python src/submit.py --task workloads/resnet18_cifar100_20e_1.rad\nsleep 200\n\
         python src/submit.py --task workloads/BERT_base.rad\nsleep 100\n\
         python src/submit.py --task workloads/resnet18_cifar100_20e_1.rad\n",
    )
    .unwrap();
    // 0.1 minute × 0.001 → 6 ms; 1.5 minutes → 90 ms.
    std::fs::write(
        tmp.path().join("durations.csv"),
        "rad,exclusive_minutes\nresnet18_cifar100_20e_1.rad,0.1\nBERT_base.rad,1.5\n",
    )
    .unwrap();
    let daemon = start(config(&dir, "2x40GiB"));
    let started = Instant::now();
    let opts = ReplayOptions {
        trace,
        workloads: work,
        time_scale: 0.001,
        command: Some("echo {peak_mib} > \"$CARMA_LOCAL_MEMORY_FILE\"; sleep {seconds}".into()),
        durations: Some(tmp.path().join("durations.csv")),
        cwd: tmp.path().to_path_buf(),
    };
    let ids = tokio::task::spawn_blocking(move || replay(&state, &opts))
        .await
        .unwrap()
        .unwrap();
    // Gaps of 200 s and 100 s at a thousandth: the replay takes about 0.3 s.
    assert!(
        started.elapsed() >= Duration::from_millis(290),
        "{:?}",
        started.elapsed()
    );
    assert_eq!(ids.len(), 3);
    let s = wait_for(&dir, Duration::from_secs(4), |s| {
        all_done(s) && s["jobs"].as_array().unwrap().len() == 3
    })
    .await;
    daemon.abort();
    assert!(
        s["jobs"]
            .as_array()
            .unwrap()
            .iter()
            .all(|j| j["state"] == "succeeded")
    );

    let r = carma_local::report::report(&StateDir::existing(&dir).unwrap()).unwrap();
    let table = r.table();
    assert!(table.contains("GPU telemetry SIMULATED"), "{table}");
    assert!(table.contains("makespan"), "{table}");
    assert!(
        table.contains("the job's own final run time (measured)") && !table.contains("Models:"),
        "{table}"
    );
    let json = r.json();
    assert_eq!(json["simulated"], true);
    let p = &json["policies"][0];
    assert_eq!(p["tasks"], 3);
    assert_eq!(p["finished"], 3);
    assert!(p["makespan_s"].as_f64().unwrap() > 0.2);
    assert!(p["energy_kwh"].as_f64().unwrap() > 0.0);
    assert_eq!(json["local"]["jobs"].as_array().unwrap().len(), 3);
    let gpus = json["local"]["gpus"].as_array().unwrap();
    assert_eq!(gpus.len(), 2);
    assert!(
        gpus.iter()
            .any(|g| g["peak_used_mib"].as_u64().unwrap() > 0)
    );
    let html = r.write(&tmp.path().join("report")).unwrap();
    let text = std::fs::read_to_string(html).unwrap();
    assert!(text.contains("carma local"));
    assert!(!text.contains("Nothing here was measured"));
    assert!(!text.contains("<h2>Models</h2>") && text.contains("<h2>What this is</h2>"));
    let results: serde_json::Value =
        serde_json::from_slice(&std::fs::read(tmp.path().join("report/results.json")).unwrap())
            .unwrap();
    assert_eq!(
        results["runs"][0]["gpus"].as_array().unwrap().len(),
        2,
        "timelines kept"
    );
}
