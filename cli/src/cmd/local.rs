//! `carma local`: CARMA on one GPU machine without Kubernetes.
//!
//! ```text
//! carma local serve  --state-dir DIR --backend nvml|dcgm|simulated [--simulated-gpus 4x40GiB] [--policy P] [--queue-order O]
//! carma local submit --state-dir DIR [--gpu-memory 4Gi | --profile F | --summary F ... | --rad F] [--gpus N] [--expected-duration 45m] -- COMMAND...
//! carma local status --state-dir DIR [--format json|table]
//! carma local replay --state-dir DIR --trace philly_mix-90-tasks.sh [--workloads DIR] [--time-scale X]
//! carma local report --state-dir DIR [--format table|json] [--out DIR]
//! ```
//!
//! Bad input (flags, files, a missing state directory) prints what is wrong and exits 2.
//! The library is `carma-local`; see `local/README.md`.

use std::path::PathBuf;
use std::process::ExitCode;
use std::str::FromStr;
use std::time::Duration;

use carma_core::Policy;
use carma_gpu::SimulatedGpus;
use carma_gpu::config::{SimulatedMetrics, parse_duration, parse_duration_up_to};
use carma_local::reservation::{MemorySource, Resolved, resolve_full};
use carma_local::spec::{JobSpec, new_job_id, now_ms, submit};
use carma_local::{BackendChoice, LocalError, ServeConfig, StateDir};
use clap::{Args, Subcommand, ValueEnum};

use super::EXIT_BAD_INPUT;

/// Arguments of `carma local`.
#[derive(Debug, Args)]
pub struct LocalArgs {
    #[command(subcommand)]
    command: LocalCommand,
}

#[derive(Debug, Subcommand)]
enum LocalCommand {
    /// Run the daemon of this machine: queue, placement, launch, out-of-memory recovery.
    Serve(ServeArgs),
    /// Submit a job (prints its id).
    Submit(SubmitArgs),
    /// Show jobs and GPUs.
    Status(StatusArgs),
    /// Submit a CARMA trace script's jobs at its gaps.
    Replay(ReplayArgs),
    /// Summarise a run like `carma simulate` does (table, JSON, HTML).
    Report(ReportArgs),
}

/// Which GPU backend.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
enum Backend {
    /// NVML (the NVIDIA driver).
    Nvml,
    /// dcgm-exporter (with NVML where it loads).
    Dcgm,
    /// The device plugin's simulated GPUs (no GPU needed).
    Simulated,
}

#[derive(Debug, Args)]
struct ServeArgs {
    /// State directory (created when missing).
    #[arg(long)]
    state_dir: PathBuf,
    /// GPU backend.
    #[arg(long, value_enum, default_value_t = Backend::Nvml)]
    backend: Backend,
    /// Simulated GPUs, COUNTxSIZE (backend simulated).
    #[arg(long, default_value = "4x40GiB", value_parser = |s: &str| SimulatedGpus::from_str(s).map_err(|e| e.to_string()))]
    simulated_gpus: SimulatedGpus,
    /// Metric set the simulated GPUs mimic: gpm (all, with a process list), nvml (no SM
    /// occupancy) or dcgm (no process list).
    #[arg(long, default_value = "gpm", value_parser = |s: &str| SimulatedMetrics::from_str(s).map_err(|e| e.to_string()))]
    simulated_metrics: SimulatedMetrics,
    /// dcgm-exporter URL (backend dcgm).
    #[arg(long, default_value = "http://127.0.0.1:9400/metrics")]
    dcgm_endpoint: String,
    /// Policy of jobs that name none: CARMA's exclusive, ff, bf, magm, lug, rr, or carma's pack.
    #[arg(long, default_value_t = Policy::DEFAULT, value_parser = parse_policy)]
    policy: Policy,
    /// Loop and sampling period (e.g. 1s, 200ms).
    #[arg(long, default_value = "1s", value_parser = |s: &str| parse_duration("--interval", s).map_err(|e| e.to_string()))]
    interval: Duration,
    /// Samples per activity window (CARMA: 30); no sharing decision before it has filled.
    #[arg(long, default_value_t = 30, value_parser = clap::value_parser!(u32).range(1..=3600))]
    window: u32,
    /// Warm-up lock: a GPU that just received a job takes no other until the job's memory shows
    /// or this long passes.
    #[arg(long, default_value = "30s", value_parser = |s: &str| parse_duration("--warm-up", s).map_err(|e| e.to_string()))]
    warm_up: Duration,
    /// Attempts per job, the first included (1 to 100).
    #[arg(long, default_value_t = 5, value_parser = clap::value_parser!(u32).range(1..=100))]
    max_attempts: u32,
    /// Out-of-memory crashes after which the next attempt runs exclusively.
    #[arg(long, default_value_t = 2, value_parser = clap::value_parser!(u32).range(1..=100))]
    exclusive_after_ooms: u32,
    /// First back-off before a retry, doubled per attempt (e.g. 10s, 0s).
    #[arg(long, default_value = "10s", value_parser = parse_backoff)]
    recovery_backoff: Duration,
    /// Set CUDA_MPS_PINNED_DEVICE_MEM_LIMIT to each job's reservation (needs a running MPS daemon).
    #[arg(long)]
    mps: bool,
    /// Exit once nothing is spooled, queued or running.
    #[arg(long)]
    exit_when_idle: bool,
    /// Order of each queue by the duration jobs declare (submit --expected-duration), then
    /// arrival: arrival (CARMA's first in first out), shortest-first, longest-first or
    /// `short-then-longest[:MINUTES]`; the queue stays strict (its head blocks the rest).
    #[arg(long, default_value = "arrival", value_parser = |s: &str| s.parse::<carma_core::QueueOrder>())]
    queue_order: carma_core::QueueOrder,
}

#[derive(Debug, Args)]
struct SubmitArgs {
    /// State directory of the daemon.
    #[arg(long)]
    state_dir: PathBuf,
    /// Memory per GPU (e.g. 4Gi, 4GiB, 4096Mi): overrides any estimate.
    #[arg(long, conflicts_with_all = ["profile", "summary", "rad"])]
    gpu_memory: Option<String>,
    /// The job's `carma.io/model-profile` JSON: GPUMemNet estimates its memory.
    #[arg(long, conflicts_with_all = ["summary", "rad"])]
    profile: Option<PathBuf>,
    /// A `torchsummary` table of the job's model (needs --family and --batch-size).
    #[arg(long, requires_all = ["family", "batch_size"], conflicts_with = "rad")]
    summary: Option<PathBuf>,
    /// Model family of --summary: mlp, cnn or transformer.
    #[arg(long, requires = "summary")]
    family: Option<String>,
    /// Training batch size of --summary.
    #[arg(long, requires = "summary")]
    batch_size: Option<u32>,
    /// A CARMA `.rad` task file: its command, GPU count and recorded GPUMemNet estimate.
    #[arg(long)]
    rad: Option<PathBuf>,
    /// GPUs (default 1, or the .rad file's).
    #[arg(long, value_parser = clap::value_parser!(u32).range(1..=64))]
    gpus: Option<u32>,
    /// Placement policy for this job (default: the daemon's).
    #[arg(long, value_parser = parse_policy)]
    policy: Option<Policy>,
    /// Expected SM activity of the job alone, 0 to 1 (read only by the `pack` policy; a
    /// --profile or --summary job gets carma-estimator's model-class prior otherwise).
    #[arg(long, value_parser = parse_activity)]
    sm_activity: Option<f64>,
    /// How long the job runs with its GPUs to itself (e.g. 45m, 2h, 300s): the daemon's
    /// --queue-order ranks jobs by it.
    #[arg(long, value_parser = parse_expected_duration)]
    expected_duration: Option<Duration>,
    /// Display name (default: the .rad file or the command).
    #[arg(long)]
    name: Option<String>,
    /// The command and its arguments (after `--`).
    #[arg(last = true)]
    command: Vec<String>,
}

/// Output format.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
enum Format {
    /// For people.
    Table,
    /// For scripts.
    Json,
}

#[derive(Debug, Args)]
struct StatusArgs {
    /// State directory of the daemon.
    #[arg(long)]
    state_dir: PathBuf,
    /// Output format.
    #[arg(long, value_enum, default_value_t = Format::Table)]
    format: Format,
}

#[derive(Debug, Args)]
struct ReplayArgs {
    /// State directory of the daemon.
    #[arg(long)]
    state_dir: PathBuf,
    /// CARMA trace script (`submit.py --task X.rad` / `sleep N` lines).
    #[arg(long)]
    trace: PathBuf,
    /// Folder of the .rad files [default: workloads/ beside the trace].
    #[arg(long)]
    workloads: Option<PathBuf>,
    /// Multiplier on the gaps (0.01: a hundred times faster; 0: all at once).
    #[arg(long, default_value_t = 1.0)]
    time_scale: f64,
    /// Run this shell command instead of each task's own. Placeholders: {rad}, {peak_mib} (the
    /// task's measured peak per GPU), {seconds} (its exclusive run time × --time-scale; needs
    /// --durations). E.g. 'echo {peak_mib} > "$CARMA_LOCAL_MEMORY_FILE"; sleep {seconds}'.
    #[arg(long)]
    command: Option<String>,
    /// CARMA's `rad,exclusive_minutes` CSV (for {seconds}).
    #[arg(long)]
    durations: Option<PathBuf>,
    /// Working directory of the jobs [default: the current directory].
    #[arg(long)]
    cwd: Option<PathBuf>,
}

#[derive(Debug, Args)]
struct ReportArgs {
    /// State directory of the run.
    #[arg(long)]
    state_dir: PathBuf,
    /// Output format.
    #[arg(long, value_enum, default_value_t = Format::Table)]
    format: Format,
    /// Also write report.html and results.json into this folder.
    #[arg(long)]
    out: Option<PathBuf>,
}

/// `--expected-duration`: a number of seconds, or with a unit `s`, `m`, `h` or `d`; 1 s to 365 d.
fn parse_expected_duration(s: &str) -> Result<Duration, String> {
    parse_duration_up_to("--expected-duration", s, Duration::from_secs(365 * 86_400))
        .ok()
        .filter(|d| d.as_secs_f64() >= 1.0)
        .ok_or_else(|| format!("{s:?} is not a duration from 1s to 365d (e.g. 300, 45m, 2h, 1.5d)"))
}

fn parse_policy(s: &str) -> Result<Policy, String> {
    Policy::from_str(s).map_err(|e| e.to_string())
}

fn parse_activity(s: &str) -> Result<f64, String> {
    match s.trim().parse::<f64>() {
        Ok(v) if (0.0..=1.0).contains(&v) => Ok(v),
        _ => Err(format!("{s:?}: expected a number from 0 to 1")),
    }
}

fn parse_backoff(s: &str) -> Result<Duration, String> {
    if s.trim().trim_end_matches(['s', 'm']).trim() == "0" {
        return Ok(Duration::ZERO);
    }
    parse_duration("--recovery-backoff", s).map_err(|e| e.to_string())
}

/// Run `carma local`.
pub fn run(args: LocalArgs) -> anyhow::Result<ExitCode> {
    let result = match args.command {
        LocalCommand::Serve(a) => serve(a),
        LocalCommand::Submit(a) => submit_job(a),
        LocalCommand::Status(a) => status(a),
        LocalCommand::Replay(a) => replay(a),
        LocalCommand::Report(a) => report(a),
    };
    match result {
        Ok(()) => Ok(ExitCode::SUCCESS),
        Err(e) => match e.downcast_ref::<LocalError>() {
            Some(local) if local.is_bad_input() => {
                eprintln!("carma local: {local}");
                Ok(ExitCode::from(EXIT_BAD_INPUT))
            }
            _ => Err(e),
        },
    }
}

fn serve(a: ServeArgs) -> anyhow::Result<()> {
    let backend = match a.backend {
        Backend::Nvml => BackendChoice::Nvml,
        Backend::Dcgm => BackendChoice::Dcgm {
            endpoint: a.dcgm_endpoint,
        },
        Backend::Simulated => BackendChoice::Simulated(a.simulated_gpus, a.simulated_metrics),
    };
    let mut cfg = ServeConfig::new(a.state_dir, backend);
    cfg.policy = a.policy;
    cfg.interval = a.interval;
    cfg.window = a.window as usize;
    cfg.placement.warmup_ms = a.warm_up.as_millis() as u64;
    cfg.recovery.max_attempts = a.max_attempts;
    cfg.recovery.exclusive_after_ooms = a.exclusive_after_ooms;
    cfg.recovery.backoff_base_ms = a.recovery_backoff.as_millis() as u64;
    cfg.mps_memory_limit = a.mps;
    cfg.exit_when_idle = a.exit_when_idle;
    cfg.queue_order = a.queue_order;
    let rt =
        super::runtime().map_err(|e| LocalError::bad_input(format!("cannot start tokio: {e}")))?;
    Ok(rt.block_on(carma_local::serve(cfg, super::shutdown_signal()))?)
}

fn submit_job(a: SubmitArgs) -> anyhow::Result<()> {
    let dir = StateDir::existing(&a.state_dir)?;
    let rad = a
        .rad
        .as_deref()
        .map(carma_local::task_file::read_rad)
        .transpose()?;
    let resolved = match (&rad, &a.gpu_memory, &a.profile, &a.summary) {
        (_, Some(q), _, _) => resolve_full(&MemorySource::Override(q.clone()))?,
        (_, _, Some(p), _) => resolve_full(&MemorySource::Profile(p.clone()))?,
        (_, _, _, Some(s)) => resolve_full(&MemorySource::Summary {
            path: s.clone(),
            family: a.family.clone().unwrap_or_default(),
            batch_size: a.batch_size.unwrap_or(0),
        })?,
        (Some(r), _, _, _) => Resolved {
            reservation: r.reservation,
            source: "rad-gpumemnet".to_string(),
            expected_sm_activity: None,
        },
        _ => resolve_full(&MemorySource::None)?,
    };
    let command = match (&rad, a.command.is_empty()) {
        (_, false) => a.command.clone(),
        (Some(r), true) => carma_local::replay::shell(&r.command),
        (None, true) => {
            return Err(LocalError::bad_input(
                "no command: put it after `--` (e.g. `carma local submit --state-dir DIR -- python train.py`) or give --rad",
            )
            .into());
        }
    };
    let now = now_ms();
    let name = a
        .name
        .or_else(|| rad.as_ref().map(|r| r.name.clone()))
        .unwrap_or_else(|| command_name(&command));
    let cwd = std::env::current_dir()
        .map_err(|e| LocalError::bad_input(format!("cannot read the current directory: {e}")))?;
    let spec = JobSpec {
        id: new_job_id(now),
        name,
        command,
        cwd,
        gpus: a.gpus.or(rad.as_ref().map(|r| r.gpus)).unwrap_or(1),
        reservation: resolved.reservation,
        reservation_source: resolved.source,
        policy: a.policy,
        expected_sm_activity: a.sm_activity.or(resolved.expected_sm_activity),
        expected_duration_ms: a.expected_duration.map(|d| d.as_millis() as u64),
        submitted_at_ms: now,
    };
    submit(&dir, &spec)?;
    outln!("{}", spec.id)
}

/// The program's base name, as a job's default display name.
fn command_name(command: &[String]) -> String {
    command
        .first()
        .map(|c| c.rsplit('/').next().unwrap_or(c).to_string())
        .unwrap_or_default()
}

fn status(a: StatusArgs) -> anyhow::Result<()> {
    let dir = StateDir::existing(&a.state_dir)?;
    let s = carma_local::status::status(&dir)?;
    match a.format {
        Format::Json => outln!("{}", serde_json::to_string_pretty(&s)?),
        Format::Table => out!("{}", carma_local::status::render_table(&s)),
    }
}

fn replay(a: ReplayArgs) -> anyhow::Result<()> {
    let dir = StateDir::existing(&a.state_dir)?;
    let cwd = match a.cwd {
        Some(c) => c,
        None => std::env::current_dir().map_err(|e| {
            LocalError::bad_input(format!("cannot read the current directory: {e}"))
        })?,
    };
    let opts = carma_local::replay::ReplayOptions {
        workloads: a
            .workloads
            .unwrap_or_else(|| carma_local::replay::default_workloads(&a.trace)),
        trace: a.trace,
        time_scale: a.time_scale,
        command: a.command,
        durations: a.durations,
        cwd,
    };
    let ids = carma_local::replay::replay(&dir, &opts)?;
    for id in ids {
        outln!("{id}")?;
    }
    Ok(())
}

fn report(a: ReportArgs) -> anyhow::Result<()> {
    let dir = StateDir::existing(&a.state_dir)?;
    let r = carma_local::report::report(&dir)?;
    match a.format {
        Format::Table => out!("{}", r.table())?,
        Format::Json => outln!("{}", serde_json::to_string_pretty(&r.json())?)?,
    }
    if let Some(out) = &a.out {
        let written = r.write(out)?;
        eprintln!("carma local: report written to {}", written.display());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use clap::Parser;

    use super::*;

    #[derive(Debug, Parser)]
    struct Cli {
        #[command(flatten)]
        args: LocalArgs,
    }

    fn parse(args: &[&str]) -> Result<LocalArgs, String> {
        Cli::try_parse_from(std::iter::once("local").chain(args.iter().copied()))
            .map(|c| c.args)
            .map_err(|e| e.to_string())
    }

    #[test]
    fn expected_durations_and_queue_orders() {
        for (text, secs) in [
            ("300", 300.0),
            ("45m", 2_700.0),
            ("2h", 7_200.0),
            ("1.5d", 129_600.0),
        ] {
            assert_eq!(
                parse_expected_duration(text).unwrap().as_secs_f64(),
                secs,
                "{text}"
            );
        }
        for bad in ["0", "0.5s", "366d", "2 weeks", "", "-5m"] {
            let e = parse_expected_duration(bad).unwrap_err();
            assert!(e.contains("1s to 365d"), "{bad}: {e}");
        }
        let e = parse(&["serve", "--state-dir", "/tmp/x", "--queue-order", "sjf"]).unwrap_err();
        assert!(e.contains("unknown queue order"), "{e}");
        assert!(
            parse(&[
                "serve",
                "--state-dir",
                "/tmp/x",
                "--queue-order",
                "short-then-longest:45"
            ])
            .is_ok()
        );
    }

    #[test]
    fn bad_flags_name_the_flag_and_what_is_expected() {
        let e = parse(&["serve", "--state-dir", "/tmp/x", "--simulated-gpus", "4x"]).unwrap_err();
        assert!(
            e.contains("--simulated-gpus") && e.contains("COUNTxSIZE"),
            "{e}"
        );
        let e = parse(&["serve", "--state-dir", "/tmp/x", "--policy", "fastest"]).unwrap_err();
        assert!(e.contains("unknown policy \"fastest\""), "{e}");
        let e = parse(&[
            "submit",
            "--state-dir",
            "/tmp/x",
            "--gpu-memory",
            "4Gi",
            "--rad",
            "a.rad",
        ])
        .unwrap_err();
        assert!(e.contains("--rad"), "{e}");
        let e = parse(&[
            "submit",
            "--state-dir",
            "/tmp/x",
            "--sm-activity",
            "1.5",
            "--",
            "true",
        ])
        .unwrap_err();
        assert!(e.contains("from 0 to 1"), "{e}");
        assert!(
            parse(&[
                "serve",
                "--state-dir",
                "/tmp/x",
                "--backend",
                "simulated",
                "--simulated-gpus",
                "2x80GiB"
            ])
            .is_ok()
        );
    }

    #[test]
    fn a_missing_state_dir_exits_2() {
        let args = parse(&["status", "--state-dir", "/nonexistent/carma-local-state"]).unwrap();
        assert_eq!(run(args).unwrap(), ExitCode::from(EXIT_BAD_INPUT));
        let args = parse(&[
            "submit",
            "--state-dir",
            "/nonexistent/carma-local-state",
            "--",
            "true",
        ])
        .unwrap();
        assert_eq!(run(args).unwrap(), ExitCode::from(EXIT_BAD_INPUT));
    }

    #[test]
    fn submit_without_a_command_or_rad_exits_2() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().to_str().unwrap();
        let args = parse(&["submit", "--state-dir", dir, "--gpu-memory", "4Gi"]).unwrap();
        assert_eq!(run(args).unwrap(), ExitCode::from(EXIT_BAD_INPUT));
        let args = parse(&[
            "submit",
            "--state-dir",
            dir,
            "--gpu-memory",
            "lots",
            "--",
            "true",
        ])
        .unwrap();
        assert_eq!(run(args).unwrap(), ExitCode::from(EXIT_BAD_INPUT));
    }
}
