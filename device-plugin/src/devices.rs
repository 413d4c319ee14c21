//! Replica device IDs (`<GPU-UUID>::<k>`) and the device list advertised to kubelet.

use carma_api::names::REPLICA_SEPARATOR;
use carma_gpu::telemetry::Snapshot;

use crate::proto::{self, Device};

/// One advertised replica of a physical GPU.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ReplicaId {
    /// GPU UUID.
    pub uuid: String,
    /// Replica number, 0..R-1.
    pub replica: u32,
}

impl ReplicaId {
    /// Parse `<UUID>::<k>`; `None` when the ID is not carma's.
    pub fn parse(id: &str) -> Option<Self> {
        let (uuid, k) = id.rsplit_once(REPLICA_SEPARATOR)?;
        if uuid.is_empty() {
            return None;
        }
        let replica = k.parse().ok()?;
        Some(Self {
            uuid: uuid.to_string(),
            replica,
        })
    }
}

impl std::fmt::Display for ReplicaId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}{REPLICA_SEPARATOR}{}", self.uuid, self.replica)
    }
}

/// The advertised state of one GPU.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AdvertisedGpu {
    /// GPU UUID.
    pub uuid: String,
    /// Whether its replicas are `Healthy`.
    pub healthy: bool,
}

/// The GPUs of `snapshot` as advertised to kubelet.
pub fn advertised(snapshot: &Snapshot) -> Vec<AdvertisedGpu> {
    snapshot
        .gpus
        .iter()
        .map(|g| AdvertisedGpu {
            uuid: g.sample.uuid.clone(),
            healthy: g.sample.healthy,
        })
        .collect()
}

/// The device list for kubelet: `replicas` devices per GPU, in GPU order then replica order.
pub fn device_list(gpus: &[AdvertisedGpu], replicas: u32) -> Vec<Device> {
    let mut out = Vec::with_capacity(gpus.len() * replicas as usize);
    for gpu in gpus {
        for k in 0..replicas {
            out.push(Device {
                id: ReplicaId {
                    uuid: gpu.uuid.clone(),
                    replica: k,
                }
                .to_string(),
                health: if gpu.healthy {
                    proto::HEALTHY
                } else {
                    proto::UNHEALTHY
                }
                .to_string(),
                topology: None,
            });
        }
    }
    out
}

/// The distinct GPU UUIDs of a set of device IDs, in first-seen order; IDs that are not carma's are
/// returned separately.
pub fn distinct_gpus<'a>(ids: impl IntoIterator<Item = &'a String>) -> (Vec<String>, Vec<String>) {
    let mut gpus: Vec<String> = Vec::new();
    let mut foreign = Vec::new();
    for id in ids {
        match ReplicaId::parse(id) {
            Some(r) => {
                if !gpus.contains(&r.uuid) {
                    gpus.push(r.uuid);
                }
            }
            None => foreign.push(id.clone()),
        }
    }
    (gpus, foreign)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn replica_ids_round_trip() {
        let r = ReplicaId::parse("GPU-1234-abcd::7").unwrap();
        assert_eq!(r.uuid, "GPU-1234-abcd");
        assert_eq!(r.replica, 7);
        assert_eq!(r.to_string(), "GPU-1234-abcd::7");
        for bad in ["GPU-1", "::3", "GPU-1::x", "GPU-1::-1", ""] {
            assert_eq!(ReplicaId::parse(bad), None, "{bad}");
        }
    }

    #[test]
    fn list_has_r_replicas_per_gpu_with_health() {
        let gpus = [
            AdvertisedGpu {
                uuid: "GPU-a".into(),
                healthy: true,
            },
            AdvertisedGpu {
                uuid: "GPU-b".into(),
                healthy: false,
            },
        ];
        let list = device_list(&gpus, 3);
        let ids: Vec<&str> = list.iter().map(|d| d.id.as_str()).collect();
        assert_eq!(
            ids,
            [
                "GPU-a::0", "GPU-a::1", "GPU-a::2", "GPU-b::0", "GPU-b::1", "GPU-b::2"
            ]
        );
        assert!(list[..3].iter().all(|d| d.health == "Healthy"));
        assert!(list[3..].iter().all(|d| d.health == "Unhealthy"));
    }

    #[test]
    fn distinct_gpus_of_a_request() {
        let ids: Vec<String> = ["GPU-a::0", "GPU-a::3", "GPU-b::1", "nvidia0"]
            .iter()
            .map(|s| s.to_string())
            .collect();
        let (gpus, foreign) = distinct_gpus(&ids);
        assert_eq!(gpus, ["GPU-a", "GPU-b"]);
        assert_eq!(foreign, ["nvidia0"]);
    }
}
