//! `carma operator` (issue #6).

use std::process::ExitCode;

/// Arguments of `carma operator`.
#[derive(Debug, clap::Args)]
pub struct OperatorArgs {}

/// Run `carma operator`.
pub fn run(_args: OperatorArgs) -> anyhow::Result<ExitCode> {
    super::not_landed("operator", 6)
}
