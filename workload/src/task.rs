//! A task as the simulator replays it.

use carma_core::Millis;
use serde::Serialize;

use crate::catalog::{SizeClass, Workload};
use crate::model::Activity;

/// One training job of a trace.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Task {
    /// Position in the trace (0-based), also its identity.
    pub id: usize,
    /// Display name (catalog key or task-file name).
    pub name: String,
    /// Submission time.
    pub arrival_ms: Millis,
    /// GPUs it needs, all on one node.
    pub gpus: u32,
    /// Run time when it has its GPUs alone.
    pub exclusive_ms: Millis,
    /// True peak memory per GPU (MiB): what it really allocates.
    pub peak_mib: u64,
    /// GPUMemNet estimate recorded in its task file, if any.
    pub recorded_mib: Option<u64>,
    /// Activity when alone.
    pub activity: Activity,
    /// Size class.
    pub size: SizeClass,
    /// Catalog entry it was built from or matched to (for the model profile).
    #[serde(skip)]
    pub workload: Option<&'static Workload>,
}

impl Task {
    /// A task running catalog workload `w`, submitted at `arrival_ms`.
    pub fn from_workload(id: usize, w: &'static Workload, arrival_ms: Millis) -> Self {
        Self {
            id,
            name: w.key.to_string(),
            arrival_ms,
            gpus: w.gpus,
            exclusive_ms: w.exclusive_ms(),
            peak_mib: w.peak_mib,
            recorded_mib: w.recorded_mib,
            activity: w.activity(),
            size: w.size,
            workload: Some(w),
        }
    }
}
