//! The scheduler's pass on a tick: risk windows refreshed, then the recovery queue and the main
//! queue served in [`QueueDiscipline`]'s order (each queue sorted by priority, then arrival); and, once nothing can happen any more, the tasks
//! still queued failed with the reason placement gives.

use std::collections::VecDeque;

use carma_core::queue_order::{PROMOTED, backlog_ms, insert_position, outlasts_backlog};
use carma_core::{Millis, place_on_node};

use super::place::TryPlace;
use super::{Engine, earliest};
use crate::config::QueueDiscipline;

impl Engine<'_> {
    /// A scheduler pass at `t`: refresh stale risk windows, serve both queues, and ask for the next
    /// pass where time alone may change an answer.
    pub(super) fn tick(&mut self, t: Millis) {
        self.now = t;
        self.next_tick = None;
        self.ticks += 1;
        self.refresh_risk();
        self.promote();
        let wake = earliest(self.drain(true), self.drain(false));
        if let Some(w) = wake {
            self.request_tick(w);
        }
    }

    /// Place what can be placed from the recovery queue or the main queue, in order; the earliest
    /// time a pass should run again for what is left. Under CARMA's discipline a task that does not
    /// fit stops the pass; under kube-scheduler's it is set aside for its back-off and the pass
    /// goes on.
    fn drain(&mut self, recovery: bool) -> Option<Millis> {
        let kube = self.cfg.queue == QueueDiscipline::Kube;
        let mut wake: Option<Millis> = None;
        let mut i = 0;
        loop {
            let queue = if recovery {
                &self.recovery_q
            } else {
                &self.main_q
            };
            let Some(&id) = queue.get(i) else { break };
            if kube && self.state[id].retry_at > self.now {
                wake = earliest(wake, Some(self.state[id].retry_at));
                i += 1;
                continue;
            }
            // CARMA's recovery-first rule: no new sharing while a recovery task waits.
            let share = recovery || self.recovery_q.is_empty();
            match self.try_place(id, share) {
                TryPlace::Placed => {
                    self.queue_mut(recovery).remove(i);
                }
                TryPlace::Impossible(reason) => {
                    self.queue_mut(recovery).remove(i);
                    self.fail(id, reason);
                }
                TryPlace::Blocked(w) if kube => {
                    let s = &mut self.state[id];
                    s.unschedulable += 1;
                    s.retry_at = self
                        .now
                        .saturating_add(QueueDiscipline::kube_backoff_ms(s.unschedulable));
                    // Tried again by the next pass after the back-off; a pass at the back-off's
                    // end only when time alone may change the answer.
                    wake = earliest(wake, w.map(|w| w.max(s.retry_at)));
                    i += 1;
                }
                TryPlace::Blocked(w) => {
                    wake = earliest(wake, w);
                    break;
                }
            }
        }
        wake
    }

    /// Queue `id` on the recovery or the main queue behind every task of the same or a higher
    /// priority (at the back under arrival order); its position.
    pub(super) fn enqueue(&mut self, id: usize, recovery: bool) -> usize {
        let priority = &self.priority;
        let at = match priority.get(id) {
            Some(&p) => {
                let q = if recovery {
                    &self.recovery_q
                } else {
                    &self.main_q
                };
                insert_position(q.iter().map(|&t| priority.get(t).copied().unwrap_or(0)), p)
            }
            None => self.queue_mut(recovery).len(),
        };
        self.queue_mut(recovery).insert(at, id);
        at
    }

    /// Move ahead the tasks that have waited long enough
    /// ([`crate::declared::QueueOrdering::promote_after_ms`]) or that declare more than the
    /// backlog ([`crate::declared::QueueOrdering::promote_beyond_backlog`]), and ask for a pass
    /// when the next one will have waited long enough.
    fn promote(&mut self) {
        let after = self.ordering.promote_after_ms;
        let beyond = self.ordering.promote_beyond_backlog;
        if (after.is_none() && beyond.is_none()) || self.priority.is_empty() {
            return;
        }
        let now = self.now;
        let gpus = u32::try_from(self.gpus.len()).unwrap_or(u32::MAX);
        let backlog = beyond.and_then(|_| self.backlog_ms(gpus));
        let mut next: Option<Millis> = None;
        for recovery in [true, false] {
            let q = if recovery {
                &self.recovery_q
            } else {
                &self.main_q
            };
            let mut due = Vec::new();
            for &id in q {
                if self.priority[id] == PROMOTED {
                    continue;
                }
                let declared = &self.declared[id];
                let waited = now.saturating_sub(self.state[id].ready_at);
                let aged = self.ordering.order.aged_priority(declared, waited, after) == PROMOTED;
                let outlasts = matches!((beyond, backlog), (Some(f), Some(b))
                    if outlasts_backlog(declared, b, gpus, f));
                if aged || outlasts {
                    due.push(id);
                } else if let Some(after) = after {
                    next = earliest(next, Some(self.state[id].ready_at.saturating_add(after)));
                }
            }
            for id in due {
                self.queue_mut(recovery).retain(|&t| t != id);
                self.priority[id] = PROMOTED;
                self.enqueue(id, recovery);
            }
        }
        if let Some(t) = next {
            self.request_tick(t);
        }
    }

    /// The declared GPU time still ahead of the cluster ÷ its GPUs
    /// ([`carma_core::queue_order::backlog_ms`]): queued tasks' declared durations, running
    /// tasks' declared durations less what they have run.
    fn backlog_ms(&self, gpus: u32) -> Option<Millis> {
        let now = self.now;
        let queued = self.recovery_q.iter().chain(self.main_q.iter()).map(|&id| {
            (
                self.declared[id].duration_ms.unwrap_or(0),
                self.tasks[id].gpus,
            )
        });
        let running = self.state.iter().enumerate().filter_map(|(id, s)| {
            let run = s.run.as_ref()?;
            let declared = self.declared[id].duration_ms.unwrap_or(0);
            let done = now.saturating_sub(run.start);
            Some((declared.saturating_sub(done), self.tasks[id].gpus))
        });
        backlog_ms(queued.chain(running), gpus)
    }

    /// The recovery queue or the main queue.
    fn queue_mut(&mut self, recovery: bool) -> &mut VecDeque<usize> {
        if recovery {
            &mut self.recovery_q
        } else {
            &mut self.main_q
        }
    }

    /// Update the telemetry view of GPUs whose risk window moved since the last pass.
    fn refresh_risk(&mut self) {
        if self.stale_risk.is_empty() {
            return;
        }
        let tel = self.cfg.telemetry;
        let now = self.now;
        let mut still = Vec::new();
        for g in std::mem::take(&mut self.stale_risk) {
            let (sm, occ, dram) = self.gpus[g].risk_scores(now, &tel);
            let (n, slot) = (self.gpus[g].node, self.gpus[g].slot);
            let view = &mut self.nodes[n].gpus[slot];
            let new = (Some(sm), Some(occ), Some(dram));
            if (view.sm_activity, view.sm_occupancy, view.dram_activity) != new {
                (view.sm_activity, view.sm_occupancy, view.dram_activity) = new;
                self.node_version[n] += 1;
            }
            if self.gpus[g].window_moving(now, &tel) {
                still.push(g);
            } else {
                self.gpus[g].risk_stale = false;
            }
        }
        self.stale_risk = still;
    }

    /// Tasks still queued when nothing can happen any more.
    pub(super) fn fail_stranded(&mut self) {
        let stranded: Vec<usize> = self
            .recovery_q
            .drain(..)
            .chain(self.main_q.drain(..))
            .collect();
        for id in stranded {
            let demand = self.demand(id);
            let why = self
                .nodes
                .iter()
                .filter_map(|node| {
                    place_on_node(node, &self.ledger, &demand, &self.pcfg, self.now, 0).err()
                })
                .map(|r| r.to_string())
                .next()
                .unwrap_or_else(|| "no placement became possible".into());
            self.fail(id, format!("never placed: {why}"));
        }
    }
}
