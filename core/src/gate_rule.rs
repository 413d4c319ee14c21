//! The names of the utilization gate's rules: which activity metrics a GPU is judged by. The rules
//! themselves, and which telemetry source gets which, are in [`crate::gate`].

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

/// Which utilization gate a GPU is judged by, named after the metrics it reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, Serialize, Deserialize)]
pub enum GateRule {
    /// SM activity, and SM occupancy or DRAM activity (CARMA's gate; DCGM, NVML GPM).
    #[default]
    #[serde(rename = "smact-smocc-drama")]
    SmactSmoccDrama,
    /// SM activity and SM occupancy (a source without a DRAM figure).
    #[serde(rename = "smact-smocc")]
    SmactSmocc,
    /// SM activity and DRAM activity (NVML utilization rates without GPM).
    #[serde(rename = "smact-drama")]
    SmactDrama,
    /// SM activity alone.
    #[serde(rename = "smact")]
    Smact,
    /// No SM activity figure: the GPU cannot be judged and takes exclusive pods only.
    #[serde(rename = "none")]
    NoActivity,
}

impl GateRule {
    /// Every rule, in documentation order.
    pub const ALL: [GateRule; 5] = [
        GateRule::SmactSmoccDrama,
        GateRule::SmactSmocc,
        GateRule::SmactDrama,
        GateRule::Smact,
        GateRule::NoActivity,
    ];

    /// The rule for a source that delivers the given metrics.
    pub fn for_metrics(sm_activity: bool, sm_occupancy: bool, dram_activity: bool) -> Self {
        match (sm_activity, sm_occupancy, dram_activity) {
            (false, _, _) => GateRule::NoActivity,
            (true, true, true) => GateRule::SmactSmoccDrama,
            (true, true, false) => GateRule::SmactSmocc,
            (true, false, true) => GateRule::SmactDrama,
            (true, false, false) => GateRule::Smact,
        }
    }

    /// The label value (`smact-smocc-drama`, `smact-drama`, …, `none`).
    pub fn as_str(self) -> &'static str {
        match self {
            GateRule::SmactSmoccDrama => "smact-smocc-drama",
            GateRule::SmactSmocc => "smact-smocc",
            GateRule::SmactDrama => "smact-drama",
            GateRule::Smact => "smact",
            GateRule::NoActivity => "none",
        }
    }

    /// Whether the rule reads SM occupancy.
    pub fn reads_occupancy(self) -> bool {
        matches!(self, GateRule::SmactSmoccDrama | GateRule::SmactSmocc)
    }

    /// Whether the rule reads DRAM activity.
    pub fn reads_dram(self) -> bool {
        matches!(self, GateRule::SmactSmoccDrama | GateRule::SmactDrama)
    }
}

impl fmt::Display for GateRule {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A gate rule name that is not one of the five.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "unknown gate rule {0:?}: expected smact-smocc-drama, smact-smocc, smact-drama, smact or none"
)]
pub struct GateRuleParseError(pub String);

impl FromStr for GateRule {
    type Err = GateRuleParseError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        GateRule::ALL
            .into_iter()
            .find(|r| r.as_str() == s.trim())
            .ok_or_else(|| GateRuleParseError(s.to_string()))
    }
}
