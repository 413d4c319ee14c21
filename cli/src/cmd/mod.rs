//! One module per subcommand. Each exposes its clap arguments and a `run`
//! function returning the process exit code.

pub mod crds;
pub mod device_plugin;
pub mod estimate;
pub mod local;
pub mod operator;
pub mod scheduler_extender;
pub mod simulate;

use std::io::IsTerminal;

use clap::ValueEnum;
use tracing_subscriber::EnvFilter;

/// Log output format.
#[derive(Debug, Clone, Copy, ValueEnum)]
pub enum LogFormat {
    /// Human-readable lines.
    Text,
    /// One JSON object per line.
    Json,
}

/// Install the tracing subscriber (logs go to stderr).
pub fn init_logging(filter: &str, format: LogFormat) -> anyhow::Result<()> {
    let filter = EnvFilter::try_new(filter)
        .map_err(|e| anyhow::anyhow!("invalid --log filter {filter:?}: {e}"))?;
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(std::io::stderr().is_terminal())
        .with_writer(std::io::stderr);
    match format {
        LogFormat::Text => builder.init(),
        LogFormat::Json => builder.json().init(),
    }
    Ok(())
}

/// Exit code for bad input (malformed files, flags, annotations).
pub const EXIT_BAD_INPUT: u8 = 2;

/// A tokio runtime for the long-running parts.
pub fn runtime() -> anyhow::Result<tokio::runtime::Runtime> {
    Ok(tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?)
}

/// Completes on SIGTERM or Ctrl-C, whichever comes first; every long-running
/// subcommand shuts down gracefully on it.
pub async fn shutdown_signal() {
    let ctrl_c = async {
        if let Err(e) = tokio::signal::ctrl_c().await {
            tracing::warn!(error = %e, "cannot listen for Ctrl-C");
            std::future::pending::<()>().await;
        }
    };
    #[cfg(unix)]
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(e) => {
                tracing::warn!(error = %e, "cannot listen for SIGTERM");
                std::future::pending::<()>().await;
            }
        }
    };
    #[cfg(not(unix))]
    let term = std::future::pending::<()>();
    tokio::select! {
        () = ctrl_c => tracing::info!("interrupt received: shutting down"),
        () = term => tracing::info!("SIGTERM received: shutting down"),
    }
}
