//! Model descriptions for the estimator: a catalog architecture plus a batch
//! size is exactly the `carma.io/model-profile` annotation the extender reads
//! (`carma_estimator::Profile`), so the simulator estimates each task as the
//! extender would.

use carma_estimator::{Family, Layers, Profile};

/// An architecture without a batch size: what the catalog stores per model.
#[derive(Debug, Clone, PartialEq)]
pub struct Architecture {
    /// Family.
    pub family: Family,
    /// Trainable parameters.
    pub parameters: u64,
    /// Sum of layer output sizes for one sample (sequence dimension included).
    pub activations: u64,
    /// Activation function name (GPUMemNet's list).
    pub activation: &'static str,
    /// Layer counts.
    pub layers: Layers,
    /// Sequence length (Transformers).
    pub seq_length: Option<u32>,
}

impl Architecture {
    /// The profile annotation of this architecture trained at `batch_size`; the
    /// depth is left for the estimator to derive from the layer counts.
    pub fn profile(&self, batch_size: u32) -> Profile {
        Profile {
            family: self.family,
            batch_size,
            parameters: self.parameters,
            activations: self.activations,
            depth: None,
            activation: Some(self.activation.to_string()),
            layers: self.layers.clone(),
            seq_length: self.seq_length,
            optimizer: None,
            mixed_precision: None,
            traced: None,
            layer_reading: None,
            caveats: Vec::new(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn profile_round_trips_through_the_annotation_parser() {
        let a = Architecture {
            family: Family::Cnn,
            parameters: 11_227_812,
            activations: 200_540,
            activation: "ReLU",
            layers: Layers {
                conv2d: 20,
                batch_norm: 20,
                linear: 1,
                adaptive_avg_pool: 1,
                ..Layers::default()
            },
            seq_length: None,
        };
        let p = a.profile(64);
        let json = serde_json::to_string(&p).unwrap();
        assert_eq!(carma_estimator::parse_profile(&json).unwrap(), p);
        assert_eq!(p.effective_depth(), 42);
    }
}
