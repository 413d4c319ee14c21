//! Prometheus metrics (prometheus-client), served on `/metrics`.
//!
//! Per GPU (labels `node`, `gpu` = index, `uuid`, `model`):
//! `carma_gpu_memory_total_bytes`, `carma_gpu_memory_used_bytes`, `carma_gpu_memory_reserved_bytes`
//! (sum of the reservations of the carma pods on the GPU), `carma_gpu_sm_activity_ratio`,
//! `carma_gpu_sm_occupancy_ratio`, `carma_gpu_dram_activity_ratio` (last sample, plus label `source`:
//! dcgm, gpm, nvml-util or simulated), `carma_gpu_sm_activity_risk_score`,
//! `carma_gpu_sm_occupancy_risk_score`, `carma_gpu_dram_activity_risk_score` (CARMA's score over the
//! 30-sample window, absent until the window has filled), `carma_gpu_power_watts`,
//! `carma_gpu_energy_joules_total` (counter, since driver load), `carma_gpu_pods`,
//! `carma_gpu_healthy` (1/0), `carma_gpu_sharing_allowed{rule}` (1/0: the utilization gate, under
//! the rule the GPU's telemetry source allows), `carma_gpu_sm_activity_cap_ratio` (the configured
//! cap), `carma_gpu_memory_enforcement{mode}` = 1 (what holds the GPU's containers to their memory
//! limit: `driver`, `mps` or `none`; set once at start).
//!
//! Per pod: `carma_pod_gpu_info{node,namespace,pod,uuid,gpu,task,simulated}` = 1,
//! `carma_pod_gpu_memory_reserved_bytes{node,namespace,pod,uuid}`,
//! `carma_pod_gpu_memory_used_bytes{node,namespace,pod,uuid}` (when attributed),
//! `carma_pod_gpu_memory_peak_bytes{node,namespace,pod,uuid}` (its running peak, at the sample interval).
//!
//! Plugin: `carma_device_plugin_allocations_total{result}`,
//! `carma_device_plugin_registrations_total{result}`,
//! `carma_telemetry_last_sample_timestamp_seconds{node}`, `carma_gpunode_publish_total{result}`,
//! `carma_gpunode_status_writes_total{reason}` (successful status writes by why: `first`, `change`,
//! `heartbeat`; at rest only heartbeats, one per node every 270–300 s by default).
//!
//! The per-GPU and per-pod series are rendered from the latest snapshot at scrape time, so series of
//! pods that left disappear at once.

use std::sync::Arc;

use parking_lot::RwLock;
use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeLabelSet, NoLabelSet};
use prometheus_client::metrics::MetricType;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::registry::Registry;

use carma_api::MemoryEnforcement;

use crate::publish_rule::WriteKind;
use carma_gpu::telemetry::{GpuView, Snapshot};

/// Label set `{reason}` of `carma_gpunode_status_writes_total`.
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ReasonLabel {
    /// `first`, `change` or `heartbeat`.
    pub reason: String,
}

fn reason(kind: WriteKind) -> ReasonLabel {
    ReasonLabel {
        reason: kind.as_str().to_string(),
    }
}

/// Label set `{result}` of the plugin's counters.
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ResultLabel {
    /// Outcome.
    pub result: String,
}

#[derive(Debug)]
struct State {
    node: String,
    cap: f64,
    snapshot: Option<Arc<Snapshot>>,
    enforcement: Option<MemoryEnforcement>,
}

/// The device plugin's metrics.
#[derive(Debug)]
pub struct Metrics {
    registry: Registry,
    allocations: Family<ResultLabel, Counter>,
    registrations: Family<ResultLabel, Counter>,
    publishes: Family<ResultLabel, Counter>,
    writes: Family<ReasonLabel, Counter>,
    state: Arc<RwLock<State>>,
}

impl Metrics {
    /// Metrics of `node` with the SM activity cap `cap`.
    pub fn new(node: impl Into<String>, cap: f64) -> Self {
        let mut registry = Registry::default();
        let allocations = Family::<ResultLabel, Counter>::default();
        let registrations = Family::<ResultLabel, Counter>::default();
        let publishes = Family::<ResultLabel, Counter>::default();
        let writes = Family::<ReasonLabel, Counter>::default();
        registry.register(
            "carma_device_plugin_allocations",
            "Allocate calls served by the device plugin, by result (ok, ok_unannotated, no_pod, lookup_off, lookup_error, bad_request, bad_assignment)",
            allocations.clone(),
        );
        registry.register(
            "carma_device_plugin_registrations",
            "Registrations with kubelet, by result",
            registrations.clone(),
        );
        registry.register(
            "carma_gpunode_publish",
            "GpuNode status writes, by result (ok, error)",
            publishes.clone(),
        );
        registry.register(
            "carma_gpunode_status_writes",
            "GpuNode status writes that succeeded, by reason (first: the process's first; change: a change beyond the deadbands; heartbeat: nothing changed for the heartbeat interval)",
            writes.clone(),
        );
        let state = Arc::new(RwLock::new(State {
            node: node.into(),
            cap,
            snapshot: None,
            enforcement: None,
        }));
        registry.register_collector(Box::new(SnapshotCollector {
            state: state.clone(),
        }));
        let m = Self {
            registry,
            allocations,
            registrations,
            publishes,
            writes,
            state,
        };
        // Make the common series exist from the start.
        for r in ["ok", "no_pod"] {
            let _ = m.allocations.get_or_create(&label(r));
        }
        for k in WriteKind::ALL {
            let _ = m.writes.get_or_create(&reason(k));
        }
        for r in ["ok", "error"] {
            let _ = m.publishes.get_or_create(&label(r));
            let _ = m.registrations.get_or_create(&label(r));
        }
        m
    }

    /// Count an Allocate outcome.
    pub fn allocation(&self, result: &str) {
        self.allocations.get_or_create(&label(result)).inc();
    }

    /// Count a registration attempt.
    pub fn registration(&self, result: &str) {
        self.registrations.get_or_create(&label(result)).inc();
    }

    /// Count a GpuNode write.
    pub fn publish(&self, result: &str) {
        self.publishes.get_or_create(&label(result)).inc();
    }

    /// Count a GpuNode status write that succeeded, by why it was made.
    pub fn status_write(&self, kind: WriteKind) {
        self.writes.get_or_create(&reason(kind)).inc();
    }

    /// How the GPUs' memory limits are enforced (`carma_gpu_memory_enforcement`).
    pub fn set_memory_enforcement(&self, enforcement: MemoryEnforcement) {
        self.state.write().enforcement = Some(enforcement);
    }

    /// Replace the snapshot the per-GPU and per-pod series come from.
    pub fn set_snapshot(&self, snapshot: Arc<Snapshot>) {
        self.state.write().snapshot = Some(snapshot);
    }

    /// The text exposition.
    pub fn encode(&self) -> Result<String, std::fmt::Error> {
        let mut out = String::with_capacity(16 * 1024);
        prometheus_client::encoding::text::encode(&mut out, &self.registry)?;
        Ok(out)
    }
}

fn label(result: &str) -> ResultLabel {
    ResultLabel {
        result: result.to_string(),
    }
}

type Labels = Vec<(&'static str, String)>;
type Rows = Vec<(Labels, f64)>;

#[derive(Debug)]
struct SnapshotCollector {
    state: Arc<RwLock<State>>,
}

fn gpu_labels(node: &str, g: &GpuView) -> Labels {
    vec![
        ("node", node.to_string()),
        ("gpu", g.sample.index.to_string()),
        ("uuid", g.sample.uuid.clone()),
        ("model", g.sample.model.clone()),
    ]
}

fn family(
    enc: &mut DescriptorEncoder,
    name: &str,
    help: &str,
    kind: MetricType,
    rows: &Rows,
) -> Result<(), std::fmt::Error> {
    let mut metric = enc.encode_descriptor(name, help, None, kind)?;
    for (labels, value) in rows {
        let mut m = metric.encode_family(labels)?;
        match kind {
            MetricType::Counter => m.encode_counter::<NoLabelSet, f64, f64>(value, None)?,
            // Whole numbers (bytes, counts, flags) are written as integers.
            _ if value.fract() == 0.0 && value.abs() < 9.0e15 => {
                m.encode_gauge(&(*value as i64))?
            }
            _ => m.encode_gauge(value)?,
        }
    }
    Ok(())
}

impl Collector for SnapshotCollector {
    fn encode(&self, mut enc: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let state = self.state.read();
        let node = state.node.as_str();
        let gpus: &[GpuView] = state
            .snapshot
            .as_ref()
            .map(|s| s.gpus.as_slice())
            .unwrap_or(&[]);
        let per_gpu = |f: &dyn Fn(&GpuView) -> Option<f64>| -> Rows {
            gpus.iter()
                .filter_map(|g| f(g).map(|v| (gpu_labels(node, g), v)))
                .collect()
        };
        let with_source = |f: &dyn Fn(&GpuView) -> Option<carma_gpu::backends::Activity>| -> Rows {
            gpus.iter()
                .filter_map(|g| {
                    f(g).map(|a| {
                        let mut l = gpu_labels(node, g);
                        l.push(("source", a.source.as_str().to_string()));
                        (l, a.value)
                    })
                })
                .collect()
        };
        const MIB: f64 = 1024.0 * 1024.0;
        let gauge = MetricType::Gauge;
        family(
            &mut enc,
            "carma_gpu_memory_total_bytes",
            "Total GPU memory",
            gauge,
            &per_gpu(&|g| Some(g.sample.memory_total_bytes as f64)),
        )?;
        family(
            &mut enc,
            "carma_gpu_memory_used_bytes",
            "Used GPU memory (latest sample)",
            gauge,
            &per_gpu(&|g| Some(g.sample.memory_used_bytes as f64)),
        )?;
        family(
            &mut enc,
            "carma_gpu_memory_reserved_bytes",
            "GPU memory reserved by the carma pods on the GPU",
            gauge,
            &per_gpu(&|g| Some(g.reserved_mib() as f64 * MIB)),
        )?;
        family(
            &mut enc,
            "carma_gpu_sm_activity_ratio",
            "SM activity of the latest sample (0..1); label source: dcgm, gpm, nvml-util (fallback: NVML utilization) or simulated",
            gauge,
            &with_source(&|g| g.sample.sm_activity),
        )?;
        family(
            &mut enc,
            "carma_gpu_sm_occupancy_ratio",
            "SM occupancy of the latest sample (0..1)",
            gauge,
            &with_source(&|g| g.sample.sm_occupancy),
        )?;
        family(
            &mut enc,
            "carma_gpu_dram_activity_ratio",
            "DRAM activity of the latest sample (0..1)",
            gauge,
            &with_source(&|g| g.sample.dram_activity),
        )?;
        family(
            &mut enc,
            "carma_gpu_sm_activity_risk_score",
            "CARMA risk score of SM activity over the sample window (0.2 mean + 0.3 median + 0.3 p95 + 0.2 EMA)",
            gauge,
            &per_gpu(&|g| g.sm_activity_risk),
        )?;
        family(
            &mut enc,
            "carma_gpu_sm_occupancy_risk_score",
            "CARMA risk score of SM occupancy over the sample window",
            gauge,
            &per_gpu(&|g| g.sm_occupancy_risk),
        )?;
        family(
            &mut enc,
            "carma_gpu_dram_activity_risk_score",
            "CARMA risk score of DRAM activity over the sample window",
            gauge,
            &per_gpu(&|g| g.dram_activity_risk),
        )?;
        family(
            &mut enc,
            "carma_gpu_power_watts",
            "GPU power draw",
            gauge,
            &per_gpu(&|g| g.sample.power_watts),
        )?;
        family(
            &mut enc,
            "carma_gpu_energy_joules",
            "GPU energy consumed since the driver loaded",
            MetricType::Counter,
            &per_gpu(&|g| g.sample.energy_joules),
        )?;
        family(
            &mut enc,
            "carma_gpu_pods",
            "carma pods placed on the GPU",
            gauge,
            &per_gpu(&|g| Some(g.pods.len() as f64)),
        )?;
        family(
            &mut enc,
            "carma_gpu_healthy",
            "Whether the GPU is healthy (1) or not (0)",
            gauge,
            &per_gpu(&|g| Some(if g.sample.healthy { 1.0 } else { 0.0 })),
        )?;
        let cap = state.cap;
        family(
            &mut enc,
            "carma_gpu_sharing_allowed",
            "Whether the utilization gate lets the GPU take another shared pod (1) or not (0); label rule: the gate its telemetry source allows (smact-smocc-drama, smact-drama, smact-smocc, smact, none)",
            gauge,
            &gpus
                .iter()
                .map(|g| {
                    let mut l = gpu_labels(node, g);
                    l.push(("rule", g.gate_rule.as_str().to_string()));
                    (l, if g.sharing_allowed { 1.0 } else { 0.0 })
                })
                .collect(),
        )?;
        family(
            &mut enc,
            "carma_gpu_sm_activity_cap_ratio",
            "SM activity cap of the utilization gate (configured)",
            gauge,
            &per_gpu(&|_| Some(cap)),
        )?;
        if let Some(e) = state.enforcement {
            family(
                &mut enc,
                "carma_gpu_memory_enforcement",
                "What holds the containers on the GPU to their memory limit (value 1); label mode: driver (NVIDIA's CDI hook apply-cuda-memory-limits), mps (MPS pinned device memory) or none (advisory)",
                gauge,
                &gpus
                    .iter()
                    .map(|g| {
                        let mut l = gpu_labels(node, g);
                        l.push(("mode", e.as_str().to_string()));
                        (l, 1.0)
                    })
                    .collect(),
            )?;
        }

        let mut info: Rows = Vec::new();
        let mut reserved: Rows = Vec::new();
        let mut used: Rows = Vec::new();
        let mut peak: Rows = Vec::new();
        for g in gpus {
            for p in &g.pods {
                let base: Labels = vec![
                    ("node", node.to_string()),
                    ("namespace", p.namespace.clone()),
                    ("pod", p.name.clone()),
                    ("uuid", g.sample.uuid.clone()),
                ];
                let mut i = base.clone();
                i.push(("gpu", g.sample.index.to_string()));
                i.push(("task", p.task.clone().unwrap_or_default()));
                i.push(("simulated", p.simulated.to_string()));
                info.push((i, 1.0));
                reserved.push((base.clone(), p.reserved_mib as f64 * MIB));
                if let Some(b) = p.peak_bytes {
                    peak.push((base.clone(), b as f64));
                }
                if let Some(b) = p.observed_bytes {
                    used.push((base, b as f64));
                }
            }
        }
        family(
            &mut enc,
            "carma_pod_gpu_info",
            "A carma pod on a GPU (value 1); labels map the pod to the GPU",
            gauge,
            &info,
        )?;
        family(
            &mut enc,
            "carma_pod_gpu_memory_reserved_bytes",
            "GPU memory reserved by the pod on the GPU",
            gauge,
            &reserved,
        )?;
        family(
            &mut enc,
            "carma_pod_gpu_memory_used_bytes",
            "GPU memory used by the pod's processes on the GPU (attributed through cgroups)",
            gauge,
            &used,
        )?;
        family(
            &mut enc,
            "carma_pod_gpu_memory_peak_bytes",
            "Most GPU memory attributed to the pod on the GPU at any sample since the plugin first saw it there",
            gauge,
            &peak,
        )?;
        let ts: Rows = state
            .snapshot
            .as_ref()
            .map(|s| {
                vec![(
                    vec![("node", node.to_string())],
                    s.taken_at.timestamp_millis() as f64 / 1000.0,
                )]
            })
            .unwrap_or_default();
        family(
            &mut enc,
            "carma_telemetry_last_sample_timestamp_seconds",
            "Unix time of the latest telemetry sample",
            gauge,
            &ts,
        )?;
        Ok(())
    }
}
