//! `carma simulate`: replay a job trace on simulated GPUs and compare
//! placement policies. With no flags it replays a generated 90-task mix on one
//! node with 4 × 40 GiB GPUs under every policy and prints the comparison.

use std::fs;
use std::path::PathBuf;
use std::process::ExitCode;
use std::str::FromStr;

use anyhow::Context as _;
use carma_core::QueueOrder;
use carma_core::{Policy, quantity::parse_mib};
use carma_simulator::config::MAX_DELAY_MS;
use carma_simulator::trace::{self, GeneratorConfig, ImportPaths};
use carma_simulator::{
    EstimatorKind, QueueDiscipline, QueueOrdering, SimConfig, SimError, compare_ordered, report,
};
use clap::ValueEnum;

use super::EXIT_BAD_INPUT;

/// Output format.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Format {
    /// A comparison table for people.
    Table,
    /// `{"policies": [...]}` for scripts.
    Json,
}

/// On or off.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Switch {
    /// Enabled.
    On,
    /// Disabled.
    Off,
}

/// Which priority a queue order sorts by.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum QueuePriority {
    /// The order's exact priority (one per declared duration).
    Exact,
    /// The PriorityClass an operator gives the pod.
    Classes,
}

/// How tasks sharing a GPU slow each other.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum SlowdownForm {
    /// (max(θ,s)/max(θ,D))^γ with --slowdown-threshold θ and --slowdown-exponent γ.
    Saturation,
    /// Max-min fair shares of the GPU's time, fitted on an H100 (docs/slowdown-on-h100.md);
    /// --slicing-* flags.
    TimeSlicing,
}

/// Arguments of `carma simulate`.
///
/// Every figure it prints is simulated: run times and peak memory are CARMA's
/// measurements, sharing slowdown, power and telemetry timing are models.
#[derive(Debug, clap::Args)]
pub struct SimulateArgs {
    /// Policies to run: `all`, or a comma-separated list of exclusive, ff, bf, magm, lug, rr, pack.
    #[arg(long, default_value = "all", value_parser = parse_policies)]
    pub policy: PolicyList,
    /// CARMA's utilization gate (exclude busy GPUs from sharing).
    #[arg(long, value_enum, default_value_t = Switch::On)]
    pub gate: Switch,
    /// How waiting tasks are queued: kube (kube-scheduler's order and back-off, how carma's pods
    /// are queued on Kubernetes; a task that does not fit lets the next ones by) or carma (CARMA's
    /// strict first-in first-out: it blocks the queue).
    #[arg(long, default_value = "kube", value_parser = |s: &str| s.parse::<QueueDiscipline>())]
    pub queue: QueueDiscipline,
    /// Order of each queue by a priority from the duration and GPUs a task declares, then
    /// arrival: arrival (no priority, today's queue), shortest-first (the shortest declared
    /// duration first), longest-first (the most declared GPU time, duration × GPUs, first) or
    /// `short-then-longest[:MINUTES]` (tasks declared shorter than MINUTES, default 30, shortest
    /// first, then the rest longest-first). A
    /// task declares its exclusive run time from the trace: perfect information, which no user
    /// has (--declared-duration-error). Under --queue carma the queue stays strict but is then a
    /// priority queue, no longer CARMA's first-in first-out.
    #[arg(long, default_value = "arrival", value_parser = |s: &str| s.parse::<QueueOrder>())]
    pub queue_order: QueueOrder,
    /// Largest factor by which a declared duration misses the task's exclusive run time, drawn
    /// log-uniformly per task between 1/F and F (1: exact; at most 100).
    #[arg(long, default_value_t = 1.0)]
    pub declared_duration_error: f64,
    /// Seed of the declared durations' errors.
    #[arg(long, default_value_t = 1)]
    pub declared_duration_seed: u64,
    /// Share of tasks that declare a duration at all, 0 to 1, drawn per task with
    /// --declared-duration-seed; the others declare none and queue behind every task that does.
    #[arg(long, default_value_t = 1.0)]
    pub declared_share: f64,
    /// With a --queue-order other than arrival: a task that has waited this long in the queue
    /// goes ahead of every task not yet promoted (seconds, e.g. 7200 or 120m; at most a day).
    /// Off by default.
    #[arg(long, value_parser = parse_seconds)]
    pub queue_promote_after: Option<u64>,
    /// With a --queue-order other than arrival: a queued task that declares at least F times
    /// the cluster's backlog (the declared GPU time still ahead of it, queued and running, ÷
    /// GPUs) goes ahead of every task not yet promoted, so that a long task starts while there
    /// is still work to run beside it instead of ending the run alone. Off by default.
    #[arg(long, value_name = "F")]
    pub queue_promote_beyond_backlog: Option<f64>,
    /// With a --queue-order other than arrival: sort by the exact priority the order computes
    /// (exact), or by the PriorityClass the operator would give each pod (classes: buckets whose
    /// bounds double, arrival order within one; what kube-scheduler can apply, `carma
    /// queue-classes` lists them).
    #[arg(long, value_enum, default_value_t = QueuePriority::Exact)]
    pub queue_priority: QueuePriority,
    /// Where reservations come from: gpumemnet (carma's estimator), oracle (true peak),
    /// recorded (the estimate in the .rad file), none (CARMA's OR-* rule).
    #[arg(long, default_value = "gpumemnet", value_parser = parse_estimator)]
    pub estimator: EstimatorKind,

    /// Nodes in the simulated cluster (1 to 100000; nodes × GPUs per node at most 100000).
    #[arg(long, default_value_t = 1, help_heading = "Cluster")]
    pub nodes: u32,
    /// GPUs per node (1 to 1024).
    #[arg(long, default_value_t = 4, help_heading = "Cluster")]
    pub gpus_per_node: u32,
    /// Memory of each GPU (e.g. 40GiB, 80Gi, 40960Mi; 1GiB to 1TiB).
    #[arg(long, default_value = "40GiB", value_parser = parse_memory, help_heading = "Cluster")]
    pub gpu_memory: u64,

    /// Tasks to generate, 1 to 100000 (ignored with --trace).
    #[arg(long, default_value_t = 90, help_heading = "Workload")]
    pub tasks: usize,
    /// Seed of the trace generator.
    #[arg(long, default_value_t = 1, help_heading = "Workload")]
    pub seed: u64,
    /// Arrival pressure per GPU relative to CARMA's trace, 0.01 to 100 (generator only).
    #[arg(long, default_value_t = 1.0, help_heading = "Workload")]
    pub load: f64,
    /// CARMA trace script to replay (`submit.py --task X.rad` / `sleep N` lines).
    #[arg(long, help_heading = "Workload")]
    pub trace: Option<PathBuf>,
    /// Folder of .rad task files [default: `workloads/` beside the trace].
    #[arg(long, requires = "trace", help_heading = "Workload")]
    pub workloads: Option<PathBuf>,
    /// CSV of exclusive run times `rad,exclusive_minutes` [default: `../task-durations.csv` from the trace].
    #[arg(long, requires = "trace", help_heading = "Workload")]
    pub durations: Option<PathBuf>,

    /// Output format.
    #[arg(long, value_enum, default_value_t = Format::Table, help_heading = "Output")]
    pub format: Format,
    /// Write an HTML report with per-GPU timelines (and results.json) into this folder.
    #[arg(long, help_heading = "Output")]
    pub out: Option<PathBuf>,
    /// GPUs per policy drawn in the HTML report.
    #[arg(long, default_value_t = 16, help_heading = "Output")]
    pub report_gpus: usize,

    /// Slowdown while sharing a GPU: saturation (summed SM activity against a threshold) or
    /// time-slicing (max-min shares of the GPU's time, the form measured on an H100).
    #[arg(long, value_enum, default_value_t = SlowdownForm::Saturation, help_heading = "Models")]
    pub slowdown_model: SlowdownForm,
    /// Summed SM activity up to which sharing costs nothing (more than 0, at most 100; saturation).
    #[arg(long, default_value_t = 0.8, help_heading = "Models")]
    pub slowdown_threshold: f64,
    /// Exponent of the slowdown beyond the threshold (1 = throughput conserved, >1 = interference losses; 0 to 10; saturation).
    #[arg(long, default_value_t = 1.0, help_heading = "Models")]
    pub slowdown_exponent: f64,
    /// SM activity alone from which a task needs the GPU all the time (θ; more than 0, at most 100; time-slicing, H100 fit 0.70).
    #[arg(long, default_value_t = 0.70, help_heading = "Models")]
    pub slicing_full_activity: f64,
    /// Exponent β of a task's demand for GPU time below --slicing-full-activity (0 to 10; time-slicing, H100 fit 0.77).
    #[arg(long, default_value_t = 0.77, help_heading = "Models")]
    pub slicing_exponent: f64,
    /// Share η of the GPU's time a crowded GPU hands out (more than 0, at most 1; time-slicing, H100 fit 0.93).
    #[arg(long, default_value_t = 0.93, help_heading = "Models")]
    pub slicing_efficiency: f64,
    /// Power of an idle GPU in watts (0 to max power).
    #[arg(long, default_value_t = 55.0, help_heading = "Models")]
    pub idle_power: f64,
    /// Power at full SM activity in watts (idle power to 10000).
    #[arg(long, default_value_t = 400.0, help_heading = "Models")]
    pub max_power: f64,
    /// Delay before a started task's memory shows in telemetry (seconds, e.g. 15 or 15s; 0 to 86400).
    #[arg(long, default_value = "15", value_parser = parse_seconds, help_heading = "Models")]
    pub telemetry_lag: u64,
    /// Multiplier on every task's SM activity, occupancy and DRAM activity (more than 0, at most 100).
    #[arg(long, default_value_t = 1.0, help_heading = "Models")]
    pub activity_scale: f64,

    /// Warm-up lock: a GPU that just received a task takes no other for this long
    /// unless the task's memory shows first (seconds; 0 to 86400).
    #[arg(long, default_value = "30", value_parser = parse_seconds, help_heading = "Placement and recovery")]
    pub warm_up: u64,
    /// Reserve each task's first attempt from the peaks earlier tasks of the same profile reached
    /// (carma's learned reservations: max peak + 10 %, at least 1 GiB, when lower than the
    /// estimate or when the estimate proved too small).
    #[arg(long, help_heading = "Placement and recovery")]
    pub learn_peaks: bool,
    /// Policy pack: combined expected SM activity up to which a busy GPU may be crowded (1 to 4).
    #[arg(long, default_value_t = carma_core::config::DEFAULT_PACK_CROWDING_LIMIT, help_heading = "Placement and recovery")]
    pub pack_crowding_limit: f64,
    /// Policy pack: seconds of waiting after which a task may crowd any busy GPU (0 to 31536000).
    #[arg(long, default_value_t = carma_core::config::DEFAULT_PACK_AGING_MS / 1000, value_parser = clap::value_parser!(u64).range(0..=31_536_000), help_heading = "Placement and recovery")]
    pub pack_aging: u64,
    /// Policy pack: take idle GPUs before complementary busy ones, sharing only when none fits.
    #[arg(long, help_heading = "Placement and recovery")]
    pub pack_idle_first: bool,
    /// Policy pack: once a task needing several GPUs has waited this many minutes (1 to 1440),
    /// keep the idle GPUs it could use next (on the node where the fewest of them are busy) from
    /// every task queued behind it until it is placed. Off by default.
    #[arg(long, value_name = "MINUTES", value_parser = clap::value_parser!(u64).range(1..=1440), help_heading = "Placement and recovery")]
    pub pack_hold_for_multi_gpu: Option<u64>,
    /// Policy pack: judge busy GPUs by the throughput the simulator's slowdown model predicts a
    /// placement adds (sum of the GPU's task rates after minus before; 1 = free sharing), crowding
    /// only where it is at least this (0 to 1) instead of by the crowding limit.
    #[arg(long, value_parser = min_gain, help_heading = "Placement and recovery")]
    pub pack_min_gain: Option<f64>,
    /// Who picks the GPUs inside the chosen node: `policy` (carma's device-plugin path) or
    /// `device-order`, what kube-scheduler's DRA allocator does (the first passing GPUs in device
    /// order, idle or not) while the policy still ranks the nodes. A what-if for the DRA path.
    #[arg(long, value_enum, default_value_t = GpuChoiceArg::Policy, help_heading = "Placement and recovery")]
    pub gpu_choice: GpuChoiceArg,
    /// Place on booked capacity alone: skip the test that the GPU shows the reservation free in
    /// telemetry (plus the margin). A what-if for the DRA path, whose allocator sees only what
    /// claims booked.
    #[arg(long, help_heading = "Placement and recovery")]
    pub no_telemetry_memory_test: bool,
    /// Attempts per task, the first included, before it fails (1 to 100).
    #[arg(long, default_value_t = 5, help_heading = "Placement and recovery")]
    pub max_attempts: u32,
    /// Out-of-memory crashes after which the next attempt runs exclusively (1 = CARMA's rule).
    #[arg(long, default_value_t = 2, help_heading = "Placement and recovery")]
    pub exclusive_after_ooms: u32,
    /// First back-off before a recovery attempt (seconds, 0 to 86400; doubled per attempt).
    #[arg(long, default_value = "10", value_parser = parse_seconds, help_heading = "Placement and recovery")]
    pub recovery_backoff: u64,
}

/// A list of policies.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PolicyList(pub Vec<Policy>);

fn parse_policies(s: &str) -> Result<PolicyList, String> {
    if s.trim().eq_ignore_ascii_case("all") {
        return Ok(PolicyList(Policy::ALL.to_vec()));
    }
    let mut out = Vec::new();
    for part in s.split(',').map(str::trim).filter(|p| !p.is_empty()) {
        let p = Policy::from_str(part).map_err(|e| e.to_string())?;
        if !out.contains(&p) {
            out.push(p);
        }
    }
    if out.is_empty() {
        return Err("no policy given".into());
    }
    Ok(PolicyList(out))
}

fn parse_estimator(s: &str) -> Result<EstimatorKind, String> {
    EstimatorKind::from_str(s).map_err(|e| e.to_string())
}

fn parse_memory(s: &str) -> Result<u64, String> {
    // Accept the familiar GiB/MiB spellings as well as Kubernetes' Gi/Mi.
    let t = s.trim();
    let k8s = t
        .strip_suffix("iB")
        .map(|rest| format!("{rest}i"))
        .unwrap_or_else(|| t.to_string());
    parse_mib(&k8s).map_err(|e| e.to_string())
}

/// A least gain of throughput in 0..=1.
fn min_gain(s: &str) -> Result<f64, String> {
    match s.trim().parse::<f64>() {
        Ok(v) if (0.0..=1.0).contains(&v) => Ok(v),
        _ => Err(format!("{s:?} is not a number from 0 to 1")),
    }
}

fn parse_seconds(s: &str) -> Result<u64, String> {
    let t = s.trim();
    let (num, scale) = if let Some(ms) = t.strip_suffix("ms") {
        (ms, 1.0)
    } else if let Some(m) = t.strip_suffix('m') {
        (m, 60_000.0)
    } else {
        (t.strip_suffix('s').unwrap_or(t), 1000.0)
    };
    // The range is checked in f64, before the conversion (which would saturate).
    match num.trim().parse::<f64>() {
        Ok(v) if v.is_finite() && v >= 0.0 && v * scale <= MAX_DELAY_MS as f64 => {
            Ok((v * scale).round() as u64)
        }
        Ok(v) if v.is_finite() && v >= 0.0 => Err(format!(
            "{s:?} is out of range: 0 to {} s (one day)",
            MAX_DELAY_MS / 1000
        )),
        _ => Err(format!("{s:?} is not a duration (e.g. 15, 15s, 500ms, 2m)")),
    }
}

impl SimulateArgs {
    fn config(&self) -> SimConfig {
        let mut cfg = SimConfig::default();
        cfg.cluster.nodes = self.nodes;
        cfg.cluster.gpus_per_node = self.gpus_per_node;
        cfg.cluster.gpu_memory_mib = self.gpu_memory;
        cfg.gate = self.gate == Switch::On;
        cfg.queue = self.queue;
        cfg.slowdown.threshold = self.slowdown_threshold;
        cfg.slowdown.exponent = self.slowdown_exponent;
        cfg.slowdown.time_slicing = (self.slowdown_model == SlowdownForm::TimeSlicing).then_some(
            carma_simulator::model::slowdown::TimeSlicing {
                full_activity: self.slicing_full_activity,
                exponent: self.slicing_exponent,
                efficiency: self.slicing_efficiency,
            },
        );
        cfg.power.idle_w = self.idle_power;
        cfg.power.max_w = self.max_power;
        cfg.telemetry.lag_ms = self.telemetry_lag;
        cfg.activity_scale = self.activity_scale;
        cfg.placement.warmup_ms = self.warm_up;
        cfg.placement.pack_crowding_limit = self.pack_crowding_limit;
        cfg.placement.pack_aging_ms = self.pack_aging * 1000;
        cfg.placement.pack_idle_first = self.pack_idle_first;
        cfg.placement.gpu_choice = match self.gpu_choice {
            GpuChoiceArg::Policy => carma_core::GpuChoice::Policy,
            GpuChoiceArg::DeviceOrder => carma_core::GpuChoice::DeviceOrder,
        };
        cfg.placement.telemetry_memory_test = !self.no_telemetry_memory_test;
        cfg.placement.pack_gain = self
            .pack_min_gain
            .map(|min_gain| carma_core::config::PackGain {
                min_gain,
                model: cfg.slowdown.sharing_model(),
            });
        cfg.learn_peaks = self.learn_peaks.then(carma_core::HistoryConfig::default);
        cfg.recovery.max_attempts = self.max_attempts;
        cfg.recovery.exclusive_after_ooms = self.exclusive_after_ooms;
        cfg.recovery.backoff_base_ms = self.recovery_backoff;
        cfg.record_timelines = self.out.is_some();
        cfg
    }

    fn ordering(&self) -> QueueOrdering {
        QueueOrdering {
            order: self.queue_order,
            error: self.declared_duration_error,
            seed: self.declared_duration_seed,
            promote_after_ms: self.queue_promote_after,
            promote_beyond_backlog: self.queue_promote_beyond_backlog,
            hold_for_multi_gpu_ms: self.pack_hold_for_multi_gpu.map(|m| m * 60_000),
            by_class: self.queue_priority == QueuePriority::Classes,
            share: self.declared_share,
        }
    }

    fn load_trace(&self) -> Result<trace::Trace, SimError> {
        match &self.trace {
            Some(path) => {
                let dir = path.parent().map(PathBuf::from).unwrap_or_default();
                let paths = ImportPaths {
                    trace: path.clone(),
                    workloads: self
                        .workloads
                        .clone()
                        .unwrap_or_else(|| dir.join("workloads")),
                    durations: self
                        .durations
                        .clone()
                        .unwrap_or_else(|| dir.join("../task-durations.csv")),
                };
                trace::import(&paths)
            }
            None => trace::generate(&GeneratorConfig {
                tasks: self.tasks,
                seed: self.seed,
                cluster_gpus: self.nodes.saturating_mul(self.gpus_per_node),
                load: self.load,
                ..GeneratorConfig::default()
            }),
        }
    }
}

/// Run `carma simulate`.
pub fn run(args: SimulateArgs) -> anyhow::Result<ExitCode> {
    let cfg = args.config();
    let ordering = args.ordering();
    let trace = match cfg
        .validate()
        .and_then(|()| ordering.validate())
        .and_then(|()| args.load_trace())
    {
        Ok(t) => t,
        Err(e) => {
            let code = bad_input(&e);
            let about_trace =
                matches!(&e, SimError::Io { path, .. } if Some(path) == args.trace.as_ref());
            if args.trace.is_some()
                && !about_trace
                && (args.workloads.is_none() || args.durations.is_none())
            {
                eprintln!(
                    "carma simulate: (without --workloads / --durations the task files are looked up in workloads/ beside the trace and the run times in ../task-durations.csv from it)"
                );
            }
            return Ok(code);
        }
    };
    tracing::debug!(
        tasks = trace.tasks.len(),
        policies = args.policy.0.len(),
        "simulating"
    );
    let cmp = match compare_ordered(&trace, args.estimator, &args.policy.0, &cfg, &ordering) {
        Ok(c) => c,
        Err(e @ (SimError::Config(_) | SimError::Parse { .. } | SimError::Input { .. })) => {
            return Ok(bad_input(&e));
        }
        Err(e) => return Err(e.into()),
    };
    // Arrival order prints nothing more, so that its output is what it was before queue orders.
    let ordered = ordering.order != QueueOrder::Arrival;
    match args.format {
        Format::Table => {
            out!("{}", report::render_table(&cmp))?;
            if ordered {
                let by = if ordering.by_class {
                    " by priority class"
                } else {
                    ""
                };
                let accuracy = if ordering.error > 1.0 {
                    format!(" off by up to ×{} (seed {})", ordering.error, ordering.seed)
                } else {
                    ", perfect information".to_string()
                };
                let share = if ordering.share < 1.0 {
                    format!("; declared by a share of {} of the tasks", ordering.share)
                } else {
                    String::new()
                };
                outln!(
                    "  Queue order: {}{by} (declared durations: exclusive run times{accuracy}{share})",
                    ordering.order
                )?;
            }
        }
        Format::Json => {
            let mut json = report::render_json(&cmp);
            if let (true, Some(map)) = (ordered, json.as_object_mut()) {
                map.insert(
                    "queue_order".into(),
                    serde_json::json!({
                        "order": ordering.order.as_str(),
                        "declared_duration_error": ordering.error,
                        "declared_duration_seed": ordering.seed,
                        "by_priority_class": ordering.by_class,
                        "declared_share": ordering.share,
                    }),
                );
            }
            outln!("{}", serde_json::to_string_pretty(&json)?)?
        }
    }
    if let Some(dir) = &args.out {
        fs::create_dir_all(dir).with_context(|| format!("cannot create {}", dir.display()))?;
        let html = dir.join("report.html");
        fs::write(&html, report::render_html(&cmp, &trace, args.report_gpus))
            .with_context(|| format!("cannot write {}", html.display()))?;
        let json = dir.join("results.json");
        fs::write(&json, serde_json::to_string_pretty(&cmp)?)
            .with_context(|| format!("cannot write {}", json.display()))?;
        if args.format == Format::Table {
            outln!("  Report: {} (and results.json)", html.display())?;
        } else {
            eprintln!("carma simulate: report written to {}", html.display());
        }
    }
    Ok(ExitCode::SUCCESS)
}

fn bad_input(e: &SimError) -> ExitCode {
    eprintln!("carma simulate: {e}");
    ExitCode::from(EXIT_BAD_INPUT)
}

/// Values of `--gpu-choice`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum GpuChoiceArg {
    /// The policy's order (exclusive first, then its own order).
    Policy,
    /// Device order, as a DRA allocator picks.
    DeviceOrder,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn flag_parsers() {
        assert_eq!(parse_policies("all").unwrap().0.len(), Policy::ALL.len());
        assert_eq!(
            parse_policies("magm, ff,magm").unwrap().0,
            vec![Policy::Magm, Policy::Ff]
        );
        assert!(parse_policies("fastest").is_err());
        assert_eq!(parse_memory("40GiB").unwrap(), 40_960);
        assert_eq!(parse_memory("80Gi").unwrap(), 81_920);
        assert!(parse_memory("lots").is_err());
        assert_eq!(parse_seconds("15").unwrap(), 15_000);
        assert_eq!(parse_seconds("2m").unwrap(), 120_000);
        assert_eq!(parse_seconds("500ms").unwrap(), 500);
        assert!(parse_seconds("-1").is_err());
    }

    /// `--warm-up 1e17` used to saturate to u64::MAX ms and spin the engine forever.
    #[test]
    fn time_flags_have_a_range() {
        assert_eq!(parse_seconds("86400").unwrap(), 86_400_000);
        assert_eq!(parse_seconds("1440m").unwrap(), 86_400_000);
        for huge in ["86401", "1e16", "1e17", "1e300", "1441m"] {
            let err = parse_seconds(huge).unwrap_err();
            assert!(err.contains("0 to 86400 s"), "{huge}: {err}");
        }
    }

    #[test]
    fn queue_order_flags() {
        use clap::Parser;
        #[derive(Parser)]
        struct Cli {
            #[command(flatten)]
            args: SimulateArgs,
        }
        let parse = |flags: &[&str]| {
            Cli::try_parse_from(std::iter::once("simulate").chain(flags.iter().copied()))
        };
        let plain = parse(&[]).unwrap().args.ordering();
        assert_eq!(plain, QueueOrdering::default());
        let sf = parse(&["--queue-order", "shortest-first"]).unwrap().args;
        assert_eq!(sf.ordering().order, QueueOrder::ShortestFirst);
        assert!(parse(&["--queue-order", "sjf"]).is_err());
        let off = parse(&["--declared-duration-error", "0.5"]).unwrap().args;
        let err = off.ordering().validate().unwrap_err().to_string();
        assert!(err.contains("between 1 and 100"), "{err}");
        let classes = parse(&[
            "--queue-order",
            "short-then-longest",
            "--queue-priority",
            "classes",
            "--declared-share",
            "0.5",
        ])
        .unwrap()
        .args
        .ordering();
        assert!(classes.by_class && classes.share == 0.5);
        let over = parse(&["--declared-share", "1.5"]).unwrap().args;
        let err = over.ordering().validate().unwrap_err().to_string();
        assert!(err.contains("--declared-share is 1.5"), "{err}");
    }

    /// `--gpus-per-node 4294967295` used to abort allocating memory for every GPU.
    #[test]
    fn cluster_and_workload_flags_have_a_range() {
        use clap::Parser;
        #[derive(Parser)]
        struct Cli {
            #[command(flatten)]
            args: SimulateArgs,
        }
        let check = |flags: &[&str], needle: &str| {
            let cli = Cli::try_parse_from(std::iter::once("simulate").chain(flags.iter().copied()))
                .unwrap();
            let err = cli
                .args
                .config()
                .validate()
                .and_then(|()| cli.args.load_trace().map(drop))
                .unwrap_err()
                .to_string();
            assert!(err.contains(needle), "{flags:?}: {err}");
        };
        check(
            &["--gpus-per-node", "4294967295", "--tasks", "10"],
            "--gpus-per-node is 4294967295; it must be between 1 and 1024",
        );
        check(
            &["--nodes", "1000000"],
            "--nodes is 1000000; it must be between 1 and 100000",
        );
        check(
            &["--nodes", "1000", "--gpus-per-node", "1000"],
            "1000000 GPUs; at most 100000",
        );
        check(
            &["--tasks", "100001"],
            "--tasks is 100001; it must be between 1 and 100000",
        );
        check(
            &["--load", "1e-300"],
            "--load is 1e-300; it must be between 0.01 and 100",
        );
        check(
            &["--max-attempts", "4294967295"],
            "--max-attempts is 4294967295; it must be between 1 and 100",
        );
        check(
            &["--gpu-memory", "1000000Gi"],
            "--gpu-memory is 1024000000 MiB",
        );
    }
}
