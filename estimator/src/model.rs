//! One trained GPUMemNet model: its sidecar (features, classes, decision rule) and
//! the tract plans that run its ONNX graph.

use std::collections::BTreeMap;
use std::fmt;
use std::sync::{Arc, Mutex};

use serde::{Deserialize, Serialize};
use tract_onnx::prelude::*;
use tract_onnx::tract_hir::infer::Factoid;
use tract_onnx::tract_hir::internal::{DimLike, bail};

use crate::features::{feature_row, feature_value};
use crate::profile::{Family, Layers, Profile};

/// One memory class of a model: measured peaks in `(lower_mib, upper_mib]`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ClassSpec {
    /// Label, e.g. `(1000,2000]` or `>5000`.
    pub label: String,
    /// Exclusive lower edge (MiB).
    pub lower_mib: u64,
    /// Inclusive upper edge (MiB), the reservation; `None` for the open top class.
    pub upper_mib: Option<u64>,
}

/// How a class is chosen from the model's probabilities.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(tag = "rule", rename_all = "kebab-case")]
pub enum DecisionRule {
    /// The most probable class (lowest index on ties).
    Argmax,
    /// The safe-side rule: the smallest class whose cumulative probability, summed
    /// in f32 from the lowest class up, is `>= threshold`; the top class if none is.
    CumulativeProbability {
        /// In `(0, 1]`.
        threshold: f32,
    },
}

impl DecisionRule {
    /// The chosen class index for one row of probabilities (never out of range for
    /// a non-empty row; 0 for an empty one).
    pub fn choose(&self, probabilities: &[f32]) -> usize {
        match *self {
            DecisionRule::Argmax => {
                let mut best = 0;
                for (i, p) in probabilities.iter().enumerate() {
                    if *p > probabilities[best] {
                        best = i;
                    }
                }
                best
            }
            DecisionRule::CumulativeProbability { threshold } => {
                let mut sum = 0.0f32;
                for (i, p) in probabilities.iter().enumerate() {
                    sum += *p;
                    if sum >= threshold {
                        return i;
                    }
                }
                probabilities.len().saturating_sub(1)
            }
        }
    }
}

/// The machine-readable model card (`models/gpumemnet-<family>.json`) as far as
/// inference needs it; the figures it also holds are for people and tests.
#[derive(Debug, Clone, Deserialize)]
pub struct ModelMeta {
    /// Sidecar format version (1).
    pub schema_version: u32,
    /// The family this model serves.
    pub family: Family,
    /// Name of the ONNX input (float32 `[N, features.len()]`).
    pub input: String,
    /// Feature names in input order (see [`crate::features::feature_value`]).
    pub features: Vec<String>,
    /// Activation-function order for `act_sin` / `act_cos`.
    pub activation_functions: Vec<String>,
    /// The classes, lowest first; the output has one probability per class.
    pub classes: Vec<ClassSpec>,
    /// The least an open-ended top class reserves (MiB).
    pub open_class_min_reservation_mib: u64,
    /// The decision rule.
    pub decision: DecisionRule,
    /// Largest training value per feature (and `batch_x_activations`); a profile
    /// beyond any of them is outside what the model has seen.
    pub training_max: BTreeMap<String, f64>,
}

/// Why a model could not be loaded.
#[derive(Debug, thiserror::Error)]
pub enum ModelError {
    /// The sidecar JSON is malformed or inconsistent.
    #[error("model sidecar for family {family}: {message}")]
    Sidecar {
        /// The family the model was registered for.
        family: Family,
        /// What is wrong.
        message: String,
    },
    /// The ONNX graph could not be loaded or optimised by tract.
    #[error("ONNX model for family {family}: {message}")]
    Onnx {
        /// The family.
        family: Family,
        /// tract's error chain.
        message: String,
    },
    /// The graph's input width differs from the sidecar's feature list.
    #[error(
        "ONNX model for family {family} takes {model_width} features but its sidecar lists {features}"
    )]
    WidthMismatch {
        /// The family.
        family: Family,
        /// The graph's declared input width.
        model_width: usize,
        /// `features.len()` in the sidecar.
        features: usize,
    },
    /// The graph's output width differs from the sidecar's class list.
    #[error(
        "ONNX model for family {family} outputs {model_width} probabilities but its sidecar lists {classes} classes"
    )]
    ClassMismatch {
        /// The family.
        family: Family,
        /// The graph's output width.
        model_width: usize,
        /// `classes.len()` in the sidecar.
        classes: usize,
    },
}

/// Rows per call of the batch plan; larger inputs run in chunks of this size
/// (the last one padded). Plans have fixed shapes so that tract can optimise
/// them fully.
pub const BATCH_ROWS: usize = 64;

/// Idle run states kept per plan (more concurrent callers just spawn their own).
const MAX_POOLED_STATES: usize = 32;

/// A tract plan for a fixed number of rows, with reusable run states: spawning
/// a state per call costs more than the inference itself.
struct Plan {
    rows: usize,
    plan: Arc<TypedRunnableModel>,
    states: Mutex<Vec<TypedSimpleState>>,
}

impl Plan {
    fn run(&self, input: Tensor) -> TractResult<TVec<TValue>> {
        let pooled = self.states.lock().ok().and_then(|mut pool| pool.pop());
        let mut state = match pooled {
            Some(state) => state,
            None => self.plan.spawn()?,
        };
        let out = state.run(tvec![input.into_tvalue()])?;
        if let Ok(mut pool) = self.states.lock()
            && pool.len() < MAX_POOLED_STATES
        {
            pool.push(state);
        }
        Ok(out)
    }
}

/// A loaded model: sidecar plus two tract plans (one row; [`BATCH_ROWS`] rows).
pub struct Model {
    meta: ModelMeta,
    single: Plan,
    batch: Plan,
}

impl fmt::Debug for Model {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Model")
            .field("family", &self.meta.family)
            .field("features", &self.meta.features)
            .field("classes", &self.meta.classes.len())
            .finish_non_exhaustive()
    }
}

fn probe_profile(family: Family) -> Profile {
    Profile {
        family,
        batch_size: 1,
        parameters: 1,
        activations: 1,
        depth: Some(1),
        activation: None,
        layers: Layers::default(),
        seq_length: None,
        optimizer: None,
        mixed_precision: None,
        traced: None,
        layer_reading: None,
        caveats: Vec::new(),
    }
}

impl ModelMeta {
    /// Parses and checks a sidecar registered for `family`.
    pub fn parse(family: Family, json: &str) -> Result<ModelMeta, ModelError> {
        let bad = |message: String| ModelError::Sidecar { family, message };
        let meta: ModelMeta = serde_json::from_str(json).map_err(|e| bad(e.to_string()))?;
        if meta.schema_version != 1 {
            return Err(bad(format!(
                "unsupported schema_version {}",
                meta.schema_version
            )));
        }
        if meta.family != family {
            return Err(bad(format!("sidecar is for family {}", meta.family)));
        }
        if meta.features.is_empty() {
            return Err(bad("no features".into()));
        }
        let probe = probe_profile(family);
        for f in &meta.features {
            if feature_value(&probe, f, &meta.activation_functions).is_none() {
                return Err(bad(format!("unknown feature `{f}`")));
            }
        }
        if meta.features.iter().any(|f| f.starts_with("act_"))
            && meta.activation_functions.is_empty()
        {
            return Err(bad(
                "activation features without an activation_functions list".into(),
            ));
        }
        for k in meta.training_max.keys() {
            if k != "batch_x_activations" && !meta.features.contains(k) {
                return Err(bad(format!("training_max names unknown feature `{k}`")));
            }
        }
        if meta.classes.len() < 2 {
            return Err(bad("fewer than two classes".into()));
        }
        let last = meta.classes.len() - 1;
        let mut previous = 0u64;
        for (i, c) in meta.classes.iter().enumerate() {
            match c.upper_mib {
                Some(u) if u > previous && u > c.lower_mib => previous = u,
                None if i == last => {}
                _ => return Err(bad(format!("class `{}` has a bad upper edge", c.label))),
            }
        }
        if let DecisionRule::CumulativeProbability { threshold } = meta.decision
            && !(threshold > 0.0 && threshold <= 1.0)
        {
            return Err(bad(format!("threshold {threshold} is not in (0, 1]")));
        }
        Ok(meta)
    }

    /// Index of the class whose range holds `mib` (upper edges inclusive; below
    /// the first class → 0, above every finite edge → the last class).
    pub fn class_of_mib(&self, mib: f64) -> usize {
        self.classes
            .iter()
            .position(|c| c.upper_mib.is_none_or(|u| mib <= u as f64))
            .unwrap_or(self.classes.len() - 1)
    }

    /// The first feature (or `batch_x_activations`) in which `p` exceeds the largest
    /// training value, with that value; `None` when `p` is within range.
    pub fn beyond_training(&self, p: &Profile) -> Option<(&str, f64, f64)> {
        self.training_max.iter().find_map(|(name, max)| {
            let v = if name == "batch_x_activations" {
                p.activations as f64 * f64::from(p.batch_size)
            } else {
                feature_value(p, name, &self.activation_functions)?
            };
            (v > *max).then_some((name.as_str(), v, *max))
        })
    }
}

fn onnx_err(family: Family) -> impl Fn(TractError) -> ModelError {
    move |e| ModelError::Onnx {
        family,
        message: format!("{e:#}"),
    }
}

impl Model {
    /// Loads an ONNX graph with its sidecar, checks that the graph's input width
    /// equals the sidecar's feature count and its output width the class count, and
    /// optimises it for one row and for batches.
    pub fn load(family: Family, onnx: &[u8], sidecar: &str) -> Result<Model, ModelError> {
        let started = std::time::Instant::now();
        let meta = ModelMeta::parse(family, sidecar)?;
        let width = meta.features.len();
        let err = onnx_err(family);
        let proto = tract_onnx::onnx()
            .model_for_read(&mut std::io::Cursor::new(onnx))
            .map_err(&err)?;
        if proto.inputs.len() != 1 || proto.outputs.len() != 1 {
            return Err(ModelError::Onnx {
                family,
                message: format!(
                    "expected one input and one output, found {} and {}",
                    proto.inputs.len(),
                    proto.outputs.len()
                ),
            });
        }
        let declared = proto.input_fact(0).map_err(&err)?;
        let dims: Vec<_> = declared.shape.dims().cloned().collect();
        let model_width = dims
            .get(1)
            .and_then(|d| d.concretize())
            .and_then(|d| d.to_usize().ok())
            .filter(|_| dims.len() == 2)
            .ok_or_else(|| ModelError::Onnx {
                family,
                message: format!(
                    "input must be [N, features] with a fixed width, found {declared:?}"
                ),
            })?;
        if model_width != width {
            return Err(ModelError::WidthMismatch {
                family,
                model_width,
                features: width,
            });
        }
        let plan = |rows: usize| -> Result<Plan, ModelError> {
            let typed = proto
                .clone()
                .with_input_fact(0, f32::fact([rows, width]).into())
                .and_then(|m| m.into_optimized())
                .map_err(&err)?;
            let out = typed.output_fact(0).map_err(&err)?;
            let out_width = out
                .shape
                .last()
                .and_then(|d| d.to_usize().ok())
                .unwrap_or(0);
            if out.shape.len() != 2 || out_width != meta.classes.len() {
                return Err(ModelError::ClassMismatch {
                    family,
                    model_width: out_width,
                    classes: meta.classes.len(),
                });
            }
            let plan = typed.into_runnable().map_err(&err)?;
            Ok(Plan {
                rows,
                plan,
                states: Mutex::new(Vec::new()),
            })
        };
        let single = plan(1)?;
        let batch = plan(BATCH_ROWS)?;
        tracing::info!(
            %family,
            features = width,
            classes = meta.classes.len(),
            elapsed_ms = started.elapsed().as_secs_f64() * 1e3,
            "loaded GPUMemNet model"
        );
        Ok(Model {
            meta,
            single,
            batch,
        })
    }

    /// The sidecar.
    pub fn meta(&self) -> &ModelMeta {
        &self.meta
    }

    /// Class probabilities for raw feature rows (row-major, `rows × features`
    /// values in the sidecar's order). Returns `rows × classes` values.
    pub fn probabilities(&self, features: &[f32]) -> TractResult<Vec<f32>> {
        let width = self.meta.features.len();
        if features.is_empty() || !features.len().is_multiple_of(width) {
            bail!(
                "expected a non-empty multiple of {width} feature values, got {}",
                features.len()
            );
        }
        let rows = features.len() / width;
        let classes = self.meta.classes.len();
        let mut probabilities = Vec::with_capacity(rows * classes);
        if rows == 1 {
            self.run_into(&self.single, features, 1, &mut probabilities)?;
            return Ok(probabilities);
        }
        let chunk = self.batch.rows * width;
        let mut padded = Vec::new();
        for part in features.chunks(chunk) {
            let n = part.len() / width;
            if n == self.batch.rows {
                self.run_into(&self.batch, part, n, &mut probabilities)?;
            } else if n == 1 {
                self.run_into(&self.single, part, 1, &mut probabilities)?;
            } else {
                // last partial chunk: pad with zero rows, keep the first n results
                padded.clear();
                padded.extend_from_slice(part);
                padded.resize(chunk, 0.0);
                self.run_into(&self.batch, &padded, n, &mut probabilities)?;
            }
        }
        Ok(probabilities)
    }

    /// Runs `plan` on `input` (exactly `plan.rows` rows) and appends the first
    /// `keep` rows of probabilities to `out`.
    fn run_into(
        &self,
        plan: &Plan,
        input: &[f32],
        keep: usize,
        out: &mut Vec<f32>,
    ) -> TractResult<()> {
        let width = self.meta.features.len();
        let classes = self.meta.classes.len();
        let result = plan.run(Tensor::from_shape(&[plan.rows, width], input)?)?;
        let view = result[0].to_plain_array_view::<f32>()?;
        if view.len() != plan.rows * classes {
            bail!(
                "model returned {} values for {} rows",
                view.len(),
                plan.rows
            );
        }
        out.extend(view.iter().take(keep * classes).copied());
        Ok(())
    }

    /// Appends `p`'s features in the sidecar's order to `out`.
    pub fn features_into(&self, p: &Profile, out: &mut Vec<f32>) {
        feature_row(p, &self.meta.features, &self.meta.activation_functions, out);
    }
}
