//! The `carma.io/model-profile` annotation: a JSON description of a training job's model.

use std::fmt;
use std::marker::PhantomData;

use serde::de::{MapAccess, Visitor, value::MapAccessDeserializer};
use serde::{Deserialize, Deserializer, Serialize};

use crate::analytic::{BoundInputs, analytic_upper_bound_mib};
use crate::caveat::{Caveat, MAX_CAVEAT_MODULES, MAX_CAVEAT_TEXT};
pub use crate::family::{Family, FamilyParseError, Optimizer};
use crate::layer_reading::LayerReading;
use crate::limits::{
    MAX_ACTIVATIONS, MAX_BATCH_SIZE, MAX_ESTIMATE_MIB, MAX_LAYERS, MAX_PARAMETERS, MAX_SEQ_LENGTH,
};
use crate::traced::{MAX_TRACED_MIB, Traced};

/// Activation module names of `torch.nn`. A name outside them is a typo or not
/// an activation and is rejected; a real one that GPUMemNet's lists lack
/// (`Hardswish`, `Sigmoid`, …) counts as `ReLU`, as GPUMemNet does.
pub const TORCH_ACTIVATIONS: [&str; 29] = [
    "CELU",
    "ELU",
    "GELU",
    "GLU",
    "Hardshrink",
    "Hardsigmoid",
    "Hardswish",
    "Hardtanh",
    "Identity",
    "LeakyReLU",
    "LogSigmoid",
    "LogSoftmax",
    "Mish",
    "PReLU",
    "RReLU",
    "ReLU",
    "ReLU6",
    "SELU",
    "SiLU",
    "Sigmoid",
    "Softmax",
    "Softmax2d",
    "Softmin",
    "Softplus",
    "Softshrink",
    "Softsign",
    "Tanh",
    "Tanhshrink",
    "Threshold",
];

/// Layer counts by type (`layers` in the annotation). Absent counts are 0,
/// each at most [`MAX_LAYERS`].
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct Layers {
    /// `nn.Linear` layers (not counting attention projections).
    pub linear: u32,
    /// `nn.Conv2d` layers.
    pub conv2d: u32,
    /// Batch-norm layers (`BatchNorm1d`, `BatchNorm2d`, …).
    pub batch_norm: u32,
    /// Dropout layers.
    pub dropout: u32,
    /// `nn.LayerNorm` layers.
    pub layer_norm: u32,
    /// Attention blocks, counted by their output projection
    /// (`NonDynamicallyQuantizableLinear` in PyTorch summaries).
    pub attention: u32,
    /// `AdaptiveAvgPool*` layers.
    pub adaptive_avg_pool: u32,
}

/// The model features of one training job: the `carma.io/model-profile` annotation.
///
/// JSON, camelCase, unknown keys rejected. Required: `family`, `batchSize`,
/// `parameters`, `activations`. Optional: `depth` (derived from `layers` when
/// absent, see [`Profile::effective_depth`]), `activation` (default `ReLU`),
/// `layers` (counts default to 0), `seqLength`, `optimizer` (`sgd`,
/// `sgdMomentum` or `adam`; default `adam`), `mixedPrecision` (default `false`) and
/// `traced` (the phase peaks of a traced training step, see [`Traced`]).
///
/// ```
/// let p = carma_estimator::parse_profile(
///     r#"{"family":"mlp","batchSize":128,"parameters":1200000,"activations":4000,
///         "depth":4,"activation":"GELU","layers":{"linear":4,"dropout":2}}"#,
/// ).unwrap();
/// assert_eq!(p.batch_size, 128);
/// ```
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Profile {
    /// Model family.
    pub family: Family,
    /// Training batch size (samples per step), 1 to [`MAX_BATCH_SIZE`].
    pub batch_size: u32,
    /// Trainable parameters, 1 to [`MAX_PARAMETERS`].
    pub parameters: u64,
    /// Activations per sample: the sum of every layer's output size for one sample
    /// (for transformers: including the sequence dimension), 1 to [`MAX_ACTIVATIONS`].
    pub activations: u64,
    /// Depth. MLP: linear layers. CNN: conv2d + batch-norm + dropout +
    /// adaptive-avg-pool + linear layers. Transformer: linear + attention +
    /// layer-norm + dropout layers. Derived from `layers` when absent. 1 to
    /// [`MAX_LAYERS`].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub depth: Option<u32>,
    /// Activation function name (e.g. `ReLU`, `GELU`), one of
    /// [`TORCH_ACTIVATIONS`] (any case); default `ReLU`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub activation: Option<String>,
    /// Layer counts by type.
    #[serde(default, deserialize_with = "map_only")]
    pub layers: Layers,
    /// Sequence length (transformers), 1 to [`MAX_SEQ_LENGTH`]; used by the
    /// analytic bound for attention scores.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub seq_length: Option<u32>,
    /// The optimizer; [`Optimizer::Adam`] (the most state) when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub optimizer: Option<Optimizer>,
    /// Mixed-precision training (`torch.autocast` / AMP): activations are kept in
    /// 16 bits. `false` (fp32) when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mixed_precision: Option<bool>,
    /// The peaks of one training step traced without a GPU (`carma_profile --trace`),
    /// for one GPU's share of the batch. When present the estimate is the traced
    /// reservation ([`crate::traced_reservation_mib`]), before GPUMemNet or the analytic bound.
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        deserialize_with = "some_map_only"
    )]
    pub traced: Option<Traced>,
    /// A torchsummary table's or module printout's layer-by-layer reading
    /// (`carma estimate --summary … --emit-profile`), for one GPU's share of the batch. Where
    /// the analytic bound would be used, the bound is read layer by layer from it
    /// ([`crate::analytic::detailed_bound_for`]) instead of from the totals.
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        deserialize_with = "some_map_only"
    )]
    pub layer_reading: Option<LayerReading>,
    /// What the table's or printout's reading had no measured rule for and counted
    /// conservatively instead (`carma estimate --summary … --emit-profile` writes them beside
    /// `layerReading`). Where that conservative bound sets the reservation, the estimate is an
    /// [`crate::EstimateSource::AnalyticFallback`] whose `warnings` are these; empty when the
    /// reading had a rule for everything. At most one per kind, each naming at least one module.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub caveats: Vec<Caveat>,
}

impl Profile {
    /// The depth feature: `depth` when given, else derived from `layers` as documented
    /// on [`Profile::depth`].
    pub fn effective_depth(&self) -> u32 {
        if let Some(d) = self.depth {
            return d;
        }
        let l = &self.layers;
        match self.family {
            Family::Mlp => l.linear,
            Family::Cnn => l
                .conv2d
                .saturating_add(l.batch_norm)
                .saturating_add(l.dropout)
                .saturating_add(l.adaptive_avg_pool)
                .saturating_add(l.linear),
            Family::Transformer => l
                .linear
                .saturating_add(l.attention)
                .saturating_add(l.layer_norm)
                .saturating_add(l.dropout),
        }
    }

    /// The optimizer, [`Optimizer::Adam`] when absent.
    pub fn effective_optimizer(&self) -> Optimizer {
        self.optimizer.unwrap_or(Optimizer::Adam)
    }

    /// Whether activations are kept in 16 bits (`mixedPrecision`), `false` when absent.
    pub fn is_mixed_precision(&self) -> bool {
        self.mixed_precision.unwrap_or(false)
    }

    /// The activation function name, `ReLU` when absent.
    pub fn activation_name(&self) -> &str {
        self.activation.as_deref().unwrap_or("ReLU")
    }

    /// Checks the values a valid job must have; errors name the key.
    pub fn validate(&self) -> Result<(), ProfileError> {
        let invalid = |key: &str, reason: &str| {
            Err(ProfileError::Invalid {
                key: key.to_string(),
                reason: reason.to_string(),
            })
        };
        let range = |key: &str, v: u64, max: u64| {
            if (1..=max).contains(&v) {
                Ok(())
            } else {
                invalid(key, &format!("got {v}; it must be between 1 and {max}"))
            }
        };
        range("batchSize", self.batch_size.into(), MAX_BATCH_SIZE.into())?;
        range("parameters", self.parameters, MAX_PARAMETERS)?;
        range("activations", self.activations, MAX_ACTIVATIONS)?;
        let l = &self.layers;
        for (key, n) in [
            ("layers.linear", l.linear),
            ("layers.conv2d", l.conv2d),
            ("layers.batchNorm", l.batch_norm),
            ("layers.dropout", l.dropout),
            ("layers.layerNorm", l.layer_norm),
            ("layers.attention", l.attention),
            ("layers.adaptiveAvgPool", l.adaptive_avg_pool),
        ] {
            if n > MAX_LAYERS {
                return invalid(key, &format!("got {n}; it must be at most {MAX_LAYERS}"));
            }
        }
        if self.effective_depth() == 0 {
            return invalid(
                "depth",
                "must be at least 1 (give `depth`, or the layer counts it is derived from)",
            );
        }
        range("depth", self.effective_depth().into(), MAX_LAYERS.into())?;
        if let Some(a) = self.activation.as_deref() {
            if a.trim().is_empty() {
                return invalid("activation", "must not be empty");
            }
            if !TORCH_ACTIVATIONS
                .iter()
                .any(|k| k.eq_ignore_ascii_case(a.trim()))
            {
                return invalid(
                    "activation",
                    &format!(
                        "`{a}` is not a torch.nn activation (e.g. ReLU, GELU, SiLU, Tanh, Identity)"
                    ),
                );
            }
        }
        if let Some(seq) = self.seq_length {
            range("seqLength", seq.into(), MAX_SEQ_LENGTH.into())?;
        }
        if let Some(t) = &self.traced {
            for (key, mib) in t.keyed() {
                range(key, mib, MAX_TRACED_MIB)?;
            }
            if let Some(reserved) = t.reserved_mib.filter(|r| *r < t.peak_mib()) {
                return invalid(
                    "traced.reservedMiB",
                    &format!(
                        "{reserved} MiB is less than the largest phase peak ({} MiB): the allocator holds at least the tensors alive at once",
                        t.peak_mib()
                    ),
                );
            }
            if let Some(largest) = t.largest_tensor_mib.filter(|l| *l > t.peak_mib()) {
                return invalid(
                    "traced.largestTensorMiB",
                    &format!(
                        "{largest} MiB is more than the largest phase peak ({} MiB), which holds that tensor",
                        t.peak_mib()
                    ),
                );
            }
        }
        if let Some(r) = &self.layer_reading {
            for (key, v) in r.keyed() {
                if v > LayerReading::MAX_VALUES {
                    return invalid(
                        key,
                        &format!("got {v}; it must be at most {}", LayerReading::MAX_VALUES),
                    );
                }
            }
            if r.saved_values.saturating_add(r.kept_fp32_values) == 0 {
                return invalid(
                    "layerReading.savedValues",
                    "a model keeps some values for backward (savedValues and keptFp32Values are both 0)",
                );
            }
            let detailed = crate::analytic::detailed_bound(self, &r.values()).total_mib;
            if detailed > MAX_ESTIMATE_MIB {
                return invalid(
                    "layerReading",
                    &format!(
                        "the bound it gives is {detailed} MiB, more than the {MAX_ESTIMATE_MIB} MiB (1 PiB) any cluster has"
                    ),
                );
            }
        }
        for (i, c) in self.caveats.iter().enumerate() {
            let key = format!("caveats[{i}]");
            if self.caveats[..i].iter().any(|d| d.kind == c.kind) {
                return invalid(&key, &format!("a second `{}` caveat", c.kind.as_str()));
            }
            if c.modules.is_empty() || c.modules.len() > MAX_CAVEAT_MODULES {
                return invalid(
                    &format!("{key}.modules"),
                    &format!("must name 1 to {MAX_CAVEAT_MODULES} module types"),
                );
            }
            if c.modules
                .iter()
                .any(|m| m.trim().is_empty() || m.len() > MAX_CAVEAT_TEXT)
                || c.counted.len() > MAX_CAVEAT_TEXT
            {
                return invalid(
                    &key,
                    &format!(
                        "module names must be non-empty and texts at most {MAX_CAVEAT_TEXT} bytes"
                    ),
                );
            }
        }
        let bound = analytic_upper_bound_mib(self);
        if bound > MAX_ESTIMATE_MIB {
            return invalid(
                "batchSize",
                &format!(
                    "with parameters {}, activations {} and seqLength {:?} the analytic bound is {bound} MiB, more than the {MAX_ESTIMATE_MIB} MiB (1 PiB) any cluster has",
                    self.parameters, self.activations, self.seq_length
                ),
            );
        }
        Ok(())
    }
}

/// The figures of a profile that the analytic bound reads, with the annotation's defaults applied.
impl From<&Profile> for BoundInputs {
    fn from(p: &Profile) -> Self {
        BoundInputs {
            family: p.family,
            optimizer: p.effective_optimizer(),
            mixed_precision: p.is_mixed_precision(),
            parameters: p.parameters,
            activations: p.activations,
            batch_size: p.batch_size,
            seq_length: p.seq_length,
            attention_layers: p.layers.attention,
        }
    }
}

/// Why a `carma.io/model-profile` annotation was rejected. Every variant names the key.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ProfileError {
    /// Not JSON, or not one JSON object.
    #[error("model profile is not a valid JSON object: {message}")]
    Syntax {
        /// serde_json's description, with line and column.
        message: String,
    },
    /// A key the schema does not know.
    #[error(
        "model profile has unknown key `{key}`{}; expected {expected}",
        at(path)
    )]
    UnknownKey {
        /// The unknown key.
        key: String,
        /// Where it occurs (`""` for the top level, `layers` inside `layers`).
        path: String,
        /// The keys allowed there, in serde's wording (`one of \`a\`, \`b\``).
        expected: String,
    },
    /// A required key is missing.
    #[error("model profile is missing required key `{key}`{}", at(path))]
    MissingKey {
        /// The missing key.
        key: String,
        /// The object it is missing from (`""` for the top level).
        path: String,
    },
    /// A key holds a value of the wrong type or an out-of-range number.
    #[error("model profile key `{key}` has a wrong type or value: {message}")]
    WrongType {
        /// Dotted path of the key, e.g. `layers.conv2d`.
        key: String,
        /// What was found and what was expected.
        message: String,
    },
    /// Well-formed but unusable (e.g. a zero batch size).
    #[error("model profile key `{key}` is invalid: {reason}")]
    Invalid {
        /// The offending key.
        key: String,
        /// Why.
        reason: String,
    },
}

fn at(path: &str) -> String {
    if path.is_empty() {
        String::new()
    } else {
        format!(" (in `{path}`)")
    }
}

/// Deserialises a struct only from a JSON object (serde's derive also accepts an
/// array of the fields in declaration order, which the schema does not allow).
fn map_only<'de, D: Deserializer<'de>, T: Deserialize<'de>>(d: D) -> Result<T, D::Error> {
    struct MapOnly<T>(PhantomData<T>);
    impl<'de, T: Deserialize<'de>> Visitor<'de> for MapOnly<T> {
        type Value = T;
        fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            f.write_str("a JSON object")
        }
        fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<T, A::Error> {
            T::deserialize(MapAccessDeserializer::new(map))
        }
    }
    d.deserialize_map(MapOnly(PhantomData))
}

/// [`map_only`] for an optional object: present means an object (never `null` or an array).
fn some_map_only<'de, D: Deserializer<'de>, T: Deserialize<'de>>(
    d: D,
) -> Result<Option<T>, D::Error> {
    map_only(d).map(Some)
}

/// Text between the first pair of backticks in a serde message.
fn quoted(msg: &str) -> Option<&str> {
    let start = msg.find('`')? + 1;
    let len = msg[start..].find('`')?;
    Some(&msg[start..start + len])
}

/// Parses and validates a `carma.io/model-profile` annotation.
///
/// Unknown keys, missing required keys, wrong types and invalid values are
/// rejected with a [`ProfileError`] that names the key.
pub fn parse_profile(json: &str) -> Result<Profile, ProfileError> {
    use serde_json::error::Category;

    let mut de = serde_json::Deserializer::from_str(json);
    let mut track = serde_path_to_error::Track::new();
    let parsed: Result<Profile, _> =
        map_only(serde_path_to_error::Deserializer::new(&mut de, &mut track));
    let profile: Profile =
        match parsed.map_err(|e| serde_path_to_error::Error::new(track.path(), e)) {
            Ok(p) => p,
            Err(e) => {
                let path = e.path().to_string();
                let path = if path == "." { String::new() } else { path };
                let inner = e.into_inner();
                let message = inner.to_string();
                return Err(match inner.classify() {
                    Category::Data => {
                        if message.starts_with("unknown field") {
                            let key = quoted(&message).unwrap_or("?").to_string();
                            let expected = message
                                .split_once("expected ")
                                .map(|(_, rest)| rest.split(" at line").next().unwrap_or(rest))
                                .unwrap_or("no other keys")
                                .to_string();
                            // path_to_error reports the unknown key itself as the last segment.
                            let parent = path
                                .strip_suffix(key.as_str())
                                .map(|p| p.trim_end_matches('.').to_string())
                                .unwrap_or(path);
                            ProfileError::UnknownKey {
                                key,
                                path: parent,
                                expected,
                            }
                        } else if message.starts_with("missing field") {
                            let key = quoted(&message).unwrap_or("?").to_string();
                            ProfileError::MissingKey { key, path }
                        } else if path.is_empty() {
                            ProfileError::Syntax { message }
                        } else {
                            ProfileError::WrongType { key: path, message }
                        }
                    }
                    _ => ProfileError::Syntax { message },
                });
            }
        };
    de.end().map_err(|e| ProfileError::Syntax {
        message: e.to_string(),
    })?;
    profile.validate()?;
    Ok(profile)
}
