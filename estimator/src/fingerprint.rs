//! The fingerprint of a model profile run on a number of GPUs per pod: the key under which the
//! cluster records what runs of that model really used (`MemoryHistory`, one object per
//! fingerprint). The GPU count is part of it: a model split across GPUs peaks lower on each.
//!
//! Two annotations that describe the same training job must get the same fingerprint, however
//! they are written: the fingerprint is taken over the profile's *effective* values (depth
//! derived from layers, default optimizer and precision, activation name in lower case), in a
//! fixed order, so key order, whitespace and spelled-out defaults do not matter. It is a
//! truncated SHA-256, so no two different profiles share a record by accident or by a crafted
//! collision; a user who declares the *same* profile does share it (records are cluster-wide).

use sha2::{Digest, Sha256};

use crate::Profile;

/// Version of the canonical form; a change of form must change it (records start afresh).
const FORM: &str = "carma-profile-v2";

impl Profile {
    /// The fingerprint of this profile run with `gpus` GPUs per pod: 32 lower-case hex digits
    /// (128 bits of SHA-256), usable as a Kubernetes object name.
    pub fn fingerprint(&self, gpus: u32) -> String {
        let l = &self.layers;
        let canonical = format!(
            "{FORM}|family={}|batchSize={}|parameters={}|activations={}|depth={}|activation={}|\
             linear={}|conv2d={}|batchNorm={}|dropout={}|layerNorm={}|attention={}|adaptiveAvgPool={}|\
             seqLength={}|optimizer={}|mixedPrecision={}|gpus={gpus}",
            self.family.as_str(),
            self.batch_size,
            self.parameters,
            self.activations,
            self.effective_depth(),
            self.activation_name().trim().to_ascii_lowercase(),
            l.linear,
            l.conv2d,
            l.batch_norm,
            l.dropout,
            l.layer_norm,
            l.attention,
            l.adaptive_avg_pool,
            self.seq_length.map_or_else(String::new, |s| s.to_string()),
            self.effective_optimizer().as_str(),
            self.is_mixed_precision(),
        );
        let digest = Sha256::digest(canonical.as_bytes());
        digest[..16].iter().map(|b| format!("{b:02x}")).collect()
    }
}

#[cfg(test)]
mod tests {
    use crate::parse_profile;

    fn fp(json: &str) -> String {
        parse_profile(json).unwrap().fingerprint(1)
    }

    #[test]
    fn same_job_same_fingerprint_however_written() {
        let a = fp(
            r#"{"family":"mlp","batchSize":64,"parameters":2500000,"activations":6000,"layers":{"linear":5,"dropout":1}}"#,
        );
        let b = fp(
            r#"{ "layers": {"dropout":1, "linear":5, "conv2d":0}, "activations":6000, "parameters":2500000,
                "batchSize":64, "family":"mlp", "depth":5, "activation":"relu", "optimizer":"adam",
                "mixedPrecision":false }"#,
        );
        assert_eq!(a, b);
        assert_eq!(a.len(), 32);
        assert!(
            a.chars()
                .all(|c| c.is_ascii_hexdigit() && !c.is_ascii_uppercase())
        );
    }

    #[test]
    fn anything_the_memory_depends_on_changes_it() {
        let base = r#"{"family":"mlp","batchSize":64,"parameters":2500000,"activations":6000,"layers":{"linear":5}}"#;
        let others = [
            r#"{"family":"mlp","batchSize":128,"parameters":2500000,"activations":6000,"layers":{"linear":5}}"#,
            r#"{"family":"mlp","batchSize":64,"parameters":2500001,"activations":6000,"layers":{"linear":5}}"#,
            r#"{"family":"mlp","batchSize":64,"parameters":2500000,"activations":6001,"layers":{"linear":5}}"#,
            r#"{"family":"mlp","batchSize":64,"parameters":2500000,"activations":6000,"layers":{"linear":6}}"#,
            r#"{"family":"mlp","batchSize":64,"parameters":2500000,"activations":6000,"layers":{"linear":5},"optimizer":"sgd"}"#,
            r#"{"family":"mlp","batchSize":64,"parameters":2500000,"activations":6000,"layers":{"linear":5},"mixedPrecision":true}"#,
            r#"{"family":"mlp","batchSize":64,"parameters":2500000,"activations":6000,"layers":{"linear":5},"activation":"GELU"}"#,
            r#"{"family":"cnn","batchSize":64,"parameters":2500000,"activations":6000,"layers":{"linear":5}}"#,
            r#"{"family":"mlp","batchSize":64,"parameters":2500000,"activations":6000,"layers":{"linear":5},"depth":7}"#,
            r#"{"family":"mlp","batchSize":64,"parameters":2500000,"activations":6000,"layers":{"linear":5,"dropout":2}}"#,
            r#"{"family":"mlp","batchSize":64,"parameters":2500000,"activations":6000,"layers":{"linear":5,"batchNorm":1}}"#,
            r#"{"family":"mlp","batchSize":64,"parameters":2500000,"activations":6000,"layers":{"linear":5},"seqLength":128}"#,
        ];
        let b = fp(base);
        for o in others {
            assert_ne!(fp(o), b, "{o}");
        }
        let p = parse_profile(base).unwrap();
        assert_ne!(p.fingerprint(2), p.fingerprint(1), "GPUs per pod");
    }
}
