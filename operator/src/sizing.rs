//! The operator's sizing of a first attempt whose GPUs come from a DRA claim.
//!
//! On the device-plugin path carma-scheduler's extender sizes each pod when it binds it. A DRA
//! claim is fixed when its pod is created, so the operator sizes it then, with the rule the
//! extender uses ([`carma_core::first_reservation`]): the template's `carma.io/gpu-memory`, else
//! the estimator's answer for `spec.modelProfile`, else the whole GPU. What earlier runs of the
//! same model used (`MemoryHistory`) is not consulted here: the extender's view of it is not
//! available to the operator, so DRA first attempts book the estimate.

use carma_api::names::ANNOTATION_GPU_MEMORY;
use carma_api::{EstimateAnnotation, TrainingTask};
use carma_core::FirstReservation;
use carma_core::quantity::parse_mib;
use carma_estimator::{Estimate, EstimateError, Estimator, parse_profile};

use crate::attempt::InvalidSpec;
use tracing::warn;

/// The booking of attempt 1 per GPU with where it comes from; `None` books whole GPUs.
/// `spec.gpuMemory` and `spec.exclusive` are the planner's to apply first. A model profile the
/// estimator refuses is the task's error to fix, as the extender leaves such a pod pending; an
/// estimator that fails on a valid profile books whole GPUs, as the extender does.
pub fn first_estimate(
    task: &TrainingTask,
    estimator: &Estimator,
) -> Result<Option<EstimateAnnotation>, InvalidSpec> {
    let template_override = task
        .spec
        .template
        .metadata
        .as_ref()
        .and_then(|m| m.annotations.as_ref())
        .and_then(|a| a.get(ANNOTATION_GPU_MEMORY))
        .and_then(|v| parse_mib(v).ok());
    let estimate = || -> Result<Option<(u64, Estimate)>, InvalidSpec> {
        let Some(profile) = task.spec.model_profile.as_ref() else {
            return Ok(None);
        };
        let invalid = |e: String| InvalidSpec::ModelProfile(e);
        let json = serde_json::to_string(profile).map_err(|e| invalid(e.to_string()))?;
        let parsed = parse_profile(&json).map_err(|e| invalid(e.to_string()))?;
        match estimator.estimate_for(&parsed, task.spec.gpus.max(1)) {
            Ok(e) => Ok(Some((e.mib, e))),
            Err(EstimateError::InvalidProfile(e)) => Err(invalid(e.to_string())),
            Err(error) => {
                warn!(
                    task = task.metadata.name.as_deref().unwrap_or(""),
                    %error,
                    "the estimator failed on spec.modelProfile; the claim books whole GPUs"
                );
                Ok(None)
            }
        }
    };
    let first = carma_core::first_reservation(template_override, estimate, |_| None)?;
    Ok(match first {
        FirstReservation::Override(mib) => Some(EstimateAnnotation {
            mib,
            source: "override".to_string(),
            class: None,
            samples: None,
        }),
        FirstReservation::Estimate { mib, estimate } => Some(EstimateAnnotation {
            mib,
            source: estimate.source.as_str().to_string(),
            class: Some(estimate.class),
            samples: None,
        }),
        FirstReservation::Learned { .. } | FirstReservation::WholeGpu => None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn task(profile: serde_json::Value, annotations: serde_json::Value) -> TrainingTask {
        serde_json::from_value(json!({
            "apiVersion": "carma.io/v1alpha1",
            "kind": "TrainingTask",
            "metadata": {"name": "t", "namespace": "ml", "uid": "u"},
            "spec": {
                "gpus": 1,
                "modelProfile": profile,
                "template": {"metadata": {"annotations": annotations},
                             "spec": {"containers": [{"name": "train", "image": "x"}]}}
            }
        }))
        .unwrap()
    }

    #[test]
    fn the_template_override_wins_then_the_estimate() {
        let est = Estimator::new().unwrap();
        let traced = json!({"family": "cnn", "batchSize": 64, "parameters": 25557032,
            "activations": 37560000, "depth": 107,
            "traced": {"forwardMiB": 5500, "backwardMiB": 5594, "optimizerStepMiB": 600,
                       "largestTensorMiB": 196, "reservedMiB": 6626}});
        let e = first_estimate(
            &task(traced.clone(), json!({"carma.io/gpu-memory": "3Gi"})),
            &est,
        )
        .unwrap()
        .unwrap();
        assert_eq!((e.mib, e.source.as_str()), (3072, "override"));
        let e = first_estimate(&task(traced, json!({})), &est)
            .unwrap()
            .unwrap();
        assert_eq!(e.source, "traced");
        // The estimator's traced reservation: context + replayed segments + the CNN workspace term.
        let want = carma_estimator::ALLOCATOR_CONTEXT_MIB
            + 6626
            + (196 * carma_estimator::ALLOCATOR_CNN_LARGEST_FACTOR_MILLI).div_ceil(1000);
        assert_eq!(e.mib, want);
    }

    #[test]
    fn no_profile_books_whole_gpus() {
        let est = Estimator::new().unwrap();
        assert_eq!(
            first_estimate(&task(json!(null), json!({})), &est),
            Ok(None)
        );
    }

    #[test]
    fn a_profile_the_estimator_refuses_is_the_tasks_error() {
        let est = Estimator::new().unwrap();
        let bad = json!({"family": "cnn", "batchSize": 0, "parameters": 1000, "activations": 1000});
        let got = first_estimate(&task(bad, json!({})), &est);
        assert!(
            matches!(&got, Err(InvalidSpec::ModelProfile(m)) if m.contains("batch")),
            "{got:?}"
        );
    }
}
