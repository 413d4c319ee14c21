//! The traced reservation against peaks carma measured itself on a GPU.
//!
//! `python -m carma_profile.measure` runs each job's training step on a real GPU and writes
//! its peak as `nvidia-smi` would show it (`measured_mib`: the CUDA context plus the caching
//! allocator's peak segments); `python -m carma_profile.calibrate` traces the same jobs on a
//! CPU. Each set pairs the two CSVs, found beside the traced CSV of `eval --peaks`.

use std::path::{Path, PathBuf};

use carma_estimator::{Family, Traced, traced_reservation_mib};
use serde::{Deserialize, Serialize};

use crate::error::PeaksError;
use crate::tally::Tally;

/// A GPU's measurements and the traces of the same jobs.
#[derive(Debug, Clone, Copy)]
pub struct MeasuredSet {
    /// Shown in the report.
    pub name: &'static str,
    /// File name of the measured peaks.
    pub measured: &'static str,
    /// File name of the traced figures.
    pub traced: &'static str,
}

/// The sets `eval --peaks` reports: CARMA's architectures re-measured on an H100 (the
/// constants were fitted on them and on CARMA's A100 figures), and architectures no constant
/// was fitted on.
pub const MEASURED_SETS: &[MeasuredSet] = &[
    MeasuredSet {
        name: "H100, CARMA's architectures",
        measured: "h100-carma-peaks.csv",
        traced: "traced-peaks.csv",
    },
    MeasuredSet {
        name: "H100, held out",
        measured: "h100-heldout-peaks.csv",
        traced: "traced-heldout.csv",
    },
];

/// One measured job with its traced reservation.
#[derive(Debug, Clone, Serialize)]
pub struct MeasuredRow {
    /// [`MeasuredSet::name`].
    pub set: &'static str,
    /// The model as the measurement names it.
    pub model: String,
    /// The model family.
    pub family: Family,
    /// Per-GPU batch.
    pub batch_size: u64,
    /// The GPU.
    pub gpu: String,
    /// What the process held at its peak (MiB).
    pub peak_mib: u64,
    /// The traced reservation (MiB).
    pub traced_mib: u64,
}

/// One set's figures on one family.
#[derive(Debug, Clone, Serialize)]
pub struct MeasuredTally {
    /// [`MeasuredSet::name`].
    pub set: &'static str,
    /// The family.
    pub family: Family,
    /// Underestimates and over-reservation of the traced reservation.
    pub tally: Tally,
}

/// Every set's rows and tallies.
#[derive(Debug, Clone, Default, Serialize)]
pub struct MeasuredReport {
    /// One row per measured job.
    pub rows: Vec<MeasuredRow>,
    /// Per set and family.
    pub tallies: Vec<MeasuredTally>,
    /// Jobs whose measurement failed (the CSV's `error` column), with the error: not counted.
    pub not_measured: Vec<String>,
}

#[derive(Deserialize)]
struct Measured {
    model: String,
    batch_size: u64,
    #[serde(default)]
    gpu: String,
    #[serde(default)]
    measured_mib: Option<u64>,
    #[serde(default)]
    error: String,
}

/// One row of a traced CSV (`python -m carma_profile.calibrate`); the `traced` source of
/// `eval --peaks` reads the same rows.
#[derive(Debug, Deserialize)]
pub struct TracedRow {
    /// The job (CARMA's task file stem, or the held-out job's label).
    pub job: String,
    /// The model family.
    pub family: Family,
    model: String,
    batch_size: u64,
    /// GPUs of the job (the trace is one GPU's share of the batch).
    pub gpus: u32,
    forward_mib: u64,
    backward_mib: u64,
    optimizer_step_mib: u64,
    #[serde(default)]
    largest_tensor_mib: Option<u64>,
    #[serde(default)]
    reserved_mib: Option<u64>,
}

impl TracedRow {
    /// The traced figures as a profile carries them.
    pub fn figures(&self) -> Traced {
        Traced {
            forward_mib: self.forward_mib,
            backward_mib: self.backward_mib,
            optimizer_step_mib: self.optimizer_step_mib,
            largest_tensor_mib: self.largest_tensor_mib,
            reserved_mib: self.reserved_mib,
        }
    }

    /// The label the measurement uses: CIFAR-100 jobs say so.
    fn label(&self) -> String {
        if self.job.to_ascii_lowercase().contains("cifar") {
            format!("{} (CIFAR-100)", self.model)
        } else {
            self.model.clone()
        }
    }
}

/// The rows of a traced CSV.
pub fn traced_rows(path: &Path) -> Result<Vec<TracedRow>, PeaksError> {
    records(path)
}

fn records<T: for<'de> Deserialize<'de>>(path: &Path) -> Result<Vec<T>, PeaksError> {
    let bad = |line: usize, message: String| PeaksError::BadTraced {
        path: path.to_path_buf(),
        line,
        message,
    };
    let mut reader = csv::Reader::from_path(path).map_err(|e| bad(1, e.to_string()))?;
    reader
        .deserialize()
        .enumerate()
        .map(|(i, r)| r.map_err(|e| bad(i + 2, e.to_string())))
        .collect()
}

/// The measured rows of every set whose two CSVs exist in `data`, and their tallies per
/// set and family.
pub fn evaluate_measured(data: &Path) -> Result<MeasuredReport, PeaksError> {
    let mut out = MeasuredReport::default();
    for set in MEASURED_SETS {
        let (measured, traced): (PathBuf, PathBuf) =
            (data.join(set.measured), data.join(set.traced));
        if !measured.is_file() || !traced.is_file() {
            continue;
        }
        let traced_rows = traced_rows(&traced)?;
        let mut set_rows = Vec::new();
        for m in records::<Measured>(&measured)? {
            let Some(peak) = m.measured_mib.filter(|_| m.error.is_empty()) else {
                out.not_measured.push(format!(
                    "{}: {} b{}: {}",
                    set.name, m.model, m.batch_size, m.error
                ));
                continue;
            };
            let t = traced_rows
                .iter()
                .find(|t| t.gpus == 1 && t.batch_size == m.batch_size && t.label() == m.model)
                .ok_or_else(|| PeaksError::BadTraced {
                    path: traced.clone(),
                    line: 0,
                    message: format!(
                        "no traced row for {} at batch {} (measured in {})",
                        m.model,
                        m.batch_size,
                        measured.display()
                    ),
                })?;
            set_rows.push(MeasuredRow {
                set: set.name,
                model: m.model,
                family: t.family,
                batch_size: m.batch_size,
                gpu: m.gpu,
                peak_mib: peak,
                traced_mib: traced_reservation_mib(&t.figures(), t.family, 1),
            });
        }
        for family in [Family::Cnn, Family::Mlp, Family::Transformer] {
            let of: Vec<&MeasuredRow> = set_rows.iter().filter(|r| r.family == family).collect();
            if of.is_empty() {
                continue;
            }
            out.tallies.push(MeasuredTally {
                set: set.name,
                family,
                tally: Tally::of(of.iter().map(|r| (r.traced_mib, r.peak_mib))),
            });
        }
        out.rows.extend(set_rows);
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn write(dir: &Path, name: &str, text: &str) {
        std::fs::write(dir.join(name), text).unwrap();
    }

    const TRACED: &str = "job,family,model,batch_size,seq_len,gpus,forward_mib,backward_mib,optimizer_step_mib,largest_tensor_mib,reserved_mib,torch_version\n\
        resnet18_cifar100_1,cnn,resnet18,32,,1,200,215,100,9,250,2.14\n\
        \"gpt2 (causal LM, bf16 autocast)\",transformer,\"gpt2 (causal LM, bf16 autocast)\",16,512,1,12088,12561,4184,1571,13000,2.14\n";

    #[test]
    fn pairs_measured_and_traced_rows_by_label_and_batch() {
        let dir = tempfile::tempdir().unwrap();
        write(dir.path(), "traced-heldout.csv", TRACED);
        write(
            dir.path(),
            "h100-heldout-peaks.csv",
            "job,family,model,batch_size,measured_mib,gpu,error\n\
             x,cnn,resnet18 (CIFAR-100),32,1070,H100,\n\
             y,transformer,\"gpt2 (causal LM, bf16 autocast)\",16,16904,H100,\n\
             z,cnn,resnet18 (CIFAR-100),64,,H100,out of memory\n",
        );
        let MeasuredReport {
            rows,
            tallies,
            not_measured,
        } = evaluate_measured(dir.path()).unwrap();
        assert_eq!(rows.len(), 2);
        // the floor, for a job this small
        assert_eq!(rows[0].traced_mib, carma_estimator::FLOOR_MIB);
        // 770 + 13,000 + 1.08 × 1,571 (rounded up): below the 16,904 measured, counted as an
        // underestimate
        assert_eq!(rows[1].traced_mib, 770 + 13_000 + 1_697);
        let t = tallies
            .iter()
            .find(|t| t.family == Family::Transformer)
            .unwrap();
        assert_eq!((t.tally.rows, t.tally.underestimates), (1, 1));
        assert_eq!(
            not_measured,
            ["H100, held out: resnet18 (CIFAR-100) b64: out of memory"]
        );
    }

    #[test]
    fn a_measured_job_without_a_trace_is_an_error_that_names_it() {
        let dir = tempfile::tempdir().unwrap();
        write(dir.path(), "traced-heldout.csv", TRACED);
        write(
            dir.path(),
            "h100-heldout-peaks.csv",
            "model,batch_size,measured_mib\nvgg19,64,9000\n",
        );
        let err = evaluate_measured(dir.path()).unwrap_err().to_string();
        assert!(err.contains("no traced row for vgg19 at batch 64"), "{err}");
        write(
            dir.path(),
            "h100-heldout-peaks.csv",
            "model,batch_size,measured_mib\nvgg19,sixty,9000\n",
        );
        let err = evaluate_measured(dir.path()).unwrap_err().to_string();
        assert!(err.contains("line 2"), "{err}");
    }
}
