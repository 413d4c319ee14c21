//! The node's ResourceSlice: one device per physical GPU, memory as consumable capacity.
//!
//! Each device is `allowMultipleAllocations: true`, so several claims can share it, each booking
//! an amount of `memory`; the scheduler's allocator keeps the booked sum within `memory.value`.
//! `memory.requestPolicy.default` is the whole memory, so a claim that names no memory takes the
//! whole GPU and nobody can join it. `slots` (value = the most sharers, every claim takes exactly
//! one) keeps the device plugin's replica limit. Taints come from [`crate::taints`].

use std::collections::BTreeMap;

use carma_gpu::telemetry::Snapshot;
use k8s_openapi::api::resource::v1::{
    CapacityRequestPolicy, CapacityRequestPolicyRange, Device, DeviceAttribute, DeviceCapacity,
    DeviceTaint, ResourcePool, ResourceSlice, ResourceSliceSpec,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference};

use crate::DRIVER_NAME;
use crate::taints::{EFFECT_NO_SCHEDULE, Taint};

/// Name of the capacity booked by each claim, in MiB quantities.
pub use carma_api::dra::CAPACITY_MEMORY;
/// Name of the device attribute holding the GPU's UUID.
pub const ATTRIBUTE_UUID: &str = "uuid";
/// Name of the capacity that bounds the number of sharers.
pub const CAPACITY_SLOTS: &str = "slots";

const MIB: u64 = 1024 * 1024;

/// The device name of GPU `index` (`gpu-<index>`).
pub fn device_name(index: u32) -> String {
    format!("gpu-{index}")
}

/// The GPU index of a device name made by [`device_name`].
pub fn device_index(name: &str) -> Option<u32> {
    let digits = name.strip_prefix("gpu-")?;
    if digits.is_empty() || (digits.len() > 1 && digits.starts_with('0')) {
        return None;
    }
    digits.parse().ok()
}

/// The node's slice name, `<node>-gpu.carma.io`; the pool is named after the node.
pub fn slice_name(node: &str) -> String {
    format!("{node}-{DRIVER_NAME}")
}

/// How the devices' capacities are published.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CapacityPolicy {
    /// Value of `slots`.
    pub slots: u32,
    /// `memory.requestPolicy.validRange.min`, MiB.
    pub min_share_mib: u64,
}

fn mib(n: u64) -> Quantity {
    Quantity(format!("{n}Mi"))
}

/// One device per GPU of `snap`, in GPU index order (the allocator takes the first device that
/// fits, in slice order), with `taints` by GPU UUID.
pub fn devices(
    snap: &Snapshot,
    taints: &BTreeMap<String, Vec<Taint>>,
    policy: CapacityPolicy,
) -> Vec<Device> {
    snap.gpus
        .iter()
        .map(|g| {
            let s = &g.sample;
            let total_mib = s.memory_total_bytes / MIB;
            let attrs = [
                (ATTRIBUTE_UUID, string_attr(&s.uuid)),
                ("model", string_attr(&s.model)),
                ("gateRule", string_attr(g.gate_rule.as_str())),
                (
                    "index",
                    DeviceAttribute {
                        int: Some(i64::from(s.index)),
                        ..Default::default()
                    },
                ),
            ];
            let memory = DeviceCapacity {
                value: mib(total_mib),
                request_policy: Some(CapacityRequestPolicy {
                    default: Some(mib(total_mib)),
                    valid_range: Some(CapacityRequestPolicyRange {
                        min: mib(policy.min_share_mib.min(total_mib)),
                        step: Some(mib(1)),
                        max: None,
                    }),
                    valid_values: None,
                }),
            };
            let one = Quantity("1".to_string());
            let slots = DeviceCapacity {
                value: Quantity(policy.slots.to_string()),
                request_policy: Some(CapacityRequestPolicy {
                    default: Some(one.clone()),
                    valid_range: Some(CapacityRequestPolicyRange {
                        min: one.clone(),
                        max: Some(one),
                        step: None,
                    }),
                    valid_values: None,
                }),
            };
            let device_taints: Vec<DeviceTaint> = taints
                .get(&s.uuid)
                .into_iter()
                .flatten()
                .map(|t| DeviceTaint {
                    key: t.key.to_string(),
                    value: t.value.clone(),
                    effect: EFFECT_NO_SCHEDULE.to_string(),
                    time_added: None,
                })
                .collect();
            Device {
                name: device_name(s.index),
                allow_multiple_allocations: Some(true),
                attributes: Some(attrs.into_iter().map(|(k, v)| (k.to_string(), v)).collect()),
                capacity: Some(BTreeMap::from([
                    (CAPACITY_MEMORY.to_string(), memory),
                    (CAPACITY_SLOTS.to_string(), slots),
                ])),
                taints: (!device_taints.is_empty()).then_some(device_taints),
                ..Default::default()
            }
        })
        .collect()
}

fn string_attr(v: &str) -> DeviceAttribute {
    DeviceAttribute {
        string: Some(v.to_string()),
        ..Default::default()
    }
}

/// The node's whole ResourceSlice: one pool named after the node, in one slice, at `generation`,
/// owned by the Node (`node_uid`) so that it goes when the node goes.
pub fn resource_slice(
    node: &str,
    node_uid: Option<&str>,
    generation: i64,
    devices: Vec<Device>,
) -> ResourceSlice {
    ResourceSlice {
        metadata: ObjectMeta {
            name: Some(slice_name(node)),
            owner_references: node_uid.map(|uid| {
                vec![OwnerReference {
                    api_version: "v1".to_string(),
                    kind: "Node".to_string(),
                    name: node.to_string(),
                    uid: uid.to_string(),
                    controller: Some(true),
                    block_owner_deletion: None,
                }]
            }),
            ..Default::default()
        },
        spec: ResourceSliceSpec {
            driver: DRIVER_NAME.to_string(),
            node_name: Some(node.to_string()),
            pool: ResourcePool {
                name: node.to_string(),
                generation,
                resource_slice_count: 1,
            },
            devices: Some(devices),
            ..Default::default()
        },
    }
}

/// What the API server dropped from a stored slice that carma sent: the sharing fields (gate
/// `DRAConsumableCapacity` off) or the taints (gate `DRADeviceTaints` off).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Dropped {
    /// `allowMultipleAllocations` or a `requestPolicy` is gone: devices would be whole-only and
    /// unshareable, and a claim's memory request would not be honoured as a share.
    pub sharing: bool,
    /// Taints are gone: the gate is not enforced by the scheduler.
    pub taints: bool,
}

/// Compare what was sent with what the API server stored.
pub fn dropped_fields(sent: &[Device], stored: &[Device]) -> Dropped {
    let mut d = Dropped::default();
    for s in sent {
        let Some(back) = stored.iter().find(|b| b.name == s.name) else {
            continue;
        };
        if s.allow_multiple_allocations.is_some() && back.allow_multiple_allocations.is_none() {
            d.sharing = true;
        }
        let policies = |dev: &Device| {
            dev.capacity
                .iter()
                .flatten()
                .filter(|(_, c)| c.request_policy.is_some())
                .count()
        };
        if policies(back) < policies(s) {
            d.sharing = true;
        }
        if s.taints.as_ref().is_some_and(|t| !t.is_empty()) && back.taints.is_none() {
            d.taints = true;
        }
    }
    d
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::taints::{TAINT_UTILIZATION_GATE, Tainter};
    use carma_gpu::backends::simulated::SimulatedBackend;
    use carma_gpu::backends::{Activity, ActivitySource, GpuBackend, SampleContext};
    use carma_gpu::config::SimulatedGpus;
    use carma_gpu::telemetry::Telemetry;
    use chrono::Utc;
    use std::time::Duration;

    const POLICY: CapacityPolicy = CapacityPolicy {
        slots: 8,
        min_share_mib: 1024,
    };

    async fn simulated(count: u32, memory_mib: u64) -> Vec<carma_gpu::backends::GpuSample> {
        let sim = SimulatedBackend::new("gpu-node-1", SimulatedGpus { count, memory_mib }, 1.0);
        sim.sample(&SampleContext::default()).await.unwrap()
    }

    #[tokio::test]
    async fn one_shareable_device_per_simulated_gpu() {
        let samples = simulated(2, 40 * 1024).await;
        let uuids: Vec<String> = samples.iter().map(|s| s.uuid.clone()).collect();
        let snap = Telemetry::new("gpu-node-1", 1).update(samples, &[], Utc::now());
        let devs = devices(&snap, &BTreeMap::new(), POLICY);
        assert_eq!(devs.len(), 2);
        assert_eq!(devs[1].name, "gpu-1");
        let d = &devs[0];
        assert_eq!(d.allow_multiple_allocations, Some(true));
        let attrs = d.attributes.as_ref().unwrap();
        assert_eq!(attrs["uuid"].string.as_deref(), Some(uuids[0].as_str()));
        assert_eq!(attrs["index"].int, Some(0));
        assert_eq!(
            attrs["gateRule"].string.as_deref(),
            Some("smact-smocc-drama")
        );
        let cap = d.capacity.as_ref().unwrap();
        let mem = &cap[CAPACITY_MEMORY];
        assert_eq!(mem.value.0, "40960Mi");
        let policy = mem.request_policy.as_ref().unwrap();
        assert_eq!(
            policy.default.as_ref().unwrap().0,
            "40960Mi",
            "default = whole GPU"
        );
        let range = policy.valid_range.as_ref().unwrap();
        assert_eq!(
            (
                range.min.0.as_str(),
                range.step.as_ref().unwrap().0.as_str()
            ),
            ("1024Mi", "1Mi")
        );
        assert!(range.max.is_none());
        let slots = &cap[CAPACITY_SLOTS];
        assert_eq!(slots.value.0, "8");
        let sp = slots
            .request_policy
            .as_ref()
            .unwrap()
            .valid_range
            .as_ref()
            .unwrap();
        assert_eq!(
            (sp.min.0.as_str(), sp.max.as_ref().unwrap().0.as_str()),
            ("1", "1")
        );
        assert!(d.taints.is_none());
    }

    #[tokio::test]
    async fn a_busy_gpu_is_tainted_in_the_slice_and_the_json_has_the_api_names() {
        let mut samples = simulated(2, 80 * 1024).await;
        for (s, load) in samples.iter_mut().zip([0.1, 0.95]) {
            s.sm_activity = Activity::new(load, ActivitySource::Simulated);
            s.sm_occupancy = Activity::new(load, ActivitySource::Simulated);
            s.dram_activity = Activity::new(load, ActivitySource::Simulated);
        }
        let now = Utc::now();
        let snap = Telemetry::new("gpu-node-1", 1).update(samples, &[], now);
        let mut tainter = Tainter::new(
            carma_gpu::sampling::GateCaps::default(),
            0.05,
            Duration::from_secs(5),
        );
        let taints = tainter.taints(&snap, now);
        let slice = resource_slice(
            "gpu-node-1",
            Some("uid-1"),
            3,
            devices(&snap, &taints, POLICY),
        );
        let json = serde_json::to_value(&slice).unwrap();
        assert_eq!(json["metadata"]["name"], "gpu-node-1-gpu.carma.io");
        assert_eq!(json["metadata"]["ownerReferences"][0]["kind"], "Node");
        assert_eq!(json["spec"]["driver"], "gpu.carma.io");
        assert_eq!(json["spec"]["nodeName"], "gpu-node-1");
        assert_eq!(json["spec"]["pool"]["generation"], 3);
        assert_eq!(json["spec"]["pool"]["resourceSliceCount"], 1);
        let devs = &json["spec"]["devices"];
        assert_eq!(devs[0]["allowMultipleAllocations"], true);
        assert_eq!(
            devs[0]["capacity"]["memory"]["requestPolicy"]["validRange"]["min"],
            "1024Mi"
        );
        assert!(devs[0].get("taints").is_none());
        assert_eq!(devs[1]["taints"][0]["key"], TAINT_UTILIZATION_GATE);
        assert_eq!(devs[1]["taints"][0]["value"], "smact-smocc-drama");
        assert_eq!(devs[1]["taints"][0]["effect"], "NoSchedule");
    }

    #[test]
    fn device_names_round_trip() {
        assert_eq!(device_index(&device_name(7)), Some(7));
        for bad in ["gpu-", "gpu-07", "gpu-x", "cpu-1", "gpu--1"] {
            assert_eq!(device_index(bad), None, "{bad}");
        }
    }

    #[test]
    fn dropped_sharing_fields_and_taints_are_detected() {
        let mut t = Telemetry::new("n", 1);
        let snap = t.update(
            vec![carma_gpu::backends::GpuSample::basic(
                0,
                "GPU-0",
                "m",
                1 << 34,
                0,
            )],
            &[],
            Utc::now(),
        );
        let taints = BTreeMap::from([(
            "GPU-0".to_string(),
            vec![Taint {
                key: TAINT_UTILIZATION_GATE,
                value: None,
            }],
        )]);
        let sent = devices(&snap, &taints, POLICY);
        assert_eq!(dropped_fields(&sent, &sent), Dropped::default());
        let mut stored = sent.clone();
        stored[0].allow_multiple_allocations = None;
        for c in stored[0].capacity.as_mut().unwrap().values_mut() {
            c.request_policy = None;
        }
        assert!(dropped_fields(&sent, &stored).sharing);
        let mut stored = sent.clone();
        stored[0].taints = None;
        assert_eq!(
            dropped_fields(&sent, &stored),
            Dropped {
                sharing: false,
                taints: true
            }
        );
    }
}
