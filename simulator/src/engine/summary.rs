//! The run's result once the engine stops: per-task outcomes, the summary's figures (completion
//! and wait figures by [`JobTimes::of`], as for a `carma local` run) and the GPU timelines.

use carma_core::Millis;

use super::Engine;
use crate::result::{GpuTimeline, JobTimes, RunResult, Summary, TaskOutcome};

impl Engine<'_> {
    /// The run's result, labelled `estimator`.
    pub(super) fn finish(mut self, estimator: &str) -> RunResult {
        let start = self.start.unwrap_or(0);
        let end = self.last_end.max(start);
        for g in &mut self.gpus {
            g.settle(end, &self.cfg.power);
        }
        let span_ms = (end - start) as f64;
        let n_gpus = self.gpus.len() as f64;
        let total_mem: f64 = self.gpus.iter().map(|g| g.total_mib as f64).sum();
        let ratio = |num: f64, den: f64| if den > 0.0 { num / den } else { 0.0 };
        let smact_mean = ratio(self.gpus.iter().map(|g| g.smact_ms).sum(), n_gpus * span_ms);
        let mem_used_mean = ratio(
            self.gpus.iter().map(|g| g.mem_mib_ms).sum(),
            total_mem * span_ms,
        );
        let energy_j: f64 = self.gpus.iter().map(|g| g.energy_j).sum();

        let s = |ms: Millis| ms as f64 / 1000.0;
        let outcomes: Vec<TaskOutcome> = self
            .tasks
            .iter()
            .zip(&self.state)
            .map(|(t, st)| TaskOutcome {
                id: t.id,
                name: t.name.clone(),
                arrival_s: s(t.arrival_ms),
                first_start_s: st.first_start.map(s),
                end_s: st.end.map(s),
                finished: st.finished,
                failure: st.failure.clone(),
                attempts: st.attempts,
                ooms: st.ooms,
                wait_s: s(st.wait_ms),
                run_s: s(st.run_ms),
            })
            .collect();
        let times = JobTimes::of(
            &outcomes,
            &self.tasks.iter().map(|t| t.gpus).collect::<Vec<_>>(),
            &self
                .tasks
                .iter()
                .map(|t| t.exclusive_ms as f64 / 1000.0)
                .collect::<Vec<_>>(),
        );
        let finished = outcomes.iter().filter(|o| o.finished).count();
        let failed = outcomes.iter().filter(|o| o.failure.is_some()).count();
        let summary = Summary {
            policy: self.policy,
            estimator: estimator.to_string(),
            makespan_s: span_ms / 1000.0,
            mean_jct_s: times.mean_jct_s,
            p95_jct_s: times.p95_jct_s,
            mean_wait_s: times.mean_wait_s,
            ooms: self.ooms,
            lost_gpu_s: self.lost_gpu_ms / 1000.0,
            smact_mean,
            mem_used_mean,
            energy_kwh: energy_j / 3.6e6,
            finished,
            failed,
            tasks: self.tasks.len(),
            learned_reservations: self.learn.as_ref().map(|b| b.learned_tasks),
            worst_wait: times.worst_wait,
        };
        let gpus = if self.cfg.record_timelines {
            self.gpus
                .iter_mut()
                .map(|g| GpuTimeline {
                    node: self.nodes[g.node].name.clone(),
                    index: g.slot as u32,
                    total_mib: g.total_mib,
                    points: std::mem::take(&mut g.points),
                })
                .collect()
        } else {
            Vec::new()
        };
        RunResult {
            summary,
            tasks: outcomes,
            attempts: self.attempts,
            gpus,
            start_ms: start,
            end_ms: end,
            events: self.events,
            ticks: self.ticks,
        }
    }
}
