//! `carma device-plugin` (issue #5).

use std::process::ExitCode;

/// Arguments of `carma device-plugin`.
#[derive(Debug, clap::Args)]
pub struct DevicePluginArgs {}

/// Run `carma device-plugin`.
pub fn run(_args: DevicePluginArgs) -> anyhow::Result<ExitCode> {
    super::not_landed("device-plugin", 5)
}
