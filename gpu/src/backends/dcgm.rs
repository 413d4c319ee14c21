//! DCGM backend: scrape a dcgm-exporter endpoint (Prometheus text) for SM activity, SM occupancy
//! and DRAM activity, mapped to GPUs by the `UUID` label.
//!
//! Where NVML can be loaded it supplies inventory, memory, power, energy, processes and health,
//! and DCGM only the activity figures (source `dcgm`); without NVML, dcgm-exporter supplies
//! everything (`DCGM_FI_DEV_FB_*` memory in MiB, `DCGM_FI_DEV_POWER_USAGE` in W,
//! `DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION` in mJ, `DCGM_FI_DEV_XID_ERRORS` for health).
//!
//! dcgm-exporter only exports `DCGM_FI_PROF_SM_ACTIVE` and `DCGM_FI_PROF_SM_OCCUPANCY` when its
//! counters CSV enables them (carma ships one under `deploy/dcgm-exporter/`). Only `http://` URLs are
//! supported (dcgm-exporter's default).

use std::collections::BTreeMap;
use std::time::Duration;

use futures::future::BoxFuture;
use http_body_util::{BodyExt, Empty, Limited};
use hyper::body::Bytes;
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use parking_lot::Mutex;
use tracing::{info, warn};

use super::nvml::NvmlBackend;
use super::{
    Activity, ActivitySource, BackendError, GpuBackend, GpuSample, SampleContext, xid_is_fatal,
};

const MIB: u64 = 1024 * 1024;
/// Largest scrape accepted.
const MAX_BODY: usize = 16 * 1024 * 1024;
/// Scrape timeout.
const SCRAPE_TIMEOUT: Duration = Duration::from_secs(3);

/// One GPU as dcgm-exporter reports it.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct DcgmGpu {
    /// `UUID` label.
    pub uuid: String,
    /// `gpu` label (index).
    pub index: Option<u32>,
    /// `modelName` label.
    pub model: Option<String>,
    /// DCGM_FI_PROF_SM_ACTIVE (0..1).
    pub sm_active: Option<f64>,
    /// DCGM_FI_PROF_SM_OCCUPANCY (0..1).
    pub sm_occupancy: Option<f64>,
    /// DCGM_FI_PROF_DRAM_ACTIVE (0..1).
    pub dram_active: Option<f64>,
    /// DCGM_FI_DEV_FB_FREE (MiB).
    pub fb_free_mib: Option<f64>,
    /// DCGM_FI_DEV_FB_TOTAL (MiB).
    pub fb_total_mib: Option<f64>,
    /// DCGM_FI_DEV_FB_USED (MiB).
    pub fb_used_mib: Option<f64>,
    /// DCGM_FI_DEV_FB_RESERVED (MiB).
    pub fb_reserved_mib: Option<f64>,
    /// DCGM_FI_DEV_POWER_USAGE (W).
    pub power_watts: Option<f64>,
    /// DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION (mJ).
    pub energy_mj: Option<f64>,
    /// DCGM_FI_DEV_XID_ERRORS (last XID).
    pub last_xid: Option<f64>,
}

/// Parse dcgm-exporter output into one entry per GPU UUID, in index order.
///
/// Series of the same GPU repeated with pod labels carry the same value; the first one wins.
pub fn parse_exposition(text: &str) -> Result<Vec<DcgmGpu>, BackendError> {
    let scrape = prometheus_parse::Scrape::parse(text.lines().map(|l| Ok(l.to_string())))
        .map_err(|e| BackendError::Dcgm(format!("unparsable exposition: {e}")))?;
    let mut gpus: BTreeMap<String, DcgmGpu> = BTreeMap::new();
    for sample in &scrape.samples {
        let Some(uuid) = sample
            .labels
            .get("UUID")
            .or_else(|| sample.labels.get("uuid"))
        else {
            continue;
        };
        let value = match sample.value {
            prometheus_parse::Value::Gauge(v)
            | prometheus_parse::Value::Counter(v)
            | prometheus_parse::Value::Untyped(v) => v,
            _ => continue,
        };
        if !value.is_finite() {
            continue;
        }
        let gpu = gpus.entry(uuid.to_string()).or_insert_with(|| DcgmGpu {
            uuid: uuid.to_string(),
            ..Default::default()
        });
        if gpu.index.is_none() {
            gpu.index = sample.labels.get("gpu").and_then(|g| g.parse().ok());
        }
        if gpu.model.is_none() {
            gpu.model = sample.labels.get("modelName").map(str::to_string);
        }
        let slot = match sample.metric.as_str() {
            "DCGM_FI_PROF_SM_ACTIVE" => &mut gpu.sm_active,
            "DCGM_FI_PROF_SM_OCCUPANCY" => &mut gpu.sm_occupancy,
            "DCGM_FI_PROF_DRAM_ACTIVE" => &mut gpu.dram_active,
            "DCGM_FI_DEV_FB_FREE" => &mut gpu.fb_free_mib,
            "DCGM_FI_DEV_FB_TOTAL" => &mut gpu.fb_total_mib,
            "DCGM_FI_DEV_FB_USED" => &mut gpu.fb_used_mib,
            "DCGM_FI_DEV_FB_RESERVED" => &mut gpu.fb_reserved_mib,
            "DCGM_FI_DEV_POWER_USAGE" => &mut gpu.power_watts,
            "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION" => &mut gpu.energy_mj,
            "DCGM_FI_DEV_XID_ERRORS" => &mut gpu.last_xid,
            _ => continue,
        };
        if slot.is_none() {
            *slot = Some(value);
        }
    }
    let mut out: Vec<DcgmGpu> = gpus.into_values().collect();
    out.sort_by(|a, b| a.index.cmp(&b.index).then(a.uuid.cmp(&b.uuid)));
    Ok(out)
}

impl DcgmGpu {
    fn activity(v: Option<f64>) -> Option<Activity> {
        v.and_then(|v| Activity::new(v, ActivitySource::Dcgm))
    }

    /// Copy the activity figures onto an NVML sample (those DCGM has).
    ///
    /// All three figures come from one source: when dcgm-exporter has any of them for this GPU,
    /// DCGM's replace NVML's (a metric DCGM lacks stays absent rather than NVML's), so one gate
    /// decision never combines DCGM's SM activity with NVML's utilization; when it has none,
    /// NVML's figures stay as the labelled fallback.
    pub fn apply_activity(&self, s: &mut GpuSample) {
        let (sm, occ, dram) = (
            Self::activity(self.sm_active),
            Self::activity(self.sm_occupancy),
            Self::activity(self.dram_active),
        );
        if sm.is_some() || occ.is_some() || dram.is_some() {
            s.sm_activity = sm;
            s.sm_occupancy = occ;
            s.dram_activity = dram;
        }
    }

    /// A full sample from dcgm-exporter alone; `position` stands in for a missing `gpu` label.
    pub fn to_sample(&self, position: u32) -> GpuSample {
        let used = self.fb_used_mib.unwrap_or(0.0).max(0.0);
        let free = self.fb_free_mib.unwrap_or(0.0).max(0.0);
        let total = self
            .fb_total_mib
            .unwrap_or(used + free + self.fb_reserved_mib.unwrap_or(0.0));
        let bytes = |mib: f64| (mib * MIB as f64) as u64;
        let mut s = GpuSample::basic(
            self.index.unwrap_or(position),
            &self.uuid,
            self.model
                .clone()
                .unwrap_or_else(|| "NVIDIA GPU".to_string()),
            bytes(total),
            bytes(used),
        );
        if self.fb_free_mib.is_some() {
            s.memory_free_bytes = bytes(free);
        }
        s.power_watts = self.power_watts;
        s.energy_joules = self.energy_mj.map(|mj| mj / 1000.0);
        // dcgm-exporter lists no processes: pods are seen through memory use instead.
        s.processes_listed = false;
        self.apply_activity(&mut s);
        if let Some(xid) = self.last_xid
            && xid >= 1.0
            && xid_is_fatal(xid as u64)
        {
            s.healthy = false;
            s.health_reason = Some(format!("XID {} (dcgm-exporter)", xid as u64));
        }
        s
    }
}

/// The DCGM backend.
#[derive(Debug)]
pub struct DcgmBackend {
    endpoint: http::Uri,
    client: Client<HttpConnector, Empty<Bytes>>,
    nvml: Option<NvmlBackend>,
    /// Whether the last scrape failed (logs once per change).
    failing: Mutex<bool>,
}

impl DcgmBackend {
    /// Scrape `endpoint`; use `nvml` for everything but activity where given.
    pub fn new(endpoint: &str, nvml: Option<NvmlBackend>) -> Result<Self, BackendError> {
        let endpoint: http::Uri = endpoint
            .parse()
            .map_err(|e| BackendError::Config(format!("--dcgm-endpoint {endpoint:?}: {e}")))?;
        if endpoint.scheme_str() != Some("http") || endpoint.host().is_none() {
            return Err(BackendError::Config(format!(
                "--dcgm-endpoint {endpoint}: expected an http:// URL such as http://127.0.0.1:9400/metrics"
            )));
        }
        info!(
            %endpoint,
            inventory = if nvml.is_some() { "nvml" } else { "dcgm-exporter" },
            "DCGM backend: SM activity, SM occupancy and DRAM activity from dcgm-exporter"
        );
        Ok(Self {
            endpoint,
            client: Client::builder(TokioExecutor::new()).build_http(),
            nvml,
            failing: Mutex::new(false),
        })
    }

    /// Fetch and parse one scrape.
    pub async fn scrape(&self) -> Result<Vec<DcgmGpu>, BackendError> {
        let fetch = async {
            let resp = self
                .client
                .get(self.endpoint.clone())
                .await
                .map_err(|e| BackendError::Dcgm(format!("GET {}: {e}", self.endpoint)))?;
            if !resp.status().is_success() {
                return Err(BackendError::Dcgm(format!(
                    "GET {}: HTTP {}",
                    self.endpoint,
                    resp.status()
                )));
            }
            let body = Limited::new(resp.into_body(), MAX_BODY)
                .collect()
                .await
                .map_err(|e| BackendError::Dcgm(format!("reading {}: {e}", self.endpoint)))?
                .to_bytes();
            let text = String::from_utf8_lossy(&body);
            parse_exposition(&text)
        };
        tokio::time::timeout(SCRAPE_TIMEOUT, fetch)
            .await
            .map_err(|_| {
                BackendError::Dcgm(format!(
                    "GET {}: timed out after {SCRAPE_TIMEOUT:?}",
                    self.endpoint
                ))
            })?
    }

    fn note(&self, result: &Result<Vec<DcgmGpu>, BackendError>) {
        let mut failing = self.failing.lock();
        match (result, *failing) {
            (Err(e), false) => {
                warn!(
                    "{e}; activity figures fall back to NVML where available until dcgm-exporter answers"
                );
                *failing = true;
            }
            (Ok(_), true) => {
                info!("dcgm-exporter answers again");
                *failing = false;
            }
            _ => {}
        }
    }
}

impl GpuBackend for DcgmBackend {
    fn name(&self) -> &'static str {
        "dcgm"
    }

    fn sample<'a>(
        &'a self,
        ctx: &'a SampleContext,
    ) -> BoxFuture<'a, Result<Vec<GpuSample>, BackendError>> {
        Box::pin(async move {
            let scraped = self.scrape().await;
            self.note(&scraped);
            match &self.nvml {
                Some(nvml) => {
                    let mut samples = nvml.sample(ctx).await?;
                    if let Ok(gpus) = &scraped {
                        for s in samples.iter_mut() {
                            if let Some(d) = gpus.iter().find(|d| d.uuid == s.uuid) {
                                d.apply_activity(s);
                            }
                        }
                    }
                    Ok(samples)
                }
                None => {
                    let gpus = scraped?;
                    Ok(gpus
                        .iter()
                        .enumerate()
                        .map(|(i, d)| d.to_sample(i as u32))
                        .collect())
                }
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const TEXT: &str = r#"# HELP DCGM_FI_DEV_FB_FREE Framebuffer memory free (in MiB).
# TYPE DCGM_FI_DEV_FB_FREE gauge
DCGM_FI_DEV_FB_FREE{gpu="1",UUID="GPU-bbbb",pci_bus_id="00000000:08:00.0",device="nvidia1",modelName="NVIDIA A100-SXM4-40GB",Hostname="n1"} 30000
DCGM_FI_DEV_FB_FREE{gpu="0",UUID="GPU-aaaa",pci_bus_id="00000000:07:00.0",device="nvidia0",modelName="NVIDIA A100-SXM4-40GB",Hostname="n1"} 40000
# TYPE DCGM_FI_DEV_FB_USED gauge
DCGM_FI_DEV_FB_USED{gpu="0",UUID="GPU-aaaa",modelName="NVIDIA A100-SXM4-40GB"} 460
DCGM_FI_DEV_FB_USED{gpu="1",UUID="GPU-bbbb",modelName="NVIDIA A100-SXM4-40GB"} 10460
# TYPE DCGM_FI_DEV_FB_TOTAL gauge
DCGM_FI_DEV_FB_TOTAL{gpu="0",UUID="GPU-aaaa"} 40960
DCGM_FI_DEV_FB_TOTAL{gpu="1",UUID="GPU-bbbb"} 40960
# TYPE DCGM_FI_PROF_SM_ACTIVE gauge
DCGM_FI_PROF_SM_ACTIVE{gpu="0",UUID="GPU-aaaa"} 0.000000
DCGM_FI_PROF_SM_ACTIVE{gpu="1",UUID="GPU-bbbb",pod="train-1",namespace="ml",container="c"} 0.734
DCGM_FI_PROF_SM_ACTIVE{gpu="1",UUID="GPU-bbbb",pod="train-2",namespace="ml",container="c"} 0.734
# TYPE DCGM_FI_PROF_SM_OCCUPANCY gauge
DCGM_FI_PROF_SM_OCCUPANCY{gpu="1",UUID="GPU-bbbb"} 0.41
# TYPE DCGM_FI_PROF_DRAM_ACTIVE gauge
DCGM_FI_PROF_DRAM_ACTIVE{gpu="1",UUID="GPU-bbbb"} 0.22
# TYPE DCGM_FI_DEV_POWER_USAGE gauge
DCGM_FI_DEV_POWER_USAGE{gpu="1",UUID="GPU-bbbb"} 251.5
# TYPE DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION counter
DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION{gpu="1",UUID="GPU-bbbb"} 123456789
# TYPE DCGM_FI_DEV_XID_ERRORS gauge
DCGM_FI_DEV_XID_ERRORS{gpu="0",UUID="GPU-aaaa"} 79
DCGM_FI_DEV_XID_ERRORS{gpu="1",UUID="GPU-bbbb"} 13
"#;

    #[test]
    fn parses_fields_by_uuid_in_index_order() {
        let gpus = parse_exposition(TEXT).unwrap();
        assert_eq!(gpus.len(), 2);
        let (a, b) = (&gpus[0], &gpus[1]);
        assert_eq!((a.uuid.as_str(), a.index), ("GPU-aaaa", Some(0)));
        assert_eq!(b.model.as_deref(), Some("NVIDIA A100-SXM4-40GB"));
        assert_eq!(b.sm_active, Some(0.734));
        assert_eq!(b.sm_occupancy, Some(0.41));
        assert_eq!(b.dram_active, Some(0.22));
        assert_eq!(a.sm_occupancy, None);
        assert_eq!(b.fb_free_mib, Some(30000.0));
        assert_eq!(b.energy_mj, Some(123456789.0));
    }

    #[test]
    fn dcgm_alone_builds_full_samples_with_sources_and_health() {
        let gpus = parse_exposition(TEXT).unwrap();
        let a = gpus[0].to_sample(0);
        let b = gpus[1].to_sample(1);
        assert_eq!(b.memory_total_bytes, 40960 * MIB);
        assert_eq!(b.memory_used_bytes, 10460 * MIB);
        assert_eq!(b.memory_free_bytes, 30000 * MIB);
        assert_eq!(b.sm_activity.unwrap().source, ActivitySource::Dcgm);
        assert_eq!(b.power_watts, Some(251.5));
        assert!((b.energy_joules.unwrap() - 123456.789).abs() < 1e-6);
        assert!(b.healthy, "XID 13 is an application error");
        assert!(!a.healthy);
        assert_eq!(a.health_reason.as_deref(), Some("XID 79 (dcgm-exporter)"));
    }

    #[test]
    fn dcgm_and_nvml_figures_never_mix_in_one_sample() {
        let mut gpus = parse_exposition(TEXT).unwrap();
        let mut s = GpuSample::basic(0, "GPU-aaaa", "m", 1, 0);
        s.sm_occupancy = Activity::new(0.3, ActivitySource::Gpm);
        gpus[0].sm_occupancy = None;
        gpus[0].apply_activity(&mut s);
        assert_eq!(s.sm_activity.unwrap().source, ActivitySource::Dcgm);
        assert_eq!(
            s.sm_occupancy, None,
            "GPM occupancy must not join DCGM's SM activity"
        );
        // DCGM has nothing for the GPU: NVML's figures stay, all of them.
        let mut t = GpuSample::basic(0, "GPU-aaaa", "m", 1, 0);
        t.sm_activity = Activity::new(0.5, ActivitySource::NvmlUtil);
        let empty = DcgmGpu {
            uuid: "GPU-aaaa".into(),
            ..DcgmGpu::default()
        };
        empty.apply_activity(&mut t);
        assert_eq!(t.sm_activity.unwrap().source, ActivitySource::NvmlUtil);
    }

    #[test]
    fn bad_endpoints_are_rejected() {
        for bad in ["https://x:9400/metrics", "not a url", "/metrics"] {
            let err = DcgmBackend::new(bad, None).unwrap_err().to_string();
            assert!(err.contains("--dcgm-endpoint"), "{bad}: {err}");
        }
    }

    #[tokio::test]
    async fn unreachable_endpoint_is_an_error_not_a_panic() {
        let b = DcgmBackend::new("http://127.0.0.1:9/metrics", None).unwrap();
        let err = b.sample(&SampleContext::default()).await.unwrap_err();
        assert!(err.to_string().contains("dcgm-exporter"), "{err}");
    }
}
