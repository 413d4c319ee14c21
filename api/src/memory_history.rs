//! The `MemoryHistory` custom resource: what runs of one model profile really used.
//!
//! Cluster-scoped, one object per profile fingerprint (the object's name), written only by the
//! operator when an attempt ends and read by the extender when it reserves. A CRD rather than a
//! ConfigMap: each model gets its own small object (no single hot object that every finishing
//! job rewrites, no 1 MiB ConfigMap ceiling), the schema is validated by the API server, RBAC
//! can grant the extender read-only access to exactly this, and `kubectl get memoryhistories`
//! shows what was learned.

use carma_core::{PeakHistory, RunEnd};

use crate::AttemptOutcomeKind;
use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// Samples kept in `status.samples` (the aggregates cover every run ever recorded).
pub const KEPT_SAMPLES: usize = 20;

/// Which model profile the record is about.
#[allow(clippy::duplicated_attributes)]
#[derive(CustomResource, Deserialize, Serialize, Clone, Debug, PartialEq, Default, JsonSchema)]
#[kube(
    group = "carma.io",
    version = "v1alpha1",
    kind = "MemoryHistory",
    plural = "memoryhistories",
    status = "MemoryHistoryStatus",
    shortname = "mh",
    category = "carma",
    doc = "Observed GPU memory peaks of the runs of one model profile; the name is the profile's fingerprint. Written by carma's operator, read by its scheduler extender.",
    printcolumn(
        name = "Family",
        type_ = "string",
        json_path = ".spec.family",
        description = "Model family"
    ),
    printcolumn(
        name = "GPUs",
        type_ = "integer",
        json_path = ".spec.gpus",
        description = "GPUs per pod"
    ),
    printcolumn(
        name = "Completed",
        type_ = "integer",
        json_path = ".status.completed",
        description = "Completed runs with an observed peak"
    ),
    printcolumn(
        name = "Max-Peak-MiB",
        type_ = "integer",
        json_path = ".status.maxPeakMiB",
        description = "Largest per-GPU peak any run reached"
    ),
    printcolumn(
        name = "OOM-At-MiB",
        type_ = "integer",
        json_path = ".status.largestOomReservationMiB",
        description = "Largest reservation under which a run still ran out of GPU memory"
    ),
    printcolumn(
        name = "Updated",
        type_ = "date",
        json_path = ".status.updatedAt",
        description = "Last recorded run"
    )
)]
#[serde(rename_all = "camelCase")]
pub struct MemoryHistorySpec {
    /// Model family of the profile (mlp, cnn, transformer).
    pub family: String,
    /// GPUs per pod the runs had (part of the fingerprint: a model split across GPUs peaks lower
    /// on each).
    pub gpus: u32,
    /// The `carma.io/model-profile` annotation of the first run recorded, for people reading the
    /// object; the fingerprint is taken over the profile's effective values, so other spellings
    /// of the same profile share the object.
    pub profile: String,
}

/// What the runs used.
#[derive(Deserialize, Serialize, Clone, Debug, PartialEq, Default, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct MemoryHistoryStatus {
    /// Completed runs with an observed peak (every run ever recorded, not only those in `samples`).
    #[serde(default)]
    pub completed: u32,
    /// Largest per-GPU peak any recorded run reached, MiB. Never decreases.
    #[serde(default, rename = "maxPeakMiB")]
    pub max_peak_mib: u64,
    /// Largest per-GPU reservation under which a run still ran out of GPU memory, MiB.
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        rename = "largestOomReservationMiB"
    )]
    pub largest_oom_reservation_mib: Option<u64>,
    /// The latest recorded runs, oldest first (at most 20).
    #[serde(default)]
    pub samples: Vec<PeakSample>,
    /// When the latest run was recorded (RFC 3339).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub updated_at: Option<String>,
}

/// One recorded run: an attempt of a TrainingTask.
#[derive(Deserialize, Serialize, Clone, Debug, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct PeakSample {
    /// `namespace/name` of the TrainingTask.
    pub task: String,
    /// UID of the TrainingTask (a task deleted and re-created under its name is another task).
    pub task_uid: String,
    /// Attempt number.
    pub attempt: u32,
    /// How the attempt ended (`Succeeded` and `GpuOutOfMemory` are recorded).
    pub outcome: AttemptOutcomeKind,
    /// Per-GPU reservation of the attempt, MiB.
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        rename = "reservedMiB"
    )]
    pub reserved_mib: Option<u64>,
    /// Where the reservation came from (`gpumemnet-mlp`, `history`, `override`, …).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reservation_source: Option<String>,
    /// Observed per-GPU peak, MiB.
    #[serde(default, skip_serializing_if = "Option::is_none", rename = "peakMiB")]
    pub peak_mib: Option<u64>,
    /// When the attempt ended (RFC 3339).
    pub finished_at: String,
}

impl PeakSample {
    /// How the run ended, as [`PeakHistory::record`] takes it; `None` for outcomes that teach
    /// nothing about the model's memory (failures, evictions, host-memory kills).
    pub fn run_end(&self) -> Option<RunEnd> {
        match self.outcome {
            AttemptOutcomeKind::Succeeded => Some(RunEnd::Completed {
                peak_mib: self.peak_mib,
            }),
            AttemptOutcomeKind::GpuOutOfMemory => Some(RunEnd::OutOfMemory {
                reserved_mib: self.reserved_mib,
                peak_mib: self.peak_mib,
            }),
            AttemptOutcomeKind::Failed
            | AttemptOutcomeKind::Evicted
            | AttemptOutcomeKind::HostOomKilled => None,
        }
    }
}

impl MemoryHistoryStatus {
    /// The aggregates placement reads.
    pub fn peaks(&self) -> PeakHistory {
        PeakHistory {
            completed: self.completed,
            max_peak_mib: self.max_peak_mib,
            largest_oom_reservation_mib: self.largest_oom_reservation_mib,
        }
    }

    /// Record `sample` (updated at `now`). Returns `false`, changing nothing, when the same
    /// attempt is already recorded (a retried write) or its outcome teaches nothing.
    pub fn record(&mut self, sample: PeakSample, now: &str) -> bool {
        let Some(end) = sample.run_end() else {
            return false;
        };
        if self
            .samples
            .iter()
            .any(|s| s.task_uid == sample.task_uid && s.attempt == sample.attempt)
        {
            return false;
        }
        let mut peaks = self.peaks();
        if !peaks.record(end) {
            return false;
        }
        self.completed = peaks.completed;
        self.max_peak_mib = peaks.max_peak_mib;
        self.largest_oom_reservation_mib = peaks.largest_oom_reservation_mib;
        self.samples.push(sample);
        let excess = self.samples.len().saturating_sub(KEPT_SAMPLES);
        self.samples.drain(..excess);
        self.updated_at = Some(now.to_string());
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample(uid: &str, attempt: u32, outcome: &str, peak: Option<u64>) -> PeakSample {
        let outcome = serde_json::from_value(serde_json::json!(outcome)).unwrap();
        PeakSample {
            task: "ml/resnet".into(),
            task_uid: uid.into(),
            attempt,
            outcome,
            reserved_mib: Some(9_000),
            reservation_source: Some("analytic-upper-bound".into()),
            peak_mib: peak,
            finished_at: "2026-11-23T20:00:00Z".into(),
        }
    }

    #[test]
    fn records_once_per_attempt_and_keeps_the_aggregates() {
        let mut s = MemoryHistoryStatus::default();
        assert!(s.record(sample("u1", 1, "GpuOutOfMemory", Some(8_900)), "t1"));
        assert!(s.record(sample("u1", 2, "Succeeded", Some(10_100)), "t2"));
        assert!(
            !s.record(sample("u1", 2, "Succeeded", Some(10_100)), "t3"),
            "retried write"
        );
        assert!(!s.record(sample("u2", 1, "Failed", Some(1)), "t3"));
        assert!(
            !s.record(sample("u3", 1, "Succeeded", None), "t3"),
            "no peak seen"
        );
        assert_eq!(s.completed, 1);
        assert_eq!(s.max_peak_mib, 10_100);
        assert_eq!(s.largest_oom_reservation_mib, Some(9_000));
        assert_eq!(s.updated_at.as_deref(), Some("t2"));
        assert_eq!(s.samples.len(), 2);
    }

    #[test]
    fn keeps_the_latest_samples_but_every_peak() {
        let mut s = MemoryHistoryStatus::default();
        s.record(sample("big", 1, "Succeeded", Some(30_000)), "t0");
        for i in 0..30u32 {
            s.record(
                sample(&format!("u{i}"), 1, "Succeeded", Some(1_000 + u64::from(i))),
                "t",
            );
        }
        assert_eq!(s.samples.len(), KEPT_SAMPLES);
        assert_eq!(s.samples[0].task_uid, "u10");
        assert_eq!(s.completed, 31);
        assert_eq!(s.max_peak_mib, 30_000, "a peak outlives its sample");
    }

    #[test]
    fn status_round_trips_with_mib_names() {
        let mut s = MemoryHistoryStatus::default();
        s.record(sample("u1", 1, "GpuOutOfMemory", Some(8_900)), "t1");
        let v = serde_json::to_value(&s).unwrap();
        assert_eq!(v["maxPeakMiB"], 8_900);
        assert_eq!(v["largestOomReservationMiB"], 9_000);
        assert_eq!(v["samples"][0]["reservedMiB"], 9_000);
        assert_eq!(v["samples"][0]["peakMiB"], 8_900);
        let back: MemoryHistoryStatus = serde_json::from_value(v).unwrap();
        assert_eq!(back, s);
    }
}
