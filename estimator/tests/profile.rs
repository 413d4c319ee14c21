//! The `carma.io/model-profile` parser: valid input, and every kind of bad input
//! rejected with a message that names the key.

use carma_estimator::{
    Family, MAX_BATCH_SIZE, MAX_LAYERS, MAX_PARAMETERS, ProfileError, parse_profile,
};
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
    // Activations up to 10^8 keep the job under the 1 PiB bound at any batch size.
    fn arbitrary_numbers_round_trip(batch in 1..=MAX_BATCH_SIZE, params in 1..=MAX_PARAMETERS, acts in 1u64..=100_000_000, depth in 1..=MAX_LAYERS) {
        let json = format!(r#"{{"family":"mlp","batchSize":{batch},"parameters":{params},"activations":{acts},"depth":{depth}}}"#);
        let p = parse_profile(&json).unwrap();
        prop_assert_eq!((p.batch_size, p.parameters, p.activations, p.depth), (batch, params, acts, Some(depth)));
    }
}

/// Absurd values used to be accepted and answered with exit 0 (all-maximum fields
/// gave an estimate of u64::MAX MiB). Each is refused naming the key and its range.
#[test]
fn out_of_range_values_are_named_with_their_range() {
    let base = serde_json::json!({"family":"transformer","batchSize":8,"parameters":1000000,"activations":1000,"depth":4});
    for (extra, key, range) in [
        (
            r#""batchSize":4294967295"#,
            "batchSize",
            "between 1 and 1048576",
        ),
        (
            r#""parameters":18446744073709551615"#,
            "parameters",
            "between 1 and 1000000000000",
        ),
        (
            r#""activations":18446744073709551615"#,
            "activations",
            "between 1 and 1000000000000",
        ),
        (r#""depth":4294967295"#, "depth", "between 1 and 100000"),
        (
            r#""layers":{"attention":4294967295}"#,
            "layers.attention",
            "at most 100000",
        ),
        (
            r#""seqLength":4294967295"#,
            "seqLength",
            "between 1 and 1048576",
        ),
        (
            r#""activation":"Bogus""#,
            "activation",
            "not a torch.nn activation",
        ),
        // Each field in range, the job as a whole more than 1 PiB.
        (
            r#""batchSize":1048576,"activations":1000000000000"#,
            "batchSize",
            "1 PiB",
        ),
    ] {
        let mut v = base.clone();
        let extra: serde_json::Value = serde_json::from_str(&format!("{{{extra}}}")).unwrap();
        for (k, x) in extra.as_object().unwrap() {
            v[k] = x.clone();
        }
        let json = v.to_string();
        let e = err(&json);
        assert!(
            matches!(&e, ProfileError::Invalid { key: k, .. } if k == key),
            "{json}: {e:?}"
        );
        assert!(e.to_string().contains(range), "{json}: {e}");
    }
    let all_max = r#"{"family":"transformer","batchSize":4294967295,"parameters":18446744073709551615,
        "activations":18446744073709551615,"depth":4294967295,"seqLength":4294967295,
        "layers":{"attention":4294967295}}"#;
    assert!(matches!(err(all_max), ProfileError::Invalid { .. }));
    // Real names GPUMemNet lacks are accepted (they count as ReLU), in any case.
    for name in ["Hardswish", "sigmoid", "ReLU6", "Identity"] {
        let mut v = base.clone();
        v["activation"] = name.into();
        let json = v.to_string();
        parse_profile(&json).unwrap_or_else(|e| panic!("{name}: {e}"));
    }
}

#[test]
fn optimizer_and_mixed_precision_are_optional() {
    use carma_estimator::Optimizer;
    let base =
        r#""family":"cnn","batchSize":32,"parameters":25600000,"activations":23000000,"depth":100"#;
    let p = parse_profile(&format!("{{{base}}}")).unwrap();
    assert_eq!((p.optimizer, p.mixed_precision), (None, None));
    assert_eq!(p.effective_optimizer(), Optimizer::Adam);
    assert!(!p.is_mixed_precision());
    for (name, want) in [
        ("sgd", Optimizer::Sgd),
        ("sgdMomentum", Optimizer::SgdMomentum),
        ("adam", Optimizer::Adam),
        ("adamw", Optimizer::Adam),
    ] {
        let p = parse_profile(&format!(
            r#"{{{base},"optimizer":"{name}","mixedPrecision":true}}"#
        ))
        .unwrap();
        assert_eq!(p.optimizer, Some(want), "{name}");
        assert_eq!(p.mixed_precision, Some(true));
    }
    // a smaller state and halved activations give a smaller bound
    let lean = parse_profile(&format!(
        r#"{{{base},"optimizer":"sgd","mixedPrecision":true}}"#
    ))
    .unwrap();
    assert!(
        carma_estimator::analytic_upper_bound_mib(&lean)
            < carma_estimator::analytic_upper_bound_mib(&p)
    );
    let e = parse_profile(&format!(r#"{{{base},"optimizer":"lbfgs"}}"#)).unwrap_err();
    assert!(e.to_string().contains("optimizer"), "{e}");
    let e = parse_profile(&format!(r#"{{{base},"mixedPrecision":"yes"}}"#)).unwrap_err();
    assert!(e.to_string().contains("mixedPrecision"), "{e}");
}

#[test]
fn a_layer_reading_is_validated_by_name_and_read_in_place_of_the_totals() {
    let base = r#"{"family":"transformer","batchSize":16,"parameters":124439808,"activations":211329536,"depth":123,"seqLength":512"#;
    let reading = r#""layerReading":{"savedValues":106340864,"keptFp32Values":153871872,"largestValues":25731584}"#;
    let p = parse_profile(&format!("{base},{reading}}}")).unwrap();
    let r = p.layer_reading.unwrap();
    assert_eq!((r.score_values, r.kept_fp32_values), (0, 153_871_872));
    let est = carma_estimator::Estimator::new().unwrap();
    let e = est.estimate(&p).unwrap();
    let detailed = carma_estimator::analytic::detailed_bound(&p, &r.values());
    assert_eq!(e.mib, detailed.total_mib);
    // GPT-2 measured 19,644 MiB on an H100: the reading gives 19,456; the totals, with no
    // layer counts given here, 17,664
    assert_eq!(
        (
            e.mib,
            carma_estimator::analytic::analytic_upper_bound_mib(&p)
        ),
        (19_456, 17_664)
    );
    // per GPU of a 2-GPU pod, the multi-GPU term is added
    assert_eq!(
        est.estimate_for(&p, 2).unwrap().mib,
        carma_estimator::analytic::detailed_bound_for(&p, &r.values(), 2).total_mib
    );
    // bad readings are refused by their key
    for (bad, key) in [
        (
            r#""layerReading":{"savedValues":0,"largestValues":1}"#,
            "layerReading.savedValues",
        ),
        (
            r#""layerReading":{"savedValues":1,"largestValues":1000000000001}"#,
            "layerReading.largestValues",
        ),
        (
            r#""layerReading":{"savedValues":1,"largestValues":1,"rows":3}"#,
            "`rows` (in `layerReading`)",
        ),
        (r#""layerReading":[1,2]"#, "layerReading"),
    ] {
        let e = err(&format!("{base},{bad}}}"));
        assert!(e.to_string().contains(key), "{bad}: {e}");
    }
}
