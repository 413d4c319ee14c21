//! The `carma.io/model-profile` parser: valid input, and every kind of bad input
//! rejected with a message that names the key.

use carma_estimator::{Family, ProfileError, parse_profile};
use proptest::prelude::*;

const FULL: &str = r#"{
  "family": "transformer", "batchSize": 16, "parameters": 110000000,
  "activations": 9000000, "depth": 12, "activation": "GELU",
  "layers": {"linear": 48, "conv2d": 0, "batchNorm": 0, "dropout": 25,
             "layerNorm": 25, "attention": 12, "adaptiveAvgPool": 0},
  "seqLength": 512
}"#;

#[test]
fn full_profile_parses() {
    let p = parse_profile(FULL).unwrap();
    assert_eq!(p.family, Family::Transformer);
    assert_eq!(p.batch_size, 16);
    assert_eq!(p.parameters, 110_000_000);
    assert_eq!(p.layers.attention, 12);
    assert_eq!(p.layers.layer_norm, 25);
    assert_eq!(p.seq_length, Some(512));
    // round trip through serde keeps camelCase
    let json = serde_json::to_string(&p).unwrap();
    assert!(
        json.contains("\"batchSize\":16") && json.contains("\"layerNorm\":25"),
        "{json}"
    );
    assert_eq!(parse_profile(&json).unwrap(), p);
}

#[test]
fn minimal_profile_uses_documented_defaults() {
    let p = parse_profile(
        r#"{"family":"cnn","batchSize":32,"parameters":5,"activations":7,
        "layers":{"conv2d":3,"batchNorm":2,"linear":1,"adaptiveAvgPool":1,"dropout":1}}"#,
    )
    .unwrap();
    assert_eq!(p.activation_name(), "ReLU");
    assert_eq!(p.effective_depth(), 8); // conv2d + bn + dropout + pool + linear
    let p = parse_profile(
        r#"{"family":"mlp","batchSize":1,"parameters":5,"activations":7,"layers":{"linear":4}}"#,
    )
    .unwrap();
    assert_eq!(p.effective_depth(), 4);
}

fn err(json: &str) -> ProfileError {
    parse_profile(json).expect_err(json)
}

#[test]
fn unknown_keys_are_named() {
    let e =
        err(r#"{"family":"mlp","batchSize":1,"parameters":5,"activations":7,"depth":2,"gpus":1}"#);
    assert!(
        matches!(&e, ProfileError::UnknownKey { key, path, .. } if key == "gpus" && path.is_empty()),
        "{e:?}"
    );
    assert!(e.to_string().contains("`gpus`"), "{e}");
    let e = err(
        r#"{"family":"mlp","batchSize":1,"parameters":5,"activations":7,"depth":2,"layers":{"lstm":1}}"#,
    );
    assert!(
        matches!(&e, ProfileError::UnknownKey { key, path, .. } if key == "lstm" && path == "layers"),
        "{e:?}"
    );
    assert!(
        e.to_string().contains("`lstm`") && e.to_string().contains("layers"),
        "{e}"
    );
    // snake_case is not the schema
    let e = err(r#"{"family":"mlp","batch_size":1,"parameters":5,"activations":7,"depth":2}"#);
    assert!(e.to_string().contains("`batch_size`"), "{e}");
}

#[test]
fn wrong_types_are_named() {
    for (json, key) in [
        (
            r#"{"family":"mlp","batchSize":"32","parameters":5,"activations":7,"depth":2}"#,
            "batchSize",
        ),
        (
            r#"{"family":"mlp","batchSize":32.5,"parameters":5,"activations":7,"depth":2}"#,
            "batchSize",
        ),
        (
            r#"{"family":"mlp","batchSize":-1,"parameters":5,"activations":7,"depth":2}"#,
            "batchSize",
        ),
        (
            r#"{"family":"mlp","batchSize":1,"parameters":5e99,"activations":7,"depth":2}"#,
            "parameters",
        ),
        (
            r#"{"family":"mlp","batchSize":1,"parameters":5,"activations":null,"depth":2}"#,
            "activations",
        ),
        (
            r#"{"family":"gpu","batchSize":1,"parameters":5,"activations":7,"depth":2}"#,
            "family",
        ),
        (
            r#"{"family":"mlp","batchSize":1,"parameters":5,"activations":7,"activation":3}"#,
            "activation",
        ),
        (
            r#"{"family":"mlp","batchSize":1,"parameters":5,"activations":7,"layers":{"conv2d":"x"}}"#,
            "layers.conv2d",
        ),
        (
            r#"{"family":"mlp","batchSize":1,"parameters":5,"activations":7,"layers":[1]}"#,
            "layers",
        ),
        (
            r#"{"family":"mlp","batchSize":4294967296,"parameters":5,"activations":7,"depth":2}"#,
            "batchSize",
        ),
    ] {
        let e = err(json);
        assert!(
            matches!(&e, ProfileError::WrongType { key: k, .. } if k == key),
            "{json}: {e:?}"
        );
        assert!(e.to_string().contains(&format!("`{key}`")), "{e}");
    }
}

#[test]
fn missing_keys_are_named() {
    let e = err(r#"{"family":"mlp","batchSize":1,"activations":7,"depth":2}"#);
    assert!(
        matches!(&e, ProfileError::MissingKey { key, .. } if key == "parameters"),
        "{e:?}"
    );
    let e = err(r#"{"batchSize":1,"parameters":1,"activations":7,"depth":2}"#);
    assert!(e.to_string().contains("`family`"), "{e}");
}

#[test]
fn invalid_values_are_named() {
    for (json, key) in [
        (
            r#"{"family":"mlp","batchSize":0,"parameters":5,"activations":7,"depth":2}"#,
            "batchSize",
        ),
        (
            r#"{"family":"mlp","batchSize":1,"parameters":0,"activations":7,"depth":2}"#,
            "parameters",
        ),
        (
            r#"{"family":"mlp","batchSize":1,"parameters":5,"activations":0,"depth":2}"#,
            "activations",
        ),
        (
            r#"{"family":"mlp","batchSize":1,"parameters":5,"activations":7}"#,
            "depth",
        ),
        (
            r#"{"family":"mlp","batchSize":1,"parameters":5,"activations":7,"depth":2,"activation":" "}"#,
            "activation",
        ),
        (
            r#"{"family":"transformer","batchSize":1,"parameters":5,"activations":7,"depth":2,"seqLength":0}"#,
            "seqLength",
        ),
    ] {
        let e = err(json);
        assert!(
            matches!(&e, ProfileError::Invalid { key: k, .. } if k == key),
            "{json}: {e:?}"
        );
    }
}

#[test]
fn syntax_errors() {
    for json in [
        "",
        "{",
        "[1,2]",
        "42",
        "\"mlp\"",
        r#"{"family":"mlp"} trailing"#,
        "{'family':'mlp'}",
    ] {
        let e = err(json);
        assert!(
            matches!(
                e,
                ProfileError::Syntax { .. } | ProfileError::MissingKey { .. }
            ),
            "{json}: {e:?}"
        );
    }
    let e = err(r#"{"family":"mlp","batchSize":1,"parameters":5,"activations":7,"depth":2} x"#);
    assert!(matches!(e, ProfileError::Syntax { .. }), "{e:?}");
}

proptest! {
    #[test]
    fn arbitrary_text_never_panics(s in ".{0,200}") {
        let _ = parse_profile(&s);
    }

    #[test]
    fn arbitrary_numbers_round_trip(batch in 1u32.., params in 1u64.., acts in 1u64.., depth in 1u32..) {
        let json = format!(r#"{{"family":"mlp","batchSize":{batch},"parameters":{params},"activations":{acts},"depth":{depth}}}"#);
        let p = parse_profile(&json).unwrap();
        prop_assert_eq!((p.batch_size, p.parameters, p.activations, p.depth), (batch, params, acts, Some(depth)));
    }
}
