//! A job's whole life on simulated GPUs: submit, placement, launch with CUDA_VISIBLE_DEVICES,
//! its declared memory in telemetry, success; and the status document's shape.

mod common;

use std::time::Duration;

use common::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_job_runs_on_its_gpu_and_its_declared_memory_shows() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = state_dir(&tmp);
    let out = tmp.path().join("visible");
    let script = format!(
        "echo 6000 > \"$CARMA_LOCAL_MEMORY_FILE\"; echo \"$CUDA_VISIBLE_DEVICES\" > {}; sleep 0.4",
        out.display()
    );
    let id = submit_sh(&dir, &script, Some(8000), 1, None);
    let daemon = start(config(&dir, "2x40GiB"));
    let s = wait_for(&dir, Duration::from_secs(4), all_done).await;
    daemon.abort();
    let j = job(&s, &id);
    assert_eq!(j["state"], "succeeded", "{j}");
    assert_eq!(j["attempts"], 1);
    assert_eq!(j["gpus"], serde_json::json!([0]));
    assert_eq!(std::fs::read_to_string(&out).unwrap().trim(), "0");
    // The device plugin's simulated model: 300 MiB + 55..90 % of the declared 6000 MiB — or, for
    // a sample taken before the job's shell wrote its file, of its 8000 MiB reservation.
    let peak = j["peak_mib"].as_u64().expect("peak seen");
    assert!((300 + 3300..=300 + 7200).contains(&peak), "peak {peak}");
    assert!(j["energy_j"].as_f64().unwrap() > 0.0);
    assert!(j["sm_activity_mean"].as_f64().unwrap() > 0.0);
    // Its output went to the attempt folder.
    assert!(dir.join("jobs").join(&id).join("1").join("stdout").exists());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn status_has_the_documented_shape_and_states() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = state_dir(&tmp);
    let ok = submit_sh(&dir, "sleep 0.2", Some(4096), 1, None);
    let bad = submit_sh(&dir, "echo nope >&2; exit 3", Some(4096), 1, None);
    // Before any daemon: both queued (in the spool).
    let s = status(&dir);
    assert_eq!(job(&s, &ok)["state"], "queued");
    let daemon = start(config(&dir, "2x40GiB"));
    let s = wait_for(&dir, Duration::from_secs(4), all_done).await;
    daemon.abort();
    for key in ["jobs", "gpus", "daemon"] {
        assert!(s.get(key).is_some(), "missing {key}");
    }
    for j in s["jobs"].as_array().unwrap() {
        for key in [
            "id",
            "state",
            "attempts",
            "gpus",
            "exit_reason",
            "peak_mib",
            "energy_j",
            "submitted_at_ms",
            "started_at_ms",
            "ended_at_ms",
        ] {
            assert!(j.get(key).is_some(), "job lacks {key}: {j}");
        }
        let state = j["state"].as_str().unwrap();
        assert!(["queued", "running", "succeeded", "failed"].contains(&state));
        // Values, not only keys: both jobs ran once and ended after they started.
        let (started, ended) = (
            j["started_at_ms"].as_u64().expect("started"),
            j["ended_at_ms"].as_u64().expect("ended"),
        );
        assert!(
            started >= j["submitted_at_ms"].as_u64().unwrap() && ended >= started,
            "{j}"
        );
        assert_eq!(j["ooms"], 0, "{j}");
    }
    assert_eq!(job(&s, &ok)["state"], "succeeded");
    let b = job(&s, &bad);
    assert_eq!(b["state"], "failed");
    assert_eq!(
        b["attempts"], 1,
        "a plain failure is not retried by default: {b}"
    );
    let reason = b["exit_reason"].as_str().unwrap();
    assert!(reason.contains("exit code 3"), "{reason}");
    let gpus = s["gpus"].as_array().unwrap();
    assert_eq!(gpus.len(), 2);
    assert_eq!(gpus[0]["simulated"], true);
    assert_eq!(gpus[0]["memory_total_mib"], 40960);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_job_asking_for_more_gpus_than_the_machine_has_fails_at_once() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = state_dir(&tmp);
    let big = submit_sh(&dir, "true", Some(1024), 3, None);
    let small = submit_sh(&dir, "true", Some(1024), 1, None);
    let daemon = start(config(&dir, "2x40GiB"));
    let s = wait_for(&dir, Duration::from_secs(4), all_done).await;
    daemon.abort();
    let b = job(&s, &big);
    assert_eq!(b["state"], "failed");
    assert!(
        b["exit_reason"]
            .as_str()
            .unwrap()
            .contains("this machine has 2"),
        "{b}"
    );
    assert_eq!(
        job(&s, &small)["state"],
        "succeeded",
        "the queue is not blocked"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_a_process_list_jobs_still_share_once_their_warm_up_has_passed() {
    use carma_gpu::config::SimulatedMetrics;
    let tmp = tempfile::tempdir().unwrap();
    let dir = state_dir(&tmp);
    let first = submit_sh(&dir, "sleep 1.2", Some(4096), 1, None);
    let mut cfg = config(&dir, "1x40GiB");
    // dcgm-exporter alone: activity metrics, no process list.
    cfg.backend =
        carma_local::BackendChoice::Simulated("1x40GiB".parse().unwrap(), SimulatedMetrics::Dcgm);
    // A CARMA policy: the default, pack, would keep these jobs of unknown activity apart.
    cfg.policy = carma_core::Policy::Magm;
    let daemon = start(cfg);
    wait_for(&dir, Duration::from_secs(2), |s| {
        job(s, &first)["state"] == "running"
    })
    .await;
    let second = submit_sh(&dir, "sleep 0.1", Some(4096), 1, None);
    // The second job shares the GPU with the first (magm) once the window is warm and the first
    // job's warm-up (300 ms) has passed, although no process list ever shows the first job.
    let s = wait_for(&dir, Duration::from_secs(3), |s| {
        job(s, &second)["state"] == "succeeded"
    })
    .await;
    assert_eq!(job(&s, &first)["state"], "running", "they shared the GPU");
    assert_eq!(job(&s, &second)["gpus"], serde_json::json!([0]));
    assert!(
        job(&s, &second)["peak_mib"].is_null(),
        "no attribution without a process list"
    );
    daemon.abort();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_relative_state_dir_works_whatever_the_jobs_working_directory() {
    let tmp = tempfile::tempdir().unwrap();
    let elsewhere = tmp.path().join("elsewhere");
    std::fs::create_dir_all(&elsewhere).unwrap();
    // A state directory named relative to this process's working directory (the crate root), inside
    // the workspace's (ignored) target folder.
    let name = format!("../target/carma-local-test-{}", std::process::id());
    let rel = std::path::PathBuf::from(&name);
    let state = carma_local::StateDir::create(&rel).unwrap();
    assert!(state.root().is_absolute());
    let now = carma_local::spec::now_ms();
    let spec = carma_local::JobSpec {
        id: carma_local::spec::new_job_id(now),
        name: "rel".into(),
        command: vec!["true".into()],
        cwd: elsewhere.clone(),
        gpus: 1,
        reservation: carma_core::Reservation::Mib(1024),
        reservation_source: "override".into(),
        policy: None,
        expected_sm_activity: None,
        expected_duration_ms: None,
        submitted_at_ms: now,
    };
    carma_local::spec::submit(&state, &spec).unwrap();
    let daemon = start(config(&rel, "1x40GiB"));
    let s = wait_for(state.root(), Duration::from_secs(3), all_done).await;
    daemon.abort();
    assert_eq!(job(&s, &spec.id)["state"], "succeeded");
    assert!(
        state
            .root()
            .join("jobs")
            .join(&spec.id)
            .join("1")
            .join("exit")
            .exists()
    );
    assert!(
        !elsewhere.join("target").exists(),
        "nothing written relative to the job's directory"
    );
    let _ = std::fs::remove_dir_all(state.root());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_queue_order_starts_the_job_declared_shortest_first() {
    // One GPU taken whole by each job: they run one after another, in the queue's order.
    let order_of_runs = |order: carma_core::QueueOrder| async move {
        let tmp = tempfile::tempdir().unwrap();
        let dir = state_dir(&tmp);
        let runs = tmp.path().join("runs");
        let mark = mark_run(&runs);
        let undeclared = submit_declared(&dir, &mark, None, 1, None, None);
        let hour = submit_declared(&dir, &mark, None, 1, None, Some(3_600_000));
        let minute = submit_declared(&dir, &mark, None, 1, None, Some(60_000));
        let mut cfg = config(&dir, "1x40GiB");
        cfg.queue_order = order;
        let daemon = start(cfg);
        wait_for(&dir, Duration::from_secs(10), all_done).await;
        daemon.abort();
        let ran: Vec<String> = std::fs::read_to_string(&runs)
            .unwrap()
            .lines()
            .map(str::to_string)
            .collect();
        let names = [(undeclared, "undeclared"), (hour, "1 h"), (minute, "1 min")];
        ran.iter()
            .map(|id| names.iter().find(|(i, _)| i == id).unwrap().1)
            .collect::<Vec<_>>()
    };
    assert_eq!(
        order_of_runs(carma_core::QueueOrder::Arrival).await,
        ["undeclared", "1 h", "1 min"]
    );
    assert_eq!(
        order_of_runs(carma_core::QueueOrder::ShortestFirst).await,
        ["1 min", "1 h", "undeclared"]
    );
}
