//! GPUMemNet's model features, computed from a [`Profile`].
//!
//! A model's sidecar lists its feature names in input order; [`feature_row`]
//! computes each named feature, so the order lives in one place (the sidecar the
//! training pipeline writes) and Rust only knows what each name means.

use crate::profile::Profile;

/// GPUMemNet's activation-function order for the MLP family (N = 11).
pub const MLP_ACTIVATIONS: [&str; 11] = [
    "ELU",
    "GELU",
    "Identity",
    "LeakyReLU",
    "Mish",
    "PReLU",
    "ReLU",
    "SELU",
    "SiLU",
    "Softplus",
    "Tanh",
];

/// GPUMemNet's activation-function order for the CNN family (N = 10: no `Identity`).
pub const CNN_ACTIVATIONS: [&str; 10] = [
    "ELU",
    "GELU",
    "LeakyReLU",
    "Mish",
    "PReLU",
    "ReLU",
    "SELU",
    "SiLU",
    "Softplus",
    "Tanh",
];

/// Maps an activation name onto `known`: case-insensitive, `ReLU6` counts as
/// `ReLU`. Returns the index, or `None` when the name is not in the list.
pub fn activation_index(name: &str, known: &[impl AsRef<str>]) -> Option<usize> {
    let n = name.trim();
    let n = if n.eq_ignore_ascii_case("relu6") {
        "ReLU"
    } else {
        n
    };
    known
        .iter()
        .position(|k| k.as_ref().eq_ignore_ascii_case(n))
}

/// `(sin(iπ/N), cos(iπ/N))` for the activation's index `i` in `known` (length N).
/// Unknown names count as `ReLU` (GPUMemNet's default), with a warning.
pub fn encode_activation(name: &str, known: &[impl AsRef<str>]) -> (f64, f64) {
    let i = activation_index(name, known).unwrap_or_else(|| {
        tracing::warn!(
            activation = name,
            "unknown activation function; counting it as ReLU"
        );
        activation_index("ReLU", known).unwrap_or(0)
    });
    let angle = i as f64 * std::f64::consts::PI / known.len().max(1) as f64;
    (angle.sin(), angle.cos())
}

/// The value of one named feature for `p`, or `None` for an unknown name.
/// `activations` is the activation list for `act_sin` / `act_cos`.
pub fn feature_value(p: &Profile, name: &str, activations: &[impl AsRef<str>]) -> Option<f64> {
    let l = &p.layers;
    Some(match name {
        "depth" => f64::from(p.effective_depth()),
        "batch_size" => f64::from(p.batch_size),
        "total_parameters" => p.parameters as f64,
        "total_activations" => p.activations as f64,
        "activations_x_batch" => p.activations as f64 * f64::from(p.batch_size),
        "batch_norm_layers" => f64::from(l.batch_norm),
        "dropout_layers" => f64::from(l.dropout),
        "conv2d_layers" => f64::from(l.conv2d),
        "linear_layers" => f64::from(l.linear),
        "attention_layers" => f64::from(l.attention),
        "layer_norm_layers" => f64::from(l.layer_norm),
        "adaptive_avg_pool_layers" => f64::from(l.adaptive_avg_pool),
        "act_sin" => encode_activation(p.activation_name(), activations).0,
        "act_cos" => encode_activation(p.activation_name(), activations).1,
        _ => return None,
    })
}

/// Appends the features `names` of `p` (as f32, the model's input type) to `out`.
/// Names must have been checked with [`feature_value`] beforehand; an unknown
/// name yields `NaN`.
pub fn feature_row(
    p: &Profile,
    names: &[String],
    activations: &[impl AsRef<str>],
    out: &mut Vec<f32>,
) {
    let (sin, cos) = encode_activation(p.activation_name(), activations);
    for n in names {
        let v = match n.as_str() {
            "act_sin" => sin,
            "act_cos" => cos,
            other => feature_value(p, other, activations).unwrap_or(f64::NAN),
        };
        out.push(v as f32);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::profile::{Family, Layers};

    /// The names [`feature_value`] understands, per family, in GPUMemNet's order.
    fn default_feature_names(family: Family) -> &'static [&'static str] {
        match family {
            Family::Mlp => &[
                "depth",
                "batch_size",
                "total_parameters",
                "total_activations",
                "batch_norm_layers",
                "dropout_layers",
                "act_sin",
                "act_cos",
            ],
            Family::Cnn => &[
                "depth",
                "total_activations",
                "activations_x_batch",
                "total_parameters",
                "batch_size",
                "conv2d_layers",
                "batch_norm_layers",
                "dropout_layers",
                "act_sin",
                "act_cos",
            ],
            Family::Transformer => &[
                "depth",
                "total_activations",
                "activations_x_batch",
                "total_parameters",
                "batch_size",
                "attention_layers",
                "linear_layers",
                "layer_norm_layers",
                "dropout_layers",
            ],
        }
    }

    fn mlp(act: &str) -> Profile {
        Profile {
            family: Family::Mlp,
            batch_size: 64,
            parameters: 1000,
            activations: 50,
            depth: Some(3),
            activation: Some(act.to_string()),
            layers: Layers {
                batch_norm: 2,
                dropout: 1,
                ..Layers::default()
            },
            seq_length: None,
            optimizer: None,
            mixed_precision: None,
            traced: None,
            layer_reading: None,
            caveats: Vec::new(),
        }
    }

    #[test]
    fn activation_encoding_follows_gpumemnet_order() {
        let (s, c) = encode_activation("ELU", &MLP_ACTIVATIONS);
        assert!((s - 0.0).abs() < 1e-12 && (c - 1.0).abs() < 1e-12);
        let (s, c) = encode_activation("relu", &MLP_ACTIVATIONS);
        let a = 6.0 * std::f64::consts::PI / 11.0;
        assert!((s - a.sin()).abs() < 1e-12 && (c - a.cos()).abs() < 1e-12);
        assert_eq!(
            encode_activation("ReLU6", &MLP_ACTIVATIONS),
            encode_activation("ReLU", &MLP_ACTIVATIONS)
        );
        assert_eq!(
            encode_activation("Swishy", &MLP_ACTIVATIONS),
            encode_activation("ReLU", &MLP_ACTIVATIONS)
        );
        // CNN list has no Identity: ReLU is index 5 of 10.
        let (s, _) = encode_activation("ReLU", &CNN_ACTIVATIONS);
        assert!((s - (5.0 * std::f64::consts::PI / 10.0).sin()).abs() < 1e-12);
    }

    #[test]
    fn mlp_row_is_in_gpumemnet_order() {
        let names: Vec<String> = default_feature_names(Family::Mlp)
            .iter()
            .map(|s| s.to_string())
            .collect();
        let mut row = Vec::new();
        feature_row(&mlp("Tanh"), &names, &MLP_ACTIVATIONS, &mut row);
        assert_eq!(&row[..6], &[3.0, 64.0, 1000.0, 50.0, 2.0, 1.0]);
        let a = 10.0 * std::f64::consts::PI / 11.0;
        assert!((f64::from(row[6]) - a.sin()).abs() < 1e-6);
        assert!((f64::from(row[7]) - a.cos()).abs() < 1e-6);
    }

    #[test]
    fn every_default_name_is_known() {
        for f in Family::ALL {
            for n in default_feature_names(f) {
                assert!(
                    feature_value(&mlp("ReLU"), n, &MLP_ACTIVATIONS).is_some(),
                    "{n}"
                );
            }
        }
        assert!(feature_value(&mlp("ReLU"), "colour", &MLP_ACTIVATIONS).is_none());
    }
}
