//! Cluster snapshots (`carma extender --cluster-snapshot`, `carma simulate`'s dry runs): YAML or
//! JSON; a snapshot that parses is applied to a cluster state.
#![no_main]

use carma_scheduler_extender::{ClusterState, Snapshot};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|text: &str| {
    if let Ok(snapshot) = Snapshot::parse(text) {
        snapshot.apply(&ClusterState::new());
    }
});
