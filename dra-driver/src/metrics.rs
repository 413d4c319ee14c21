//! The driver's Prometheus metrics (prometheus-client, as the other components), served on
//! `/metrics` (with `/healthz` and `/readyz`, see [`crate::health`]):
//!
//! * `carma_dra_driver_prepares_total{result}`, `carma_dra_driver_unprepares_total{result}`: claims
//!   prepared and unprepared, by result (`ok`, `error`), one per claim of each kubelet call;
//! * `carma_dra_driver_prepare_duration_seconds`, `carma_dra_driver_unprepare_duration_seconds`:
//!   histograms of the time one claim took (reading it, writing or removing its CDI spec, the
//!   checkpoint);
//! * `carma_dra_driver_devices_published`: devices of the node's ResourceSlice as last written;
//! * `carma_dra_driver_devices_tainted{taint}`: of those, the devices carrying each taint key;
//! * `carma_dra_driver_slice_publications_total{result}`: ResourceSlice writes (`ok`, `error`);
//! * `carma_dra_driver_devices_withdrawn_total{reason}`: devices that left the slice
//!   (`gpus_gone`, `sharing_dropped`), each also reported as an Event on the Node;
//! * `carma_dra_driver_grpc_serving{socket}`: 1 while the last gRPC health check over the socket
//!   (`dra`, `registration`) answered SERVING, else 0;
//! * `carma_dra_driver_kubelet_registered`: 1 once the kubelet registered the driver;
//! * `carma_dra_driver_memory_enforcement{mode}`: 1 for what holds the node's claims to their memory
//!   limit (`driver`: NVIDIA's CDI hook in every claim's spec; `mps`; `none`), decided at start.

use std::collections::BTreeMap;
use std::time::Duration;

use k8s_openapi::api::resource::v1::Device;
use parking_lot::Mutex;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;

/// Label set `{result}`.
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ResultLabel {
    /// `ok` or `error`.
    pub result: String,
}

/// Label set `{taint}`.
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct TaintLabel {
    /// The taint key.
    pub taint: String,
}

/// Label set `{reason}`.
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ReasonLabel {
    /// Why the devices were withdrawn.
    pub reason: String,
}

/// Label set `{mode}`.
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ModeLabel {
    /// `driver`, `mps` or `none`.
    pub mode: String,
}

/// Label set `{socket}`.
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct SocketLabel {
    /// `dra` or `registration`.
    pub socket: String,
}

/// The driver's metrics.
#[derive(Debug)]
pub struct Metrics {
    registry: Registry,
    prepares: Family<ResultLabel, Counter>,
    unprepares: Family<ResultLabel, Counter>,
    prepare_duration: Histogram,
    unprepare_duration: Histogram,
    published: Gauge,
    tainted: Family<TaintLabel, Gauge>,
    tainted_keys: Mutex<Vec<String>>,
    publications: Family<ResultLabel, Counter>,
    withdrawn: Family<ReasonLabel, Counter>,
    serving: Family<SocketLabel, Gauge>,
    registered: Gauge,
    enforcement: Family<ModeLabel, Gauge>,
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

fn label(result: &str) -> ResultLabel {
    ResultLabel {
        result: result.to_string(),
    }
}

fn outcome<E>(r: &Result<(), E>) -> &'static str {
    if r.is_ok() { "ok" } else { "error" }
}

impl Metrics {
    /// The metrics, every result series at zero.
    pub fn new() -> Self {
        let mut registry = Registry::default();
        let prepares = Family::<ResultLabel, Counter>::default();
        let unprepares = Family::<ResultLabel, Counter>::default();
        // 1 ms .. about 33 s: a claim read plus two fsynced file writes, on a busy disk or API server.
        let prepare_duration = Histogram::new(exponential_buckets(0.001, 2.0, 16));
        let unprepare_duration = Histogram::new(exponential_buckets(0.001, 2.0, 16));
        let published = Gauge::default();
        let tainted = Family::<TaintLabel, Gauge>::default();
        let publications = Family::<ResultLabel, Counter>::default();
        let withdrawn = Family::<ReasonLabel, Counter>::default();
        let serving = Family::<SocketLabel, Gauge>::default();
        let registered = Gauge::default();
        let enforcement = Family::<ModeLabel, Gauge>::default();
        registry.register(
            "carma_dra_driver_prepares",
            "Claims the kubelet asked the DRA driver to prepare, by result (ok, error)",
            prepares.clone(),
        );
        registry.register(
            "carma_dra_driver_unprepares",
            "Claims the kubelet asked the DRA driver to unprepare, by result (ok, error)",
            unprepares.clone(),
        );
        registry.register(
            "carma_dra_driver_prepare_duration_seconds",
            "Time to prepare one claim (read it, write its CDI spec and the checkpoint)",
            prepare_duration.clone(),
        );
        registry.register(
            "carma_dra_driver_unprepare_duration_seconds",
            "Time to unprepare one claim (remove its CDI spec, write the checkpoint)",
            unprepare_duration.clone(),
        );
        registry.register(
            "carma_dra_driver_devices_published",
            "Devices of the node's ResourceSlice as last written",
            published.clone(),
        );
        registry.register(
            "carma_dra_driver_devices_tainted",
            "Devices of the node's ResourceSlice carrying each taint key",
            tainted.clone(),
        );
        registry.register(
            "carma_dra_driver_slice_publications",
            "ResourceSlice writes, by result (ok, error)",
            publications.clone(),
        );
        registry.register(
            "carma_dra_driver_devices_withdrawn",
            "Devices withdrawn from the node's ResourceSlice, by reason (gpus_gone, sharing_dropped)",
            withdrawn.clone(),
        );
        registry.register(
            "carma_dra_driver_grpc_serving",
            "1 while the last gRPC health check over the socket (dra, registration) answered SERVING",
            serving.clone(),
        );
        registry.register(
            "carma_dra_driver_kubelet_registered",
            "1 once the kubelet registered the DRA driver",
            registered.clone(),
        );
        registry.register(
            "carma_dra_driver_memory_enforcement",
            "What holds the node's claims to their memory limit (value 1); label mode: driver (NVIDIA's CDI hook apply-cuda-memory-limits), mps (MPS pinned device memory) or none (advisory)",
            enforcement.clone(),
        );
        let m = Self {
            registry,
            prepares,
            unprepares,
            prepare_duration,
            unprepare_duration,
            published,
            tainted,
            tainted_keys: Mutex::new(Vec::new()),
            publications,
            withdrawn,
            serving,
            registered,
            enforcement,
        };
        for r in ["ok", "error"] {
            let _ = m.prepares.get_or_create(&label(r));
            let _ = m.unprepares.get_or_create(&label(r));
            let _ = m.publications.get_or_create(&label(r));
        }
        for s in ["dra", "registration"] {
            let _ = m.serving.get_or_create(&SocketLabel {
                socket: s.to_string(),
            });
        }
        m
    }

    /// One claim prepared (or not) in `took`.
    pub fn prepared<E>(&self, result: &Result<(), E>, took: Duration) {
        self.prepares.get_or_create(&label(outcome(result))).inc();
        self.prepare_duration.observe(took.as_secs_f64());
    }

    /// One claim unprepared (or not) in `took`.
    pub fn unprepared<E>(&self, result: &Result<(), E>, took: Duration) {
        self.unprepares.get_or_create(&label(outcome(result))).inc();
        self.unprepare_duration.observe(took.as_secs_f64());
    }

    /// A ResourceSlice write: `ok` or `error`.
    pub fn publication(&self, result: &str) {
        self.publications.get_or_create(&label(result)).inc();
    }

    /// The node's slice now carries `devices`.
    pub fn set_slice(&self, devices: &[Device]) {
        self.published.set(devices.len() as i64);
        let mut counts: BTreeMap<String, i64> = BTreeMap::new();
        for d in devices {
            let mut keys: Vec<&str> = d.taints.iter().flatten().map(|t| t.key.as_str()).collect();
            keys.dedup();
            for k in keys {
                *counts.entry(k.to_string()).or_default() += 1;
            }
        }
        // A key seen once stays at 0 when no device carries it any more.
        let mut known = self.tainted_keys.lock();
        for k in counts.keys() {
            if !known.contains(k) {
                known.push(k.clone());
            }
        }
        for k in known.iter() {
            self.tainted
                .get_or_create(&TaintLabel { taint: k.clone() })
                .set(counts.get(k).copied().unwrap_or(0));
        }
    }

    /// `count` devices withdrawn for `reason`.
    pub fn devices_withdrawn(&self, reason: &str, count: u64) {
        self.withdrawn
            .get_or_create(&ReasonLabel {
                reason: reason.to_string(),
            })
            .inc_by(count);
    }

    /// What the last health check over `socket` found.
    pub fn set_serving(&self, socket: &str, serving: bool) {
        self.serving
            .get_or_create(&SocketLabel {
                socket: socket.to_string(),
            })
            .set(i64::from(serving));
    }

    /// How the node's memory limits are enforced (set once, at start).
    pub fn set_memory_enforcement(&self, enforcement: carma_api::MemoryEnforcement) {
        self.enforcement
            .get_or_create(&ModeLabel {
                mode: enforcement.as_str().to_string(),
            })
            .set(1);
    }

    /// Whether the kubelet registered the driver.
    pub fn set_registered(&self, registered: bool) {
        self.registered.set(i64::from(registered));
    }

    /// The text exposition.
    pub fn encode(&self) -> Result<String, std::fmt::Error> {
        let mut out = String::with_capacity(4 * 1024);
        prometheus_client::encoding::text::encode(&mut out, &self.registry)?;
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::resource::v1::DeviceTaint;

    fn device(name: &str, taints: &[&str]) -> Device {
        Device {
            name: name.to_string(),
            taints: (!taints.is_empty()).then(|| {
                taints
                    .iter()
                    .map(|k| DeviceTaint {
                        key: k.to_string(),
                        effect: "NoSchedule".to_string(),
                        ..Default::default()
                    })
                    .collect()
            }),
            ..Default::default()
        }
    }

    #[test]
    fn the_exposition_has_every_series_from_the_start_and_counts_what_happened() {
        let m = Metrics::new();
        let text = m.encode().unwrap();
        for line in [
            "carma_dra_driver_prepares_total{result=\"ok\"} 0",
            "carma_dra_driver_prepares_total{result=\"error\"} 0",
            "carma_dra_driver_unprepares_total{result=\"error\"} 0",
            "carma_dra_driver_slice_publications_total{result=\"error\"} 0",
            "carma_dra_driver_prepare_duration_seconds_count 0",
            "carma_dra_driver_devices_published 0",
            "carma_dra_driver_grpc_serving{socket=\"dra\"} 0",
            "carma_dra_driver_kubelet_registered 0",
        ] {
            assert!(text.contains(line), "{line} missing in\n{text}");
        }
        assert!(!text.contains("carma_dra_driver_memory_enforcement{"));
        m.set_memory_enforcement(carma_api::MemoryEnforcement::Driver);
        assert!(
            m.encode()
                .unwrap()
                .contains("carma_dra_driver_memory_enforcement{mode=\"driver\"} 1")
        );
        m.prepared::<()>(&Ok(()), Duration::from_millis(3));
        m.prepared(&Err(()), Duration::from_millis(3));
        m.unprepared::<()>(&Ok(()), Duration::from_millis(1));
        m.set_slice(&[
            device("gpu-0", &["gpu.carma.io/utilization-gate"]),
            device("gpu-1", &[]),
        ]);
        m.devices_withdrawn("gpus_gone", 2);
        m.set_serving("dra", true);
        let text = m.encode().unwrap();
        for line in [
            "carma_dra_driver_prepares_total{result=\"ok\"} 1",
            "carma_dra_driver_prepares_total{result=\"error\"} 1",
            "carma_dra_driver_prepare_duration_seconds_count 2",
            "carma_dra_driver_unprepares_total{result=\"ok\"} 1",
            "carma_dra_driver_devices_published 2",
            "carma_dra_driver_devices_tainted{taint=\"gpu.carma.io/utilization-gate\"} 1",
            "carma_dra_driver_devices_withdrawn_total{reason=\"gpus_gone\"} 2",
            "carma_dra_driver_grpc_serving{socket=\"dra\"} 1",
        ] {
            assert!(text.contains(line), "{line} missing in\n{text}");
        }
        // The gate reopens: the key's series drops to 0 instead of keeping its last value.
        m.set_slice(&[device("gpu-0", &[]), device("gpu-1", &[])]);
        assert!(m.encode().unwrap().contains(
            "carma_dra_driver_devices_tainted{taint=\"gpu.carma.io/utilization-gate\"} 0"
        ));
    }
}
