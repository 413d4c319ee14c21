//! A prior for the SM activity a training job keeps busy when it runs alone, by model class.
//!
//! `pack` (carma's own placement policy) prefers to collocate pods whose expected activities add up
//! to at most the gate's cap. Before a job runs, its profile is all carma knows; once it runs,
//! `pack` reads the larger of the GPU's measured activity and the priors booked there: telemetry
//! raises a GPU's load when a job is busier than expected, and never lowers it below the booked
//! priors. The prior is deliberately coarse — one figure per class, batch size ignored — because
//! carma has no per-model measurements yet (CARMA published none):
//!
//! | class | rule | prior |
//! |---|---|---|
//! | Transformer | family `transformer` | 0.80 (fills the SMs; CARMA saw large models gain almost nothing from collocation) |
//! | ImageNet-size CNN | family `cnn`, at least 2,000,000 activations per sample | 0.60 |
//! | small CNN | family `cnn`, fewer (CIFAR/MNIST inputs: at most ~0.7 M in CARMA's models, ImageNet models 20 M or more) | 0.20 (CARMA: ~5× throughput collocated) |
//! | MLP | family `mlp` (e.g. DLRM: bound by embeddings and the host) | 0.35 |
//!
//! A pod's `carma.io/sm-activity` annotation overrides the prior.

use crate::{Family, Profile};

/// Activations per sample from which a CNN counts as ImageNet-size.
pub const LARGE_CNN_ACTIVATIONS: u64 = 2_000_000;

/// The expected SM activity (0..1) of a job with `profile` running alone.
pub fn expected_sm_activity(profile: &Profile) -> f64 {
    match profile.family {
        Family::Transformer => 0.80,
        Family::Cnn if profile.activations >= LARGE_CNN_ACTIVATIONS => 0.60,
        Family::Cnn => 0.20,
        Family::Mlp => 0.35,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn profile(family: Family, activations: u64) -> Profile {
        let json = format!(
            r#"{{"family":"{}","batchSize":64,"parameters":1000000,"activations":{activations},"depth":4,"seqLength":128}}"#,
            family.as_str()
        );
        crate::parse_profile(&json).unwrap()
    }

    #[test]
    fn classes_get_their_priors() {
        assert_eq!(expected_sm_activity(&profile(Family::Cnn, 200_540)), 0.20);
        assert_eq!(
            expected_sm_activity(&profile(Family::Cnn, 37_560_000)),
            0.60
        );
        assert_eq!(
            expected_sm_activity(&profile(Family::Transformer, 1_000)),
            0.80
        );
        assert_eq!(expected_sm_activity(&profile(Family::Mlp, 3_137)), 0.35);
    }
}
