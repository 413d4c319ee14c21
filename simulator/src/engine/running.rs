//! Running attempts: a task's memory showing in telemetry (or overflowing its GPU), a task taken
//! off its GPUs, each GPU's memory, demand and telemetry view recomputed from its tasks, progress
//! rates under the slowdown model, and timeline points.

use carma_core::Millis;

use super::{Engine, Event, Run};
use crate::model::Activity;

impl Engine<'_> {
    /// Attempt `attempt` of task `id` shows its memory: it crashes when its GPU cannot hold it,
    /// else its ledger record is confirmed and the rates on its GPUs change.
    pub(super) fn show(&mut self, id: usize, attempt: u32) {
        if self.state[id].attempts != attempt {
            return;
        }
        let Some(run) = self.state[id].run.as_ref() else {
            return;
        };
        let peak = self.tasks[id].peak_mib;
        let overflow = run
            .gpus
            .iter()
            .copied()
            .find(|g| self.gpus[*g].mem_used_mib + peak > self.gpus[*g].total_mib);
        if let Some(g) = overflow {
            self.crash(id, g);
            return;
        }
        let gpus = run.gpus.clone();
        let pod = run.pod.clone();
        self.ledger.confirm(&pod);
        let node = self.gpus[gpus[0]].node;
        self.touch(node);
        for &g in &gpus {
            self.gpus[g].settle(self.now, &self.cfg.power);
            self.gpus[g].shown.push(id);
            self.recompute_gpu(g);
        }
        if let Some(run) = self.state[id].run.as_mut() {
            run.shown = true;
        }
        self.rerate_on(&gpus);
        self.request_tick(self.now);
    }

    /// Take a task off its GPUs and out of the ledger.
    pub(super) fn release(&mut self, id: usize, run: &Run) {
        self.ledger.release(&run.pod);
        if let Some(g) = run.gpus.first() {
            let node = self.gpus[*g].node;
            self.touch(node);
        }
        for &g in &run.gpus {
            self.gpus[g].settle(self.now, &self.cfg.power);
            self.gpus[g].placed.retain(|t| *t != id);
            let was_shown = self.gpus[g].shown.len();
            self.gpus[g].shown.retain(|t| *t != id);
            if self.gpus[g].shown.len() != was_shown {
                self.recompute_gpu(g);
            } else {
                self.record_point(g);
            }
        }
    }

    /// Recompute memory, demand and the telemetry view of a GPU from its shown tasks.
    fn recompute_gpu(&mut self, g: usize) {
        let gpu = &mut self.gpus[g];
        gpu.mem_used_mib = gpu.shown.iter().map(|t| self.tasks[*t].peak_mib).sum();
        gpu.demand = gpu
            .shown
            .iter()
            .fold(Activity::default(), |a, t| a + self.activity[*t]);
        gpu.activity_changed(self.now, &self.cfg.telemetry);
        if !gpu.risk_stale {
            gpu.risk_stale = true;
            self.stale_risk.push(g);
        }
        let (n, slot) = (gpu.node, gpu.slot);
        self.node_version[n] += 1;
        let view = &mut self.nodes[n].gpus[slot];
        view.memory_free_mib = gpu.total_mib.saturating_sub(gpu.mem_used_mib);
        view.processes = gpu.shown.len() as u32;
        self.record_point(g);
    }

    /// A timeline point for GPU `g`, when timelines are recorded.
    pub(super) fn record_point(&mut self, g: usize) {
        if self.cfg.record_timelines {
            let (n, slot) = (self.gpus[g].node, self.gpus[g].slot);
            let uuid = &self.nodes[n].gpus[slot].uuid;
            let reserved = self.ledger.reserved_mib(uuid);
            self.gpus[g].record(self.now, reserved);
        }
    }

    /// Update progress rates of every task on `gpus` and reschedule completions.
    pub(super) fn rerate_on(&mut self, gpus: &[usize]) {
        let mut affected: Vec<usize> = gpus
            .iter()
            .flat_map(|g| self.gpus[*g].placed.iter().copied())
            .collect();
        affected.sort_unstable();
        affected.dedup();
        for id in affected {
            let rate = self.rate_of(id);
            let now = self.now;
            let attempt = self.state[id].attempts;
            let Some(run) = self.state[id].run.as_mut() else {
                continue;
            };
            run.work_left = (run.work_left - run.rate * (now - run.last) as f64).max(0.0);
            run.last = now;
            if (rate - run.rate).abs() <= 1e-12 {
                continue;
            }
            run.rate = rate;
            run.version += 1;
            // `as` and the addition saturate: a time beyond the horizon is refused by `push`.
            let at = now.saturating_add((run.work_left / rate).ceil() as Millis);
            let version = run.version;
            self.push(
                at,
                Event::Finish {
                    task: id,
                    attempt,
                    version,
                },
            );
        }
    }

    /// Task `id`'s progress rate: its slowest GPU's under the slowdown model (1 until it shows).
    fn rate_of(&self, id: usize) -> f64 {
        let Some(run) = self.state[id].run.as_ref() else {
            return 1.0;
        };
        if !run.shown {
            return 1.0;
        }
        let own = self.activity[id].sm_activity;
        run.gpus
            .iter()
            .map(|g| {
                let gpu = &self.gpus[*g];
                self.cfg.slowdown.rate_among(
                    own,
                    gpu.demand.sm_activity,
                    gpu.shown.iter().map(|t| self.activity[*t].sm_activity),
                )
            })
            .fold(1.0, f64::min)
    }
}
