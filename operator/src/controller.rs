//! Wiring: the metrics server, leader election and the kube-runtime
//! `Controller` on `TrainingTask` (owning its attempt pods), with graceful
//! shutdown. The controller runs only while this replica leads; when leadership
//! is lost it drains its in-flight reconciles and stands by.

use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use futures::{FutureExt, StreamExt};
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::Pod;
use kube::runtime::controller::{self, Controller};
use kube::runtime::watcher;
use kube::{Api, Client};
use tokio::sync::watch;
use tracing::{debug, info, warn};

use carma_api::TrainingTask;
use carma_api::names::LABEL_MANAGED_BY;

use crate::attempt::MANAGER;
use crate::error::{Error, Result};
use crate::leader::{LeaseLock, LeaseTiming, run_elector};
use crate::metrics::{Metrics, PHASES};
use crate::reconcile::{Context, Settings, error_policy, reconcile};
use crate::server::{self, Health};

/// Leader election settings.
#[derive(Debug, Clone)]
pub struct LeaderElection {
    /// Namespace of the Lease; the client's default namespace when `None`.
    pub namespace: Option<String>,
    /// Name of the Lease.
    pub lease_name: String,
    /// Timing.
    pub timing: LeaseTiming,
}

/// Everything `carma operator` is configured with.
#[derive(Debug, Clone)]
pub struct OperatorConfig {
    /// Address of `/healthz`, `/readyz` and `/metrics`.
    pub metrics_addr: SocketAddr,
    /// Leader election; `None` runs the controller unconditionally (one replica only).
    pub leader_election: Option<LeaderElection>,
    /// This replica's identity (Lease holder and Event reporter instance).
    pub identity: String,
    /// Only watch this namespace (all namespaces when `None`).
    pub watch_namespace: Option<String>,
    /// TrainingTasks reconciled at once.
    pub concurrency: u16,
    /// Reconciler tunables.
    pub settings: Settings,
}

impl OperatorConfig {
    /// Check the configuration before anything starts.
    pub fn validate(&self) -> Result<()> {
        if let Some(le) = &self.leader_election {
            le.timing.validate().map_err(Error::Config)?;
            if le.lease_name.trim().is_empty() {
                return Err(Error::Config("the lease name is empty".into()));
            }
        }
        if self.identity.trim().is_empty() {
            return Err(Error::Config("the identity is empty".into()));
        }
        if self.settings.log_tail_lines < 1 {
            return Err(Error::Config("log tail lines must be at least 1".into()));
        }
        if self.settings.peak_poll.is_zero() {
            return Err(Error::Config(
                "the peak poll interval must be positive".into(),
            ));
        }
        Ok(())
    }
}

/// Run the operator until `shutdown` completes.
pub async fn run(
    client: Client,
    config: OperatorConfig,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<()> {
    config.validate()?;
    let metrics = Arc::new(Metrics::new());
    let health = Arc::new(Health::default());
    let listener = server::bind(config.metrics_addr).await?;
    info!(addr = %config.metrics_addr, "serving /healthz, /readyz and /metrics");

    let (shutdown_tx, shutdown_rx) = watch::channel(false);
    tokio::spawn(async move {
        shutdown.await;
        info!("shutting down");
        shutdown_tx.send_replace(true);
    });
    let server = tokio::spawn(server::serve(
        listener,
        metrics.clone(),
        health.clone(),
        wait_true(shutdown_rx.clone()),
    ));

    let (leading_tx, leading_rx) = watch::channel(false);
    let elector = match &config.leader_election {
        Some(le) => {
            let ns = le
                .namespace
                .clone()
                .unwrap_or_else(|| client.default_namespace().to_string());
            info!(lease = %le.lease_name, namespace = %ns, identity = %config.identity, "leader election on");
            let lock = LeaseLock::new(
                Api::<Lease>::namespaced(client.clone(), &ns),
                le.lease_name.clone(),
                config.identity.clone(),
                le.timing,
            );
            let h = health.clone();
            Some(tokio::spawn(run_elector(
                lock,
                leading_tx,
                shutdown_rx.clone(),
                move || h.set_ready(true),
            )))
        }
        None => {
            info!("leader election off: this must be the only replica");
            health.set_ready(true);
            leading_tx.send_replace(true);
            // Keep the sender alive for the life of the operator.
            let rx = shutdown_rx.clone();
            Some(tokio::spawn(async move {
                wait_true(rx).await;
                drop(leading_tx);
            }))
        }
    };

    let ctx = Arc::new(Context::new(
        client.clone(),
        metrics.clone(),
        config.settings.clone(),
        Some(config.identity.clone()),
    ));
    let mut leading = leading_rx.clone();
    let shutdown_now = || *shutdown_rx.borrow();
    loop {
        tokio::select! {
            r = leading.wait_for(|l| *l) => if r.is_err() { break },
            _ = wait_true(shutdown_rx.clone()) => {}
        }
        if shutdown_now() {
            break;
        }
        metrics.set_leader(true);
        info!("starting the TrainingTask controller");
        let stop = stop_signal(leading_rx.clone(), shutdown_rx.clone());
        // A replica that is no longer leader must stop acting at once: another may take the lease
        // soon after (one lease duration after the last renewal, on its own clock), and a reconcile
        // still in flight — e.g. blocked on an API server that stopped answering — would then write
        // beside it. So losing leadership drops the controller with whatever it is doing; reconciles
        // are level-based, and the next leader redoes any step cut short. On shutdown the elector
        // gives up leadership before it releases the lease, so the same holds then.
        tokio::select! {
            () = run_controller(client.clone(), ctx.clone(), &config, stop) => {}
            () = leadership_lost(leading_rx.clone()) => {
                warn!("leadership lost: the controller is stopped with its reconciles in flight");
            }
        }
        metrics.set_leader(false);
        metrics.set_tasks(&[]);
        if shutdown_now() {
            break;
        }
        warn!("lost leadership: controller stopped, standing by");
    }

    if let Some(e) = elector {
        let _ = e.await;
    }
    match server.await {
        Ok(r) => r?,
        Err(e) => warn!(error = %e, "metrics server task failed"),
    }
    info!("stopped");
    Ok(())
}

/// Completes when `leading` turns false (or its sender is gone).
async fn leadership_lost(mut leading: watch::Receiver<bool>) {
    let _ = leading.wait_for(|l| !*l).await;
}

/// Completes when `rx` turns true (or its sender is gone).
async fn wait_true(mut rx: watch::Receiver<bool>) {
    let _ = rx.wait_for(|v| *v).await;
}

/// A `Send + Sync` future that completes when leadership is lost or shutdown begins.
fn stop_signal(
    mut leading: watch::Receiver<bool>,
    shutdown: watch::Receiver<bool>,
) -> impl Future<Output = ()> + Send + Sync + 'static {
    let (tx, rx) = futures::channel::oneshot::channel::<()>();
    tokio::spawn(async move {
        tokio::select! {
            _ = leading.wait_for(|l| !*l) => {}
            _ = wait_true(shutdown) => {}
        }
        let _ = tx.send(());
    });
    rx.map(|_| ())
}

async fn run_controller(
    client: Client,
    ctx: Arc<Context>,
    config: &OperatorConfig,
    stop: impl Future<Output = ()> + Send + Sync + 'static,
) {
    let (tasks, pods): (Api<TrainingTask>, Api<Pod>) = match &config.watch_namespace {
        Some(ns) => (
            Api::namespaced(client.clone(), ns),
            Api::namespaced(client, ns),
        ),
        None => (Api::all(client.clone()), Api::all(client)),
    };
    let owned = watcher::Config::default().labels(&format!("{LABEL_MANAGED_BY}={MANAGER}"));
    let controller = Controller::new(tasks, watcher::Config::default())
        .owns(pods, owned)
        .with_config(controller::Config::default().concurrency(config.concurrency))
        .graceful_shutdown_on(stop);

    let store = controller.store();
    let metrics = ctx.metrics.clone();
    // Aborted when this future ends or is dropped (leadership lost).
    let gauge = AbortOnDrop(tokio::spawn(async move {
        let mut tick = tokio::time::interval(Duration::from_secs(5));
        loop {
            tick.tick().await;
            let counts: Vec<_> = PHASES
                .iter()
                .map(|p| {
                    let n = store
                        .state()
                        .iter()
                        .filter(|t| {
                            t.status
                                .as_ref()
                                .and_then(|s| s.phase)
                                .unwrap_or(carma_api::TaskPhase::Pending)
                                == *p
                        })
                        .count();
                    (*p, n as i64)
                })
                .collect();
            metrics.set_tasks(&counts);
        }
    }));

    controller
        .run(reconcile, error_policy, ctx)
        .for_each(|r| async move {
            match r {
                Ok((obj, _)) => debug!(task = %obj.name, "reconciled"),
                // Counted and logged by error_policy.
                Err(controller::Error::ReconcilerFailed(_, obj)) => {
                    debug!(task = %obj.name, "reconcile failed")
                }
                Err(e) => warn!(error = %e, "controller"),
            }
        })
        .await;
    drop(gauge);
}

/// Aborts its task when dropped.
#[derive(Debug)]
struct AbortOnDrop(tokio::task::JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}
