//! One module per subcommand. Each exposes its clap arguments and a `run`
//! function returning the process exit code.
//!
//! Commands print their results with `out!` and `outln!`, never `print!`/`println!`: those
//! panic ("failed printing to stdout: Broken pipe", exit 101) when the reader has closed the pipe,
//! as `carma simulate | head -1` does once it has its line. The macros return
//! [`StdoutClosed`] instead, which `main` turns into a quiet exit 0.

/// Print on stdout like `print!`, returning `anyhow::Result<()>`: [`StdoutClosed`] when the
/// reader has closed the pipe, any other write error as itself.
macro_rules! out {
    ($($arg:tt)*) => {
        $crate::cmd::write_stdout(format_args!($($arg)*))
    };
}

/// Print a line on stdout like `println!`; see `out!`.
macro_rules! outln {
    ($($arg:tt)*) => {
        $crate::cmd::write_stdout(format_args!("{}\n", format_args!($($arg)*)))
    };
}

pub mod crds;
pub mod device_plugin;
pub mod dra_driver;
pub mod estimate;
pub mod local;
pub mod node_agent;
pub mod operator;
pub mod queue_classes;
pub mod scheduler_extender;
pub mod simulate;

use std::fmt;
use std::io::{IsTerminal, Write as _};

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

/// The reader of stdout went away before the command finished printing (`carma ... | head`).
/// Not a failure: the reader has what it wanted, so the command stops and exits 0, as if its
/// output had been read to the end.
#[derive(Debug)]
pub struct StdoutClosed;

impl fmt::Display for StdoutClosed {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("stdout was closed by its reader")
    }
}

impl std::error::Error for StdoutClosed {}

/// Whether `e` is, or was caused by, [`StdoutClosed`].
pub fn is_stdout_closed(e: &anyhow::Error) -> bool {
    e.chain().any(|c| c.is::<StdoutClosed>())
}

/// What `out!` and `outln!` call: write and flush, so that a closed pipe is seen here and not
/// ignored at exit.
pub fn write_stdout(args: fmt::Arguments<'_>) -> anyhow::Result<()> {
    let mut stdout = std::io::stdout().lock();
    match stdout.write_fmt(args).and_then(|()| stdout.flush()) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => Err(StdoutClosed.into()),
        Err(e) => Err(anyhow::Error::new(e).context("cannot write to stdout")),
    }
}

/// Exit code for bad input (malformed files, flags, annotations).
pub const EXIT_BAD_INPUT: u8 = 2;

/// A tokio runtime for the long-running parts.
pub fn runtime() -> anyhow::Result<tokio::runtime::Runtime> {
    Ok(tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?)
}

/// The runtime of a per-node agent (device plugin, DRA driver): two worker threads are plenty
/// (a sample a second, a few kubelet and API calls) and keep the footprint flat on nodes with
/// many cores.
pub fn node_agent_runtime(thread_name: &str) -> anyhow::Result<tokio::runtime::Runtime> {
    Ok(tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .thread_name(thread_name)
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
