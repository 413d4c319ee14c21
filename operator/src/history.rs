//! Recording what attempts really used: each ended attempt's observed peak goes into the
//! `MemoryHistory` record of its model profile's fingerprint, which the extender reserves from
//! (`carma_core::history` holds both rules).
//!
//! Recording is advisory: a failed write is logged and counted, and the task goes on (a lost
//! sample only means the next run of the model is reserved by its estimate).

use kube::api::PostParams;
use kube::{Api, Client};
use thiserror::Error;
use tracing::{debug, instrument};

use carma_api::{
    AttemptOutcomeKind, AttemptStatus, MemoryHistory, MemoryHistorySpec, MemoryHistoryStatus,
    PeakSample, TrainingTask,
};

use crate::observe::ObservedAttempt;

/// Conflicting writers (two attempts of one model ending together) are retried this often.
const CONFLICT_RETRIES: usize = 5;

/// One ended attempt to record under its profile's fingerprint.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PeakRecord {
    /// The profile's fingerprint: the `MemoryHistory` object's name.
    pub fingerprint: String,
    /// Model family (the record's `spec.family`).
    pub family: String,
    /// GPUs per pod (the record's `spec.gpus`).
    pub gpus: u32,
    /// The pod's `carma.io/model-profile` annotation (the record's `spec.profile`).
    pub profile: String,
    /// The run.
    pub sample: PeakSample,
}

/// The record of an attempt that ended as `kind`, when it teaches something: it succeeded or
/// ran out of GPU memory, and its pod carried a valid model profile.
pub fn peak_record(
    task: &TrainingTask,
    attempt: &AttemptStatus,
    pod: Option<&ObservedAttempt>,
    kind: AttemptOutcomeKind,
    finished_at: &str,
) -> Option<PeakRecord> {
    if !matches!(
        kind,
        AttemptOutcomeKind::Succeeded | AttemptOutcomeKind::GpuOutOfMemory
    ) {
        return None;
    }
    let pod = pod?;
    let raw = pod.model_profile.as_deref()?;
    let profile = carma_estimator::parse_profile(raw).ok()?;
    let reservation_source = pod.estimate.as_ref().map(|e| e.source.clone());
    let gpus = task.spec.gpus;
    Some(PeakRecord {
        fingerprint: profile.fingerprint(gpus),
        family: profile.family.as_str().to_string(),
        gpus,
        profile: raw.to_string(),
        sample: PeakSample {
            task: format!(
                "{}/{}",
                task.metadata.namespace.as_deref().unwrap_or_default(),
                task.metadata.name.as_deref().unwrap_or_default()
            ),
            task_uid: task.metadata.uid.clone().unwrap_or_default(),
            attempt: attempt.index,
            outcome: kind,
            // The extender books an exclusive attempt's GPUs whole; the GpuNode's memory stands in
            // where that figure is missing.
            reserved_mib: carma_core::recorded_reservation_mib(
                attempt.exclusive,
                attempt.reserved_mib,
                attempt.reserved_mib.or(pod.gpu_memory_mib),
            ),
            reservation_source,
            peak_mib: attempt.observed_peak_mib,
            finished_at: finished_at.to_string(),
        },
    })
}

/// What a write did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Recorded {
    /// The sample is in the record now.
    Added,
    /// Already recorded (a retried reconcile), or it teaches nothing.
    Unchanged,
}

/// Why a sample was not recorded.
#[derive(Debug, Error)]
pub enum HistoryError {
    /// Reading, creating or writing the record failed.
    #[error("MemoryHistory {name}: {source}")]
    Api {
        /// The record's name (the profile's fingerprint).
        name: String,
        /// The API error.
        #[source]
        source: kube::Error,
    },
    /// Other writers changed the record on every try.
    #[error("MemoryHistory {name}: still conflicting after {CONFLICT_RETRIES} tries")]
    Conflicts {
        /// The record's name.
        name: String,
    },
}

/// Add `rec` to its `MemoryHistory` (created on first use), retrying on write conflicts.
#[instrument(skip_all, fields(fingerprint = %rec.fingerprint, task = %rec.sample.task, attempt = rec.sample.attempt))]
pub async fn record(
    client: &Client,
    rec: &PeakRecord,
    now: &str,
) -> Result<Recorded, HistoryError> {
    let api: Api<MemoryHistory> = Api::all(client.clone());
    let failed = |source| HistoryError::Api {
        name: rec.fingerprint.clone(),
        source,
    };
    for _ in 0..CONFLICT_RETRIES {
        let existing = match api.get_opt(&rec.fingerprint).await.map_err(failed)? {
            Some(h) => h,
            None => {
                let fresh = MemoryHistory::new(
                    &rec.fingerprint,
                    MemoryHistorySpec {
                        family: rec.family.clone(),
                        gpus: rec.gpus,
                        profile: rec.profile.clone(),
                    },
                );
                match api.create(&PostParams::default(), &fresh).await {
                    Ok(h) => h,
                    Err(kube::Error::Api(s)) if s.code == 409 => continue,
                    Err(e) => return Err(failed(e)),
                }
            }
        };
        let mut status: MemoryHistoryStatus = existing.status.clone().unwrap_or_default();
        if !status.record(rec.sample.clone(), now) {
            debug!("already recorded");
            return Ok(Recorded::Unchanged);
        }
        let mut updated = existing;
        updated.status = Some(status);
        match api
            .replace_status(&rec.fingerprint, &PostParams::default(), &updated)
            .await
        {
            Ok(_) => return Ok(Recorded::Added),
            Err(kube::Error::Api(s)) if s.code == 409 => {}
            Err(e) => return Err(failed(e)),
        }
    }
    Err(HistoryError::Conflicts {
        name: rec.fingerprint.clone(),
    })
}
