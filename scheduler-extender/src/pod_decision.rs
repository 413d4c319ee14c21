//! Per-pod decisions: how many GPUs, how much memory on each, which policy.
//!
//! The reservation is the `carma.io/gpu-memory` override, else the estimator's
//! answer for the `carma.io/model-profile` annotation — or what earlier runs of the same profile
//! were seen to use plus headroom, when that is lower or the estimate proved too small
//! ([`crate::history`]) — else the whole GPU (`carma_core::first_reservation`). It is
//! computed once per pod and cached by pod UID (with a fingerprint of the inputs,
//! so that a pod whose annotations are edited while pending is judged again).

use std::collections::HashMap;
use std::hash::{DefaultHasher, Hash, Hasher};
use std::sync::Arc;

use carma_api::names::{
    ANNOTATION_EXCLUSIVE, ANNOTATION_GPU_MEMORY, ANNOTATION_MODEL_PROFILE, ANNOTATION_POLICY,
    RESOURCE_GPU,
};
use carma_api::{AnnotationError, PodRequest};
use carma_core::{Demand, FirstReservation, HistoryConfig, Policy, Reservation, first_reservation};
use carma_estimator::{EstimateError, Estimator, Profile, parse_profile};
use k8s_openapi::api::core::v1::{Container, Pod};
use parking_lot::Mutex;
use thiserror::Error;

use crate::history::{HistoryBook, SOURCE_HISTORY};

/// Source label of a reservation given by `carma.io/gpu-memory`.
pub const SOURCE_OVERRIDE: &str = "override";
/// Source label of a whole-GPU reservation (no override, no profile).
pub const SOURCE_WHOLE_GPU: &str = "whole-gpu";
/// Source label of a pod that asks for no `carma.io/gpu` at all.
pub const SOURCE_NO_GPU: &str = "none";

/// Cached decisions beyond this count are dropped all at once (pods normally
/// leave the cache when they are bound or deleted).
const CACHE_LIMIT: usize = 100_000;

/// What carma will reserve for one pod.
#[derive(Debug, Clone, PartialEq)]
pub struct Decision {
    /// GPUs, reservation per GPU, policy, exclusivity. `gpus == 0` means the pod
    /// asks for no `carma.io/gpu` and carma has nothing to place.
    pub demand: Demand,
    /// Where the reservation comes from: `override`, an estimator source such as
    /// `traced`, `gpumemnet-mlp` or `analytic-upper-bound`, `history` (earlier runs of the same model
    /// profile), or `whole-gpu`.
    pub source: String,
    /// The estimator's class label, when an estimate was made.
    pub class: Option<String>,
    /// For source `history`: the completed runs of the same model profile it rests on.
    pub samples: Option<u32>,
    /// The pod is a recovery attempt (priority class `carma-recovery`): CARMA's recovery-first rule
    /// never holds it back.
    pub recovery: bool,
    /// When the pod was created (ms since the Unix epoch): `pack` ages a pod by how long it has
    /// waited since (`Demand::waited_ms`, set per request).
    pub created_at_ms: Option<carma_core::Millis>,
}

impl Decision {
    /// Whether the pod needs GPUs placed at all.
    pub fn needs_gpus(&self) -> bool {
        self.demand.gpus > 0
    }
}

/// A pod carma cannot judge. The message names the annotation or resource to fix.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum DecisionError {
    /// An input annotation is malformed.
    #[error(transparent)]
    Annotation(#[from] AnnotationError),
    /// The model profile annotation is not a usable profile.
    #[error("annotation {ANNOTATION_MODEL_PROFILE}: {0}")]
    Profile(String),
    /// A container's `carma.io/gpu` request is not a whole number.
    #[error(
        "resource {RESOURCE_GPU} of container {container:?}: {value:?} is not a whole number of GPUs"
    )]
    GpuRequest {
        /// Container name.
        container: String,
        /// The quantity as written.
        value: String,
    },
}

impl DecisionError {
    /// The Event reason posted on the pod.
    pub fn event_reason(&self) -> &'static str {
        match self {
            DecisionError::GpuRequest { .. } => "InvalidCarmaRequest",
            _ => "InvalidCarmaAnnotation",
        }
    }
}

/// The decision for one pod, or why there is none.
pub type DecisionResult = Result<Decision, DecisionError>;

#[derive(Debug)]
struct Entry {
    /// Hash of the pod's inputs.
    fingerprint: u64,
    /// The history book's generation the decision was made under.
    history_generation: u64,
    /// `namespace/name` of the pod the decision was made for.
    pod: String,
    result: Arc<DecisionResult>,
}

/// Computes and caches per-pod decisions.
#[derive(Debug)]
pub struct Decisions {
    estimator: Estimator,
    default_policy: Policy,
    history: HistoryBook,
    cache: Mutex<HashMap<String, Entry>>,
}

/// A decision and whether it was just computed (the caller counts fresh
/// reservations and reports fresh errors once).
#[derive(Debug, Clone)]
pub struct Looked {
    /// The decision.
    pub result: Arc<DecisionResult>,
    /// `true` when it was computed by this call.
    pub fresh: bool,
}

impl Decisions {
    /// Decisions with `estimator` and `default_policy` (used when a pod names none).
    pub fn new(estimator: Estimator, default_policy: Policy) -> Self {
        Self {
            estimator,
            default_policy,
            history: HistoryBook::default(),
            cache: Mutex::new(HashMap::new()),
        }
    }

    /// The same decisions reserving from history under `config`.
    pub fn with_history(mut self, config: HistoryConfig) -> Self {
        self.history = HistoryBook::new(config);
        self
    }

    /// The observed peaks this extender reserves from (the `MemoryHistory` watcher feeds it).
    pub fn history(&self) -> &HistoryBook {
        &self.history
    }

    /// The decision for `pod`, from the cache when its inputs are unchanged.
    pub fn decide(&self, pod: &Pod) -> Looked {
        let uid = pod.metadata.uid.as_deref().unwrap_or_default();
        let fingerprint = fingerprint(pod);
        let history_generation = self.history.generation();
        let previous = match self.cache.lock().get(uid) {
            Some(e) if e.fingerprint == fingerprint => {
                if e.history_generation == history_generation {
                    return Looked {
                        result: Arc::clone(&e.result),
                        fresh: false,
                    };
                }
                Some(Arc::clone(&e.result))
            }
            _ => None,
        };
        // Judged again: a new pod, edited inputs, or a history change (which may or may not
        // concern this pod; only a changed result counts as fresh, so reservations are not counted
        // and warnings not posted twice).
        let result = Arc::new(self.compute(pod));
        let fresh = previous.is_none_or(|p| !same_reservation(&p, &result));
        if !uid.is_empty() {
            let mut cache = self.cache.lock();
            if cache.len() >= CACHE_LIMIT {
                tracing::warn!(
                    entries = cache.len(),
                    "decision cache full; dropping it (decisions are recomputed on demand)"
                );
                cache.clear();
            }
            cache.insert(
                uid.to_string(),
                Entry {
                    fingerprint,
                    history_generation,
                    pod: pod_key(pod),
                    result: Arc::clone(&result),
                },
            );
        }
        Looked { result, fresh }
    }

    /// The cached decision of a pod, if filter has seen it, with the `namespace/name` of the pod it
    /// was made for (a bind must name the same pod).
    pub fn cached(&self, uid: &str) -> Option<(String, Arc<DecisionResult>)> {
        self.cache
            .lock()
            .get(uid)
            .map(|e| (e.pod.clone(), Arc::clone(&e.result)))
    }

    /// Drop a pod's decision (bound or deleted).
    pub fn forget(&self, uid: &str) {
        self.cache.lock().remove(uid);
    }

    /// Compute a decision without the cache.
    pub fn compute(&self, pod: &Pod) -> DecisionResult {
        let empty = Default::default();
        let annotations = pod.metadata.annotations.as_ref().unwrap_or(&empty);
        let request = PodRequest::from_annotations(annotations)?;
        let gpus = gpu_request(pod)?;
        let policy = request.policy.unwrap_or(self.default_policy);
        // Parsed once: the reservation and the expected SM activity both read it.
        let parsed = request.model_profile.as_deref().map(parse_profile);
        let mut samples = None;
        let (reservation, source, class) = if gpus == 0 {
            (Reservation::WholeGpu, SOURCE_NO_GPU.to_string(), None)
        } else {
            let estimate = || {
                // A malformed profile is an error the user must see, estimated or not.
                let Some(profile) = parsed.as_ref() else {
                    return Ok(None);
                };
                let profile = profile
                    .as_ref()
                    .map_err(|e| DecisionError::Profile(e.to_string()))?;
                // An exclusive pod (e.g. recovery escalation after repeated OOMs) owns its GPUs:
                // book them whole, never the estimate that crashed.
                if request.exclusive {
                    return Ok(None);
                }
                match self.estimator.estimate_for(profile, gpus) {
                    Ok(e) => Ok(Some((e.mib, e))),
                    Err(EstimateError::InvalidProfile(e)) => {
                        Err(DecisionError::Profile(e.to_string()))
                    }
                    Err(e) => {
                        tracing::warn!(
                            pod = %pod_key(pod),
                            error = %e,
                            "estimator failed; reserving whole GPUs for this pod"
                        );
                        Ok(None)
                    }
                }
            };
            let learned = |mib| match &parsed {
                Some(Ok(profile)) => self.history.learned(profile, gpus, mib),
                _ => None,
            };
            let first = first_reservation(request.gpu_memory_mib, estimate, learned)?;
            let reservation = first.reservation();
            match first {
                FirstReservation::Override(_) => (reservation, SOURCE_OVERRIDE.to_string(), None),
                FirstReservation::Learned { learned, .. } => {
                    samples = Some(learned.samples);
                    (reservation, SOURCE_HISTORY.to_string(), None)
                }
                FirstReservation::Estimate { estimate, .. } => (
                    reservation,
                    estimate.source.as_str().to_string(),
                    Some(estimate.class),
                ),
                FirstReservation::WholeGpu => (reservation, SOURCE_WHOLE_GPU.to_string(), None),
            }
        };
        Ok(Decision {
            demand: Demand {
                gpus,
                reservation,
                policy,
                exclusive: request.exclusive,
                idle_only: false,
                expected_sm_activity: expected_from(
                    request.sm_activity,
                    parsed.as_ref().and_then(|p| p.as_ref().ok()),
                ),
                waited_ms: 0,
            },
            source,
            class,
            samples,
            recovery: crate::recovery_queue::is_recovery(pod),
            created_at_ms: pod
                .metadata
                .creation_timestamp
                .as_ref()
                .and_then(|t| u64::try_from(t.0.as_millisecond()).ok()),
        })
    }
}

/// Whether two results reserve the same (a new sample count alone is not a new reservation).
fn same_reservation(a: &DecisionResult, b: &DecisionResult) -> bool {
    match (a, b) {
        (Ok(a), Ok(b)) => a.demand == b.demand && a.source == b.source && a.class == b.class,
        (Err(a), Err(b)) => a == b,
        _ => false,
    }
}

/// The SM activity `pack` expects of a pod: its `carma.io/sm-activity` annotation, else the
/// model-class prior of its profile (whatever its reservation comes from: a recovery attempt
/// carries a `gpu-memory` override and still its profile); `None` when neither is usable.
pub fn expected_sm_activity(request: &PodRequest) -> Option<f64> {
    let profile = request
        .model_profile
        .as_deref()
        .and_then(|raw| parse_profile(raw).ok());
    expected_from(request.sm_activity, profile.as_ref())
}

/// The annotation's figure, else the profile's prior.
fn expected_from(annotated: Option<f64>, profile: Option<&Profile>) -> Option<f64> {
    annotated.or_else(|| profile.map(carma_estimator::activity::expected_sm_activity))
}

/// `namespace/name` of a pod, for logs and messages.
pub fn pod_key(pod: &Pod) -> String {
    format!(
        "{}/{}",
        pod.metadata.namespace.as_deref().unwrap_or("default"),
        pod.metadata.name.as_deref().unwrap_or("")
    )
}

/// The pod's `carma.io/gpu` count: the sum over its containers (limit, else
/// request), or the largest init container's when that is more.
pub fn gpu_request(pod: &Pod) -> Result<u32, DecisionError> {
    let Some(spec) = &pod.spec else {
        return Ok(0);
    };
    let mut sum: u32 = 0;
    for c in &spec.containers {
        sum = sum.saturating_add(container_gpus(c)?);
    }
    let mut init_max = 0;
    for c in spec.init_containers.iter().flatten() {
        init_max = init_max.max(container_gpus(c)?);
    }
    Ok(sum.max(init_max))
}

fn container_gpus(c: &Container) -> Result<u32, DecisionError> {
    carma_api::resources::container_gpus(c).map_err(|value| DecisionError::GpuRequest {
        container: c.name.clone(),
        value,
    })
}

/// A hash of the pod's inputs to its decision (the history book's generation is kept beside it).
fn fingerprint(pod: &Pod) -> u64 {
    let mut h = DefaultHasher::new();
    if let Some(a) = &pod.metadata.annotations {
        for key in [
            ANNOTATION_GPU_MEMORY,
            ANNOTATION_POLICY,
            ANNOTATION_EXCLUSIVE,
            ANNOTATION_MODEL_PROFILE,
        ] {
            a.get(key).hash(&mut h);
        }
    }
    if let Some(spec) = &pod.spec {
        for c in spec
            .containers
            .iter()
            .chain(spec.init_containers.iter().flatten())
        {
            if let Some(r) = &c.resources {
                r.limits
                    .as_ref()
                    .and_then(|l| l.get(RESOURCE_GPU))
                    .map(|q| &q.0)
                    .hash(&mut h);
                r.requests
                    .as_ref()
                    .and_then(|l| l.get(RESOURCE_GPU))
                    .map(|q| &q.0)
                    .hash(&mut h);
            }
        }
    }
    h.finish()
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::{PodSpec, ResourceRequirements};
    use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
    use std::collections::BTreeMap;

    fn pod(annotations: &[(&str, &str)], gpus: &[&str]) -> Pod {
        let containers = gpus
            .iter()
            .enumerate()
            .map(|(i, g)| Container {
                name: format!("c{i}"),
                resources: Some(ResourceRequirements {
                    limits: Some(BTreeMap::from([(
                        RESOURCE_GPU.to_string(),
                        Quantity(g.to_string()),
                    )])),
                    ..Default::default()
                }),
                ..Default::default()
            })
            .collect();
        let mut p = Pod {
            spec: Some(PodSpec {
                containers,
                ..Default::default()
            }),
            ..Default::default()
        };
        p.metadata.uid = Some("u1".into());
        p.metadata.annotations = Some(
            annotations
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
        );
        p
    }

    fn decisions() -> Decisions {
        Decisions::new(Estimator::new().unwrap(), Policy::Magm)
    }

    #[test]
    fn override_beats_profile_and_policy_annotation_beats_default() {
        let d = decisions()
            .compute(&pod(
                &[
                    (ANNOTATION_GPU_MEMORY, "12Gi"),
                    (ANNOTATION_MODEL_PROFILE, "not even json"),
                    (ANNOTATION_POLICY, "bf"),
                ],
                &["1"],
            ))
            .unwrap();
        assert_eq!(d.demand.reservation, Reservation::Mib(12288));
        assert_eq!(d.demand.policy, Policy::Bf);
        assert_eq!(d.source, SOURCE_OVERRIDE);
    }

    #[test]
    fn no_inputs_means_whole_gpu_and_gpus_are_summed() {
        let d = decisions().compute(&pod(&[], &["1", "2"])).unwrap();
        assert_eq!(d.demand.reservation, Reservation::WholeGpu);
        assert_eq!(d.demand.gpus, 3);
        assert_eq!(d.demand.policy, Policy::Magm);
        assert_eq!(d.source, SOURCE_WHOLE_GPU);
    }

    #[test]
    fn profile_goes_through_the_estimator() {
        let profile = r#"{"family":"mlp","batchSize":256,"parameters":2000000,"activations":6000,"depth":5,"activation":"ReLU","layers":{"linear":5}}"#;
        let d = decisions()
            .compute(&pod(&[(ANNOTATION_MODEL_PROFILE, profile)], &["1"]))
            .unwrap();
        assert!(matches!(d.demand.reservation, Reservation::Mib(m) if m > 0));
        assert_eq!(d.source, "gpumemnet-mlp");
        assert!(d.class.is_some());
    }

    #[test]
    fn a_traced_profile_gets_the_traced_reservation_per_gpu() {
        // BERT-large at batch 8: the traced step, not GPUMemNet or the analytic bound.
        let profile = r#"{"family":"transformer","batchSize":8,"parameters":335141888,"activations":428000000,"depth":170,"seqLength":512,"traced":{"forwardMiB":12641,"backwardMiB":13118,"optimizerStepMiB":7467}}"#;
        let one = decisions()
            .compute(&pod(&[(ANNOTATION_MODEL_PROFILE, profile)], &["1"]))
            .unwrap();
        assert_eq!(one.source, "traced");
        assert_eq!(
            one.demand.reservation,
            Reservation::Mib(carma_estimator::CONTEXT_MIB + 13_118)
        );
        // Two GPUs per pod: each GPU's reservation carries the multi-GPU factor.
        let two = decisions()
            .compute(&pod(&[(ANNOTATION_MODEL_PROFILE, profile)], &["2"]))
            .unwrap();
        let t = carma_estimator::Traced {
            forward_mib: 12_641,
            backward_mib: 13_118,
            optimizer_step_mib: 7_467,
            largest_tensor_mib: None,
            reserved_mib: None,
        };
        let want =
            carma_estimator::traced_reservation_mib(&t, carma_estimator::Family::Transformer, 2);
        assert!(want > carma_estimator::CONTEXT_MIB + 13_118);
        assert_eq!(two.demand.reservation, Reservation::Mib(want));
        // A bad traced figure is the user's error, naming the key.
        let bad = profile.replace("\"forwardMiB\":12641", "\"forwardMiB\":0");
        let err = decisions()
            .compute(&pod(&[(ANNOTATION_MODEL_PROFILE, &bad)], &["1"]))
            .unwrap_err();
        assert!(err.to_string().contains("traced.forwardMiB"), "{err}");
    }

    #[test]
    fn exclusive_pods_book_whole_gpus_not_the_estimate() {
        let profile = r#"{"family":"mlp","batchSize":256,"parameters":2000000,"activations":6000,"depth":5,"activation":"ReLU","layers":{"linear":5}}"#;
        let d = decisions()
            .compute(&pod(
                &[
                    (ANNOTATION_MODEL_PROFILE, profile),
                    (ANNOTATION_EXCLUSIVE, "true"),
                ],
                &["1"],
            ))
            .unwrap();
        assert_eq!(d.demand.reservation, Reservation::WholeGpu);
        assert!(d.demand.exclusive);
        assert_eq!(d.source, SOURCE_WHOLE_GPU);
        let err = decisions()
            .compute(&pod(
                &[
                    (ANNOTATION_MODEL_PROFILE, "{\"family\":\"mlp\"}"),
                    (ANNOTATION_EXCLUSIVE, "true"),
                ],
                &["1"],
            ))
            .unwrap_err();
        assert!(err.to_string().contains(ANNOTATION_MODEL_PROFILE), "{err}");
    }

    #[test]
    fn bad_inputs_name_what_to_fix() {
        let ds = decisions();
        type Case<'a> = (&'a [(&'a str, &'a str)], &'a [&'a str], &'a str);
        let cases: [Case<'_>; 4] = [
            (
                &[(ANNOTATION_MODEL_PROFILE, "{\"family\":\"mlp\",\"bogus\":1}")],
                &["1"],
                ANNOTATION_MODEL_PROFILE,
            ),
            (
                &[(ANNOTATION_GPU_MEMORY, "lots")],
                &["1"],
                ANNOTATION_GPU_MEMORY,
            ),
            (&[(ANNOTATION_POLICY, "fastest")], &["1"], ANNOTATION_POLICY),
            (&[], &["half"], RESOURCE_GPU),
        ];
        for (ann, gpus, needle) in cases {
            let err = ds.compute(&pod(ann, gpus)).unwrap_err();
            assert!(err.to_string().contains(needle), "{err}");
        }
    }

    #[test]
    fn history_lowers_an_estimate_and_cached_decisions_follow_it() {
        use carma_api::{MemoryHistory, MemoryHistorySpec, MemoryHistoryStatus};
        let profile = r#"{"family":"cnn","batchSize":128,"parameters":25557032,"activations":11000000,"layers":{"conv2d":53,"batchNorm":53,"linear":1}}"#;
        let ds = decisions();
        let p = pod(&[(ANNOTATION_MODEL_PROFILE, profile)], &["1"]);
        let first = ds.decide(&p);
        let estimate = first.result.as_ref().as_ref().unwrap().clone();
        let Reservation::Mib(estimate_mib) = estimate.demand.reservation else {
            panic!("an estimate: {estimate:?}")
        };
        assert_ne!(estimate.source, crate::history::SOURCE_HISTORY);
        assert!(!ds.decide(&p).fresh);

        let mut record = MemoryHistory::new(
            &parse_profile(profile).unwrap().fingerprint(1),
            MemoryHistorySpec {
                family: "cnn".into(),
                gpus: 1,
                profile: profile.into(),
            },
        );
        let peak = estimate_mib / 3;
        record.status = Some(MemoryHistoryStatus {
            completed: 2,
            max_peak_mib: peak,
            ..Default::default()
        });
        ds.history().apply(&record);
        let learned = ds.decide(&p);
        assert!(learned.fresh, "a history change judges cached pods again");
        // Another model's record changes the generation but not this pod's decision: not fresh.
        let mut other = record.clone();
        other.metadata.name = Some("0123456789abcdef0123456789abcdef".into());
        ds.history().apply(&other);
        let same = ds.decide(&p);
        assert!(!same.fresh, "an unchanged decision is not counted again");
        assert_eq!(same.result, learned.result);
        let d = learned.result.as_ref().as_ref().unwrap();
        let expected = peak + HistoryConfig::default().headroom(peak);
        assert_eq!(d.demand.reservation, Reservation::Mib(expected));
        assert_eq!(d.source, crate::history::SOURCE_HISTORY);
        assert_eq!(d.samples, Some(2));

        // An override still wins; a peak near the estimate leaves the estimate in place.
        let o = ds
            .compute(&pod(
                &[
                    (ANNOTATION_MODEL_PROFILE, profile),
                    (ANNOTATION_GPU_MEMORY, "4Gi"),
                ],
                &["1"],
            ))
            .unwrap();
        assert_eq!(o.source, SOURCE_OVERRIDE);
        record.status.as_mut().unwrap().max_peak_mib = estimate_mib - 500;
        ds.history().apply(&record);
        let back = ds.decide(&p);
        assert_eq!(back.result.as_ref().as_ref().unwrap(), &estimate);
        // A run that peaked at the estimate proves it too small: history raises it.
        record.status.as_mut().unwrap().max_peak_mib = estimate_mib;
        ds.history().apply(&record);
        let raised = ds.decide(&p);
        let d = raised.result.as_ref().as_ref().unwrap();
        assert_eq!(d.source, crate::history::SOURCE_HISTORY);
        assert_eq!(
            d.demand.reservation,
            Reservation::Mib(estimate_mib + HistoryConfig::default().headroom(estimate_mib))
        );
    }

    #[test]
    fn cache_is_keyed_by_uid_and_inputs() {
        let ds = decisions();
        let p = pod(&[(ANNOTATION_GPU_MEMORY, "8Gi")], &["1"]);
        assert!(ds.decide(&p).fresh);
        assert!(!ds.decide(&p).fresh);
        let edited = pod(&[(ANNOTATION_GPU_MEMORY, "9Gi")], &["1"]);
        let again = ds.decide(&edited);
        assert!(again.fresh);
        assert_eq!(
            again.result.as_ref().as_ref().unwrap().demand.reservation,
            Reservation::Mib(9216)
        );
        ds.forget("u1");
        assert!(ds.cached("u1").is_none());
    }
}
