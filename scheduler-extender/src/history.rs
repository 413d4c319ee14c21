//! The `MemoryHistory` records the extender reserves from (fed by a watcher, or by a snapshot).
//!
//! The rule itself — `max(peaks) + headroom` when lower than the estimate, or when the estimate
//! is known to be too small — is `carma_core::learned_reservation`; this is the lookup by
//! profile fingerprint, and a generation that changes with every record so that cached
//! decisions are judged again.

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicU64, Ordering};

use carma_api::MemoryHistory;
use carma_core::{HistoryConfig, LearnedReservation, PeakHistory, learned_reservation};
use carma_estimator::Profile;
use parking_lot::RwLock;

/// Source label of a reservation learned from earlier runs of the same model profile.
pub const SOURCE_HISTORY: &str = "history";

/// Observed peaks by profile fingerprint.
#[derive(Debug, Default)]
pub struct HistoryBook {
    config: HistoryConfig,
    records: RwLock<HashMap<String, PeakHistory>>,
    generation: AtomicU64,
}

impl HistoryBook {
    /// An empty book applying `config`.
    pub fn new(config: HistoryConfig) -> Self {
        Self {
            config,
            ..Self::default()
        }
    }

    /// Changes whenever a record changes (decisions cached before are judged again).
    pub fn generation(&self) -> u64 {
        self.generation.load(Ordering::Acquire)
    }

    /// The reservation history gives a pod with `profile` on `gpus` GPUs whose estimate is
    /// `estimate_mib`; `None` keeps the estimate.
    pub fn learned(
        &self,
        profile: &Profile,
        gpus: u32,
        estimate_mib: u64,
    ) -> Option<LearnedReservation> {
        if !self.config.enabled {
            return None;
        }
        let fingerprint = profile.fingerprint(gpus);
        let history = *self.records.read().get(&fingerprint)?;
        learned_reservation(estimate_mib, &history, &self.config)
    }

    /// A record was created or changed. Objects without a status teach nothing yet.
    pub fn apply(&self, record: &MemoryHistory) {
        let Some(name) = record.metadata.name.as_deref() else {
            return;
        };
        let peaks = record
            .status
            .as_ref()
            .map(carma_api::MemoryHistoryStatus::peaks);
        let mut records = self.records.write();
        let changed = match peaks {
            Some(p) => records.insert(name.to_string(), p) != Some(p),
            None => records.remove(name).is_some(),
        };
        if changed {
            self.generation.fetch_add(1, Ordering::AcqRel);
        }
    }

    /// A record was deleted (an administrator resetting what was learned).
    pub fn delete(&self, name: &str) {
        if self.records.write().remove(name).is_some() {
            self.generation.fetch_add(1, Ordering::AcqRel);
        }
    }

    /// A re-list found exactly `names`: forget the others.
    pub fn retain(&self, names: &HashSet<String>) {
        let mut records = self.records.write();
        let before = records.len();
        records.retain(|k, _| names.contains(k));
        if records.len() != before {
            self.generation.fetch_add(1, Ordering::AcqRel);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use carma_api::{MemoryHistorySpec, MemoryHistoryStatus};

    fn profile() -> Profile {
        carma_estimator::parse_profile(
            r#"{"family":"cnn","batchSize":64,"parameters":25000000,"activations":9000000,"layers":{"conv2d":50,"linear":1}}"#,
        )
        .unwrap()
    }

    fn record(name: &str, completed: u32, peak: u64) -> MemoryHistory {
        let mut r = MemoryHistory::new(
            name,
            MemoryHistorySpec {
                family: "cnn".into(),
                gpus: 1,
                profile: String::new(),
            },
        );
        r.status = Some(MemoryHistoryStatus {
            completed,
            max_peak_mib: peak,
            ..Default::default()
        });
        r
    }

    #[test]
    fn looks_up_by_fingerprint_and_bumps_the_generation_on_change() {
        let book = HistoryBook::new(HistoryConfig::default());
        let p = profile();
        assert_eq!(book.learned(&p, 1, 30_000), None);
        let g0 = book.generation();
        book.apply(&record(&p.fingerprint(1), 2, 10_000));
        assert!(book.generation() > g0);
        let l = book.learned(&p, 1, 30_000).unwrap();
        assert_eq!(
            (l.mib, l.samples),
            (11_024, 2),
            "10 % is under the 1,024 MiB minimum"
        );
        // The same record again changes nothing.
        let g1 = book.generation();
        book.apply(&record(&p.fingerprint(1), 2, 10_000));
        assert_eq!(book.generation(), g1);
        // Another model's record does not apply.
        book.apply(&record("0123456789abcdef0123456789abcdef", 5, 1_000));
        assert_eq!(book.learned(&p, 1, 30_000).unwrap().mib, 11_024);
        book.retain(&HashSet::from([
            "0123456789abcdef0123456789abcdef".to_string()
        ]));
        assert_eq!(book.learned(&p, 1, 30_000), None);
        assert!(book.generation() > g1);
    }

    #[test]
    fn disabled_book_learns_nothing() {
        let book = HistoryBook::new(HistoryConfig {
            enabled: false,
            ..HistoryConfig::default()
        });
        let p = profile();
        book.apply(&record(&p.fingerprint(1), 3, 10_000));
        assert_eq!(book.learned(&p, 1, 30_000), None);
    }
}
