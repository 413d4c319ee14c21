//! `carma`: one binary, one subcommand per part of the system.

use std::process::ExitCode;

use clap::{Parser, Subcommand};

#[macro_use]
mod cmd;

/// Collocation-aware GPU scheduling for deep-learning training on Kubernetes.
///
/// carma predicts each training job's GPU memory (GPUMemNet), places jobs on
/// nodes and individual GPUs only where the memory fits and the GPU is not
/// already busy, and requeues jobs that still crash out of memory.
#[derive(Debug, Parser)]
#[command(name = "carma", version, propagate_version = true)]
struct Cli {
    /// Log filter (tracing's EnvFilter syntax), e.g. `info` or `carma=debug`.
    #[arg(long, global = true, env = "CARMA_LOG", default_value = "info")]
    log: String,
    /// Log format.
    #[arg(long, global = true, value_enum, default_value_t = cmd::LogFormat::Text)]
    log_format: cmd::LogFormat,
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Per-node DaemonSet: advertise shareable GPUs to kubelet, sample GPU telemetry, publish GpuNode status and metrics.
    DevicePlugin(cmd::device_plugin::DevicePluginArgs),
    /// Per-node DaemonSet on Dynamic Resource Allocation (Kubernetes 1.36+): publish GPUs as ResourceSlices with memory as consumable capacity, prepare claims for kubelet.
    DraDriver(cmd::dra_driver::DraDriverArgs),
    /// kube-scheduler HTTP extender: filter, prioritize and bind pods to nodes and individual GPUs.
    SchedulerExtender(cmd::scheduler_extender::SchedulerExtenderArgs),
    /// TrainingTask controller: run attempts, detect GPU out-of-memory crashes, recover with larger reservations.
    Operator(cmd::operator::OperatorArgs),
    /// Estimate a training job's GPU memory with GPUMemNet, or evaluate the shipped model.
    Estimate(cmd::estimate::EstimateArgs),
    /// Replay a job trace on simulated GPUs and compare placement policies (no cluster, no GPU needed).
    Simulate(cmd::simulate::SimulateArgs),
    /// Run CARMA on this machine without Kubernetes: a job queue daemon, submit, status, replay, report.
    Local(cmd::local::LocalArgs),
    /// Print the CustomResourceDefinitions (TrainingTask, GpuNode, MemoryHistory) as YAML.
    Crds(cmd::crds::CrdsArgs),
    /// Print the PriorityClasses through which kube-scheduler applies a queue order of declared durations.
    QueueClasses(cmd::queue_classes::QueueClassesArgs),
    /// Print version and build information.
    Version,
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    if let Err(e) = cmd::init_logging(&cli.log, cli.log_format) {
        eprintln!("carma: {e}");
        return ExitCode::from(2);
    }
    let result = match cli.command {
        Command::DevicePlugin(args) => cmd::device_plugin::run(args),
        Command::DraDriver(args) => cmd::dra_driver::run(args),
        Command::SchedulerExtender(args) => cmd::scheduler_extender::run(args),
        Command::Operator(args) => cmd::operator::run(args),
        Command::Estimate(args) => cmd::estimate::run(args),
        Command::Simulate(args) => cmd::simulate::run(args),
        Command::Local(args) => cmd::local::run(args),
        Command::Crds(args) => cmd::crds::run(args),
        Command::QueueClasses(args) => cmd::queue_classes::run(args),
        Command::Version => {
            outln!("carma {}", env!("CARGO_PKG_VERSION")).map(|()| ExitCode::SUCCESS)
        }
    };
    match result {
        Ok(code) => code,
        // `carma ... | head`: the reader has what it wanted
        Err(e) if cmd::is_stdout_closed(&e) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("carma: error: {e:#}");
            ExitCode::from(1)
        }
    }
}
