//! A job that crashes out of GPU memory: the operator's classifier recognises it, carma-core's
//! decide_next requeues it with a larger reservation, then exclusively after two OOMs.

mod common;

use std::time::Duration;

use carma_core::{AttemptOutcome, Reservation};
use carma_local::jobs::JobTable;
use carma_local::journal::Journal;
use common::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_oom_is_requeued_larger_then_exclusive_then_succeeds() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = state_dir(&tmp);
    // Attempts 1 and 2 crash as PyTorch does; attempt 3 succeeds.
    let script = "if [ \"$CARMA_LOCAL_ATTEMPT\" -lt 3 ]; then \
        echo 'torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB' >&2; exit 1; fi; sleep 0.1";
    let id = submit_sh(&dir, script, Some(4096), 1, None);
    let daemon = start(config(&dir, "2x40GiB"));
    let s = wait_for(&dir, Duration::from_secs(4), all_done).await;
    daemon.abort();
    let j = job(&s, &id);
    assert_eq!(j["state"], "succeeded", "{j}");
    assert_eq!(j["attempts"], 3);
    assert_eq!(j["ooms"], 2);

    let table = JobTable::from_events(&Journal::new(dir.join("journal.jsonl")).read().unwrap());
    let a = &table.get(&id).unwrap().attempts;
    assert!(matches!(
        a[0].end.as_ref().unwrap().outcome,
        AttemptOutcome::GpuOutOfMemory { .. }
    ));
    assert_eq!(a[0].reservation, Reservation::Mib(4096));
    assert!(!a[0].exclusive);
    // decide_next: the next GPUMemNet class edge above 4096 MiB.
    assert_eq!(a[1].reservation, Reservation::Mib(8000));
    assert!(!a[1].exclusive);
    // After two OOMs (the default escalation): whole GPU, alone.
    assert_eq!(a[2].reservation, Reservation::WholeGpu);
    assert!(a[2].exclusive);
    assert_eq!(a[2].reserved_mib, 40960);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_oom_on_an_exclusive_gpu_fails_the_job_with_the_reason() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = state_dir(&tmp);
    let id = submit_sh(
        &dir,
        "echo 'RuntimeError: CUDA out of memory.' >&2; exit 1",
        None,
        1,
        None,
    );
    let daemon = start(config(&dir, "1x40GiB"));
    let s = wait_for(&dir, Duration::from_secs(4), all_done).await;
    daemon.abort();
    let j = job(&s, &id);
    assert_eq!(j["state"], "failed");
    assert_eq!(j["attempts"], 1);
    assert!(
        j["exit_reason"]
            .as_str()
            .unwrap()
            .contains("does not fit this GPU"),
        "{j}"
    );
}
