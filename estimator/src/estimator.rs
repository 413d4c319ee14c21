//! The estimator: profile in, memory reservation out.

use std::fmt;
use std::sync::{Arc, OnceLock};

use serde::{Deserialize, Serialize};

use crate::analytic::{analytic_upper_bound_mib, detailed_bound_for};
use crate::model::{Model, ModelError};
use crate::profile::{Family, Profile, ProfileError};
use crate::traced::traced_reservation_mib;

/// An ONNX model and its sidecar, as bytes (see [`Estimator::from_parts`]).
#[derive(Debug, Clone, Copy)]
pub struct ModelParts<'a> {
    /// The family the model serves.
    pub family: Family,
    /// The ONNX graph.
    pub onnx: &'a [u8],
    /// The JSON sidecar (`gpumemnet-<family>.json`).
    pub sidecar: &'a str,
}

/// The models compiled into the binary (`estimator/models/`). CNN and Transformer
/// join this list once their datasets exist and `estimator/training/train.py`
/// has produced their ONNX files.
pub const EMBEDDED_MODELS: &[ModelParts<'static>] = &[ModelParts {
    family: Family::Mlp,
    onnx: include_bytes!("../models/gpumemnet-mlp.onnx"),
    sidecar: include_str!("../models/gpumemnet-mlp.json"),
}];

/// Where an estimate's reservation comes from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum EstimateSource {
    /// The GPUMemNet MLP-family model (`gpumemnet-mlp`).
    GpumemnetMlp,
    /// The GPUMemNet CNN-family model (`gpumemnet-cnn`).
    GpumemnetCnn,
    /// The GPUMemNet Transformer-family model (`gpumemnet-transformer`).
    GpumemnetTransformer,
    /// The analytic upper bound (`analytic-upper-bound`): no model for the family,
    /// or the profile lies beyond the model's training range.
    AnalyticUpperBound,
    /// The traced reservation (`traced`): the profile carries the peaks of a training
    /// step traced without a GPU ([`crate::Traced`]); it comes before any model.
    Traced,
    /// The analytic bound read from a table or printout that holds a module type, or an
    /// attention or sharing pattern, with no measured rule (`analytic-fallback`): that part was
    /// counted conservatively ([`crate::Caveat`]), and [`Estimate::warnings`] says what it was.
    AnalyticFallback,
}

impl EstimateSource {
    /// The model source for a family.
    pub fn model(family: Family) -> Self {
        match family {
            Family::Mlp => EstimateSource::GpumemnetMlp,
            Family::Cnn => EstimateSource::GpumemnetCnn,
            Family::Transformer => EstimateSource::GpumemnetTransformer,
        }
    }

    /// The kebab-case name, as serialised.
    pub fn as_str(self) -> &'static str {
        match self {
            EstimateSource::GpumemnetMlp => "gpumemnet-mlp",
            EstimateSource::GpumemnetCnn => "gpumemnet-cnn",
            EstimateSource::GpumemnetTransformer => "gpumemnet-transformer",
            EstimateSource::AnalyticUpperBound => "analytic-upper-bound",
            EstimateSource::Traced => "traced",
            EstimateSource::AnalyticFallback => "analytic-fallback",
        }
    }

    /// Whether the reservation is the analytic bound, read with measured rules or not.
    pub fn is_analytic(self) -> bool {
        matches!(
            self,
            EstimateSource::AnalyticUpperBound | EstimateSource::AnalyticFallback
        )
    }
}

impl fmt::Display for EstimateSource {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A memory estimate for one training job.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Estimate {
    /// The per-GPU reservation in MiB: the chosen class's upper edge; for the
    /// open-ended top class the analytic upper bound (at least the sidecar's
    /// `open_class_min_reservation_mib`); with [`EstimateSource::AnalyticUpperBound`]
    /// the analytic upper bound; with [`EstimateSource::Traced`] the traced reservation.
    pub mib: u64,
    /// The chosen class's label (e.g. `(1000,2000]`); for the analytic bound and the
    /// traced reservation `(0,<mib>]`.
    pub class: String,
    /// The model's class probabilities, lowest class first; empty when no model ran.
    pub probabilities: Vec<f32>,
    /// Where `mib` comes from.
    pub source: EstimateSource,
    /// With [`EstimateSource::AnalyticFallback`]: what the reservation could not read with a
    /// measured rule, one line per [`Profile::caveats`] entry. Empty otherwise: also when the
    /// profile has caveats but a model's class sets a larger reservation than the conservative
    /// bound, or the profile carries a traced step (which comes before any bound).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub warnings: Vec<String>,
}

impl Estimate {
    /// The estimate `mib` set by a profile's conservative bound, which rests on its
    /// [`Profile::caveats`]: the source says so and the warnings say why.
    fn fallback(p: &Profile, mib: u64, probabilities: Vec<f32>) -> Estimate {
        Estimate {
            mib,
            class: format!("(0,{mib}]"),
            probabilities,
            source: EstimateSource::AnalyticFallback,
            warnings: p.caveats.iter().map(|c| c.to_string()).collect(),
        }
    }
}

/// Why an [`Estimator`] could not be built.
#[derive(Debug, thiserror::Error)]
pub enum EstimatorError {
    /// A model failed to load or does not match its sidecar.
    #[error(transparent)]
    Model(#[from] ModelError),
    /// Two models were given for one family.
    #[error("two models given for family {0}")]
    DuplicateFamily(Family),
}

/// Why one estimate failed.
#[derive(Debug, thiserror::Error)]
pub enum EstimateError {
    /// The profile is unusable (the error names the key).
    #[error(transparent)]
    InvalidProfile(#[from] ProfileError),
    /// tract failed to run the model (should not happen with a checked model).
    #[error("inference failed for family {family}: {message}")]
    Inference {
        /// The family.
        family: Family,
        /// tract's error chain.
        message: String,
    },
}

#[derive(Debug)]
struct Inner {
    models: [Option<Model>; 3],
}

/// GPUMemNet estimator: one loaded model per trained family, the analytic upper
/// bound for the others. Cheap to clone (an `Arc`), `Send + Sync`: build it once
/// and share it across threads.
#[derive(Debug, Clone)]
pub struct Estimator {
    inner: Arc<Inner>,
}

fn slot(f: Family) -> usize {
    match f {
        Family::Mlp => 0,
        Family::Cnn => 1,
        Family::Transformer => 2,
    }
}

static DEFAULT: OnceLock<Estimator> = OnceLock::new();

impl Estimator {
    /// The estimator with the models compiled into the binary ([`EMBEDDED_MODELS`]).
    /// Loaded once per process (a few milliseconds) and shared afterwards; a
    /// failed load is returned, not cached.
    pub fn new() -> Result<Estimator, EstimatorError> {
        if let Some(e) = DEFAULT.get() {
            return Ok(e.clone());
        }
        let loaded = Estimator::from_parts(EMBEDDED_MODELS)?;
        Ok(DEFAULT.get_or_init(|| loaded).clone())
    }

    /// An estimator with the given models (and the analytic bound for every other
    /// family). Each model's input width must equal its sidecar's feature count.
    pub fn from_parts(parts: &[ModelParts<'_>]) -> Result<Estimator, EstimatorError> {
        let mut models: [Option<Model>; 3] = [None, None, None];
        for p in parts {
            let s = &mut models[slot(p.family)];
            if s.is_some() {
                return Err(EstimatorError::DuplicateFamily(p.family));
            }
            *s = Some(Model::load(p.family, p.onnx, p.sidecar)?);
        }
        Ok(Estimator {
            inner: Arc::new(Inner { models }),
        })
    }

    /// The loaded model for `family`, if one was trained.
    pub fn model(&self, family: Family) -> Option<&Model> {
        self.inner.models[slot(family)].as_ref()
    }

    /// Estimates the GPU memory reservation for one job on one GPU (see
    /// [`Estimator::estimate_for`]).
    pub fn estimate(&self, p: &Profile) -> Result<Estimate, EstimateError> {
        self.estimate_for(p, 1)
    }

    /// Estimates the per-GPU reservation for one job run with `gpus` GPUs per pod. A
    /// profile with `traced` gets the traced reservation (each GPU beyond the first adds the
    /// multi-GPU term); the models and the analytic bound do not read the GPU count.
    pub fn estimate_for(&self, p: &Profile, gpus: u32) -> Result<Estimate, EstimateError> {
        p.validate()?;
        if let Some(e) = traced(p, gpus) {
            return Ok(e);
        }
        let Some(model) = self.model(p.family) else {
            return Ok(analytic(p, Vec::new(), gpus));
        };
        let mut row = Vec::with_capacity(model.meta().features.len());
        model.features_into(p, &mut row);
        let probabilities = model
            .probabilities(&row)
            .map_err(|e| inference(p.family, e))?;
        Ok(decide(model, p, probabilities, gpus))
    }

    /// Estimates many jobs (one GPU each) with one model call per family; the result has
    /// one entry per profile, in order. Faster than [`Estimator::estimate`] in a loop.
    pub fn estimate_batch(&self, profiles: &[Profile]) -> Vec<Result<Estimate, EstimateError>> {
        let mut out: Vec<Option<Result<Estimate, EstimateError>>> =
            profiles.iter().map(|_| None).collect();
        for family in Family::ALL {
            let idx: Vec<usize> = profiles
                .iter()
                .enumerate()
                .filter(|(_, p)| p.family == family)
                .map(|(i, _)| i)
                .collect();
            if idx.is_empty() {
                continue;
            }
            let mut valid = Vec::with_capacity(idx.len());
            for &i in &idx {
                match profiles[i].validate() {
                    Ok(()) => match traced(&profiles[i], 1) {
                        Some(e) => out[i] = Some(Ok(e)),
                        None => valid.push(i),
                    },
                    Err(e) => out[i] = Some(Err(e.into())),
                }
            }
            let Some(model) = self.model(family) else {
                for i in valid {
                    out[i] = Some(Ok(analytic(&profiles[i], Vec::new(), 1)));
                }
                continue;
            };
            if valid.is_empty() {
                continue;
            }
            let width = model.meta().features.len();
            let classes = model.meta().classes.len();
            let mut rows = Vec::with_capacity(valid.len() * width);
            for &i in &valid {
                model.features_into(&profiles[i], &mut rows);
            }
            match model.probabilities(&rows) {
                Ok(probs) => {
                    for (k, &i) in valid.iter().enumerate() {
                        let pr = probs[k * classes..(k + 1) * classes].to_vec();
                        out[i] = Some(Ok(decide(model, &profiles[i], pr, 1)));
                    }
                }
                Err(e) => {
                    let message = format!("{e:#}");
                    for i in valid {
                        out[i] = Some(Err(EstimateError::Inference {
                            family,
                            message: message.clone(),
                        }));
                    }
                }
            }
        }
        out.into_iter()
            .map(|r| {
                r.unwrap_or_else(|| {
                    Err(EstimateError::Inference {
                        family: Family::Mlp,
                        message: "internal: profile left without a result".into(),
                    })
                })
            })
            .collect()
    }
}

fn inference(family: Family, e: tract_onnx::prelude::TractError) -> EstimateError {
    EstimateError::Inference {
        family,
        message: format!("{e:#}"),
    }
}

/// The traced reservation, when the profile carries a traced step.
fn traced(p: &Profile, gpus: u32) -> Option<Estimate> {
    let t = p.traced.as_ref()?;
    let mib = traced_reservation_mib(t, p.family, gpus);
    Some(Estimate {
        mib,
        class: format!("(0,{mib}]"),
        probabilities: Vec::new(),
        source: EstimateSource::Traced,
        warnings: Vec::new(),
    })
}

/// The analytic bound: read layer by layer where the profile carries a `layerReading` (then
/// per GPU of a pod with `gpus` GPUs), else from the profile's totals.
fn bound_mib(p: &Profile, gpus: u32) -> u64 {
    match &p.layer_reading {
        Some(r) => detailed_bound_for(p, &r.values(), gpus).total_mib,
        None => analytic_upper_bound_mib(p),
    }
}

/// The analytic bound as an estimate: a fallback when the profile's reading has caveats.
fn analytic(p: &Profile, probabilities: Vec<f32>, gpus: u32) -> Estimate {
    let mib = bound_mib(p, gpus);
    if !p.caveats.is_empty() {
        return Estimate::fallback(p, mib, probabilities);
    }
    Estimate {
        mib,
        class: format!("(0,{mib}]"),
        probabilities,
        source: EstimateSource::AnalyticUpperBound,
        warnings: Vec::new(),
    }
}

/// Applies the decision rule, the open-class rule and the range guard.
fn decide(model: &Model, p: &Profile, probabilities: Vec<f32>, gpus: u32) -> Estimate {
    let meta = model.meta();
    if let Some((feature, value, max)) = meta.beyond_training(p) {
        let class_mib = meta
            .classes
            .get(meta.decision.choose(&probabilities))
            .and_then(|c| c.upper_mib)
            .unwrap_or(0);
        let mut e = analytic(p, probabilities, gpus);
        tracing::debug!(
            family = %p.family,
            feature,
            value,
            training_max = max,
            "profile beyond the model's training range; using the analytic upper bound"
        );
        if class_mib > e.mib {
            // the class, not the (possibly conservative) bound, sets the reservation
            e.mib = class_mib;
            e.class = format!("(0,{class_mib}]");
            e.source = EstimateSource::AnalyticUpperBound;
            e.warnings.clear();
        }
        return e;
    }
    let k = meta.decision.choose(&probabilities);
    let class = &meta.classes[k.min(meta.classes.len() - 1)];
    // A profile whose reading counted parts conservatively (caveats) gets the larger of the
    // class and that bound; it is a fallback only where the bound is the larger.
    let mib = match class.upper_mib {
        Some(u) if p.caveats.is_empty() => u,
        Some(u) => {
            let bound = bound_mib(p, gpus);
            if bound > u {
                return Estimate::fallback(p, bound, probabilities);
            }
            u
        }
        None => {
            let bound = bound_mib(p, gpus);
            if !p.caveats.is_empty() && bound >= meta.open_class_min_reservation_mib {
                return Estimate::fallback(p, bound, probabilities);
            }
            bound.max(meta.open_class_min_reservation_mib)
        }
    };
    Estimate {
        mib,
        class: class.label.clone(),
        probabilities,
        source: EstimateSource::model(p.family),
        warnings: Vec::new(),
    }
}
