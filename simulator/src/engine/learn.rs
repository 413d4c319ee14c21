//! Learned reservations in the simulator (`--learn-peaks`): the cluster's `MemoryHistory` rule
//! (`carma_core::history`) replayed on the trace. Tasks of the same workload, batch size and GPU
//! count share a record keyed by the same profile fingerprint the cluster uses; a finished task
//! records its true peak (telemetry in a cluster sees it at its sample interval), a crash records
//! the reservation it crashed under (an exclusive crash the whole GPU), and a task's *first*
//! attempt is reserved from the record when the rule says so. Recovery attempts keep the recovery
//! rule's figure, as in a cluster.

use std::collections::HashMap;
use std::convert::Infallible;

use carma_core::{HistoryConfig, PeakHistory, Reservation, RunEnd, learned_reservation};

use crate::task::Task;

/// The records and what each task's first reservation would be without them.
#[derive(Debug)]
pub(super) struct PeakBook {
    cfg: HistoryConfig,
    /// The record each task belongs to (`None`: no profile, never learned).
    keys: Vec<Option<String>>,
    records: HashMap<String, PeakHistory>,
    /// First attempts reserved from a record.
    pub(super) learned_tasks: usize,
}

impl PeakBook {
    pub(super) fn new(tasks: &[Task], cfg: HistoryConfig) -> Self {
        let keys = tasks
            .iter()
            .map(|t| {
                t.workload
                    .map(|w| w.arch.profile(w.batch_size).fingerprint(t.gpus))
            })
            .collect();
        Self {
            cfg,
            keys,
            records: HashMap::new(),
            learned_tasks: 0,
        }
    }

    /// The first-attempt reservation of task `id` planned as `planned` (the estimate, or the whole
    /// GPU without one): carma's order with the record at hand.
    pub(super) fn first_reservation(&self, id: usize, planned: Reservation) -> Reservation {
        let estimate = match planned {
            Reservation::Mib(mib) => Some((mib, ())),
            Reservation::WholeGpu => None,
            // CARMA's OR-* rule: no estimate to learn in place of.
            Reservation::Unknown => return planned,
        };
        let learned = |mib| {
            let key = self.keys[id].as_ref()?;
            learned_reservation(mib, self.records.get(key)?, &self.cfg)
        };
        let Ok(first) =
            carma_core::first_reservation(None, || Ok::<_, Infallible>(estimate), learned);
        first.reservation()
    }

    /// Task `id` finished; `peak_mib` is what it used.
    pub(super) fn completed(&mut self, id: usize, peak_mib: u64) {
        self.record(
            id,
            RunEnd::Completed {
                peak_mib: Some(peak_mib),
            },
        );
    }

    /// Task `id` ran out of memory under `reserved_mib` per GPU (as
    /// `carma_core::recorded_reservation_mib` records it).
    pub(super) fn crashed(&mut self, id: usize, reserved_mib: Option<u64>) {
        self.record(
            id,
            RunEnd::OutOfMemory {
                reserved_mib,
                peak_mib: None,
            },
        );
    }

    fn record(&mut self, id: usize, end: RunEnd) {
        if let Some(key) = &self.keys[id] {
            self.records.entry(key.clone()).or_default().record(end);
        }
    }
}
