//! Placement of one demand on one node: exclusive first, then the memory test,
//! the utilization gate and the policy's order; and the node score for prioritize.
//!
//! Scores (0..10, kube-scheduler's `MaxExtenderPriority`): a node that can give the
//! pod idle GPUs scores 10 (CARMA's exclusive-first rule lifted to the cluster).
//! Otherwise the policy's own preference is mapped to 0..9:
//! `ff` prefers the lowest GPU index, `bf` the tightest fit, `magm` the most memory
//! left, `lug` the lowest SM activity, `rr` the fewest pods already sharing.

use serde::Serialize;

use crate::Millis;
use crate::config::PlacementConfig;
use crate::gate::utilization_gate;
use crate::ledger::Ledger;
use crate::model::{Demand, Gpu, Node, Policy, Reservation};
use crate::reason::{GpuRejection, NodeRejection};

/// Where a demand goes on one node.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct NodePlacement {
    /// Node name.
    pub node: String,
    /// Chosen GPU UUIDs, in the policy's order.
    pub gpus: Vec<String>,
    /// Their indices.
    pub indices: Vec<u32>,
    /// Whether the pod gets the GPUs alone.
    pub exclusive: bool,
    /// MiB booked on each GPU.
    pub reserved_mib: u64,
    /// Node score 0..10 for prioritize.
    pub score: u8,
    /// Whether booking must keep each GPU's reservations within its memory — exactly when placement
    /// checked it, so that a bind never refuses what filter passed: round robin (no memory test, as in
    /// CARMA) books without the check.
    pub capacity_checked: bool,
}

impl NodePlacement {
    /// Where round robin starts next on this node: after the last GPU chosen, in the policy's
    /// (rotated) order — after a wrap-around that is not the highest index. The simulator and the
    /// extender both advance their cursors with this.
    pub fn next_rr_cursor(&self) -> Option<usize> {
        self.indices.last().map(|i| *i as usize + 1)
    }
}

/// A GPU that passed, with what the policy orders by.
#[derive(Debug, Clone, Copy)]
struct Fit<'a> {
    gpu: &'a Gpu,
    usable_mib: u64,
    need_mib: u64,
    pods: usize,
}

/// Memory usable for a new pod: telemetry free minus the reserve minus in-flight.
pub fn usable_mib(gpu: &Gpu, ledger: &Ledger, cfg: &PlacementConfig) -> u64 {
    gpu.memory_free_mib
        .saturating_sub(cfg.telemetry_reserve_mib)
        .saturating_sub(ledger.in_flight_mib(&gpu.uuid))
}

/// Whether a GPU is idle: healthy, no pod placed, no compute process.
pub fn is_idle(gpu: &Gpu, ledger: &Ledger) -> bool {
    gpu.healthy && gpu.processes == 0 && ledger.pods_on(&gpu.uuid) == 0
}

/// Whether `demand` takes `gpu` whole: it must be alone on the GPU, or it reserves the GPU's whole
/// memory or more. A reservation that large leaves nothing to share, and an estimate above the GPU
/// (GPUMemNet's classes are upper edges) is best tried on the whole GPU rather than refused; if it
/// really does not fit, the attempt fails with an out-of-memory crash and recovery decides. The
/// simulator and the extender both follow this one rule.
pub fn takes_whole(gpu: &Gpu, demand: &Demand) -> bool {
    demand.wants_exclusive()
        || matches!(demand.reservation, Reservation::Mib(m) if m >= gpu.memory_total_mib)
}

/// The reservation fills the GPU: only an idle GPU, taken whole, will do.
fn needs_whole(gpu: &Gpu, demand: &Demand) -> Option<GpuRejection> {
    match demand.reservation {
        Reservation::Mib(need) if need >= gpu.memory_total_mib => {
            Some(GpuRejection::NeedsWholeGpu {
                uuid: gpu.uuid.clone(),
                index: gpu.index,
                total_mib: gpu.memory_total_mib,
                need_mib: need,
            })
        }
        _ => None,
    }
}

/// CARMA's recovery-first rule: while a recovery attempt (a pod of a task that crashed out of
/// memory, priority class `carma-recovery`) waits for GPUs, every other pod takes idle GPUs only, so
/// no new collocation competes with the recovering task for the GPUs that free up. The simulator
/// applies it with its recovery queue, the extender with the pending `carma-recovery` pods it sees.
pub fn recovery_first(mut demand: Demand, recovery_waiting: bool, is_recovery: bool) -> Demand {
    demand.idle_only = recovery_waiting && !is_recovery;
    demand
}

/// Checks every rule for sharing one GPU with `demand`.
fn check_shared<'a>(
    gpu: &'a Gpu,
    ledger: &Ledger,
    demand: &Demand,
    cfg: &PlacementConfig,
    now: Millis,
) -> Result<Fit<'a>, GpuRejection> {
    let uuid = || gpu.uuid.clone();
    if let Some(r) = needs_whole(gpu, demand) {
        return Err(r);
    }
    if !gpu.healthy {
        return Err(GpuRejection::Unhealthy {
            uuid: uuid(),
            index: gpu.index,
        });
    }
    if let Some(holder) = ledger.exclusive_holder(&gpu.uuid) {
        return Err(GpuRejection::ExclusivelyHeld {
            uuid: uuid(),
            index: gpu.index,
            holder: holder.to_string(),
        });
    }
    // A mechanical limit, whatever the policy: kubelet admits at most one pod per replica.
    if let Some(max_pods) = gpu.max_pods {
        let pods = ledger.pods_on(&gpu.uuid);
        if pods >= max_pods as usize {
            return Err(GpuRejection::ReplicasTaken {
                uuid: uuid(),
                index: gpu.index,
                pods,
                max_pods,
            });
        }
    }
    if let Some((holder, left_ms)) = ledger.warmup_holder(&gpu.uuid, cfg.warmup_ms, now) {
        return Err(GpuRejection::WarmUpLock {
            uuid: uuid(),
            index: gpu.index,
            holder: holder.to_string(),
            remaining_s: left_ms as f64 / 1000.0,
        });
    }
    let usable = usable_mib(gpu, ledger, cfg);
    let pods = ledger.pods_on(&gpu.uuid);
    let need = demand
        .reservation
        .booked_mib(gpu.memory_total_mib, cfg.min_free_without_estimate_mib);
    if !demand.policy.checks_memory_and_gate() {
        return Ok(Fit {
            gpu,
            usable_mib: usable,
            need_mib: need,
            pods,
        });
    }
    let (need_test, margin) = match demand.reservation {
        Reservation::Mib(m) => (m, cfg.memory_margin_mib),
        Reservation::Unknown | Reservation::WholeGpu => (need, 0),
    };
    if usable < need_test.saturating_add(margin) {
        return Err(GpuRejection::InsufficientMemory {
            uuid: uuid(),
            index: gpu.index,
            free_mib: gpu.memory_free_mib,
            reserve_mib: cfg.telemetry_reserve_mib,
            in_flight_mib: ledger.in_flight_mib(&gpu.uuid),
            usable_mib: usable,
            need_mib: need_test,
            margin_mib: margin,
        });
    }
    if cfg.honor_reservations {
        let booked = ledger.reserved_mib(&gpu.uuid);
        if booked.saturating_add(need) > gpu.memory_total_mib {
            return Err(GpuRejection::OverReserved {
                uuid: uuid(),
                index: gpu.index,
                booked_mib: booked,
                total_mib: gpu.memory_total_mib,
                pods,
                need_mib: need,
            });
        }
    }
    utilization_gate(gpu, cfg, now)?;
    Ok(Fit {
        gpu,
        usable_mib: usable,
        need_mib: need,
        pods,
    })
}

/// Place `demand` on `node`.
///
/// `rr_cursor` is the GPU index round robin starts from (the caller keeps it and
/// advances it past the last GPU chosen). Every rejected node carries the reason
/// of every GPU that failed.
pub fn place_on_node(
    node: &Node,
    ledger: &Ledger,
    demand: &Demand,
    cfg: &PlacementConfig,
    now: Millis,
    rr_cursor: usize,
) -> Result<NodePlacement, NodeRejection> {
    let wanted = demand.gpus.max(1);
    if node.gpus.is_empty() {
        return Err(NodeRejection::NoGpus {
            node: node.name.clone(),
        });
    }
    if node.gpus.len() < wanted as usize {
        return Err(NodeRejection::TooFewGpus {
            node: node.name.clone(),
            wanted,
            have: node.gpus.len(),
        });
    }

    // Exclusive first: enough idle GPUs → take the first N alone.
    let mut by_index: Vec<&Gpu> = node.gpus.iter().collect();
    by_index.sort_by_key(|g| g.index);
    let idle: Vec<&Gpu> = by_index
        .iter()
        .copied()
        .filter(|g| is_idle(g, ledger))
        .collect();
    if idle.len() >= wanted as usize {
        let chosen = &idle[..wanted as usize];
        // A pod that takes its GPUs whole owns them; a sharer that merely found idle GPUs books
        // its own reservation, so others may join later.
        let whole = chosen.iter().any(|g| takes_whole(g, demand));
        let reserved = chosen
            .iter()
            .map(|g| {
                if whole {
                    g.memory_total_mib
                } else {
                    demand
                        .reservation
                        .booked_mib(g.memory_total_mib, cfg.min_free_without_estimate_mib)
                }
            })
            .max()
            .unwrap_or(0);
        return Ok(NodePlacement {
            node: node.name.clone(),
            gpus: chosen.iter().map(|g| g.uuid.clone()).collect(),
            indices: chosen.iter().map(|g| g.index).collect(),
            exclusive: whole,
            reserved_mib: reserved,
            score: 10,
            capacity_checked: true,
        });
    }
    if demand.wants_exclusive() {
        let rejections = by_index
            .iter()
            .filter(|g| !idle.iter().any(|i| i.uuid == g.uuid))
            .map(|g| {
                if g.healthy {
                    GpuRejection::NotIdle {
                        uuid: g.uuid.clone(),
                        index: g.index,
                        pods: ledger.pods_on(&g.uuid),
                        processes: g.processes,
                    }
                } else {
                    GpuRejection::Unhealthy {
                        uuid: g.uuid.clone(),
                        index: g.index,
                    }
                }
            })
            .collect();
        return Err(NodeRejection::NotEnoughGpus {
            node: node.name.clone(),
            wanted,
            passing: idle.len(),
            mode: "exclusively",
            rejections,
        });
    }

    if demand.idle_only {
        return Err(NodeRejection::RecoveryFirst {
            node: node.name.clone(),
            wanted,
            idle: idle.len(),
        });
    }

    // Collocation: every rule per GPU, then the policy's order.
    let mut fits = Vec::new();
    let mut rejections = Vec::new();
    for gpu in &by_index {
        match check_shared(gpu, ledger, demand, cfg, now) {
            Ok(fit) => fits.push(fit),
            Err(r) => rejections.push(r),
        }
    }
    if fits.len() < wanted as usize {
        return Err(NodeRejection::NotEnoughGpus {
            node: node.name.clone(),
            wanted,
            passing: fits.len(),
            mode: "to share",
            rejections,
        });
    }
    order(&mut fits, demand.policy, rr_cursor, node.gpus.len());
    let chosen = &fits[..wanted as usize];
    let score = collocation_score(chosen, demand.policy);
    Ok(NodePlacement {
        node: node.name.clone(),
        gpus: chosen.iter().map(|f| f.gpu.uuid.clone()).collect(),
        indices: chosen.iter().map(|f| f.gpu.index).collect(),
        exclusive: false,
        reserved_mib: chosen.iter().map(|f| f.need_mib).max().unwrap_or(0),
        score,
        capacity_checked: cfg.honor_reservations && demand.policy.checks_memory_and_gate(),
    })
}

/// Stable sort of candidates by the policy's key (ties keep index order).
fn order(fits: &mut [Fit<'_>], policy: Policy, rr_cursor: usize, gpu_count: usize) {
    match policy {
        Policy::Ff | Policy::Exclusive => {}
        Policy::Bf => fits.sort_by_key(|f| f.usable_mib),
        Policy::Magm => fits.sort_by_key(|f| std::cmp::Reverse(f.usable_mib)),
        Policy::Lug => fits.sort_by(|a, b| {
            let x = a.gpu.sm_activity.unwrap_or(0.0);
            let y = b.gpu.sm_activity.unwrap_or(0.0);
            x.total_cmp(&y)
        }),
        Policy::Rr => {
            let n = gpu_count.max(1);
            let start = rr_cursor % n;
            fits.sort_by_key(|f| (f.gpu.index as usize + n - start) % n);
        }
    }
}

/// Map the policy's preference for the chosen GPUs to 0..9.
fn collocation_score(chosen: &[Fit<'_>], policy: Policy) -> u8 {
    let scale = |x: f64| (x.clamp(0.0, 1.0) * 9.0).round() as u8;
    let left_fraction = |f: &Fit<'_>| {
        let after = f.usable_mib.saturating_sub(f.need_mib) as f64;
        after / f.gpu.memory_total_mib.max(1) as f64
    };
    match policy {
        Policy::Exclusive => 0,
        Policy::Ff => {
            let first = chosen.iter().map(|f| f.gpu.index).min().unwrap_or(0);
            9u8.saturating_sub(first.min(9) as u8)
        }
        Policy::Bf => {
            let tightest = chosen.iter().map(left_fraction).fold(1.0, f64::min);
            scale(1.0 - tightest)
        }
        Policy::Magm => {
            let least = chosen.iter().map(left_fraction).fold(1.0, f64::min);
            scale(least)
        }
        Policy::Lug => {
            let busiest = chosen
                .iter()
                .map(|f| f.gpu.sm_activity.unwrap_or(1.0))
                .fold(0.0, f64::max);
            scale(1.0 - busiest)
        }
        Policy::Rr => {
            let most = chosen.iter().map(|f| f.pods).max().unwrap_or(0);
            9u8.saturating_sub(most.min(9) as u8)
        }
    }
}

/// The earliest moment at which [`place_on_node`]'s answer for `node` can change by time alone: a
/// warm-up lock lifting or the node's telemetry turning stale. Until then an answer may be reused
/// while the node, the ledger records on its GPUs and the demand stay the same (the simulator's
/// memo and the extender's verdict cache both follow this). `None`: only an event can change it.
pub fn verdict_expiry(
    node: &Node,
    ledger: &Ledger,
    cfg: &PlacementConfig,
    now: Millis,
) -> Option<Millis> {
    let locks = node
        .gpus
        .iter()
        .flat_map(|g| ledger.on_gpu(&g.uuid))
        .filter(|r| r.in_warmup(cfg.warmup_ms, now))
        .map(|r| r.assigned_at.saturating_add(cfg.warmup_ms));
    let stale = node
        .gpus
        .iter()
        .filter_map(|g| crate::gate::stale_at(g, cfg, now));
    locks.chain(stale).filter(|t| *t > now).min()
}

/// The prioritize score of a node: the placement's score, 0 when it cannot place.
pub fn score_node(
    node: &Node,
    ledger: &Ledger,
    demand: &Demand,
    cfg: &PlacementConfig,
    now: Millis,
) -> u8 {
    place_on_node(node, ledger, demand, cfg, now, 0).map_or(0, |p| p.score)
}
