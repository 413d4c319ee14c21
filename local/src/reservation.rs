//! Where a job's reservation comes from, resolved when it is submitted so that bad input fails
//! `submit` at once: an explicit override, carma-estimator's GPUMemNet on a model profile or a
//! `torchsummary` table, or nothing (the job then takes whole GPUs, as on Kubernetes).

use std::fs;
use std::path::PathBuf;

use carma_core::Reservation;
use carma_estimator::{Estimator, Family, parse_profile, parse_torchsummary};

use crate::error::{LocalError, Result};

/// What `submit` was told about the job's memory.
#[derive(Debug, Clone, PartialEq)]
pub enum MemorySource {
    /// `--gpu-memory 4Gi`: this much per GPU.
    Override(String),
    /// `--profile FILE`: the `carma.io/model-profile` JSON.
    Profile(PathBuf),
    /// `--summary FILE --family F --batch-size B`: a `torchsummary` table.
    Summary {
        /// The table.
        path: PathBuf,
        /// Model family (mlp, cnn, transformer).
        family: String,
        /// Training batch size.
        batch_size: u32,
    },
    /// Nothing known: whole GPUs.
    None,
}

/// A memory quantity such as `4Gi`, `4GiB`, `4096Mi` or `16G`, in MiB.
pub fn parse_memory(text: &str) -> Result<u64> {
    let t = text.trim();
    let k8s = t
        .strip_suffix("iB")
        .map(|rest| format!("{rest}i"))
        .unwrap_or_else(|| t.to_string());
    carma_core::quantity::parse_mib(&k8s)
        .map_err(|e| LocalError::bad_input(format!("--gpu-memory {text:?}: {e}")))
}

/// The reservation for `source` and where it comes from.
pub fn resolve(source: &MemorySource) -> Result<(Reservation, String)> {
    let read = |p: &PathBuf, flag: &str| {
        fs::read_to_string(p)
            .map_err(|e| LocalError::bad_input(format!("{flag} {}: {e}", p.display())))
    };
    let estimator = || {
        Estimator::new().map_err(|e| LocalError::bad_input(format!("cannot load GPUMemNet: {e}")))
    };
    match source {
        MemorySource::Override(q) => Ok((Reservation::Mib(parse_memory(q)?), "override".into())),
        MemorySource::None => Ok((Reservation::WholeGpu, "none".into())),
        MemorySource::Profile(path) => {
            let profile = parse_profile(&read(path, "--profile")?)
                .map_err(|e| LocalError::bad_input(format!("--profile {}: {e}", path.display())))?;
            let e = estimator()?
                .estimate(&profile)
                .map_err(|e| LocalError::bad_input(format!("--profile {}: {e}", path.display())))?;
            Ok((Reservation::Mib(e.mib), e.source.as_str().to_string()))
        }
        MemorySource::Summary {
            path,
            family,
            batch_size,
        } => {
            let family: Family = family
                .parse()
                .map_err(|e| LocalError::bad_input(format!("--family: {e}")))?;
            let profile = parse_torchsummary(&read(path, "--summary")?, family, *batch_size)
                .map_err(|e| LocalError::bad_input(format!("--summary {}: {e}", path.display())))?;
            let e = estimator()?
                .estimate(&profile)
                .map_err(|e| LocalError::bad_input(format!("--summary {}: {e}", path.display())))?;
            Ok((Reservation::Mib(e.mib), e.source.as_str().to_string()))
        }
    }
}
