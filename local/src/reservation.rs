//! Where a job's reservation comes from, resolved when it is submitted so that bad input fails
//! `submit` at once: an explicit override, carma-estimator's GPUMemNet on a model profile or a
//! `torchsummary` table, or nothing (the job then takes whole GPUs, as on Kubernetes).

use std::fs;
use std::path::PathBuf;

use carma_core::{FirstReservation, Reservation, first_reservation};
use carma_estimator::activity::expected_sm_activity;
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

/// What `submit` learns from a memory source.
#[derive(Debug, Clone, PartialEq)]
pub struct Resolved {
    /// Memory per GPU.
    pub reservation: Reservation,
    /// Where it comes from (`override`, `gpumemnet-mlp`, `analytic-upper-bound`, `none`).
    pub source: String,
    /// carma-estimator's expected SM activity, for a profile or summary (for `pack`).
    pub expected_sm_activity: Option<f64>,
}

/// The reservation for `source` and where it comes from.
pub fn resolve(source: &MemorySource) -> Result<(Reservation, String)> {
    resolve_full(source).map(|r| (r.reservation, r.source))
}

/// [`resolve`], with the expected SM activity where a model profile is known.
pub fn resolve_full(source: &MemorySource) -> Result<Resolved> {
    let plain = |reservation, source: &str| Resolved {
        reservation,
        source: source.to_string(),
        expected_sm_activity: None,
    };
    let read = |p: &PathBuf, flag: &str| {
        fs::read_to_string(p)
            .map_err(|e| LocalError::bad_input(format!("{flag} {}: {e}", p.display())))
    };
    let estimator = || {
        Estimator::new().map_err(|e| LocalError::bad_input(format!("cannot load GPUMemNet: {e}")))
    };
    let override_mib = match source {
        MemorySource::Override(q) => Some(parse_memory(q)?),
        _ => None,
    };
    let estimate = || -> Result<Option<(u64, (String, f64))>> {
        let (profile, flag, path) = match source {
            MemorySource::Override(_) | MemorySource::None => return Ok(None),
            MemorySource::Profile(path) => {
                let profile = parse_profile(&read(path, "--profile")?).map_err(|e| {
                    LocalError::bad_input(format!("--profile {}: {e}", path.display()))
                })?;
                (profile, "--profile", path)
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
                    .map_err(|e| {
                        LocalError::bad_input(format!("--summary {}: {e}", path.display()))
                    })?;
                (profile, "--summary", path)
            }
        };
        let e = estimator()?
            .estimate(&profile)
            .map_err(|e| LocalError::bad_input(format!("{flag} {}: {e}", path.display())))?;
        let activity = expected_sm_activity(&profile);
        Ok(Some((e.mib, (e.source.as_str().to_string(), activity))))
    };
    // `carma local` keeps no history of peaks.
    let first = first_reservation(override_mib, estimate, |_| None)?;
    let reservation = first.reservation();
    Ok(match first {
        FirstReservation::Override(_) => plain(reservation, "override"),
        FirstReservation::WholeGpu => plain(reservation, "none"),
        FirstReservation::Estimate {
            estimate: (source, activity),
            ..
        }
        | FirstReservation::Learned {
            estimate: (source, activity),
            ..
        } => Resolved {
            reservation,
            source,
            expected_sm_activity: Some(activity),
        },
    })
}
