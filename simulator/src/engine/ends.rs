//! How attempts and tasks end: completion, an out-of-memory crash and the recovery decision
//! after it (`carma_core::decide_next`), failure.

use carma_core::{AttemptOutcome, AttemptRecord, RecoveryDecision, Reservation, decide_next};
use tracing::{debug, warn};

use super::{Engine, Event, Run};
use crate::result::{AttemptEnd, AttemptLog};

impl Engine<'_> {
    /// Task `id`'s attempt ran to completion.
    pub(super) fn complete(&mut self, id: usize) {
        let Some(run) = self.state[id].run.take() else {
            return;
        };
        self.release(id, &run);
        let s = &mut self.state[id];
        s.run_ms += self.now - run.start;
        s.end = Some(self.now);
        s.finished = true;
        s.history.push(AttemptRecord {
            outcome: AttemptOutcome::Succeeded,
            reservation: s.reservation,
            exclusive: s.exclusive,
        });
        if let Some(book) = self.learn.as_mut() {
            book.completed(id, self.tasks[id].peak_mib);
        }
        self.log_attempt(id, &run, AttemptEnd::Finished);
        self.rerate_on(&run.gpus);
        self.last_end = self.last_end.max(self.now);
        self.request_tick(self.now);
    }

    /// Task `id`'s attempt ran out of memory on GPU `gpu`: recovery decides what follows.
    pub(super) fn crash(&mut self, id: usize, gpu: usize) {
        let Some(run) = self.state[id].run.take() else {
            return;
        };
        self.release(id, &run);
        let ran = self.now - run.start;
        self.ooms += 1;
        self.lost_gpu_ms += ran as f64 * run.gpus.len() as f64;
        self.log_attempt(id, &run, AttemptEnd::OutOfMemory);
        self.last_end = self.last_end.max(self.now);
        let total = self.gpus[gpu].total_mib;
        let s = &mut self.state[id];
        s.run_ms += ran;
        s.ooms += 1;
        s.history.push(AttemptRecord {
            outcome: AttemptOutcome::GpuOutOfMemory {
                observed_peak_mib: None,
            },
            reservation: s.reservation,
            exclusive: run.exclusive,
        });
        if let Some(book) = self.learn.as_mut() {
            let reserved = match s.reservation {
                Reservation::Mib(m) => Some(m),
                Reservation::WholeGpu | Reservation::Unknown => None,
            };
            book.crashed(
                id,
                carma_core::recorded_reservation_mib(run.exclusive, reserved, Some(total)),
            );
        }
        debug!(task = id, gpu, "out of memory");
        match decide_next(&s.history, Some(total), &self.cfg.recovery) {
            RecoveryDecision::Retry {
                reservation,
                exclusive,
                backoff_ms,
                recovery_priority,
                ..
            } => {
                s.reservation = reservation;
                s.exclusive = exclusive;
                self.push(
                    self.now.saturating_add(backoff_ms),
                    Event::Ready {
                        task: id,
                        recovery: recovery_priority,
                    },
                );
            }
            RecoveryDecision::GiveUp { reason } => self.fail(id, reason),
            RecoveryDecision::Done => {
                warn!(task = id, "recovery says done after an out-of-memory crash");
                self.fail(id, "recovery ended after an out-of-memory crash".into());
            }
        }
        self.request_tick(self.now);
    }

    /// Task `id` fails for `reason`.
    pub(super) fn fail(&mut self, id: usize, reason: String) {
        let s = &mut self.state[id];
        s.failure = Some(reason);
        s.end = Some(self.now);
        self.last_end = self.last_end.max(self.now);
    }

    /// Record the attempt `run` of task `id` for the HTML report, when timelines are recorded.
    fn log_attempt(&mut self, id: usize, run: &Run, end: AttemptEnd) {
        if !self.cfg.record_timelines {
            return;
        }
        self.attempts.push(AttemptLog {
            task: id,
            name: self.tasks[id].name.clone(),
            attempt: self.state[id].attempts,
            gpus: run.gpus.clone(),
            start_ms: run.start,
            end_ms: self.now,
            end,
            reserved_mib: run.reserved_mib,
            peak_mib: self.tasks[id].peak_mib,
            exclusive: run.exclusive,
        });
    }
}
