//! Bad input is named and classed as the user's (exit code 2 on the command line); nothing panics.

mod common;

use carma_local::reservation::{MemorySource, resolve};
use carma_local::{LocalError, StateDir};
use common::*;

#[test]
fn a_missing_state_dir_is_named() {
    let e = StateDir::existing("/nonexistent/carma-state").unwrap_err();
    assert!(e.is_bad_input());
    assert!(
        e.to_string()
            .contains("/nonexistent/carma-state does not exist"),
        "{e}"
    );
}

#[test]
fn bad_memory_and_profiles_are_named() {
    let e = resolve(&MemorySource::Override("lots".into())).unwrap_err();
    assert!(e.is_bad_input());
    assert!(e.to_string().contains("--gpu-memory \"lots\""), "{e}");
    let e = resolve(&MemorySource::Profile("/nonexistent/profile.json".into())).unwrap_err();
    assert!(
        e.to_string()
            .contains("--profile /nonexistent/profile.json"),
        "{e}"
    );
    let (r, _) = resolve(&MemorySource::Override("4GiB".into())).unwrap();
    assert_eq!(r, carma_core::Reservation::Mib(4096));
}

#[test]
fn a_bad_rad_file_is_named() {
    let tmp = tempfile::tempdir().unwrap();
    let rad = tmp.path().join("short.rad");
    std::fs::write(&rad, "# c\nenv\npython x.py\nsummary\n").unwrap();
    let e = carma_local::task_file::read_rad(&rad).unwrap_err();
    assert!(e.is_bad_input());
    assert!(e.to_string().contains("short.rad"), "{e}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_daemon_on_the_same_state_dir_is_refused() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = state_dir(&tmp);
    let first = start(config(&dir, "1x40GiB"));
    tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    let second = carma_local::serve(config(&dir, "1x40GiB"), std::future::pending()).await;
    first.abort();
    let e = second.unwrap_err();
    assert!(matches!(e, LocalError::AlreadyServed { .. }), "{e}");
    assert!(e.is_bad_input());
}

#[test]
fn a_torn_journal_line_is_cut_and_the_rest_kept() {
    let tmp = tempfile::tempdir().unwrap();
    let path = tmp.path().join("journal.jsonl");
    let j = carma_local::journal::Journal::new(path.clone());
    j.append(&carma_local::journal::Event::Decided {
        id: "x".into(),
        decision: carma_core::RecoveryDecision::Done,
        at_ms: 1,
    })
    .unwrap();
    std::fs::OpenOptions::new()
        .append(true)
        .open(&path)
        .and_then(|mut f| std::io::Write::write_all(&mut f, b"{\"event\":\"Deci"))
        .unwrap();
    assert_eq!(j.read().unwrap().len(), 1, "a torn last line is skipped");
    j.repair().unwrap();
    j.append(&carma_local::journal::Event::Decided {
        id: "y".into(),
        decision: carma_core::RecoveryDecision::Done,
        at_ms: 2,
    })
    .unwrap();
    assert_eq!(j.read().unwrap().len(), 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_daemon_whose_state_dir_is_removed_stops_instead_of_sharing_it_with_a_new_one() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = state_dir(&tmp);
    let daemon = start(config(&dir, "1x40GiB"));
    tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    // Moved away in one step (as `rm -rf` would remove it, but without racing the daemon's writes).
    std::fs::rename(&dir, tmp.path().join("moved")).unwrap();
    let e = tokio::time::timeout(std::time::Duration::from_secs(2), daemon)
        .await
        .expect("the daemon stops")
        .unwrap()
        .unwrap_err();
    // Caught by the lock check at the next pass, or by the pass the removal interrupted.
    assert!(
        matches!(e, LocalError::StateDirReplaced(_) | LocalError::Io { .. }),
        "{e}"
    );
}
