//! Bringing the status's attempts up to date with their pods: adopt pods the status does not list,
//! record how attempts ended and what the ones that succeeded or ran out of GPU memory used.

use chrono::{DateTime, Utc};

use carma_api::{AttemptOutcomeKind, AttemptStatus};

use super::{Observation, PlannedEvent, Step, describe_reservation};
use crate::classify::{PodProgress, Verdict};
use crate::observe::ObservedAttempt;
use crate::status::rfc3339;

impl Step<'_, '_> {
    /// Record pods the status does not list (a create whose status write was lost).
    pub(super) fn adopt(&mut self) {
        let mut pods: Vec<&ObservedAttempt> = self.input.pods.iter().collect();
        pods.sort_by_key(|o| o.index);
        for o in pods {
            if self.st.attempts.iter().any(|a| a.index == o.index) {
                continue;
            }
            self.st.attempts.push(AttemptStatus {
                index: o.index,
                pod: o.pod.clone(),
                node: o.node.clone(),
                gpus: o.gpus.clone(),
                reserved_mib: o.estimate.as_ref().map(|e| e.mib).or(o.requested_mib),
                exclusive: o.exclusive,
                started_at: Some(rfc3339(o.created_at.unwrap_or(self.input.now))),
                ..AttemptStatus::default()
            });
            self.event(
                false,
                "AttemptAdopted",
                "AdoptAttempt",
                format!(
                    "pod {} exists and is recorded as attempt {}",
                    o.pod, o.index
                ),
                Some(&o.pod),
            );
        }
        self.st.attempts.sort_by_key(|a| a.index);
        let last = self.st.attempts.last().map_or(0, |a| a.index);
        self.st.attempt_count = self.st.attempt_count.max(last);
    }

    /// Update attempts that have not ended: placement, memory peak, outcome.
    pub(super) fn refresh_open_attempts(&mut self) {
        let now = self.now();
        let mut finished: Vec<(usize, Verdict, DateTime<Utc>)> = Vec::new();
        for (i, a) in self.st.attempts.iter_mut().enumerate() {
            if a.outcome.is_some() {
                continue;
            }
            let Some(o) = self.input.pods.iter().find(|o| o.index == a.index) else {
                finished.push((
                    i,
                    Verdict::Evicted {
                        reason: format!(
                            "pod {} disappeared before it finished (deleted, or its node was lost)",
                            a.pod
                        ),
                    },
                    now,
                ));
                continue;
            };
            if o.node.is_some() {
                a.node.clone_from(&o.node);
            }
            if !o.gpus.is_empty() {
                a.gpus.clone_from(&o.gpus);
            }
            if let Some(e) = &o.estimate {
                a.reserved_mib = Some(e.mib);
            } else if a.reserved_mib.is_none() {
                a.reserved_mib = o.requested_mib;
            }
            a.exclusive |= o.exclusive;
            a.observed_peak_mib = a.observed_peak_mib.max(o.peak_mib);
            match &o.progress {
                PodProgress::Finished(v) => {
                    finished.push((i, v.clone(), o.finished_at.unwrap_or(now)));
                }
                PodProgress::NeedsLogs { .. } => finished.push((
                    i,
                    Verdict::Failed {
                        reason: "terminated with an error; neither its termination message nor its log says why"
                            .to_string(),
                    },
                    o.finished_at.unwrap_or(now),
                )),
                PodProgress::Pending | PodProgress::Running => {}
            }
        }
        for (i, verdict, at) in finished {
            self.finish(i, verdict, at);
        }
    }

    fn finish(&mut self, i: usize, verdict: Verdict, at: DateTime<Utc>) {
        let kind = crate::classify::outcome_kind(verdict.kind());
        let reason = verdict.reason();
        let a = &mut self.st.attempts[i];
        a.outcome = Some(kind);
        a.reason = Some(reason.clone());
        a.finished_at = Some(rfc3339(at));
        let (index, pod, reserved) = (a.index, a.pod.clone(), describe_reservation(a));
        self.out
            .observations
            .push(Observation::AttemptFinished(kind));
        self.record_memory(i, kind);
        let (warning, ev_reason, note) = match kind {
            AttemptOutcomeKind::Succeeded => (
                false,
                "AttemptSucceeded",
                format!("attempt {index} ({pod}) succeeded"),
            ),
            AttemptOutcomeKind::GpuOutOfMemory => (
                true,
                "AttemptOutOfMemory",
                format!(
                    "attempt {index} ({pod}) crashed out of GPU memory with {reserved}: {reason}"
                ),
            ),
            AttemptOutcomeKind::Failed => (
                true,
                "AttemptFailed",
                format!("attempt {index} ({pod}) failed: {reason}"),
            ),
            AttemptOutcomeKind::Evicted => (
                true,
                "AttemptEvicted",
                format!("attempt {index} ({pod}) was evicted or preempted (not counted): {reason}"),
            ),
            AttemptOutcomeKind::HostOomKilled => (
                true,
                "AttemptHostOOMKilled",
                format!("attempt {index} ({pod}) ran out of host memory with {reserved}: {reason}"),
            ),
        };
        self.event(warning, ev_reason, "RecordOutcome", note, Some(&pod));
    }

    /// What an attempt that succeeded or ran out of GPU memory reserved and used: a metric, and
    /// a sample for its model profile's `MemoryHistory`.
    fn record_memory(&mut self, i: usize, kind: AttemptOutcomeKind) {
        let out_of_memory = kind == AttemptOutcomeKind::GpuOutOfMemory;
        if kind != AttemptOutcomeKind::Succeeded && !out_of_memory {
            return;
        }
        let a = &self.st.attempts[i];
        let input = self.input;
        let pod = input.pods.iter().find(|o| o.index == a.index);
        self.out.observations.push(Observation::AttemptMemory {
            source: pod
                .and_then(|p| p.estimate.as_ref())
                .map_or_else(|| "unknown".to_string(), |e| e.source.clone()),
            reserved_mib: if a.exclusive { None } else { a.reserved_mib },
            peak_mib: a.observed_peak_mib,
            out_of_memory,
        });
        let finished_at = a.finished_at.clone().unwrap_or_default();
        if let Some(rec) = crate::history::peak_record(input.task, a, pod, kind, &finished_at) {
            self.out.peak_records.push(rec);
            if out_of_memory {
                // Optimistic: the executor writes `false` when the record could not be written.
                self.st.attempts[i].history_recorded = Some(true);
            }
        }
    }

    /// Crashes out of GPU memory whose MemoryHistory write failed are recorded again: a lost one
    /// would leave later tasks of the model reserved at the size that crashed.
    pub(super) fn retry_history(&mut self) {
        let input = self.input;
        for a in &mut self.st.attempts {
            if a.history_recorded != Some(false)
                || a.outcome != Some(AttemptOutcomeKind::GpuOutOfMemory)
            {
                continue;
            }
            let pod = input.pods.iter().find(|o| o.index == a.index);
            let finished_at = a.finished_at.clone().unwrap_or_default();
            match crate::history::peak_record(
                input.task,
                a,
                pod,
                AttemptOutcomeKind::GpuOutOfMemory,
                &finished_at,
            ) {
                Some(rec) => {
                    self.out.peak_records.push(rec);
                    a.history_recorded = Some(true);
                }
                None => {
                    // The pod (and with it the profile it ran with) is gone: nothing to write.
                    a.history_recorded = None;
                    self.out.events.push(PlannedEvent {
                        warning: true,
                        reason: "HistoryNotRecorded".into(),
                        action: "RecordPeak".into(),
                        note: format!(
                            "attempt {} ran out of GPU memory but its pod is gone; the crash is not in its model's MemoryHistory",
                            a.index
                        ),
                        pod: None,
                    });
                }
            }
        }
    }
}
