//! carma's pod annotations as the extender decides on them: the input, split at NUL bytes, is
//! `carma.io/model-profile`, `carma.io/gpu-memory`, `carma.io/policy`, `carma.io/exclusive` and
//! the `carma.io/gpu` limit, in that order; the profile goes through the estimator, and the
//! extender's own output annotations are read back (`Assignment::from_annotations`).
#![no_main]

use std::collections::BTreeMap;
use std::sync::OnceLock;

use carma_api::Assignment;
use carma_api::names::{
    ANNOTATION_ASSIGNED_AT, ANNOTATION_ASSIGNED_GPUS, ANNOTATION_ESTIMATE, ANNOTATION_EXCLUSIVE,
    ANNOTATION_GPU_MEMORY, ANNOTATION_MODEL_PROFILE, ANNOTATION_POLICY,
};
use carma_core::Policy;
use carma_estimator::Estimator;
use carma_scheduler_extender::Decisions;
use k8s_openapi::api::core::v1::{Container, Pod, PodSpec, ResourceRequirements};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use libfuzzer_sys::fuzz_target;

fn decisions() -> &'static Decisions {
    static D: OnceLock<Decisions> = OnceLock::new();
    D.get_or_init(|| {
        Decisions::new(
            Estimator::new().expect("embedded models load"),
            Policy::Magm,
        )
    })
}

fuzz_target!(|text: &str| {
    let mut parts = text.split('\0');
    let mut annotations = BTreeMap::new();
    for key in [
        ANNOTATION_MODEL_PROFILE,
        ANNOTATION_GPU_MEMORY,
        ANNOTATION_POLICY,
        ANNOTATION_EXCLUSIVE,
    ] {
        if let Some(v) = parts.next().filter(|v| !v.is_empty()) {
            annotations.insert(key.to_string(), v.to_string());
        }
    }
    let gpus = parts.next().unwrap_or("1").to_string();
    let pod = Pod {
        metadata: k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta {
            name: Some("fuzz".into()),
            namespace: Some("ml".into()),
            uid: Some("fuzz-uid".into()),
            annotations: Some(annotations.clone()),
            ..Default::default()
        },
        spec: Some(PodSpec {
            containers: vec![Container {
                name: "train".into(),
                resources: Some(ResourceRequirements {
                    limits: Some(
                        [("carma.io/gpu".to_string(), Quantity(gpus))]
                            .into_iter()
                            .collect(),
                    ),
                    ..Default::default()
                }),
                ..Default::default()
            }],
            ..Default::default()
        }),
        ..Default::default()
    };
    let _ = decisions().compute(&pod);
    // The same texts as the extender's output annotations, read back as the watcher does.
    let mut out = BTreeMap::new();
    let mut values = text.split('\0');
    for key in [
        ANNOTATION_ASSIGNED_GPUS,
        ANNOTATION_ASSIGNED_AT,
        ANNOTATION_ESTIMATE,
    ] {
        if let Some(v) = values.next() {
            out.insert(key.to_string(), v.to_string());
        }
    }
    let _ = Assignment::from_annotations(&out);
});
