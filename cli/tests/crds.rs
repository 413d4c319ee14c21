//! The TrainingTask CRD's `modelProfile` ranges are the estimator's: the API server refuses a
//! profile exactly when `carma estimate` and the extender would, and the committed CRD
//! files are what `carma crds` generates.

use carma_estimator::{
    MAX_ACTIVATIONS, MAX_BATCH_SIZE, MAX_LAYERS, MAX_PARAMETERS, MAX_SEQ_LENGTH,
};
use serde_json::Value;

fn model_profile_schema() -> Value {
    let (_, crd) = carma_api::crds::all()
        .into_iter()
        .find(|(f, _)| *f == "trainingtasks.carma.io.yaml")
        .unwrap();
    let crd = serde_json::to_value(crd).unwrap();
    crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]["properties"]
        ["modelProfile"]
        .clone()
}

fn maximum(schema: &Value, path: &[&str]) -> f64 {
    let mut s = schema;
    for p in path {
        s = &s["properties"][p];
    }
    s["maximum"]
        .as_f64()
        .unwrap_or_else(|| panic!("{path:?} has no maximum: {s}"))
}

#[test]
fn model_profile_ranges_are_the_estimators() {
    let s = model_profile_schema();
    assert_eq!(maximum(&s, &["batchSize"]), f64::from(MAX_BATCH_SIZE));
    assert_eq!(maximum(&s, &["seqLength"]), f64::from(MAX_SEQ_LENGTH));
    assert_eq!(maximum(&s, &["parameters"]), MAX_PARAMETERS as f64);
    assert_eq!(maximum(&s, &["activations"]), MAX_ACTIVATIONS as f64);
    assert_eq!(maximum(&s, &["depth"]), f64::from(MAX_LAYERS));
    let layers = s["properties"]["layers"]["properties"].as_object().unwrap();
    assert!(!layers.is_empty());
    for name in layers.keys() {
        assert_eq!(
            maximum(&s, &["layers", name]),
            f64::from(MAX_LAYERS),
            "{name}"
        );
    }
}

#[test]
fn committed_crds_are_generated() {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    for (file, crd) in carma_api::crds::all() {
        let generated = carma_api::crds::to_yaml(&crd).unwrap();
        for dir in ["crds", "charts/carma/crds"] {
            let committed = std::fs::read_to_string(root.join(dir).join(file)).unwrap();
            assert_eq!(
                committed, generated,
                "{dir}/{file} is stale: run `carma crds --out-dir crds` and tools/sync-chart.sh"
            );
        }
    }
}

#[test]
fn a_modelprofile_with_optimizer_and_mixed_precision_reaches_the_estimator() {
    // The operator writes spec.modelProfile into the pod's carma.io/model-profile annotation as
    // JSON; the estimator must read every field the CRD accepts.
    let spec: carma_api::training_task::ModelProfile = serde_json::from_value(serde_json::json!({
        "family": "cnn", "batchSize": 128, "parameters": 25_557_032u64,
        "activations": 37_560_000u64, "depth": 107, "optimizer": "sgdMomentum", "mixedPrecision": true
    }))
    .unwrap();
    let json = serde_json::to_string(&spec).unwrap();
    let profile = carma_estimator::parse_profile(&json).unwrap();
    assert_eq!(
        profile.optimizer,
        Some(carma_estimator::Optimizer::SgdMomentum)
    );
    assert_eq!(profile.mixed_precision, Some(true));
    let unknown = serde_json::json!({"family": "cnn", "batchSize": 1, "parameters": 1,
        "activations": 1, "optimizer": "lamb"});
    assert!(serde_json::from_value::<carma_api::training_task::ModelProfile>(unknown).is_err());
}

#[test]
fn a_modelprofile_with_a_layer_reading_reaches_the_estimator_with_its_range() {
    let s = model_profile_schema();
    for key in [
        "savedValues",
        "keptFp32Values",
        "largestValues",
        "scoreValues",
    ] {
        assert_eq!(
            maximum(&s, &["layerReading", key]),
            carma_estimator::LayerReading::MAX_VALUES as f64,
            "{key}"
        );
    }
    // GPT-2 at batch 16, 512 tokens: what `carma estimate --summary --emit-profile` writes
    let spec: carma_api::training_task::ModelProfile = serde_json::from_value(serde_json::json!({
        "family": "transformer", "batchSize": 16, "parameters": 124_439_808u64,
        "activations": 211_329_536u64, "depth": 123, "seqLength": 512,
        "layerReading": {"savedValues": 106_340_864u64, "keptFp32Values": 153_871_872u64,
                         "largestValues": 25_731_584u64, "scoreValues": 0}
    }))
    .unwrap();
    let json = serde_json::to_string(&spec).unwrap();
    let profile = carma_estimator::parse_profile(&json).unwrap();
    let e = carma_estimator::Estimator::new()
        .unwrap()
        .estimate(&profile)
        .unwrap();
    assert_eq!(
        e.source,
        carma_estimator::EstimateSource::AnalyticUpperBound
    );
    let reading = profile.layer_reading.unwrap();
    assert_eq!(
        e.mib,
        carma_estimator::analytic::detailed_bound(&profile, &reading.values()).total_mib
    );
    // not the bound from the totals (17,664 MiB without layer counts; GPT-2 measured 19,644
    // on an H100)
    let totals = carma_estimator::analytic::analytic_upper_bound_mib(&profile);
    assert_eq!((e.mib, totals), (19_456, 17_664));
    let extra = serde_json::json!({"family": "cnn", "batchSize": 1, "parameters": 1,
        "activations": 1, "layerReading": {"savedValues": 1, "largestValues": 1, "rows": 2}});
    assert!(serde_json::from_value::<carma_api::training_task::ModelProfile>(extra).is_err());
}

#[test]
fn a_modelprofile_with_caveats_reaches_the_estimator() {
    // what `carma estimate --summary albert.txt … --emit-profile` writes without
    // --shared-layer-runs: the reading's caveat beside its layer reading
    let spec: carma_api::training_task::ModelProfile = serde_json::from_value(serde_json::json!({
        "family": "transformer", "batchSize": 16, "parameters": 11_221_680u64,
        "activations": 9_000_000u64, "depth": 40, "seqLength": 512,
        "caveats": [{"kind": "shared-layers", "modules": ["AlbertLayerGroup"],
                     "counted": "24 runs"}]
    }))
    .unwrap();
    let json = serde_json::to_string(&spec).unwrap();
    let profile = carma_estimator::parse_profile(&json).unwrap();
    assert_eq!(
        profile.caveats[0].kind,
        carma_estimator::CaveatKind::SharedLayers
    );
    let e = carma_estimator::Estimator::new()
        .unwrap()
        .estimate(&profile)
        .unwrap();
    assert_eq!(e.source, carma_estimator::EstimateSource::AnalyticFallback);
    assert_eq!(e.warnings, ["shared-layers: AlbertLayerGroup: 24 runs"]);
    // every kind the estimator knows, and nothing else, is accepted by the CRD's type
    for kind in ["unknown-attention", "shared-layers", "unknown-module"] {
        let c = serde_json::json!({"kind": kind, "modules": ["M"], "counted": ""});
        assert!(
            serde_json::from_value::<carma_api::training_task::ProfileCaveat>(c.clone()).is_ok()
                && serde_json::from_value::<carma_estimator::Caveat>(c).is_ok(),
            "{kind}"
        );
    }
    let odd = serde_json::json!({"kind": "odd", "modules": ["M"], "counted": ""});
    assert!(serde_json::from_value::<carma_api::training_task::ProfileCaveat>(odd).is_err());
    let s = model_profile_schema();
    assert_eq!(
        s["properties"]["caveats"]["maxItems"], 3,
        "{}",
        s["properties"]["caveats"]
    );
}

#[test]
fn a_modelprofile_with_a_traced_step_reaches_the_estimator_with_its_range() {
    let s = model_profile_schema();
    for key in ["forwardMiB", "backwardMiB", "optimizerStepMiB"] {
        assert_eq!(
            maximum(&s, &["traced", key]),
            carma_estimator::MAX_TRACED_MIB as f64,
            "{key}"
        );
    }
    let spec: carma_api::training_task::ModelProfile = serde_json::from_value(serde_json::json!({
        "family": "transformer", "batchSize": 8, "parameters": 335_141_888u64,
        "activations": 428_000_000u64, "depth": 170, "seqLength": 512,
        "traced": {"forwardMiB": 12641, "backwardMiB": 13118, "optimizerStepMiB": 7467}
    }))
    .unwrap();
    let json = serde_json::to_string(&spec).unwrap();
    let profile = carma_estimator::parse_profile(&json).unwrap();
    assert_eq!(profile.traced.map(|t| t.backward_mib), Some(13118));
    let e = carma_estimator::Estimator::new()
        .unwrap()
        .estimate(&profile)
        .unwrap();
    assert_eq!(e.source, carma_estimator::EstimateSource::Traced);
    let extra = serde_json::json!({"family": "cnn", "batchSize": 1, "parameters": 1,
        "activations": 1, "traced": {"forwardMiB": 1, "backwardMiB": 1, "optimizerStepMiB": 1,
        "peakMiB": 2}});
    assert!(serde_json::from_value::<carma_api::training_task::ModelProfile>(extra).is_err());
}
