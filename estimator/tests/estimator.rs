//! Estimator behaviour: sources, the safe-side rule, the range guard, load-time
//! checks, batching and sharing across threads.

mod common;

use carma_estimator::{
    DecisionRule, EMBEDDED_MODELS, EstimateError, EstimateSource, Estimator, EstimatorError,
    Family, ModelError, ModelParts, parse_profile,
};

fn mlp(batch: u32, params: u64, acts: u64) -> carma_estimator::Profile {
    parse_profile(&format!(
        r#"{{"family":"mlp","batchSize":{batch},"parameters":{params},"activations":{acts},"depth":4,"activation":"ReLU","layers":{{"linear":4}}}}"#
    ))
    .unwrap()
}

#[test]
fn estimator_is_shareable() {
    fn check<T: Clone + Send + Sync + 'static>() {}
    check::<Estimator>();
    let est = Estimator::new().unwrap();
    let handles: Vec<_> = (0..4)
        .map(|i| {
            let est = est.clone();
            std::thread::spawn(move || est.estimate(&mlp(32 + i, 1_000_000, 5_000)).unwrap().mib)
        })
        .collect();
    for h in handles {
        assert_eq!(h.join().unwrap(), 2000);
    }
}

#[test]
fn mlp_estimates_use_the_model_and_class_edges() {
    let est = Estimator::new().unwrap();
    let small = est.estimate(&mlp(64, 100_000, 2_000)).unwrap();
    assert_eq!(small.source, EstimateSource::GpumemnetMlp);
    assert_eq!((small.mib, small.class.as_str()), (2000, "(1000,2000]"));
    assert_eq!(small.probabilities.len(), 5);
    assert!((small.probabilities.iter().sum::<f32>() - 1.0).abs() < 1e-4);
    // ~100 M parameters at 24 B each is > 2 GiB on top of the context
    let big = est.estimate(&mlp(512, 100_000_000, 50_000)).unwrap();
    assert_eq!(big.source, EstimateSource::GpumemnetMlp);
    assert!(big.mib >= 4000, "{big:?}");
    // monotone in size
    assert!(big.mib > small.mib);
}

#[test]
fn beyond_training_range_falls_back_to_the_analytic_bound() {
    let est = Estimator::new().unwrap();
    // 2 G parameters: far beyond the largest training net (155 M)
    let e = est.estimate(&mlp(256, 2_000_000_000, 100_000)).unwrap();
    assert_eq!(e.source, EstimateSource::AnalyticUpperBound);
    // at least Adam's 20 B of state per parameter
    assert!(e.mib > 2_000_000_000 * 20 / (1 << 20), "{e:?}");
    assert_eq!(e.class, format!("(0,{}]", e.mib));
    assert_eq!(
        e.probabilities.len(),
        5,
        "the model's view is still reported"
    );
}

#[test]
fn families_without_a_model_use_the_analytic_bound() {
    let est = Estimator::new().unwrap();
    let p = parse_profile(
        r#"{"family":"cnn","batchSize":32,"parameters":25600000,"activations":23000000,"depth":100}"#,
    )
    .unwrap();
    let e = est.estimate(&p).unwrap();
    assert_eq!(e.source, EstimateSource::AnalyticUpperBound);
    assert_eq!(e.mib, carma_estimator::analytic_upper_bound_mib(&p));
    assert!(e.probabilities.is_empty());
    let json = serde_json::to_value(&e).unwrap();
    assert_eq!(json["source"], "analytic-upper-bound");
    let m = est.estimate(&mlp(8, 1000, 100)).unwrap();
    assert_eq!(serde_json::to_value(&m).unwrap()["source"], "gpumemnet-mlp");
}

#[test]
fn invalid_profiles_are_errors_not_panics() {
    let est = Estimator::new().unwrap();
    let mut p = mlp(8, 1000, 100);
    p.batch_size = 0;
    let e = est.estimate(&p).unwrap_err();
    assert!(matches!(e, EstimateError::InvalidProfile(_)));
    assert!(e.to_string().contains("batchSize"), "{e}");
}

#[test]
fn batch_equals_single() {
    let est = Estimator::new().unwrap();
    let mut profiles: Vec<_> = (0..50u64)
        .map(|i| mlp(4 + 20 * i as u32, 10_000 + 3_000_000 * i, 100 + 1_000 * i))
        .collect();
    profiles.push(parse_profile(r#"{"family":"transformer","batchSize":8,"parameters":1000,"activations":10,"depth":2}"#).unwrap());
    let mut bad = mlp(8, 1000, 100);
    bad.parameters = 0;
    profiles.insert(3, bad);
    let batch = est.estimate_batch(&profiles);
    assert_eq!(batch.len(), profiles.len());
    for (p, b) in profiles.iter().zip(&batch) {
        match (est.estimate(p), b) {
            (Ok(single), Ok(b)) => {
                assert_eq!(
                    (single.mib, &single.class, single.source),
                    (b.mib, &b.class, b.source)
                );
                for (x, y) in single.probabilities.iter().zip(&b.probabilities) {
                    assert!((x - y).abs() < 1e-5);
                }
            }
            (Err(_), Err(_)) => {}
            other => panic!("single and batch disagree: {other:?}"),
        }
    }
}

#[test]
fn decision_rule_prefers_the_higher_class_when_unsure() {
    let r = DecisionRule::CumulativeProbability { threshold: 0.8 };
    assert_eq!(r.choose(&[0.9, 0.1, 0.0]), 0);
    assert_eq!(r.choose(&[0.7, 0.3, 0.0]), 1); // argmax would say 0
    assert_eq!(r.choose(&[0.5, 0.2, 0.3]), 2);
    assert_eq!(r.choose(&[0.1, 0.1, 0.1]), 2); // never reaches: top class
    assert_eq!(r.choose(&[0.8, 0.2]), 0); // >= is inclusive
    assert_eq!(DecisionRule::Argmax.choose(&[0.2, 0.5, 0.3]), 1);
    assert_eq!(DecisionRule::Argmax.choose(&[0.5, 0.5]), 0);
    assert_eq!(r.choose(&[]), 0);
}

fn sidecar_with(edit: impl FnOnce(&mut serde_json::Value)) -> String {
    let mut v = common::sidecar();
    edit(&mut v);
    v.to_string()
}

#[test]
fn load_checks_input_width_against_the_sidecar() {
    let onnx = EMBEDDED_MODELS[0].onnx;
    let sidecar = sidecar_with(|v| {
        v["features"].as_array_mut().unwrap().pop();
        v["training_max"]
            .as_object_mut()
            .unwrap()
            .remove("dropout_layers");
    });
    // act_cos removed: 7 features for an 8-wide model
    let parts = [ModelParts {
        family: Family::Mlp,
        onnx,
        sidecar: &sidecar,
    }];
    let err = Estimator::from_parts(&parts).unwrap_err();
    assert!(
        matches!(
            err,
            EstimatorError::Model(ModelError::WidthMismatch {
                model_width: 8,
                features: 7,
                ..
            })
        ),
        "{err:?}"
    );
    assert!(
        err.to_string().contains("8 features") && err.to_string().contains("lists 7"),
        "{err}"
    );
}

#[test]
fn load_checks_classes_and_sidecar_consistency() {
    let onnx = EMBEDDED_MODELS[0].onnx;
    let load = |s: String| {
        Estimator::from_parts(&[ModelParts {
            family: Family::Mlp,
            onnx,
            sidecar: &s,
        }])
    };
    let e = load(sidecar_with(|v| {
        v["classes"].as_array_mut().unwrap().pop();
    }))
    .unwrap_err();
    assert!(
        matches!(
            e,
            EstimatorError::Model(ModelError::ClassMismatch {
                model_width: 5,
                classes: 4,
                ..
            })
        ),
        "{e:?}"
    );
    let e = load(sidecar_with(|v| v["features"][0] = "colour".into())).unwrap_err();
    assert!(e.to_string().contains("colour"), "{e}");
    let e = load(sidecar_with(|v| v["family"] = "cnn".into())).unwrap_err();
    assert!(
        matches!(e, EstimatorError::Model(ModelError::Sidecar { .. })),
        "{e:?}"
    );
    let e = load(sidecar_with(|v| v["decision"]["threshold"] = 1.5.into())).unwrap_err();
    assert!(e.to_string().contains("threshold"), "{e}");
    let e = load("{}".into()).unwrap_err();
    assert!(
        matches!(e, EstimatorError::Model(ModelError::Sidecar { .. })),
        "{e:?}"
    );
    let bad_onnx = Estimator::from_parts(&[ModelParts {
        family: Family::Mlp,
        onnx: b"not an onnx file",
        sidecar: EMBEDDED_MODELS[0].sidecar,
    }])
    .unwrap_err();
    assert!(
        matches!(bad_onnx, EstimatorError::Model(ModelError::Onnx { .. })),
        "{bad_onnx:?}"
    );
    let dup = Estimator::from_parts(&[EMBEDDED_MODELS[0], EMBEDDED_MODELS[0]]).unwrap_err();
    assert!(matches!(dup, EstimatorError::DuplicateFamily(Family::Mlp)));
}
