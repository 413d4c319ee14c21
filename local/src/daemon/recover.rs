//! What a daemon does with the journal it finds at start.
//!
//! * A submission still in the spool is taken as usual (the journal is written before the spool
//!   file is removed, and a job id already journaled is not taken twice).
//! * An attempt whose last attempt ended without a decision gets its decision now.
//! * An attempt that was running when the previous daemon stopped:
//!   - its launcher recorded an exit status meanwhile → it is finished as usual on the first tick;
//!   - its launcher still runs (found by the pid it wrote, or by its command line, which names
//!     the attempt folder) → **re-adopted**: booked again in the ledger, watched through its exit
//!     file, never started a second time;
//!   - neither → **lost**: recorded as an eviction (carma-core reruns it unchanged and does not
//!     count it as an attempt), so the job runs again, once.

use carma_core::PlacementRecord;

use super::Daemon;
use super::schedule::NODE;
use crate::error::Result;
use crate::journal::Event;
use crate::launch::{exit_status, find_launcher, launcher_alive, launcher_pid};
use crate::spec::now_ms;

impl Daemon {
    /// Rebuild the ledger and settle the attempts the previous daemon left running.
    pub(super) fn recover(&mut self) -> Result<()> {
        let running: Vec<_> = self
            .table
            .jobs()
            .iter()
            .filter_map(|j| {
                j.running()
                    .map(|a| (j.spec.id.clone(), a.clone(), j.spec.expected_sm_activity))
            })
            .collect();
        for (id, attempt, expected_sm_activity) in running {
            let dir = self.dir.attempt(&id, attempt.number);
            let pid = launcher_pid(&dir)
                .or(attempt.pid)
                .filter(|p| launcher_alive(*p, &dir))
                .or_else(|| find_launcher(&dir));
            let finished = exit_status(&dir).is_some();
            if pid.is_none() && !finished {
                self.lose(
                    &id,
                    attempt.number,
                    "the daemon stopped and its process is gone without an exit status",
                )?;
                continue;
            }
            if finished {
                tracing::info!(job = %id, attempt = attempt.number, "an attempt ended while no daemon ran");
            } else {
                tracing::info!(job = %id, attempt = attempt.number, ?pid, "re-adopted a running attempt");
            }
            self.ledger.insert_unchecked(PlacementRecord {
                pod: id.clone(),
                node: NODE.to_string(),
                gpus: attempt.uuids.clone(),
                reserved_mib: attempt.reserved_mib,
                exclusive: attempt.exclusive,
                assigned_at: attempt.launched_at_ms,
                visible: false,
                // As placement booked it: the job's own expectation (1 when unknown).
                expected_sm_activity: carma_core::placement::pack::booked(expected_sm_activity),
            });
            if let Some(pid) = pid
                && attempt.pid != Some(pid)
            {
                self.record(Event::Started {
                    id: id.clone(),
                    attempt: attempt.number,
                    pid,
                    at_ms: now_ms(),
                })?;
            }
        }
        self.decide_pending()
    }
}
