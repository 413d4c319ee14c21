//! Fixtures for the tests of the GPU layer and of the node agents built on it (feature
//! `test-fixtures`; not part of the normal build).

use carma_api::{Assignment, EstimateAnnotation};
use chrono::{DateTime, Utc};

/// Owned strings: GPU UUIDs, replica ids.
pub fn ids(v: &[&str]) -> Vec<String> {
    v.iter().map(|s| s.to_string()).collect()
}

/// A shared assignment of `GPU-a` and `GPU-b`, 6000 MiB reserved on each.
pub fn shared_assignment() -> Assignment {
    Assignment {
        gpus: ids(&["GPU-a", "GPU-b"]),
        assigned_at: DateTime::<Utc>::from_timestamp(1_767_225_601, 0).unwrap_or_default(),
        estimate: EstimateAnnotation {
            mib: 6000,
            source: "override".into(),
            class: None,
            samples: None,
        },
        exclusive: false,
        allocated: false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_assignment_is_made_at_the_documented_time() {
        let at = DateTime::parse_from_rfc3339("2026-01-01T00:00:01Z").unwrap();
        assert_eq!(shared_assignment().assigned_at, at);
    }
}
