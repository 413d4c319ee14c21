//! The two choices of a training job that set the analytic bound's constants: the model family
//! and the optimizer (see [`crate::analytic`]).

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

/// Model family; each family has its own features and (once trained) its own model.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Family {
    /// Multi-layer perceptrons (Linear / activation / BatchNorm / Dropout stacks).
    Mlp,
    /// Convolutional networks.
    Cnn,
    /// Transformer encoders / decoders.
    Transformer,
}

impl Family {
    /// Every family, in a fixed order.
    pub const ALL: [Family; 3] = [Family::Mlp, Family::Cnn, Family::Transformer];

    /// The lowercase name used in JSON and on the command line.
    pub fn as_str(self) -> &'static str {
        match self {
            Family::Mlp => "mlp",
            Family::Cnn => "cnn",
            Family::Transformer => "transformer",
        }
    }
}

impl fmt::Display for Family {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Error of [`Family::from_str`].
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown model family `{0}`; expected one of `mlp`, `cnn`, `transformer`")]
pub struct FamilyParseError(pub String);

impl FromStr for Family {
    type Err = FamilyParseError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s.trim().to_ascii_lowercase().as_str() {
            "mlp" => Ok(Family::Mlp),
            "cnn" => Ok(Family::Cnn),
            "transformer" => Ok(Family::Transformer),
            _ => Err(FamilyParseError(s.to_string())),
        }
    }
}

/// The optimizer of a training job (`optimizer` in the annotation). It decides
/// how many bytes of state each parameter keeps (see [`crate::analytic`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum Optimizer {
    /// Plain SGD: weights and gradients.
    Sgd,
    /// SGD with momentum (or Nesterov): one momentum buffer per parameter.
    SgdMomentum,
    /// Adam or AdamW: two moment buffers per parameter. The default when
    /// `optimizer` is absent, because it keeps the most state.
    #[serde(alias = "adamW", alias = "adamw")]
    Adam,
}

impl Optimizer {
    /// The name used in JSON.
    pub fn as_str(self) -> &'static str {
        match self {
            Optimizer::Sgd => "sgd",
            Optimizer::SgdMomentum => "sgdMomentum",
            Optimizer::Adam => "adam",
        }
    }
}
