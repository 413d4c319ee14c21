//! Dispatch: CARMA's two first-in-first-out queues (recovery first, strict head of line), each
//! head placed by carma-core, booked in its ledger, journaled, then launched.

use carma_core::placement::recovery_first;
use carma_core::{Demand, Millis, Node, NodePlacement, place_on_node};

use super::Daemon;
use crate::error::Result;
use crate::journal::Event;
use crate::launch::{LaunchEnv, spawn};
use crate::spec::now_ms;

/// The node name carma-core sees for this machine.
pub(crate) const NODE: &str = "local";

impl Daemon {
    /// Dispatch queue heads until none can be placed.
    pub(super) fn schedule(&mut self, now: Millis) -> Result<()> {
        self.waiting.clear();
        // Each launch changes the ledger; every GPU can take at most one more job per pass.
        for _ in 0..=self.gpus.len() {
            if !self.schedule_one(now)? {
                break;
            }
        }
        Ok(())
    }

    /// Try the head of the recovery queue, then the head of the main queue; launch the first that
    /// carma-core places. Returns whether one was launched.
    #[tracing::instrument(skip(self))]
    fn schedule_one(&mut self, now: Millis) -> Result<bool> {
        let order = self.cfg.queue_order;
        let recovery_head = self
            .table
            .queue(true, order)
            .first()
            .map(|j| j.spec.id.clone());
        let main_head = self
            .table
            .queue(false, order)
            .first()
            .map(|j| j.spec.id.clone());
        let recovery_waiting = recovery_head.is_some();
        let node = Node {
            name: NODE.to_string(),
            gpus: self.gpus.iter().map(|r| r.gpu.clone()).collect(),
        };
        let candidates = [(recovery_head, true), (main_head, false)];
        for (id, is_recovery) in candidates {
            let Some(id) = id else { continue };
            let Some(job) = self.table.get(&id) else {
                continue;
            };
            if job.not_before_ms > now {
                let left = (job.not_before_ms - now) as f64 / 1000.0;
                self.waiting
                    .insert(id, format!("recovery back-off: {left:.1} s left"));
                continue;
            }
            let mut demand = Demand::new(
                job.spec.gpus,
                job.reservation,
                job.spec.policy.unwrap_or(self.cfg.policy),
            );
            demand.exclusive = job.exclusive;
            demand.expected_sm_activity = job.spec.expected_sm_activity;
            demand.waited_ms = now.saturating_sub(job.queued_at_ms);
            let demand = recovery_first(demand, recovery_waiting, is_recovery);
            match place_on_node(
                &node,
                &self.ledger,
                &demand,
                &self.cfg.placement,
                now,
                self.rr_cursor,
            ) {
                Ok(placement) => {
                    return self.launch(&id, &placement, job.reservation, now);
                }
                Err(rejection) => {
                    tracing::debug!(job = %id, %rejection, "waiting");
                    self.waiting.insert(id, rejection.to_string());
                }
            }
        }
        Ok(false)
    }

    /// Book `placement` for job `id`, journal it, and spawn the attempt. Returns whether it was
    /// booked (a refused booking leaves the job queued, and the pass stops).
    #[tracing::instrument(skip(self, placement, reservation, now), fields(gpus = ?placement.indices))]
    fn launch(
        &mut self,
        id: &str,
        placement: &NodePlacement,
        reservation: carma_core::Reservation,
        now: Millis,
    ) -> Result<bool> {
        let totals: Vec<(String, u64)> = self
            .gpus
            .iter()
            .map(|r| (r.gpu.uuid.clone(), r.gpu.memory_total_mib))
            .collect();
        let record = placement.record(id, now);
        let checked = placement.capacity_checked;
        let booked = self.ledger.assume(
            record,
            |uuid| {
                checked
                    .then(|| totals.iter().find(|(u, _)| u == uuid).map(|(_, t)| *t))
                    .flatten()
            },
            self.cfg.placement.warmup_ms,
            now,
        );
        if let Err(e) = booked {
            // Placement and the ledger read the same records, so this does not happen; if it does,
            // the job simply waits for the next pass.
            tracing::warn!(job = id, error = %e, "the ledger refused a placement");
            return Ok(false);
        }
        if let Some(next) = placement.next_rr_cursor() {
            self.rr_cursor = next;
        }
        let Some(job) = self.table.get(id) else {
            return Ok(false);
        };
        let attempt = job.attempts.len() as u32 + 1;
        let spec = job.spec.clone();
        self.record(Event::Launching {
            id: id.to_string(),
            attempt,
            gpus: placement.indices.clone(),
            uuids: placement.gpus.clone(),
            reserved_mib: placement.reserved_mib,
            reservation,
            exclusive: placement.exclusive,
            at_ms: now,
        })?;
        let dir = self.dir.attempt(id, attempt);
        let env = LaunchEnv {
            gpus: placement.indices.clone(),
            reserved_mib: placement.reserved_mib,
            attempt,
            mps_memory_limit: self.cfg.mps_memory_limit,
        };
        match spawn(&spec, &dir, &env) {
            Ok(child) => {
                let pid = child.id();
                self.children.insert(id.to_string(), child);
                self.record(Event::Started {
                    id: id.to_string(),
                    attempt,
                    pid,
                    at_ms: now_ms(),
                })?;
                Ok(true)
            }
            Err(e) => {
                tracing::warn!(job = id, error = %e, "cannot launch");
                self.end(
                    id,
                    attempt,
                    carma_core::AttemptOutcome::Failed {
                        reason: e.to_string(),
                    },
                    None,
                    format!("cannot launch: {e}"),
                    Default::default(),
                )?;
                Ok(true)
            }
        }
    }
}
