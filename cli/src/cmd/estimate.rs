//! `carma estimate` (issue #3).

use std::process::ExitCode;

/// Arguments of `carma estimate`.
#[derive(Debug, clap::Args)]
pub struct EstimateArgs {}

/// Run `carma estimate`.
pub fn run(_args: EstimateArgs) -> anyhow::Result<ExitCode> {
    super::not_landed("estimate", 3)
}
