//! The condition of a carma resource, in the Kubernetes style (as `metav1.Condition`, without
//! `observedGeneration`): TrainingTasks and GpuNodes list theirs in `status.conditions`, whose
//! documentation names the types each uses.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// A condition of a carma resource, in the Kubernetes style.
#[derive(Deserialize, Serialize, Clone, Debug, PartialEq, Eq, Default, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Condition {
    /// Condition type; the resource's `conditions` field names the types it uses.
    #[serde(rename = "type")]
    pub type_: String,
    /// True, False or Unknown.
    pub status: String,
    /// Machine-readable reason in CamelCase.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// Human-readable message: what was found and what to do about it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
    /// When the status last changed (RFC 3339).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_transition_time: Option<String>,
}
