//! Placements in flight and the warm-up lock.
//!
//! The ledger holds every placement carma has made that still occupies a GPU:
//! pods assigned at bind (or, in the simulator, tasks started). A record is
//! *in flight* until its memory shows in telemetry; while in flight its
//! reservation is subtracted from the GPU's telemetry free memory, and for
//! [`PlacementConfig::warmup_ms`](crate::PlacementConfig) after assignment the
//! GPU accepts no other pod (the warm-up lock). Records leave the ledger when the
//! pod ends ([`Ledger::release`]).
//!
//! `assume` checks and books atomically, so callers that serialise access (a
//! mutex in the extender) can never double-book a GPU.

use std::collections::{BTreeMap, HashMap};

use serde::{Deserialize, Serialize};
use thiserror::Error;

use crate::Millis;

/// One placement: a pod on one or more GPUs of one node.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PlacementRecord {
    /// Pod identity (UID in Kubernetes, task id in the simulator).
    pub pod: String,
    /// Node name.
    pub node: String,
    /// GPU UUIDs.
    pub gpus: Vec<String>,
    /// MiB booked on each GPU.
    pub reserved_mib: u64,
    /// Whether the pod asked for its GPUs alone.
    pub exclusive: bool,
    /// When the placement was made.
    pub assigned_at: Millis,
    /// Whether the pod's memory already shows in telemetry.
    pub visible: bool,
    /// SM activity the pod was expected to add to each of its GPUs (its demand's; 0 when unknown,
    /// e.g. a record rebuilt from annotations). `pack` reads the sum per GPU beside telemetry,
    /// which shows a new pod's activity only after its warm-up and sample window.
    #[serde(default)]
    pub expected_sm_activity: f64,
}

/// Why the ledger refused a booking.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum LedgerError {
    /// The pod is already booked.
    #[error("pod {pod} already has a placement on node {node}")]
    AlreadyPlaced {
        /// Pod identity.
        pod: String,
        /// Node of the existing placement.
        node: String,
    },
    /// A GPU is held exclusively, or the new pod wants exclusivity on a used GPU.
    #[error("GPU {gpu} is held exclusively by {holder}")]
    Exclusive {
        /// GPU UUID.
        gpu: String,
        /// Pod holding it.
        holder: String,
    },
    /// The reservations on a GPU would exceed its capacity.
    #[error(
        "GPU {gpu}: booking {requested_mib} MiB on top of {booked_mib} MiB exceeds its {capacity_mib} MiB"
    )]
    OverCommit {
        /// GPU UUID.
        gpu: String,
        /// Already booked.
        booked_mib: u64,
        /// Requested.
        requested_mib: u64,
        /// Capacity the booking is checked against.
        capacity_mib: u64,
    },
    /// A GPU is still in its warm-up lock.
    #[error("GPU {gpu} is in its warm-up lock for pod {holder}")]
    WarmingUp {
        /// GPU UUID.
        gpu: String,
        /// Pod that holds the lock.
        holder: String,
    },
    /// The placement names no GPU.
    #[error("placement of pod {0} names no GPU")]
    NoGpu(String),
}

/// All placements that occupy GPUs.
#[derive(Debug, Clone, Default)]
pub struct Ledger {
    records: BTreeMap<String, PlacementRecord>,
    by_gpu: HashMap<String, GpuBook>,
}

/// Per-GPU totals kept up to date on every change, so the placement hot path
/// reads them in O(1) instead of walking the records.
#[derive(Debug, Clone, Default)]
struct GpuBook {
    pods: Vec<String>,
    reserved_mib: u64,
    in_flight_mib: u64,
    /// Sum of the records' expected SM activity, in thousandths (integers: adding and removing
    /// records leaves no rounding drift).
    expected_activity_milli: u32,
}

/// An activity (0..1, clamped) in thousandths.
fn milli(activity: f64) -> u32 {
    if activity.is_finite() {
        (activity.clamp(0.0, 1.0) * 1000.0).round() as u32
    } else {
        0
    }
}

impl Ledger {
    /// An empty ledger.
    pub fn new() -> Self {
        Self::default()
    }

    /// Book a placement, checking against `capacity_mib(gpu)` (the GPU's total
    /// memory, or `None` when the GPU is unknown and only exclusivity is checked)
    /// and the warm-up lock at `now`. Nothing is booked when an error is returned.
    pub fn assume(
        &mut self,
        record: PlacementRecord,
        capacity_mib: impl Fn(&str) -> Option<u64>,
        warmup_ms: u64,
        now: Millis,
    ) -> Result<(), LedgerError> {
        if record.gpus.is_empty() {
            return Err(LedgerError::NoGpu(record.pod));
        }
        if let Some(existing) = self.records.get(&record.pod) {
            return Err(LedgerError::AlreadyPlaced {
                pod: record.pod.clone(),
                node: existing.node.clone(),
            });
        }
        for gpu in &record.gpus {
            let holders = self.on_gpu(gpu);
            if let Some(h) = holders.iter().find(|r| r.exclusive) {
                return Err(LedgerError::Exclusive {
                    gpu: gpu.clone(),
                    holder: h.pod.clone(),
                });
            }
            if record.exclusive
                && let Some(h) = holders.first()
            {
                return Err(LedgerError::Exclusive {
                    gpu: gpu.clone(),
                    holder: h.pod.clone(),
                });
            }
            if let Some(h) = holders.iter().find(|r| r.in_warmup(warmup_ms, now)) {
                return Err(LedgerError::WarmingUp {
                    gpu: gpu.clone(),
                    holder: h.pod.clone(),
                });
            }
            if let Some(capacity) = capacity_mib(gpu) {
                let booked = self.reserved_mib(gpu);
                if booked.saturating_add(record.reserved_mib) > capacity {
                    return Err(LedgerError::OverCommit {
                        gpu: gpu.clone(),
                        booked_mib: booked,
                        requested_mib: record.reserved_mib,
                        capacity_mib: capacity,
                    });
                }
            }
        }
        self.insert_unchecked(record);
        Ok(())
    }

    /// Insert a record without checks: used to rebuild the ledger from the
    /// cluster's annotations after a restart, where the placements already exist.
    pub fn insert_unchecked(&mut self, record: PlacementRecord) {
        self.release(&record.pod);
        for gpu in &record.gpus {
            let book = self.by_gpu.entry(gpu.clone()).or_default();
            book.pods.push(record.pod.clone());
            book.reserved_mib = book.reserved_mib.saturating_add(record.reserved_mib);
            book.expected_activity_milli = book
                .expected_activity_milli
                .saturating_add(milli(record.expected_sm_activity));
            if !record.visible {
                book.in_flight_mib = book.in_flight_mib.saturating_add(record.reserved_mib);
            }
        }
        self.records.insert(record.pod.clone(), record);
    }

    /// The pod's memory now shows in telemetry: it is no longer in flight.
    /// Returns whether the pod was known.
    pub fn confirm(&mut self, pod: &str) -> bool {
        let Some(r) = self.records.get_mut(pod) else {
            return false;
        };
        if !r.visible {
            r.visible = true;
            for gpu in &r.gpus {
                if let Some(book) = self.by_gpu.get_mut(gpu) {
                    book.in_flight_mib = book.in_flight_mib.saturating_sub(r.reserved_mib);
                }
            }
        }
        true
    }

    /// The pod ended or was deleted: its GPUs are free of it.
    pub fn release(&mut self, pod: &str) -> Option<PlacementRecord> {
        let record = self.records.remove(pod)?;
        for gpu in &record.gpus {
            if let Some(book) = self.by_gpu.get_mut(gpu) {
                book.pods.retain(|p| p != pod);
                book.reserved_mib = book.reserved_mib.saturating_sub(record.reserved_mib);
                book.expected_activity_milli = book
                    .expected_activity_milli
                    .saturating_sub(milli(record.expected_sm_activity));
                if !record.visible {
                    book.in_flight_mib = book.in_flight_mib.saturating_sub(record.reserved_mib);
                }
                if book.pods.is_empty() {
                    self.by_gpu.remove(gpu);
                }
            }
        }
        Some(record)
    }

    /// The record of a pod.
    pub fn get(&self, pod: &str) -> Option<&PlacementRecord> {
        self.records.get(pod)
    }

    /// Every record, ordered by pod.
    pub fn records(&self) -> impl Iterator<Item = &PlacementRecord> {
        self.records.values()
    }

    /// Number of placements held.
    pub fn len(&self) -> usize {
        self.records.len()
    }

    /// Whether the ledger is empty.
    pub fn is_empty(&self) -> bool {
        self.records.is_empty()
    }

    /// Records on one GPU.
    pub fn on_gpu(&self, gpu: &str) -> Vec<&PlacementRecord> {
        self.by_gpu
            .get(gpu)
            .map(|book| {
                book.pods
                    .iter()
                    .filter_map(|p| self.records.get(p))
                    .collect()
            })
            .unwrap_or_default()
    }

    /// Number of pods holding the GPU.
    pub fn pods_on(&self, gpu: &str) -> usize {
        self.by_gpu.get(gpu).map_or(0, |b| b.pods.len())
    }

    /// Sum of reservations of every pod on the GPU.
    pub fn reserved_mib(&self, gpu: &str) -> u64 {
        self.by_gpu.get(gpu).map_or(0, |b| b.reserved_mib)
    }

    /// Sum of the expected SM activity of every pod on the GPU (0..1 per pod, the sum may pass 1).
    pub fn expected_sm_activity(&self, gpu: &str) -> f64 {
        self.by_gpu
            .get(gpu)
            .map_or(0.0, |b| f64::from(b.expected_activity_milli) / 1000.0)
    }

    /// Sum of reservations of pods on the GPU whose memory is not yet in telemetry.
    pub fn in_flight_mib(&self, gpu: &str) -> u64 {
        self.by_gpu.get(gpu).map_or(0, |b| b.in_flight_mib)
    }

    /// Number of placements not yet visible in telemetry.
    pub fn in_flight_count(&self) -> usize {
        self.records.values().filter(|r| !r.visible).count()
    }

    /// The pod holding the GPU's warm-up lock at `now`, with the milliseconds left.
    pub fn warmup_holder(&self, gpu: &str, warmup_ms: u64, now: Millis) -> Option<(&str, u64)> {
        self.on_gpu(gpu)
            .into_iter()
            .filter(|r| r.in_warmup(warmup_ms, now))
            .map(|r| {
                let left = (r.assigned_at + warmup_ms).saturating_sub(now);
                (r.pod.as_str(), left)
            })
            .max_by_key(|(_, left)| *left)
    }

    /// The pod holding the GPU exclusively, if any.
    pub fn exclusive_holder(&self, gpu: &str) -> Option<&str> {
        self.on_gpu(gpu)
            .into_iter()
            .find(|r| r.exclusive)
            .map(|r| r.pod.as_str())
    }
}

impl PlacementRecord {
    /// Whether this record still locks its GPUs at `now`.
    pub fn in_warmup(&self, warmup_ms: u64, now: Millis) -> bool {
        !self.visible && now < self.assigned_at.saturating_add(warmup_ms)
    }
}
