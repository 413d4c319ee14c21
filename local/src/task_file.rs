//! CARMA's `.rad` task files as jobs. The numeric fields come from the shared trace parser
//! (`carma_workload::trace::carma::parse_rad`); the command (line 2, 0-based) is read here, as
//! that parser does not keep it.

use std::fs;
use std::path::Path;

use carma_core::Reservation;
use carma_workload::trace::carma::parse_rad;

use crate::error::{LocalError, Result};

/// What a `.rad` file says about a job.
#[derive(Debug, Clone, PartialEq)]
pub struct RadTask {
    /// The file's base name.
    pub name: String,
    /// The command line (run with `sh -c`).
    pub command: String,
    /// GPUs.
    pub gpus: u32,
    /// CARMA's recorded GPUMemNet estimate per GPU, else the whole GPU.
    pub reservation: Reservation,
    /// Measured peak per GPU (MiB), for comparison.
    pub peak_mib: u64,
}

/// Read a `.rad` task file.
pub fn read_rad(path: &Path) -> Result<RadTask> {
    let text = fs::read_to_string(path)
        .map_err(|e| LocalError::bad_input(format!("--rad {}: {e}", path.display())))?;
    let rad = parse_rad(path, &text).map_err(|e| LocalError::bad_input(e.to_string()))?;
    let command = text
        .lines()
        .nth(2)
        .map(str::trim)
        .filter(|c| !c.is_empty())
        .ok_or_else(|| {
            LocalError::bad_input(format!(
                "{}: line 3 (0-based 2) should be the task's command and is empty",
                path.display()
            ))
        })?
        .to_string();
    Ok(RadTask {
        name: path
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default(),
        command,
        gpus: rad.gpus,
        reservation: rad
            .gpumemnet_mib
            .map_or(Reservation::WholeGpu, Reservation::Mib),
        peak_mib: rad.peak_mib,
    })
}
