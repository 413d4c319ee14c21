//! GPUs, nodes, demands and reservations.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};
use thiserror::Error;

use crate::gate_rule::GateRule;

/// One physical GPU as the scheduler sees it: inventory plus the latest telemetry.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Gpu {
    /// NVIDIA UUID, e.g. `GPU-5d2c…`.
    pub uuid: String,
    /// Index on its node (NVML order).
    pub index: u32,
    /// Product name, e.g. `NVIDIA A100-SXM4-40GB`.
    pub model: String,
    /// Total framebuffer memory in MiB.
    pub memory_total_mib: u64,
    /// Free memory in MiB from the latest telemetry sample.
    pub memory_free_mib: u64,
    /// SM activity risk score (0..1); `None` until the sample window has filled.
    pub sm_activity: Option<f64>,
    /// SM occupancy risk score (0..1); `None` until the window has filled.
    pub sm_occupancy: Option<f64>,
    /// DRAM activity risk score (0..1); `None` until the window has filled.
    pub dram_activity: Option<f64>,
    /// Whether the GPU is healthy (no fatal XID, reachable).
    pub healthy: bool,
    /// Compute processes running on the GPU according to telemetry (MPS daemon excluded).
    pub processes: u32,
    /// Most pods that may share the GPU: the replicas the device plugin advertises for it
    /// (kubelet cannot admit more). `None`: no limit known.
    #[serde(default)]
    pub max_pods: Option<u32>,
    /// The utilization gate the GPU's telemetry source allows (which risk scores it has at all).
    #[serde(default)]
    pub gate_rule: GateRule,
    /// When the telemetry was published (same clock as placement's `now`); `None`: never ages
    /// (the simulator's GPUs, tests).
    #[serde(default)]
    pub telemetry_at: Option<crate::Millis>,
}

impl Gpu {
    /// A healthy, idle GPU with the given memory and no telemetry history yet.
    pub fn idle(uuid: impl Into<String>, index: u32, memory_total_mib: u64) -> Self {
        Self {
            uuid: uuid.into(),
            index,
            model: String::new(),
            memory_total_mib,
            memory_free_mib: memory_total_mib,
            sm_activity: Some(0.0),
            sm_occupancy: Some(0.0),
            dram_activity: Some(0.0),
            healthy: true,
            processes: 0,
            max_pods: None,
            gate_rule: GateRule::SmactSmoccDrama,
            telemetry_at: None,
        }
    }
}

/// A node and its GPUs.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Node {
    /// Kubernetes node name.
    pub name: String,
    /// GPUs of the node, in index order.
    pub gpus: Vec<Gpu>,
}

/// How much memory a pod reserves on each of its GPUs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", tag = "kind", content = "mib")]
pub enum Reservation {
    /// A known per-GPU reservation in MiB (override or estimate).
    Mib(u64),
    /// Nothing is known: the pod takes whole GPUs and never shares.
    WholeGpu,
    /// No estimate, but sharing is allowed when a fixed amount is free (CARMA's
    /// OR-MAGM / OR-LUG variants).
    Unknown,
}

impl Reservation {
    /// MiB booked on a GPU of `gpu_total_mib` for this reservation.
    pub fn booked_mib(self, gpu_total_mib: u64, cfg_min_free_without_estimate: u64) -> u64 {
        match self {
            Reservation::Mib(m) => m,
            Reservation::WholeGpu => gpu_total_mib,
            Reservation::Unknown => cfg_min_free_without_estimate.min(gpu_total_mib),
        }
    }
}

impl fmt::Display for Reservation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Reservation::Mib(m) => write!(f, "{m} MiB"),
            Reservation::WholeGpu => f.write_str("whole GPU"),
            Reservation::Unknown => f.write_str("unknown (no estimate)"),
        }
    }
}

/// Placement policy: how candidate GPUs are ordered.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, PartialOrd, Ord)]
#[serde(rename_all = "lowercase")]
pub enum Policy {
    /// Never collocate.
    Exclusive,
    /// First fit: GPU index order.
    Ff,
    /// Best fit: least free memory first.
    Bf,
    /// Most available GPU memory first.
    Magm,
    /// Least utilized GPU (lowest SM activity) first.
    Lug,
    /// Round robin over GPUs, no memory test and no gate (relies on recovery).
    Rr,
    /// carma's own (not CARMA's): complementary packing. A pod goes first where its expected SM
    /// activity fits beside what the GPU already runs (the tightest such fit), then to idle GPUs,
    /// then — crowded — to the least busy GPU that passes the gate; idle GPUs are kept for pods that
    /// cannot share. Memory test, reservations and gate as the other policies (see
    /// `placement::pack`).
    Pack,
}

impl Policy {
    /// The policy of pods that name none, in the chart, the extender, `carma local` and the
    /// simulator's comparison: carma's own `pack`, chosen on the simulated grid of
    /// docs/default-policy.md without knowing how much co-located jobs interfere.
    pub const DEFAULT: Policy = Policy::Pack;

    /// Every policy, in documentation order: CARMA's six, then carma's own.
    pub const ALL: [Policy; 7] = [
        Policy::Exclusive,
        Policy::Ff,
        Policy::Bf,
        Policy::Magm,
        Policy::Lug,
        Policy::Rr,
        Policy::Pack,
    ];

    /// Whether the policy is one of CARMA's six (the paper's), as opposed to one of carma's own.
    pub fn is_carmas(self) -> bool {
        match self {
            Policy::Exclusive
            | Policy::Ff
            | Policy::Bf
            | Policy::Magm
            | Policy::Lug
            | Policy::Rr => true,
            Policy::Pack => false,
        }
    }

    /// The policy's short name as used in annotations and flags.
    pub fn as_str(self) -> &'static str {
        match self {
            Policy::Exclusive => "exclusive",
            Policy::Ff => "ff",
            Policy::Bf => "bf",
            Policy::Magm => "magm",
            Policy::Lug => "lug",
            Policy::Rr => "rr",
            Policy::Pack => "pack",
        }
    }

    /// Whether the policy applies the memory test and the utilization gate.
    pub fn checks_memory_and_gate(self) -> bool {
        !matches!(self, Policy::Rr)
    }
}

impl fmt::Display for Policy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A policy name that is not one of the seven.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
#[error("unknown policy {0:?}: expected one of exclusive, ff, bf, magm, lug, rr, pack")]
pub struct PolicyParseError(pub String);

impl FromStr for Policy {
    type Err = PolicyParseError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s.trim().to_ascii_lowercase().as_str() {
            "exclusive" => Ok(Policy::Exclusive),
            "ff" | "first-fit" => Ok(Policy::Ff),
            "bf" | "best-fit" => Ok(Policy::Bf),
            "magm" => Ok(Policy::Magm),
            "lug" => Ok(Policy::Lug),
            "rr" | "round-robin" => Ok(Policy::Rr),
            "pack" => Ok(Policy::Pack),
            _ => Err(PolicyParseError(s.to_string())),
        }
    }
}

/// What a pod asks for.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Demand {
    /// Number of GPUs, all on one node.
    pub gpus: u32,
    /// Memory per GPU.
    pub reservation: Reservation,
    /// Policy used to order candidates.
    pub policy: Policy,
    /// The pod must not share its GPUs (recovery escalation or user request).
    pub exclusive: bool,
    /// The pod may take idle GPUs only: another pod's recovery attempt is waiting for GPUs
    /// (CARMA's recovery-first rule, see [`crate::placement::recovery_first`]).
    #[serde(default)]
    pub idle_only: bool,
    /// SM activity (0..1) the pod is expected to keep busy when it runs alone: from its
    /// `carma.io/sm-activity` annotation or its model class. Only `pack` reads it; `None` (unknown)
    /// counts as a pod that fills the GPU.
    #[serde(default)]
    pub expected_sm_activity: Option<f64>,
    /// How long the pod has waited for GPUs so far (ms). `pack` lets a pod that has waited
    /// [`PlacementConfig::pack_aging_ms`](crate::PlacementConfig) crowd a busy GPU, so no pod
    /// waits without bound for a GPU where it fits.
    #[serde(default)]
    pub waited_ms: crate::Millis,
}

impl Demand {
    /// A single-GPU demand with a known reservation.
    pub fn new(gpus: u32, reservation: Reservation, policy: Policy) -> Self {
        Self {
            gpus,
            reservation,
            policy,
            exclusive: false,
            idle_only: false,
            expected_sm_activity: None,
            waited_ms: 0,
        }
    }

    /// Whether this demand may only take idle GPUs.
    pub fn wants_exclusive(&self) -> bool {
        self.exclusive
            || self.policy == Policy::Exclusive
            || self.reservation == Reservation::WholeGpu
    }
}
