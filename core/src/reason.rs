//! Rejection reasons a person can act on: which GPU, which rule, which numbers.

use std::fmt;

use serde::Serialize;
use thiserror::Error;

use crate::gate_rule::GateRule;

/// Why one GPU cannot take a demand.
#[derive(Debug, Clone, PartialEq, Serialize, Error)]
#[serde(rename_all = "camelCase", tag = "rule")]
pub enum GpuRejection {
    /// The reservation is the GPU's whole memory or more: the pod takes this GPU only whole, idle.
    #[error(
        "GPU {index} ({uuid}) has {total_mib} MiB in all and the pod reserves {need_mib} MiB per GPU: it takes this GPU only whole, when it is idle"
    )]
    NeedsWholeGpu {
        /// GPU UUID.
        uuid: String,
        /// GPU index.
        index: u32,
        /// GPU memory.
        total_mib: u64,
        /// Reservation of the pod.
        need_mib: u64,
    },
    /// Telemetry marks the GPU unhealthy.
    #[error("GPU {index} ({uuid}) is unhealthy")]
    Unhealthy {
        /// GPU UUID.
        uuid: String,
        /// GPU index.
        index: u32,
    },
    /// Another pod holds the GPU exclusively.
    #[error("GPU {index} ({uuid}) is held exclusively by {holder}")]
    ExclusivelyHeld {
        /// GPU UUID.
        uuid: String,
        /// GPU index.
        index: u32,
        /// Holder pod.
        holder: String,
    },
    /// A pod was placed on the GPU moments ago and its memory does not show yet.
    #[error(
        "GPU {index} ({uuid}) is in its warm-up lock: pod {holder} was placed there and its memory is not yet in telemetry ({remaining_s:.0} s left)"
    )]
    WarmUpLock {
        /// GPU UUID.
        uuid: String,
        /// GPU index.
        index: u32,
        /// Pod holding the lock.
        holder: String,
        /// Seconds until the lock lifts.
        remaining_s: f64,
    },
    /// The demand wants whole GPUs and this one is in use.
    #[error(
        "GPU {index} ({uuid}) is not idle ({pods} pod(s), {processes} process(es)) and the pod needs an exclusive GPU"
    )]
    NotIdle {
        /// GPU UUID.
        uuid: String,
        /// GPU index.
        index: u32,
        /// Pods placed on it.
        pods: usize,
        /// Compute processes seen by telemetry.
        processes: u32,
    },
    /// Every replica the device plugin advertises for the GPU is taken.
    #[error(
        "GPU {index} ({uuid}) already holds {pods} pod(s), all the replicas its device plugin advertises ({max_pods})"
    )]
    ReplicasTaken {
        /// GPU UUID.
        uuid: String,
        /// GPU index.
        index: u32,
        /// Pods placed on it.
        pods: usize,
        /// Replicas advertised.
        max_pods: u32,
    },
    /// Free memory is below the reservation plus the margin.
    #[error(
        "GPU {index} ({uuid}) has {usable_mib} MiB usable ({free_mib} free − {reserve_mib} telemetry reserve − {in_flight_mib} in flight), needs {need_mib} + {margin_mib} margin"
    )]
    InsufficientMemory {
        /// GPU UUID.
        uuid: String,
        /// GPU index.
        index: u32,
        /// Telemetry free memory.
        free_mib: u64,
        /// Held back from telemetry.
        reserve_mib: u64,
        /// Reservations of pods placed but not yet visible.
        in_flight_mib: u64,
        /// Usable memory after the deductions.
        usable_mib: u64,
        /// Reservation of the pod.
        need_mib: u64,
        /// Safety margin.
        margin_mib: u64,
    },
    /// The reservations already booked on the GPU leave no room.
    #[error(
        "GPU {index} ({uuid}) has {booked_mib} MiB of {total_mib} MiB reserved by {pods} pod(s); {need_mib} MiB more does not fit"
    )]
    OverReserved {
        /// GPU UUID.
        uuid: String,
        /// GPU index.
        index: u32,
        /// Reservations already booked.
        booked_mib: u64,
        /// GPU memory.
        total_mib: u64,
        /// Pods holding reservations.
        pods: usize,
        /// Reservation of the pod.
        need_mib: u64,
    },
    /// `pack`: the pod's expected SM activity does not fit beside the GPU's load under the cap.
    #[error(
        "GPU {index} ({uuid}) is loaded to SM activity {load:.2}; this pod's expected {expected:.2} on top would pass {limit:.2} (policy pack crowds a GPU only up to full activity: the pod waits for a GPU where it fits, an idle one, or until it has waited the aging time)"
    )]
    ActivityCapExceeded {
        /// GPU UUID.
        uuid: String,
        /// GPU index.
        index: u32,
        /// The larger of the measured SM activity risk score and the activity booked with its pods.
        load: f64,
        /// The pod's expected SM activity (1 when unknown).
        expected: f64,
        /// The most combined activity `pack` lets a busy GPU reach: the larger of the gate's cap
        /// and full activity (1).
        limit: f64,
    },
    /// The utilization gate: the GPU is already busy.
    #[error("GPU {index} ({uuid}) fails the utilization gate ({gate}): {}", gate_text(*.sm_activity, *.sm_activity_cap, *.sm_occupancy, *.sm_occupancy_cap, *.dram_activity, *.dram_activity_cap))]
    UtilizationGate {
        /// GPU UUID.
        uuid: String,
        /// GPU index.
        index: u32,
        /// The rule the GPU's telemetry source allows.
        gate: GateRule,
        /// SM activity risk score.
        sm_activity: f64,
        /// SM occupancy risk score, when the rule reads it.
        sm_occupancy: Option<f64>,
        /// DRAM activity risk score, when the rule reads it.
        dram_activity: Option<f64>,
        /// Cap on SM activity.
        sm_activity_cap: f64,
        /// Cap on SM occupancy.
        sm_occupancy_cap: f64,
        /// Cap on DRAM activity.
        dram_activity_cap: f64,
    },
    /// The telemetry window has not filled yet, so sharing cannot be judged.
    #[error(
        "GPU {index} ({uuid}) has no activity risk score yet for gate rule {gate} (telemetry window still filling); it can only be used exclusively"
    )]
    TelemetryWarmingUp {
        /// GPU UUID.
        uuid: String,
        /// GPU index.
        index: u32,
        /// The rule whose metrics are awaited.
        gate: GateRule,
    },
    /// The GPU's telemetry source delivers no SM activity figure, so sharing cannot be judged.
    #[error(
        "GPU {index} ({uuid}) has no SM activity telemetry (gate rule none): it can only be used exclusively; with dcgm-exporter enable DCGM_FI_PROF_SM_ACTIVE in its counters, or use the nvml backend"
    )]
    NoActivityTelemetry {
        /// GPU UUID.
        uuid: String,
        /// GPU index.
        index: u32,
    },
    /// The node's telemetry has not been published for too long (device plugin down?).
    #[error(
        "GPU {index} ({uuid}) has telemetry {age_s:.0} s old (limit {max_age_s:.0} s): is the node's carma device plugin running? It takes no new shared pods until its telemetry is fresh"
    )]
    TelemetryStale {
        /// GPU UUID.
        uuid: String,
        /// GPU index.
        index: u32,
        /// Age of the latest publication.
        age_s: f64,
        /// The configured limit.
        max_age_s: f64,
    },
}

/// "SM activity 0.91 ≥ 0.80 and (SM occupancy 0.50 ≥ 0.45 or DRAM activity …)", over the metrics
/// the rule reads.
fn gate_text(
    smact: f64,
    smact_cap: f64,
    smocc: Option<f64>,
    smocc_cap: f64,
    drama: Option<f64>,
    drama_cap: f64,
) -> String {
    let mut second = Vec::new();
    if let Some(v) = smocc {
        second.push(format!("SM occupancy {v:.2} ≥ {smocc_cap:.2}"));
    }
    if let Some(v) = drama {
        second.push(format!("DRAM activity {v:.2} ≥ {drama_cap:.2}"));
    }
    let first = format!("SM activity {smact:.2} ≥ {smact_cap:.2}");
    if second.is_empty() {
        first
    } else {
        format!("{first} and ({})", second.join(" or "))
    }
}

impl GpuRejection {
    /// Whether this rejection can lift with no change kube-scheduler watches: only through the
    /// GPU's telemetry (the GpuNode's status) or the clock (a warm-up lock running out).
    /// kube-scheduler retries a pod it was told fits nowhere only on cluster events its own
    /// plugins name (a pod deleted, a node's allocatable grown) or after five minutes, so a pod
    /// held back by such a rule alone would wait out those minutes after the rule lifted.
    /// Rules over bookings (exclusive holders, replicas, reserved memory) lift when a pod goes,
    /// which kube-scheduler sees; so do rules that only configuration or repair can lift.
    pub fn lifts_unseen(&self) -> bool {
        match self {
            GpuRejection::WarmUpLock { .. }
            | GpuRejection::InsufficientMemory { .. }
            | GpuRejection::ActivityCapExceeded { .. }
            | GpuRejection::UtilizationGate { .. }
            | GpuRejection::TelemetryWarmingUp { .. }
            | GpuRejection::TelemetryStale { .. } => true,
            // Busy through processes telemetry sees, not through pods placed on it.
            GpuRejection::NotIdle { pods, .. } => *pods == 0,
            GpuRejection::NeedsWholeGpu { .. }
            | GpuRejection::Unhealthy { .. }
            | GpuRejection::ExclusivelyHeld { .. }
            | GpuRejection::ReplicasTaken { .. }
            | GpuRejection::OverReserved { .. }
            | GpuRejection::NoActivityTelemetry { .. } => false,
        }
    }

    /// A short, stable label for metrics.
    pub fn code(&self) -> &'static str {
        match self {
            GpuRejection::NeedsWholeGpu { .. } => "needs-whole-gpu",
            GpuRejection::Unhealthy { .. } => "unhealthy",
            GpuRejection::ExclusivelyHeld { .. } => "exclusively-held",
            GpuRejection::WarmUpLock { .. } => "warm-up-lock",
            GpuRejection::NotIdle { .. } => "not-idle",
            GpuRejection::ReplicasTaken { .. } => "replicas-taken",
            GpuRejection::InsufficientMemory { .. } => "insufficient-memory",
            GpuRejection::OverReserved { .. } => "over-reserved",
            GpuRejection::ActivityCapExceeded { .. } => "activity-cap",
            GpuRejection::UtilizationGate { .. } => "utilization-gate",
            GpuRejection::TelemetryWarmingUp { .. } => "telemetry-warming-up",
            GpuRejection::NoActivityTelemetry { .. } => "no-activity-telemetry",
            GpuRejection::TelemetryStale { .. } => "telemetry-stale",
        }
    }
}

/// Why a node cannot take a demand.
#[derive(Debug, Clone, PartialEq, Serialize, Error)]
#[serde(rename_all = "camelCase", tag = "rule")]
pub enum NodeRejection {
    /// The node reports no GPU (no GpuNode, or an empty one).
    #[error("node {node} reports no carma GPUs")]
    NoGpus {
        /// Node name.
        node: String,
    },
    /// The pod asks for more GPUs than the node has.
    #[error("node {node} has {have} GPU(s), the pod needs {wanted} on one node")]
    TooFewGpus {
        /// Node name.
        node: String,
        /// GPUs wanted.
        wanted: u32,
        /// GPUs on the node.
        have: usize,
    },
    /// A recovery attempt waits for GPUs, so the pod may take idle GPUs only, and too few are idle.
    #[error(
        "node {node}: a recovery attempt (priority class carma-recovery) is waiting for GPUs, so other pods take idle GPUs only until it is placed (CARMA's recovery-first rule); the pod needs {wanted}, {idle} idle here"
    )]
    RecoveryFirst {
        /// Node name.
        node: String,
        /// GPUs wanted.
        wanted: u32,
        /// Idle GPUs on the node.
        idle: usize,
    },
    /// Fewer GPUs than needed pass the rules.
    #[error("node {node}: the pod needs {wanted} GPU(s) {mode}, {passing} pass: {}", join(.rejections))]
    NotEnoughGpus {
        /// Node name.
        node: String,
        /// GPUs wanted.
        wanted: u32,
        /// GPUs that passed.
        passing: usize,
        /// `exclusively` or `to share`.
        mode: &'static str,
        /// Why each other GPU failed.
        rejections: Vec<GpuRejection>,
    },
}

fn join(rejections: &[GpuRejection]) -> String {
    let parts: Vec<String> = rejections.iter().map(ToString::to_string).collect();
    parts.join("; ")
}

impl NodeRejection {
    /// Whether the node may take the pod after a change kube-scheduler does not watch (see
    /// [`GpuRejection::lifts_unseen`]): one of its GPUs is held back by such a rule, or the
    /// recovery-first rule holds, which lifts when the recovery attempt is bound (an event
    /// kube-scheduler's plugins ignore).
    pub fn lifts_unseen(&self) -> bool {
        match self {
            NodeRejection::NoGpus { .. } | NodeRejection::TooFewGpus { .. } => false,
            NodeRejection::RecoveryFirst { .. } => true,
            NodeRejection::NotEnoughGpus { rejections, .. } => {
                rejections.iter().any(GpuRejection::lifts_unseen)
            }
        }
    }

    /// A short, stable label for metrics: the most frequent GPU rule, or the node rule.
    pub fn code(&self) -> &'static str {
        match self {
            NodeRejection::NoGpus { .. } => "no-gpus",
            NodeRejection::TooFewGpus { .. } => "too-few-gpus",
            NodeRejection::RecoveryFirst { .. } => "recovery-first",
            NodeRejection::NotEnoughGpus { rejections, .. } => {
                let mut counts: Vec<(&'static str, usize)> = Vec::new();
                for r in rejections {
                    match counts.iter_mut().find(|(c, _)| *c == r.code()) {
                        Some((_, n)) => *n += 1,
                        None => counts.push((r.code(), 1)),
                    }
                }
                counts
                    .into_iter()
                    .max_by_key(|(_, n)| *n)
                    .map_or("not-enough-gpus", |(c, _)| c)
            }
        }
    }
}

/// Display helper for a list of node rejections.
#[derive(Debug)]
pub struct Rejections<'a>(pub &'a [NodeRejection]);

impl fmt::Display for Rejections<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, r) in self.0.iter().enumerate() {
            if i > 0 {
                f.write_str("\n")?;
            }
            write!(f, "{r}")?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn node_with(rejections: Vec<GpuRejection>) -> NodeRejection {
        NodeRejection::NotEnoughGpus {
            node: "n".into(),
            wanted: 1,
            passing: 0,
            mode: "to share",
            rejections,
        }
    }

    #[test]
    fn only_telemetry_clock_and_recovery_rules_lift_unseen() {
        let uuid = || "GPU-0".to_string();
        let lock = GpuRejection::WarmUpLock {
            uuid: uuid(),
            index: 0,
            holder: "p".into(),
            remaining_s: 12.0,
        };
        let booked = GpuRejection::OverReserved {
            uuid: uuid(),
            index: 1,
            booked_mib: 40_000,
            total_mib: 40_960,
            pods: 2,
            need_mib: 8_000,
        };
        let busy_by_process = GpuRejection::NotIdle {
            uuid: uuid(),
            index: 2,
            pods: 0,
            processes: 1,
        };
        let busy_by_pod = GpuRejection::NotIdle {
            uuid: uuid(),
            index: 3,
            pods: 1,
            processes: 1,
        };
        assert!(lock.lifts_unseen());
        assert!(busy_by_process.lifts_unseen());
        assert!(!booked.lifts_unseen());
        assert!(!busy_by_pod.lifts_unseen());
        assert!(!node_with(vec![booked.clone(), busy_by_pod]).lifts_unseen());
        assert!(node_with(vec![booked, lock]).lifts_unseen());
        assert!(
            NodeRejection::RecoveryFirst {
                node: "n".into(),
                wanted: 1,
                idle: 0
            }
            .lifts_unseen()
        );
        assert!(!NodeRejection::NoGpus { node: "n".into() }.lifts_unseen());
    }
}
