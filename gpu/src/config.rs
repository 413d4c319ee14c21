//! The GPU layer's configuration values and the parsers of their flag values: which backend
//! samples the GPUs, the simulated GPUs and the metric set they mimic, MPS settings, and
//! durations (`carma device-plugin`, `carma dra-driver` and `carma local` parse theirs here).

use std::path::PathBuf;
use std::str::FromStr;
use std::time::Duration;

use thiserror::Error;

/// A flag value that cannot be used. The message names the flag and says what is expected.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum ConfigError {
    /// `--simulated-gpus` is not `COUNTxSIZE`.
    #[error(
        "--simulated-gpus {0:?}: expected COUNTxSIZE such as 4x40GiB or 8x80GiB (1..=64 GPUs, size at least 1GiB)"
    )]
    SimulatedGpus(String),
    /// A duration flag is not a positive duration.
    #[error("{flag} {value:?}: expected a positive duration such as 1s, 500ms or 2m")]
    Duration {
        /// The flag.
        flag: &'static str,
        /// What was given.
        value: String,
    },
    /// `--backend` is unknown.
    #[error("--backend {0:?}: expected nvml, dcgm or simulated")]
    Backend(String),
    /// `--backend dcgm` without `--dcgm-endpoint`.
    #[error(
        "--backend dcgm needs --dcgm-endpoint (the dcgm-exporter URL, e.g. http://127.0.0.1:9400/metrics)"
    )]
    NoDcgmEndpoint,
    /// An activity window of no samples.
    #[error("the activity window must hold at least one sample")]
    EmptyWindow,
    /// Another flag is out of range.
    #[error("{0}")]
    Invalid(String),
}

/// Which GPU backend samples the GPUs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BackendKind {
    /// NVML through nvml-wrapper (GPM SM activity on Hopper and newer, NVML utilization otherwise).
    Nvml,
    /// Scrape dcgm-exporter for SM activity, occupancy and DRAM activity; NVML for inventory and
    /// memory where it can be loaded, else dcgm-exporter alone.
    Dcgm,
    /// Simulated GPUs with scripted load (tests and demos).
    Simulated,
}

impl BackendKind {
    /// The name used in flags and in `GpuNode.spec.backend`.
    pub fn as_str(self) -> &'static str {
        match self {
            BackendKind::Nvml => "nvml",
            BackendKind::Dcgm => "dcgm",
            BackendKind::Simulated => "simulated",
        }
    }
}

impl FromStr for BackendKind {
    type Err = ConfigError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s.trim().to_ascii_lowercase().as_str() {
            "nvml" => Ok(BackendKind::Nvml),
            "dcgm" => Ok(BackendKind::Dcgm),
            "simulated" | "sim" => Ok(BackendKind::Simulated),
            _ => Err(ConfigError::Backend(s.to_string())),
        }
    }
}

/// The metric set the simulated backend mimics (`--simulated-metrics`), so every gate rule and
/// every visibility path can be seen end to end without a GPU.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum SimulatedMetrics {
    /// NVML without GPM (pre-Hopper): SM activity and DRAM activity, processes listed.
    Nvml,
    /// NVML with GPM (Hopper and newer): SM activity, SM occupancy, DRAM activity, processes listed.
    #[default]
    Gpm,
    /// dcgm-exporter without NVML: all three activity metrics, no process list.
    Dcgm,
}

impl SimulatedMetrics {
    /// The flag value.
    pub fn as_str(self) -> &'static str {
        match self {
            SimulatedMetrics::Nvml => "nvml",
            SimulatedMetrics::Gpm => "gpm",
            SimulatedMetrics::Dcgm => "dcgm",
        }
    }
}

impl FromStr for SimulatedMetrics {
    type Err = ConfigError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s.trim() {
            "nvml" => Ok(SimulatedMetrics::Nvml),
            "gpm" => Ok(SimulatedMetrics::Gpm),
            "dcgm" => Ok(SimulatedMetrics::Dcgm),
            _ => Err(ConfigError::Invalid(format!(
                "--simulated-metrics {s:?}: expected nvml (no occupancy), gpm or dcgm (no process list)"
            ))),
        }
    }
}

/// How a node agent samples its GPUs: the backend, what it scrapes or simulates, and the
/// sampling interval and window. The device plugin, the DRA driver and `carma local` open their
/// backend from it ([`crate::backends::open_backend`]).
#[derive(Debug, Clone, PartialEq)]
pub struct BackendSettings {
    /// Which backend.
    pub kind: BackendKind,
    /// The simulated GPUs (backend `simulated`).
    pub simulated_gpus: SimulatedGpus,
    /// The metric set the simulated GPUs mimic (backend `simulated`).
    pub simulated_metrics: SimulatedMetrics,
    /// dcgm-exporter's metrics URL (backend `dcgm`).
    pub dcgm_endpoint: Option<String>,
    /// Telemetry sampling interval.
    pub sample_interval: Duration,
    /// Samples per activity window (CARMA: 30).
    pub window: usize,
}

impl BackendSettings {
    /// `kind` with the defaults: four simulated 40 GiB GPUs mimicking GPM, no dcgm-exporter, a
    /// sample a second into CARMA's window.
    pub fn new(kind: BackendKind) -> Self {
        Self {
            kind,
            simulated_gpus: SimulatedGpus::default(),
            simulated_metrics: SimulatedMetrics::default(),
            dcgm_endpoint: None,
            sample_interval: Duration::from_secs(1),
            window: carma_core::telemetry::DEFAULT_WINDOW,
        }
    }

    /// Check what the flag parsers cannot check alone.
    pub fn validate(&self) -> Result<(), ConfigError> {
        if self.kind == BackendKind::Dcgm && self.dcgm_endpoint.is_none() {
            return Err(ConfigError::NoDcgmEndpoint);
        }
        if self.window == 0 {
            return Err(ConfigError::EmptyWindow);
        }
        Ok(())
    }
}

/// Simulated GPUs: how many and how much memory each (`--simulated-gpus 4x40GiB`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SimulatedGpus {
    /// Number of GPUs (1..=64).
    pub count: u32,
    /// Memory of each GPU in MiB.
    pub memory_mib: u64,
}

impl Default for SimulatedGpus {
    fn default() -> Self {
        Self {
            count: 4,
            memory_mib: 40 * 1024,
        }
    }
}

impl FromStr for SimulatedGpus {
    type Err = ConfigError;

    /// Parse `COUNTxSIZE`, SIZE a Kubernetes-style quantity (`40Gi`, `40GiB`, `81920Mi`, `80G`).
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let bad = || ConfigError::SimulatedGpus(s.to_string());
        let (count, size) = s.trim().split_once(['x', 'X']).ok_or_else(bad)?;
        let count: u32 = count.trim().parse().map_err(|_| bad())?;
        if !(1..=64).contains(&count) {
            return Err(bad());
        }
        let mut size = size.trim().to_string();
        // Accept the byte suffix people write (GiB, MiB, GB) as well as Kubernetes quantities.
        if size.ends_with("iB")
            || size.ends_with("GB")
            || size.ends_with("MB")
            || size.ends_with("TB")
        {
            size.pop();
        }
        let memory_mib = carma_core::quantity::parse_mib(&size).map_err(|_| bad())?;
        if memory_mib < 1024 {
            return Err(bad());
        }
        Ok(Self { count, memory_mib })
    }
}

/// Parse a duration such as `1s`, `500ms`, `2m` or `1.5s`, at most a day.
pub fn parse_duration(flag: &'static str, text: &str) -> Result<Duration, ConfigError> {
    parse_duration_up_to(flag, text, Duration::from_secs(86_400))
}

/// [`parse_duration`] up to `max` instead of a day; the units are `ms`, `s` (or none), `m`, `h`
/// and `d`.
pub fn parse_duration_up_to(
    flag: &'static str,
    text: &str,
    max: Duration,
) -> Result<Duration, ConfigError> {
    let bad = || ConfigError::Duration {
        flag,
        value: text.to_string(),
    };
    let s = text.trim();
    let split = s
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(s.len());
    let (number, unit) = s.split_at(split);
    let value: f64 = number.parse().map_err(|_| bad())?;
    let seconds = match unit.trim() {
        "ms" => value / 1000.0,
        "s" | "" => value,
        "m" => value * 60.0,
        "h" => value * 3600.0,
        "d" => value * 86_400.0,
        _ => return Err(bad()),
    };
    if !seconds.is_finite() || seconds <= 0.0 || seconds > max.as_secs_f64() {
        return Err(bad());
    }
    Ok(Duration::from_secs_f64(seconds))
}

/// MPS settings applied by Allocate when `--mps` is on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MpsConfig {
    /// Host directory of the MPS control daemon's pipes, mounted into containers and exported as
    /// `CUDA_MPS_PIPE_DIRECTORY`; `None` leaves the container's default.
    pub pipe_directory: Option<PathBuf>,
    /// Host directory holding the MPS server's shared memory, mounted at the container's
    /// `/dev/shm` (a pod's private `/dev/shm` cannot reach the server's segments); `None`: not
    /// mounted.
    pub shm_directory: Option<PathBuf>,
    /// Host directory of the MPS control daemon's logs, mounted read-only and exported as
    /// `CUDA_MPS_LOG_DIRECTORY`; `None`: not mounted.
    pub log_directory: Option<PathBuf>,
    /// `CUDA_MPS_ACTIVE_THREAD_PERCENTAGE` for shared pods; `None` (the default) leaves SMs
    /// unlimited, so a pod alone on a GPU gets all of it and the utilization gate, not a static
    /// split, keeps collocated pods from starving each other.
    pub active_thread_percentage: Option<u32>,
}

impl MpsConfig {
    /// MPS with the control daemon's default directories and no SM limit.
    pub fn with_defaults() -> Self {
        Self {
            pipe_directory: Some(PathBuf::from("/tmp/nvidia-mps")),
            shm_directory: Some(PathBuf::from("/dev/shm")),
            log_directory: Some(PathBuf::from("/var/log/nvidia-mps")),
            active_thread_percentage: None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn simulated_gpus_table() {
        let ok = [
            ("4x40GiB", 4, 40960),
            ("8x80GiB", 8, 81920),
            ("2x40Gi", 2, 40960),
            ("1X16384Mi", 1, 16384),
            (" 3x24GB ", 3, 22889),
        ];
        for (text, count, mib) in ok {
            let g: SimulatedGpus = text.parse().unwrap();
            assert_eq!((g.count, g.memory_mib), (count, mib), "{text}");
        }
        for bad in [
            "", "4", "x40GiB", "0x40GiB", "65x40GiB", "4x", "4x512Mi", "4xlots", "-1x4Gi",
        ] {
            let err = bad.parse::<SimulatedGpus>().unwrap_err();
            assert!(err.to_string().contains("--simulated-gpus"), "{bad}: {err}");
        }
    }

    #[test]
    fn durations() {
        assert_eq!(parse_duration("f", "1s").unwrap(), Duration::from_secs(1));
        assert_eq!(
            parse_duration("f", "500ms").unwrap(),
            Duration::from_millis(500)
        );
        assert_eq!(parse_duration("f", "2m").unwrap(), Duration::from_secs(120));
        assert_eq!(
            parse_duration("f", "1.5s").unwrap(),
            Duration::from_millis(1500)
        );
        assert_eq!(parse_duration("f", "3").unwrap(), Duration::from_secs(3));
        for bad in ["", "0s", "-1s", "1 day", "s", "1e9s", "2d"] {
            let err = parse_duration("--sample-interval", bad).unwrap_err();
            assert!(err.to_string().contains("--sample-interval"), "{bad}");
        }
        let year = Duration::from_secs(365 * 86_400);
        assert_eq!(
            parse_duration_up_to("f", "2d", year).unwrap(),
            Duration::from_secs(172_800)
        );
        assert!(parse_duration_up_to("f", "366d", year).is_err());
    }

    #[test]
    fn backend_settings_validation_names_the_flag() {
        let mut s = BackendSettings::new(BackendKind::Simulated);
        assert_eq!(s.validate(), Ok(()));
        assert_eq!(s.sample_interval, Duration::from_secs(1));
        assert_eq!(s.window, carma_core::telemetry::DEFAULT_WINDOW);
        s.kind = BackendKind::Dcgm;
        let err = s.validate().unwrap_err().to_string();
        assert!(err.contains("--dcgm-endpoint"), "{err}");
        s.dcgm_endpoint = Some("http://127.0.0.1:9400/metrics".into());
        assert_eq!(s.validate(), Ok(()));
        s.window = 0;
        assert_eq!(s.validate(), Err(ConfigError::EmptyWindow));
    }

    #[test]
    fn backend_names() {
        for kind in [BackendKind::Nvml, BackendKind::Dcgm, BackendKind::Simulated] {
            assert_eq!(kind.as_str().parse::<BackendKind>().unwrap(), kind);
        }
        assert!("cuda".parse::<BackendKind>().is_err());
    }
}
