//! `carma simulate` (issue #7).

use std::process::ExitCode;

/// Arguments of `carma simulate`.
#[derive(Debug, clap::Args)]
pub struct SimulateArgs {}

/// Run `carma simulate`.
pub fn run(_args: SimulateArgs) -> anyhow::Result<ExitCode> {
    super::not_landed("simulate", 7)
}
