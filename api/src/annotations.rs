//! Reading and writing the pod annotations that carry carma's decisions.

use std::collections::BTreeMap;

use carma_core::quantity::{self, QuantityError};
use carma_core::{Policy, PolicyParseError};
use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use thiserror::Error;

use crate::names::*;

/// A carma annotation on a pod that cannot be used. The message names the
/// annotation, so the pod's Event tells the user what to fix.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum AnnotationError {
    /// `carma.io/gpu-memory` is not a quantity.
    #[error("annotation {ANNOTATION_GPU_MEMORY}: {0}")]
    GpuMemory(#[from] QuantityError),
    /// `carma.io/policy` is not a policy.
    #[error("annotation {ANNOTATION_POLICY}: {0}")]
    Policy(#[from] PolicyParseError),
    /// `carma.io/exclusive` is not a boolean.
    #[error("annotation {ANNOTATION_EXCLUSIVE}: {0:?} is not \"true\" or \"false\"")]
    Exclusive(String),
    /// `carma.io/estimate` is not the expected JSON.
    #[error("annotation {ANNOTATION_ESTIMATE}: {0}")]
    Estimate(String),
    /// `carma.io/assigned-gpus` is empty or malformed.
    #[error("annotation {ANNOTATION_ASSIGNED_GPUS}: {0}")]
    AssignedGpus(String),
    /// `carma.io/sm-activity` is not a number from 0 to 1.
    #[error(
        "annotation {ANNOTATION_SM_ACTIVITY}: {0:?} is not a number from 0 to 1 (e.g. \"0.35\")"
    )]
    SmActivity(String),
    /// `carma.io/assigned-at` is not RFC 3339.
    #[error("annotation {ANNOTATION_ASSIGNED_AT}: {0:?} is not an RFC 3339 time")]
    AssignedAt(String),
}

/// What the user (or the operator) asked for through input annotations.
/// The model profile stays raw JSON here: the estimator parses and validates it.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct PodRequest {
    /// Explicit per-GPU reservation in MiB.
    pub gpu_memory_mib: Option<u64>,
    /// Policy override.
    pub policy: Option<Policy>,
    /// Exclusive GPUs requested.
    pub exclusive: bool,
    /// Raw `carma.io/model-profile` JSON.
    pub model_profile: Option<String>,
    /// Expected SM activity when alone (`carma.io/sm-activity`), 0..1.
    pub sm_activity: Option<f64>,
}

impl PodRequest {
    /// Read the input annotations; the first malformed one is an error.
    pub fn from_annotations(
        annotations: &BTreeMap<String, String>,
    ) -> Result<Self, AnnotationError> {
        let gpu_memory_mib = annotations
            .get(ANNOTATION_GPU_MEMORY)
            .map(|v| quantity::parse_mib(v))
            .transpose()?;
        let policy = annotations
            .get(ANNOTATION_POLICY)
            .map(|v| v.parse::<Policy>())
            .transpose()?;
        let exclusive = match annotations.get(ANNOTATION_EXCLUSIVE).map(|s| s.trim()) {
            None | Some("false") => false,
            Some("true") => true,
            Some(other) => return Err(AnnotationError::Exclusive(other.to_string())),
        };
        let sm_activity = annotations
            .get(ANNOTATION_SM_ACTIVITY)
            .map(|raw| {
                raw.trim()
                    .parse::<f64>()
                    .ok()
                    .filter(|a| (0.0..=1.0).contains(a))
                    .ok_or_else(|| AnnotationError::SmActivity(raw.clone()))
            })
            .transpose()?;
        Ok(Self {
            gpu_memory_mib,
            policy,
            exclusive,
            model_profile: annotations.get(ANNOTATION_MODEL_PROFILE).cloned(),
            sm_activity,
        })
    }
}

/// The `carma.io/estimate` annotation.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EstimateAnnotation {
    /// Reserved MiB per GPU.
    pub mib: u64,
    /// Where the figure came from (`override`, `traced`, `gpumemnet-mlp`, `analytic-upper-bound`, `whole-gpu`, …).
    pub source: String,
    /// Estimator class label, when one applies.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub class: Option<String>,
    /// For source `history`: completed runs of the same model profile the reservation rests on.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub samples: Option<u32>,
}

/// The extender's assignment of a pod to GPUs, read back from its annotations.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Assignment {
    /// GPU UUIDs.
    pub gpus: Vec<String>,
    /// When the assignment was made.
    pub assigned_at: DateTime<Utc>,
    /// Reservation per GPU.
    pub estimate: EstimateAnnotation,
    /// Whether the pod holds its GPUs alone.
    pub exclusive: bool,
    /// Whether the device plugin has served Allocate for it.
    pub allocated: bool,
}

impl Assignment {
    /// The assignment in `annotations`, `None` when the pod has not been assigned.
    pub fn from_annotations(
        annotations: &BTreeMap<String, String>,
    ) -> Result<Option<Self>, AnnotationError> {
        let Some(gpus_raw) = annotations.get(ANNOTATION_ASSIGNED_GPUS) else {
            return Ok(None);
        };
        let gpus: Vec<String> = gpus_raw
            .split(',')
            .map(str::trim)
            .filter(|s| !s.is_empty())
            .map(String::from)
            .collect();
        if gpus.is_empty() {
            return Err(AnnotationError::AssignedGpus(format!(
                "{gpus_raw:?} names no GPU"
            )));
        }
        let at_raw = annotations
            .get(ANNOTATION_ASSIGNED_AT)
            .ok_or_else(|| AnnotationError::AssignedAt(String::new()))?;
        let assigned_at = DateTime::parse_from_rfc3339(at_raw)
            .map_err(|_| AnnotationError::AssignedAt(at_raw.clone()))?
            .with_timezone(&Utc);
        let estimate_raw = annotations
            .get(ANNOTATION_ESTIMATE)
            .ok_or_else(|| AnnotationError::Estimate("missing".to_string()))?;
        let estimate: EstimateAnnotation = serde_json::from_str(estimate_raw)
            .map_err(|e| AnnotationError::Estimate(e.to_string()))?;
        let exclusive = annotations
            .get(ANNOTATION_EXCLUSIVE)
            .is_some_and(|v| v.trim() == "true");
        let allocated = annotations
            .get(ANNOTATION_ALLOCATED)
            .is_some_and(|v| v.trim() == "true");
        Ok(Some(Self {
            gpus,
            assigned_at,
            estimate,
            exclusive,
            allocated,
        }))
    }

    /// The output annotations the extender writes at bind.
    pub fn to_annotations(&self, node: &str) -> BTreeMap<String, String> {
        let mut out = BTreeMap::new();
        out.insert(ANNOTATION_ASSIGNED_GPUS.to_string(), self.gpus.join(","));
        out.insert(
            ANNOTATION_ASSIGNED_AT.to_string(),
            self.assigned_at
                .to_rfc3339_opts(chrono::SecondsFormat::Millis, true),
        );
        out.insert(ANNOTATION_ASSIGNED_NODE.to_string(), node.to_string());
        out.insert(
            ANNOTATION_ESTIMATE.to_string(),
            serde_json::to_string(&self.estimate).unwrap_or_default(),
        );
        if self.exclusive {
            out.insert(ANNOTATION_EXCLUSIVE.to_string(), "true".to_string());
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn map(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn request_reads_every_input_annotation() {
        let r = PodRequest::from_annotations(&map(&[
            (ANNOTATION_GPU_MEMORY, "12Gi"),
            (ANNOTATION_POLICY, "magm"),
            (ANNOTATION_EXCLUSIVE, "true"),
            (ANNOTATION_MODEL_PROFILE, "{}"),
            (ANNOTATION_SM_ACTIVITY, " 0.35"),
        ]))
        .unwrap();
        assert_eq!(r.sm_activity, Some(0.35));
        assert_eq!(r.gpu_memory_mib, Some(12288));
        assert_eq!(r.policy, Some(Policy::Magm));
        assert!(r.exclusive);
        assert_eq!(r.model_profile.as_deref(), Some("{}"));
    }

    #[test]
    fn malformed_inputs_name_their_annotation() {
        let cases = [
            (ANNOTATION_GPU_MEMORY, "twelve"),
            (ANNOTATION_POLICY, "fastest"),
            (ANNOTATION_EXCLUSIVE, "yes"),
            (ANNOTATION_SM_ACTIVITY, "1.5"),
            (ANNOTATION_SM_ACTIVITY, "NaN"),
            (ANNOTATION_SM_ACTIVITY, "busy"),
        ];
        for (key, value) in cases {
            let err = PodRequest::from_annotations(&map(&[(key, value)])).unwrap_err();
            assert!(err.to_string().contains(key), "{err}");
        }
    }

    #[test]
    fn assignment_round_trips() {
        let a = Assignment {
            gpus: vec!["GPU-a".into(), "GPU-b".into()],
            assigned_at: DateTime::parse_from_rfc3339("2026-11-21T10:00:00.000Z")
                .unwrap()
                .with_timezone(&Utc),
            estimate: EstimateAnnotation {
                mib: 8000,
                source: "gpumemnet-mlp".into(),
                class: Some("(1000,2000]".into()),
                samples: None,
            },
            exclusive: false,
            allocated: false,
        };
        let back = Assignment::from_annotations(&a.to_annotations("n1"))
            .unwrap()
            .unwrap();
        assert_eq!(back, a);
    }

    #[test]
    fn unassigned_pod_has_no_assignment() {
        assert_eq!(Assignment::from_annotations(&BTreeMap::new()), Ok(None));
    }

    #[test]
    fn broken_assignment_is_an_error() {
        let err = Assignment::from_annotations(&map(&[
            (ANNOTATION_ASSIGNED_GPUS, "GPU-a"),
            (ANNOTATION_ASSIGNED_AT, "yesterday"),
        ]))
        .unwrap_err();
        assert!(err.to_string().contains(ANNOTATION_ASSIGNED_AT));
        let err =
            Assignment::from_annotations(&map(&[(ANNOTATION_ASSIGNED_GPUS, " , ")])).unwrap_err();
        assert!(err.to_string().contains(ANNOTATION_ASSIGNED_GPUS));
    }
}
