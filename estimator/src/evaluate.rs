//! Evaluation of the shipped model on a CSV in GPUMemNet's MLP schema.
//!
//! Columns (by name, any order, extra columns ignored): `Depth`, `Batch Size`,
//! `Total Parameters`, `Total Activations`, `Activation Function`,
//! `Max GPU Memory (MiB)`, and — in step-2 files — `Batch Normalization Layers`
//! and `Dropout Layers` (0 when absent, as in step-1 files).
//!
//! A row is *correct* when the class of the reservation equals the class of the
//! measured peak, and an *underestimate* when the reservation's class is below
//! the measured one (the job would run out of memory). Over-reservation is
//! `max(0, reservation − measured)`, averaged over all rows.

use std::path::Path;

use serde::Serialize;

use crate::estimator::{EstimateError, Estimator};
use crate::profile::{Family, Layers, Profile};

/// Recall of one class.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ClassRecall {
    /// Class label.
    pub class: String,
    /// Rows whose measured peak is in this class.
    pub rows: u64,
    /// Share of those rows predicted in this class; `None` when there are none.
    pub recall: Option<f64>,
}

/// Figures of an evaluation.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Evaluation {
    /// Rows evaluated.
    pub rows: u64,
    /// Share of rows whose reservation class equals the measured class.
    pub accuracy: f64,
    /// Share of rows whose reservation class is below the measured class.
    pub underestimate_rate: f64,
    /// Number of underestimated rows.
    pub underestimates: u64,
    /// Recall per class, lowest class first.
    pub per_class_recall: Vec<ClassRecall>,
    /// Mean of `max(0, reservation − measured)` over all rows (MiB).
    pub mean_over_reservation_mib: f64,
    /// Rows whose reservation came from the analytic bound (beyond the training range).
    pub analytic_rows: u64,
    /// `confusion[true][predicted]` counts.
    pub confusion: Vec<Vec<u64>>,
}

/// Why an evaluation failed.
#[derive(Debug, thiserror::Error)]
pub enum EvaluateError {
    /// The file could not be read.
    #[error("cannot read {path}: {source}")]
    Io {
        /// The path.
        path: String,
        /// The I/O error.
        source: std::io::Error,
    },
    /// Malformed CSV.
    #[error("CSV line {line}: {message}")]
    Csv {
        /// 1-based line.
        line: usize,
        /// What is wrong.
        message: String,
    },
    /// A required column is missing.
    #[error("CSV has no column `{0}` (expected GPUMemNet's MLP schema, step 1 or step 2)")]
    MissingColumn(String),
    /// A cell holds no usable number.
    #[error("CSV line {line}, column `{column}`: `{value}` is not a non-negative number")]
    BadValue {
        /// 1-based line.
        line: usize,
        /// The column.
        column: String,
        /// The cell.
        value: String,
    },
    /// The CSV has a header but no data rows.
    #[error("CSV has no data rows")]
    Empty,
    /// The estimator has no model for the family.
    #[error("no trained model for family {0}; nothing to evaluate")]
    NoModel(Family),
    /// A row could not be estimated.
    #[error("CSV line {line}: {source}")]
    Estimate {
        /// 1-based line.
        line: usize,
        /// The estimate error.
        source: EstimateError,
    },
}

/// Evaluates `estimator`'s MLP model on the CSV at `csv_path`.
pub fn evaluate(estimator: &Estimator, csv_path: &Path) -> Result<Evaluation, EvaluateError> {
    let text = std::fs::read_to_string(csv_path).map_err(|source| EvaluateError::Io {
        path: csv_path.display().to_string(),
        source,
    })?;
    evaluate_csv(estimator, &text)
}

const MEMORY: &str = "Max GPU Memory (MiB)";

/// One row of a GPUMemNet MLP CSV: the profile and the measured peak.
#[derive(Debug, Clone, PartialEq)]
pub struct LabelledRow {
    /// 1-based line of the row in the file.
    pub line: usize,
    /// The MLP profile built from the row.
    pub profile: Profile,
    /// Measured peak memory (MiB).
    pub measured_mib: f64,
}

/// Reads the rows of a CSV in GPUMemNet's MLP schema (step 1 or step 2).
pub fn read_mlp_csv(text: &str) -> Result<Vec<LabelledRow>, EvaluateError> {
    let records = parse_csv(text)?;
    let Some(((_, header), data)) = records.split_first() else {
        return Err(EvaluateError::Empty);
    };
    let col = |name: &str| header.iter().position(|h| h.trim() == name);
    let need = |name: &str| col(name).ok_or_else(|| EvaluateError::MissingColumn(name.to_string()));
    let depth = need("Depth")?;
    let batch = need("Batch Size")?;
    let params = need("Total Parameters")?;
    let acts = need("Total Activations")?;
    let act_fn = need("Activation Function")?;
    let memory = need(MEMORY)?;
    let bn = col("Batch Normalization Layers");
    let dropout = col("Dropout Layers");
    let mut rows = Vec::with_capacity(data.len());
    for (line, rec) in data {
        let line = *line;
        if rec.len() != header.len() {
            return Err(EvaluateError::Csv {
                line,
                message: format!("{} fields, header has {}", rec.len(), header.len()),
            });
        }
        let num = |i: usize| -> Result<f64, EvaluateError> {
            let v = rec[i].trim();
            v.parse::<f64>()
                .ok()
                .filter(|x| x.is_finite() && *x >= 0.0)
                .ok_or_else(|| EvaluateError::BadValue {
                    line,
                    column: header[i].clone(),
                    value: v.to_string(),
                })
        };
        let int = |i: usize| -> Result<u64, EvaluateError> {
            let v = num(i)?;
            if v.fract() != 0.0 || v > u64::MAX as f64 {
                return Err(EvaluateError::BadValue {
                    line,
                    column: header[i].clone(),
                    value: rec[i].clone(),
                });
            }
            Ok(v as u64)
        };
        let small = |i: usize| -> Result<u32, EvaluateError> {
            u32::try_from(int(i)?).map_err(|_| EvaluateError::BadValue {
                line,
                column: header[i].clone(),
                value: rec[i].clone(),
            })
        };
        let depth_v = small(depth)?;
        let profile = Profile {
            family: Family::Mlp,
            batch_size: small(batch)?,
            parameters: int(params)?,
            activations: int(acts)?,
            depth: Some(depth_v),
            activation: Some(rec[act_fn].trim().to_string()),
            layers: Layers {
                linear: depth_v,
                batch_norm: bn.map(small).transpose()?.unwrap_or(0),
                dropout: dropout.map(small).transpose()?.unwrap_or(0),
                ..Layers::default()
            },
            seq_length: None,
            optimizer: None,
            mixed_precision: None,
            traced: None,
            layer_reading: None,
            caveats: Vec::new(),
        };
        rows.push(LabelledRow {
            line,
            profile,
            measured_mib: num(memory)?,
        });
    }
    if rows.is_empty() {
        return Err(EvaluateError::Empty);
    }
    Ok(rows)
}

/// Evaluates `estimator`'s MLP model on CSV text (see [`evaluate`]).
pub fn evaluate_csv(estimator: &Estimator, text: &str) -> Result<Evaluation, EvaluateError> {
    let model = estimator
        .model(Family::Mlp)
        .ok_or(EvaluateError::NoModel(Family::Mlp))?;
    let meta = model.meta();
    let rows = read_mlp_csv(text)?;
    let n_classes = meta.classes.len();
    let mut confusion = vec![vec![0u64; n_classes]; n_classes];
    let mut correct = 0u64;
    let mut under = 0u64;
    let mut analytic_rows = 0u64;
    let mut over_sum = 0.0f64;
    const CHUNK: usize = 1024;
    for chunk in rows.chunks(CHUNK) {
        let profiles: Vec<Profile> = chunk.iter().map(|r| r.profile.clone()).collect();
        let estimates = estimator.estimate_batch(&profiles);
        for (row, est) in chunk.iter().zip(estimates) {
            let est = est.map_err(|source| EvaluateError::Estimate {
                line: row.line,
                source,
            })?;
            let truth = meta.class_of_mib(row.measured_mib);
            let predicted = if est.source.is_analytic() {
                analytic_rows += 1;
                meta.class_of_mib(est.mib as f64)
            } else {
                meta.classes
                    .iter()
                    .position(|c| c.label == est.class)
                    .unwrap_or(n_classes - 1)
            };
            confusion[truth][predicted] += 1;
            if predicted == truth {
                correct += 1;
            }
            if predicted < truth {
                under += 1;
            }
            over_sum += (est.mib as f64 - row.measured_mib).max(0.0);
        }
    }
    let n = rows.len() as u64;
    let per_class_recall = meta
        .classes
        .iter()
        .enumerate()
        .map(|(k, c)| {
            let total: u64 = confusion[k].iter().sum();
            ClassRecall {
                class: c.label.clone(),
                rows: total,
                recall: (total > 0).then(|| confusion[k][k] as f64 / total as f64),
            }
        })
        .collect();
    Ok(Evaluation {
        rows: n,
        accuracy: correct as f64 / n as f64,
        underestimate_rate: under as f64 / n as f64,
        underestimates: under,
        per_class_recall,
        mean_over_reservation_mib: over_sum / n as f64,
        analytic_rows,
        confusion,
    })
}

/// Minimal RFC 4180 reader: comma-separated, `"`-quoted fields with `""` escapes,
/// LF or CRLF line ends, newlines allowed inside quotes. Returns (line, fields)
/// per record, skipping blank lines.
fn parse_csv(text: &str) -> Result<Vec<(usize, Vec<String>)>, EvaluateError> {
    let mut records = Vec::new();
    let mut fields: Vec<String> = Vec::new();
    let mut field = String::new();
    let mut in_quotes = false;
    let mut line = 1usize;
    let mut start_line = 1usize;
    let mut quoted_field = false;
    let mut chars = text
        .strip_prefix('\u{feff}')
        .unwrap_or(text)
        .chars()
        .peekable();
    while let Some(c) = chars.next() {
        if in_quotes {
            match c {
                '"' if chars.peek() == Some(&'"') => {
                    chars.next();
                    field.push('"');
                }
                '"' => in_quotes = false,
                '\n' => {
                    line += 1;
                    field.push(c);
                }
                _ => field.push(c),
            }
            continue;
        }
        match c {
            '"' if field.is_empty() && !quoted_field => {
                in_quotes = true;
                quoted_field = true;
            }
            '"' => {
                return Err(EvaluateError::Csv {
                    line,
                    message: "stray quote in a field".into(),
                });
            }
            ',' => {
                fields.push(std::mem::take(&mut field));
                quoted_field = false;
            }
            '\r' if chars.peek() == Some(&'\n') => {}
            '\n' => {
                fields.push(std::mem::take(&mut field));
                quoted_field = false;
                if !(fields.len() == 1 && fields[0].is_empty()) {
                    records.push((start_line, std::mem::take(&mut fields)));
                } else {
                    fields.clear();
                }
                line += 1;
                start_line = line;
            }
            _ => {
                if quoted_field {
                    return Err(EvaluateError::Csv {
                        line,
                        message: "text after a closing quote".into(),
                    });
                }
                field.push(c);
            }
        }
    }
    if in_quotes {
        return Err(EvaluateError::Csv {
            line: start_line,
            message: "unterminated quoted field".into(),
        });
    }
    if !field.is_empty() || !fields.is_empty() || quoted_field {
        fields.push(field);
        records.push((start_line, fields));
    }
    Ok(records)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn csv_quotes_and_line_ends() {
        let r = parse_csv("a,b,c\r\n1,\"x, \"\"y\"\"\",3\n\n4,5,6").unwrap();
        assert_eq!(r.len(), 3);
        assert_eq!(r[1].1, vec!["1", "x, \"y\"", "3"]);
        assert_eq!(r[2], (4, vec!["4".to_string(), "5".into(), "6".into()]));
    }

    #[test]
    fn csv_errors() {
        assert!(matches!(
            parse_csv("a,b\n\"open,1\n"),
            Err(EvaluateError::Csv { .. })
        ));
        assert!(matches!(
            parse_csv("a,b\nx\"y,1\n"),
            Err(EvaluateError::Csv { line: 2, .. })
        ));
        assert!(matches!(
            parse_csv("a,b\n\"x\"y,1\n"),
            Err(EvaluateError::Csv { line: 2, .. })
        ));
    }

    #[test]
    fn rows_from_step1_and_step2_headers() {
        let step1 = "Filename,Depth,Activations-Params,Activation Function,Total Activations,Total Parameters,Batch Size,Max GPU Memory (MiB)\n\
                     f,3,\"[('linear', 5, 10)]\",ReLU,100,2000,32,1500\n";
        let rows = read_mlp_csv(step1).unwrap();
        assert_eq!(rows[0].profile.layers.batch_norm, 0);
        assert_eq!(rows[0].profile.parameters, 2000);
        assert_eq!(rows[0].line, 2);
        let step2 = "Depth,Activation Function,Total Activations,Total Parameters,Batch Size,Batch Normalization Layers,Dropout Layers,Max GPU Memory (MiB)\n\
                     3,GELU,100,2000,32,2,1,1500\n";
        let rows = read_mlp_csv(step2).unwrap();
        assert_eq!(
            (
                rows[0].profile.layers.batch_norm,
                rows[0].profile.layers.dropout
            ),
            (2, 1)
        );
    }

    #[test]
    fn bad_rows_name_line_and_column() {
        let h = "Depth,Activation Function,Total Activations,Total Parameters,Batch Size,Max GPU Memory (MiB)\n";
        let e = read_mlp_csv(&format!("{h}3,ReLU,100,-5,32,1500\n")).unwrap_err();
        assert!(
            matches!(&e, EvaluateError::BadValue { line: 2, column, .. } if column == "Total Parameters"),
            "{e}"
        );
        let e = read_mlp_csv(&format!("{h}3,ReLU,100,5,32.5,1500\n")).unwrap_err();
        assert!(
            matches!(&e, EvaluateError::BadValue { column, .. } if column == "Batch Size"),
            "{e}"
        );
        let e = read_mlp_csv(&format!("{h}3,ReLU,100\n")).unwrap_err();
        assert!(matches!(e, EvaluateError::Csv { line: 2, .. }));
        assert!(matches!(read_mlp_csv(h), Err(EvaluateError::Empty)));
        assert!(matches!(read_mlp_csv(""), Err(EvaluateError::Empty)));
        let e = read_mlp_csv("Depth,Batch Size\n1,2\n").unwrap_err();
        assert!(matches!(e, EvaluateError::MissingColumn(c) if c == "Total Parameters"));
    }
}
