//! `carma scheduler-extender` (issue #4).

use std::process::ExitCode;

/// Arguments of `carma scheduler-extender`.
#[derive(Debug, clap::Args)]
pub struct SchedulerExtenderArgs {}

/// Run `carma scheduler-extender`.
pub fn run(_args: SchedulerExtenderArgs) -> anyhow::Result<ExitCode> {
    super::not_landed("scheduler-extender", 4)
}
