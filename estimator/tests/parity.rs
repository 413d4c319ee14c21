//! tract (Rust) reproduces onnxruntime (Python) on the fixture the training
//! pipeline writes, and Rust builds the same feature rows from the CSVs.

mod common;

use carma_estimator::{Estimator, Family, read_mlp_csv};

fn fixture() -> serde_json::Value {
    let text = std::fs::read_to_string(common::model_file("fixture-mlp.json")).expect("fixture");
    serde_json::from_str(&text).expect("fixture JSON")
}

fn floats(v: &serde_json::Value) -> Vec<f32> {
    v.as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_f64().unwrap() as f32)
        .collect()
}

#[test]
fn tract_matches_onnxruntime_on_the_fixture() {
    let est = Estimator::new().unwrap();
    let model = est.model(Family::Mlp).unwrap();
    let fx = fixture();
    let rows = fx["rows"].as_array().unwrap();
    assert!(rows.len() >= 10);
    let mut all = Vec::new();
    for r in rows {
        let features = floats(&r["features"]);
        let expected = floats(&r["probabilities"]);
        let got = model.probabilities(&features).unwrap();
        for (g, e) in got.iter().zip(&expected) {
            assert!(
                (g - e).abs() <= 1e-4,
                "row {features:?}: tract {got:?} vs onnxruntime {expected:?}"
            );
        }
        assert_eq!(
            model.meta().decision.choose(&got),
            r["class"].as_u64().unwrap() as usize
        );
        all.extend(features);
    }
    // the batched plan gives the same numbers as the single-row plan
    let batched = model.probabilities(&all).unwrap();
    let classes = model.meta().classes.len();
    for (i, r) in rows.iter().enumerate() {
        let expected = floats(&r["probabilities"]);
        for (g, e) in batched[i * classes..(i + 1) * classes]
            .iter()
            .zip(&expected)
        {
            assert!((g - e).abs() <= 1e-4, "batched row {i}");
        }
    }
}

#[test]
fn rust_features_equal_python_features() {
    let est = Estimator::new().unwrap();
    let model = est.model(Family::Mlp).unwrap();
    let fx = fixture();
    let mut files = std::collections::HashMap::new();
    let mut checked = 0;
    for r in fx["rows"].as_array().unwrap() {
        let Some(src) = r["source"].as_object() else {
            continue;
        };
        let file = src["file"].as_str().unwrap();
        let rows = files.entry(file.to_string()).or_insert_with(|| {
            let text =
                std::fs::read_to_string(common::shared_file(&format!("gpumemnet/{file}"))).unwrap();
            read_mlp_csv(&text).unwrap()
        });
        let row = &rows[src["row"].as_u64().unwrap() as usize];
        let mut got = Vec::new();
        model.features_into(&row.profile, &mut got);
        let expected = floats(&r["features"]);
        for (g, e) in got.iter().zip(&expected) {
            assert!(
                (g - e).abs() <= 1e-6 * e.abs().max(1.0),
                "{file}:{} {got:?} vs {expected:?}",
                row.line
            );
        }
        checked += 1;
    }
    assert!(checked >= 10);
}
