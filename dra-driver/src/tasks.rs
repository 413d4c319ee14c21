//! The driver's parts as named tasks, and their supervision: a part ends only when the driver is
//! told to stop; one that ends otherwise ends the driver with an error naming it.

use std::collections::HashMap;
use std::future::Future;
use std::time::Duration;

use tokio::task::JoinSet;
use tracing::{error, warn};

use crate::Error;
use crate::server::ServerEnd;

/// The driver's tasks, each with its name; each ends with `Ok` only when told to stop.
#[derive(Debug, Default)]
pub struct Tasks {
    set: JoinSet<ServerEnd>,
    names: HashMap<tokio::task::Id, &'static str>,
}

impl Tasks {
    /// Run `task` as the part `name`.
    pub fn spawn(
        &mut self,
        name: &'static str,
        task: impl Future<Output = ServerEnd> + Send + 'static,
    ) {
        let handle = self.set.spawn(task);
        self.names.insert(handle.id(), name);
    }

    /// Wait for the first task to end: its name and why (`Ok` if it was told to stop, an error,
    /// or the panic). `None` when there are no tasks.
    pub async fn first_end(&mut self) -> Option<(&'static str, ServerEnd)> {
        let (id, end) = match self.set.join_next_with_id().await? {
            Ok((id, end)) => (id, end),
            Err(e) => (e.id(), Err(format!("the task failed: {e}"))),
        };
        Some((self.names.remove(&id).unwrap_or("unknown"), end))
    }

    /// Wait for every task, at most `grace` in all; those still running then are aborted.
    pub async fn join_all(mut self, grace: Duration) {
        let all = async { while self.set.join_next().await.is_some() {} };
        if tokio::time::timeout(grace, all).await.is_err() {
            warn!("driver tasks still running after {grace:?}: aborted");
            self.set.abort_all();
            while self.set.join_next().await.is_some() {}
        }
    }
}

/// Run `tasks` until `signal` resolves (`None`) or a task ends first: `Some` with
/// [`Error::TaskEnded`] naming it (logged as an error). A task that ends `Ok` before the signal
/// also counts: nothing told it to stop.
pub async fn supervise(tasks: &mut Tasks, signal: impl Future<Output = ()>) -> Option<Error> {
    let ended = tokio::select! {
        _ = signal => return None,
        ended = tasks.first_end() => ended,
    };
    let (task, why) = match ended {
        Some((task, Err(why))) => (task, why),
        Some((task, Ok(()))) => (task, "ended without being told to stop".to_string()),
        // Nothing to supervise: nothing can end.
        None => return None,
    };
    error!(
        task,
        "a part of the DRA driver ended: {why}; stopping the driver"
    );
    Some(Error::TaskEnded { task, why })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::server::server;
    use crate::stopped;
    use tokio::io::DuplexStream;
    use tokio::sync::watch;
    use tonic::service::Routes;

    #[tokio::test]
    async fn a_server_task_that_ends_ends_supervision_with_an_error_naming_it() {
        let (stop_tx, stop) = watch::channel(false);
        let dir = tempfile::tempdir().unwrap();
        let mut tasks = Tasks::default();
        let mut told = stop.clone();
        tasks.spawn("telemetry", async move {
            stopped(&mut told).await;
            Ok(())
        });
        // A gRPC server whose connections stop coming: its task ends on its own.
        tasks.spawn(
            "dra-grpc",
            server(
                futures::stream::empty::<std::io::Result<DuplexStream>>(),
                Routes::default(),
                "test.Service",
                stop,
                dir.path().join("dra.sock"),
            ),
        );
        let ended = tokio::time::timeout(
            Duration::from_secs(10),
            supervise(&mut tasks, std::future::pending()),
        )
        .await
        .expect("supervision returns when a task ends");
        match ended {
            Some(Error::TaskEnded { task, why }) => {
                assert_eq!(task, "dra-grpc");
                assert!(why.contains("ended without being told to stop"), "{why}");
            }
            other => panic!("expected TaskEnded, got {other:?}"),
        }
        stop_tx.send_replace(true);
        tasks.join_all(Duration::from_secs(5)).await;
    }

    #[tokio::test]
    async fn the_signal_ends_supervision_without_an_error_and_a_panic_is_an_end() {
        let mut tasks = Tasks::default();
        tasks.spawn("loop", std::future::pending());
        assert!(supervise(&mut tasks, async {}).await.is_none());
        tasks.spawn("sweep", async { panic!("boom") });
        let ended = tokio::time::timeout(
            Duration::from_secs(10),
            supervise(&mut tasks, std::future::pending()),
        )
        .await
        .expect("supervision returns when a task panics");
        match ended {
            Some(Error::TaskEnded { task: "sweep", why }) => {
                assert!(why.contains("panicked"), "{why}")
            }
            other => panic!("expected the sweep's end, got {other:?}"),
        }
        tasks.join_all(Duration::from_millis(100)).await;
    }
}
