//! Where tasks come from: CARMA's trace files, or the built-in generator.

pub mod carma;
pub mod generate;

pub use carma::{ImportPaths, import};
pub use generate::{GeneratorConfig, generate};

use serde::Serialize;

use crate::task::Task;

/// An ordered list of tasks and where it came from.
#[derive(Debug, Clone, Serialize)]
pub struct Trace {
    /// Tasks in submission order (ids are positions).
    pub tasks: Vec<Task>,
    /// One line saying what this trace is.
    pub description: String,
}

impl Trace {
    /// Sum of exclusive GPU time over all tasks, in seconds.
    pub fn exclusive_gpu_s(&self) -> f64 {
        self.tasks
            .iter()
            .map(|t| t.exclusive_ms as f64 / 1000.0 * t.gpus as f64)
            .sum()
    }
}
