//! The reservation's estimate as the task's status shows it, and the Event that says when it is
//! the estimator's conservative fallback.

use carma_api::{EstimateAnnotation, EstimateStatus};

use super::Step;

/// The estimator's source for a reservation set by its conservative fallback bound.
const FALLBACK_SOURCE: &str = "analytic-fallback";

/// The task's model-profile caveats, one line each as the estimator words them; none when the
/// profile has none or cannot be read.
fn fallback_warnings(task: &carma_api::TrainingTask) -> Vec<String> {
    let Some(profile) = task.spec.model_profile.as_ref() else {
        return Vec::new();
    };
    let caveats = profile.caveats.as_deref().unwrap_or_default();
    caveats
        .iter()
        .filter_map(|c| serde_json::to_value(c).ok())
        .filter_map(|v| serde_json::from_value::<carma_estimator::Caveat>(v).ok())
        .map(|c| c.to_string())
        .collect()
}

impl Step<'_, '_> {
    /// The status of a reservation the extender (or, on DRA, the operator) made: with source
    /// `analytic-fallback`, its warnings are what the model profile's reading had no rule for.
    pub(super) fn estimate_status(&self, e: &EstimateAnnotation) -> EstimateStatus {
        let warnings = if e.source == FALLBACK_SOURCE {
            fallback_warnings(self.input.task)
        } else {
            Vec::new()
        };
        EstimateStatus {
            mib: Some(e.mib),
            source: e.source.clone(),
            class: e.class.clone(),
            warnings,
        }
    }

    /// An Event, once per reservation, when the current attempt's reservation is the estimator's
    /// conservative fallback: the person who wrote the profile learns that it rests on counts
    /// with no measured rule, and which.
    pub(super) fn announce_fallback(&mut self, index: u32, pod: &str) {
        let Some(e) = self.st.estimate.clone() else {
            return;
        };
        if e.source != FALLBACK_SOURCE || self.old.estimate.as_ref() == Some(&e) {
            return;
        }
        let mib = e
            .mib
            .map_or_else(String::new, |m| format!("{m} MiB per GPU "));
        let why = if e.warnings.is_empty() {
            "the model profile names no caveat".to_string()
        } else {
            e.warnings.join("; ")
        };
        let note = format!(
            "attempt {index} ({pod}) reserves {mib}from the estimator's conservative fallback: \
             its model profile holds what no measured rule covers ({why})"
        );
        self.event(true, "EstimateIsFallback", "Estimate", note, Some(pod));
    }
}
