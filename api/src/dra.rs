//! carma's GPUs under Dynamic Resource Allocation: the driver's names, its device taints, and the
//! claim templates a pod references to book GPU memory as consumable capacity.
//!
//! A claim's spec is immutable and a pod's `spec.resourceClaims` cannot change after creation, so
//! the booking is fixed when the pod is created. Every pod that books the same amount shares one
//! namespaced template whose name is derived from its content ([`claim_template_name`]);
//! kube-controller-manager makes each pod its own claim from it, owned by the pod. A bigger booking
//! (a recovery after an out-of-memory crash) is a new pod with another template, never an edit.

pub mod template;

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{PodResourceClaim, PodSpec, ResourceClaim as ContainerClaim};
use k8s_openapi::api::resource::v1::{
    CapacityRequirements, DeviceClaim, DeviceRequest, DeviceToleration, ExactDeviceRequest,
    ResourceClaimSpec, ResourceClaimTemplate, ResourceClaimTemplateSpec,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

use crate::names::{LABEL_MANAGED_BY, RESOURCE_GPU};

/// The DRA driver name: the `driver` of carma's ResourceSlices and allocation results.
pub const DRIVER_NAME: &str = "gpu.carma.io";
/// The chart's default DeviceClass for carma's GPUs (`dra.deviceClass.name`).
pub const DEFAULT_DEVICE_CLASS: &str = "carma-gpu";
/// The consumable capacity a claim books on each GPU, in bytes as a quantity.
pub const CAPACITY_MEMORY: &str = "memory";
/// The pod-level claim entry and the device request that attempt pods use.
pub const CLAIM_NAME: &str = "carma-gpu";

/// The GPU's utilization gate is closed (value: the gate rule, or `window-filling` while the
/// activity windows have not filled since the driver started or the source changed).
pub const TAINT_UTILIZATION_GATE: &str = "gpu.carma.io/utilization-gate";
/// The GPU's telemetry source has no SM activity figure: nothing can be judged, so the GPU takes
/// whole-GPU claims only (they tolerate this taint).
pub const TAINT_NO_ACTIVITY_TELEMETRY: &str = "gpu.carma.io/no-activity-telemetry";
/// The driver has no recent sample of the GPU (the backend stopped answering).
pub const TAINT_TELEMETRY_STALE: &str = "gpu.carma.io/telemetry-stale";
/// The backend reports the GPU unusable (fatal XID, gone from the driver).
pub const TAINT_UNHEALTHY: &str = "gpu.carma.io/unhealthy";
/// The only effect the driver uses.
pub const EFFECT_NO_SCHEDULE: &str = "NoSchedule";

/// The taints a whole-GPU claim tolerates: on a GPU nobody shares, the activity a job sees is its
/// own, so the gate and a missing activity figure do not concern it (CARMA's exclusive placement
/// ignores telemetry too). Stale telemetry and an unhealthy GPU still keep it off.
pub const WHOLE_GPU_TOLERATED: &[&str] = &[TAINT_UTILIZATION_GATE, TAINT_NO_ACTIVITY_TELEMETRY];

/// What each GPU of a claim books.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GpuBooking {
    /// This many MiB of the GPU's memory; other claims may share the GPU.
    Mib(u64),
    /// The whole GPU: no capacity request, so the claim consumes the DeviceClass's
    /// `requestPolicy.default` (all of the memory) and nobody can join it.
    Whole,
}

/// The template name for `gpus` GPUs of `device_class` booked as `booking`:
/// `<class>-g<N>-m<MiB>` or `<class>-g<N>-whole`. The name holds everything the template says, so
/// equal bookings share one template and an existing one of that name is the same.
pub fn claim_template_name(device_class: &str, gpus: u32, booking: GpuBooking) -> String {
    match booking {
        GpuBooking::Mib(mib) => format!("{device_class}-g{gpus}-m{mib}"),
        GpuBooking::Whole => format!("{device_class}-g{gpus}-whole"),
    }
}

/// The template for `gpus` GPUs of `device_class`, each booked as `booking`, in `namespace`.
pub fn claim_template(
    namespace: &str,
    device_class: &str,
    gpus: u32,
    booking: GpuBooking,
) -> ResourceClaimTemplate {
    let (capacity, tolerations) = match booking {
        GpuBooking::Mib(mib) => (
            Some(CapacityRequirements {
                requests: Some(BTreeMap::from([(
                    CAPACITY_MEMORY.to_string(),
                    Quantity(format!("{mib}Mi")),
                )])),
            }),
            None,
        ),
        GpuBooking::Whole => (
            None,
            Some(
                WHOLE_GPU_TOLERATED
                    .iter()
                    .map(|key| DeviceToleration {
                        key: Some((*key).to_string()),
                        operator: Some("Exists".to_string()),
                        effect: Some(EFFECT_NO_SCHEDULE.to_string()),
                        ..DeviceToleration::default()
                    })
                    .collect(),
            ),
        ),
    };
    ResourceClaimTemplate {
        metadata: ObjectMeta {
            name: Some(claim_template_name(device_class, gpus, booking)),
            namespace: Some(namespace.to_string()),
            labels: Some(BTreeMap::from([(
                LABEL_MANAGED_BY.to_string(),
                "carma".to_string(),
            )])),
            ..ObjectMeta::default()
        },
        spec: ResourceClaimTemplateSpec {
            metadata: None,
            spec: ResourceClaimSpec {
                devices: Some(DeviceClaim {
                    requests: Some(vec![DeviceRequest {
                        name: CLAIM_NAME.to_string(),
                        exactly: Some(ExactDeviceRequest {
                            device_class_name: device_class.to_string(),
                            allocation_mode: Some("ExactCount".to_string()),
                            count: Some(i64::from(gpus)),
                            capacity,
                            tolerations,
                            ..ExactDeviceRequest::default()
                        }),
                        first_available: None,
                    }]),
                    ..DeviceClaim::default()
                }),
            },
        },
    }
}

/// Make `spec` take its GPUs from a claim made from `template` instead of the `carma.io/gpu`
/// extended resource: every container and init container that asks for `carma.io/gpu` loses that
/// request and references the claim instead, and the pod gets the claim entry. Containers that
/// asked separately now share the claim's GPUs (a claim is one set of devices for the pod). Returns
/// how many containers moved; with none, `spec` is left unchanged.
pub fn move_gpus_to_claim(spec: &mut PodSpec, template: &str) -> usize {
    let mut moved = 0;
    for container in spec
        .containers
        .iter_mut()
        .chain(spec.init_containers.iter_mut().flatten())
    {
        let Some(resources) = container.resources.as_mut() else {
            continue;
        };
        let mut asked = false;
        for list in [resources.limits.as_mut(), resources.requests.as_mut()]
            .into_iter()
            .flatten()
        {
            asked |= list.remove(RESOURCE_GPU).is_some();
        }
        if !asked {
            continue;
        }
        moved += 1;
        let claims = resources.claims.get_or_insert_with(Vec::new);
        claims.retain(|c| c.name != CLAIM_NAME);
        claims.push(ContainerClaim {
            name: CLAIM_NAME.to_string(),
            request: None,
        });
    }
    if moved > 0 {
        let claims = spec.resource_claims.get_or_insert_with(Vec::new);
        claims.retain(|c| c.name != CLAIM_NAME);
        claims.push(PodResourceClaim {
            name: CLAIM_NAME.to_string(),
            resource_claim_template_name: Some(template.to_string()),
            resource_claim_name: None,
        });
    }
    moved
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::Container;

    #[test]
    fn names_follow_the_booking() {
        assert_eq!(
            claim_template_name("carma-gpu", 1, GpuBooking::Mib(12288)),
            "carma-gpu-g1-m12288"
        );
        assert_eq!(
            claim_template_name("gpus.example.com", 2, GpuBooking::Whole),
            "gpus.example.com-g2-whole"
        );
    }

    #[test]
    fn a_booking_requests_memory_and_tolerates_nothing() {
        let t = claim_template("ml", "carma-gpu", 2, GpuBooking::Mib(4096));
        let json = serde_json::to_value(&t).unwrap();
        let req = &json["spec"]["spec"]["devices"]["requests"][0];
        assert_eq!(req["name"], "carma-gpu");
        assert_eq!(req["exactly"]["deviceClassName"], "carma-gpu");
        assert_eq!(req["exactly"]["count"], 2);
        assert_eq!(req["exactly"]["capacity"]["requests"]["memory"], "4096Mi");
        assert!(req["exactly"].get("tolerations").is_none());
        assert_eq!(json["metadata"]["namespace"], "ml");
    }

    #[test]
    fn a_whole_gpu_requests_no_capacity_and_tolerates_the_gate() {
        let t = claim_template("ml", "carma-gpu", 1, GpuBooking::Whole);
        let json = serde_json::to_value(&t).unwrap();
        let req = &json["spec"]["spec"]["devices"]["requests"][0]["exactly"];
        assert!(req.get("capacity").is_none());
        let keys: Vec<_> = req["tolerations"]
            .as_array()
            .unwrap()
            .iter()
            .map(|t| t["key"].as_str().unwrap())
            .collect();
        assert_eq!(keys, WHOLE_GPU_TOLERATED);
    }

    fn gpu_container(name: &str, gpus: &str) -> Container {
        serde_json::from_value(serde_json::json!({"name": name, "resources": {
            "limits": {"carma.io/gpu": gpus, "memory": "1Gi"}, "requests": {"carma.io/gpu": gpus}}}))
        .unwrap()
    }

    #[test]
    fn every_container_that_asked_for_gpus_takes_the_claim_instead() {
        let mut spec = PodSpec {
            containers: vec![
                Container {
                    name: "sidecar".into(),
                    ..Container::default()
                },
                gpu_container("train", "2"),
            ],
            init_containers: Some(vec![gpu_container("warm-up", "1")]),
            ..PodSpec::default()
        };
        assert_eq!(move_gpus_to_claim(&mut spec, "carma-g1-m100"), 2);
        // Applied again (a re-invoked webhook): one entry each, the newest template.
        spec.containers[1] = gpu_container("train", "2");
        assert_eq!(move_gpus_to_claim(&mut spec, "carma-g1-m200"), 1);
        let claims = spec.resource_claims.as_ref().unwrap();
        assert_eq!(claims.len(), 1);
        assert_eq!(
            claims[0].resource_claim_template_name.as_deref(),
            Some("carma-g1-m200")
        );
        assert!(spec.containers[0].resources.is_none());
        for c in [
            &spec.containers[1],
            &spec.init_containers.as_ref().unwrap()[0],
        ] {
            let r = c.resources.as_ref().unwrap();
            assert_eq!(r.claims.as_ref().unwrap().len(), 1, "{}", c.name);
            assert!(!r.limits.as_ref().unwrap().contains_key(RESOURCE_GPU));
            assert!(!r.requests.as_ref().unwrap().contains_key(RESOURCE_GPU));
        }
        // Other resources stay.
        assert!(
            spec.containers[1]
                .resources
                .as_ref()
                .unwrap()
                .limits
                .as_ref()
                .unwrap()
                .contains_key("memory")
        );
    }

    #[test]
    fn a_pod_without_gpus_is_left_alone() {
        let mut spec = PodSpec {
            containers: vec![Container::default()],
            ..PodSpec::default()
        };
        assert_eq!(move_gpus_to_claim(&mut spec, "x"), 0);
        assert_eq!(
            spec,
            PodSpec {
                containers: vec![Container::default()],
                ..PodSpec::default()
            }
        );
    }
}
