//! A daemon killed mid-queue and started again: no job is lost and none runs twice.

mod common;

use std::time::Duration;

use carma_core::Policy;
use common::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_daemon_killed_mid_queue_loses_no_job_and_runs_none_twice() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = state_dir(&tmp);
    let runs = tmp.path().join("runs");
    // One GPU, exclusive policy: the jobs run one after another.
    let script = format!("{}; sleep 0.4", mark_run(&runs));
    let ids: Vec<String> = (0..4)
        .map(|_| submit_sh(&dir, &script, Some(2048), 1, Some(Policy::Exclusive)))
        .collect();
    let daemon = start(config(&dir, "1x40GiB"));
    // Kill the daemon while the first job runs and the others wait.
    wait_for(&dir, Duration::from_secs(3), |s| {
        job(s, &ids[0])["state"] == "running"
    })
    .await;
    daemon.abort();
    let _ = daemon.await;
    // The job outlives the daemon, and the queue waits.
    tokio::time::sleep(Duration::from_millis(150)).await;
    let s = status(&dir);
    assert_eq!(job(&s, &ids[0])["state"], "running");
    assert_eq!(job(&s, &ids[1])["state"], "queued");
    // A new job arrives while no daemon runs.
    let late = submit_sh(&dir, &script, Some(2048), 1, Some(Policy::Exclusive));

    let daemon = start(config(&dir, "1x40GiB"));
    // Kill it once more in the middle, then let a third daemon finish.
    wait_for(&dir, Duration::from_secs(4), |s| {
        job(s, &ids[2])["state"] == "running"
    })
    .await;
    daemon.abort();
    let _ = daemon.await;
    let daemon = start(config(&dir, "1x40GiB"));
    let s = wait_for(&dir, Duration::from_secs(5), all_done).await;
    daemon.abort();

    let counts = run_counts(&runs);
    for id in ids.iter().chain([&late]) {
        let j = job(&s, id);
        assert_eq!(j["state"], "succeeded", "{j}");
        assert_eq!(j["attempts"], 1, "{j}");
        assert_eq!(
            counts.get(id.as_str()),
            Some(&1),
            "{id} ran {:?} times",
            counts.get(id.as_str())
        );
    }
    assert_eq!(counts.len(), 5);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_attempt_whose_process_vanished_while_no_daemon_ran_is_lost_and_rerun_once() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = state_dir(&tmp);
    let runs = tmp.path().join("runs");
    // The second attempt finishes quickly; the first would sleep long.
    let script = format!(
        "{}; if [ \"$CARMA_LOCAL_ATTEMPT\" = 1 ]; then sleep 30; fi",
        mark_run(&runs)
    );
    let id = submit_sh(&dir, &script, Some(2048), 1, None);
    let daemon = start(config(&dir, "1x40GiB"));
    wait_for(&dir, Duration::from_secs(3), |s| {
        job(s, &id)["state"] == "running"
    })
    .await;
    daemon.abort();
    let _ = daemon.await;
    // "running" is journaled when the launcher is spawned; on a loaded machine the launcher may
    // not have written its pid, nor the job its first line, yet. Both outlive the daemon.
    let pid_file = dir.join("jobs").join(&id).join("1").join("pid");
    let started = tokio::time::Instant::now();
    while !(pid_file.exists() && run_counts(&runs).get(id.as_str()) == Some(&1)) {
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "the first attempt never started"
        );
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    // The machine "reboots": the job's whole process group dies without an exit status.
    let pid: i32 = std::fs::read_to_string(&pid_file)
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    let killed = std::process::Command::new("kill")
        .args(["-KILL", "--", &format!("-{pid}")])
        .status()
        .unwrap();
    assert!(killed.success());
    let daemon = start(config(&dir, "1x40GiB"));
    let s = wait_for(&dir, Duration::from_secs(4), all_done).await;
    daemon.abort();
    let j = job(&s, &id);
    assert_eq!(j["state"], "succeeded", "{j}");
    assert_eq!(j["attempts"], 2);
    assert_eq!(j["lost_attempts"], 1);
    assert_eq!(
        run_counts(&runs).get(id.as_str()),
        Some(&2),
        "started once per attempt"
    );
}
