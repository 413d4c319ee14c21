//! `carma crds`: print or write the generated CRDs.

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Context;

/// Arguments of `carma crds`.
#[derive(Debug, clap::Args)]
pub struct CrdsArgs {
    /// Write one file per CRD into this directory instead of printing them.
    #[arg(long)]
    pub out_dir: Option<PathBuf>,
}

/// Run `carma crds`.
pub fn run(args: CrdsArgs) -> anyhow::Result<ExitCode> {
    match args.out_dir {
        None => out!("{}", carma_api::crds::all_yaml()?)?,
        Some(dir) => {
            std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
            for (file, crd) in carma_api::crds::all() {
                let path = dir.join(file);
                std::fs::write(&path, carma_api::crds::to_yaml(&crd)?)
                    .with_context(|| format!("writing {}", path.display()))?;
            }
        }
    }
    Ok(ExitCode::SUCCESS)
}
