//! Is the driver alive and ready: `grpc.health.v1` on both sockets ([`crate::server`] serves it
//! next to each socket's service, SERVING while that server runs), a checker that calls it over
//! each socket as a client would, and what `/healthz`, `/readyz` and `/metrics` answer
//! ([`router`], [`carma_http::health`]'s router).
//!
//! `/healthz` fails when the last check over a socket failed (no answer within the timeout, a
//! refused connection, NOT_SERVING) or is older than [`Health::stale_after`]: a server that hangs
//! fails it, not only one that ended (which ends the process anyway, see
//! [`crate::driver::RunningDriver::run_until`]). `/readyz` also needs a telemetry sample and the
//! kubelet's registration.

use std::borrow::Cow;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::Router;
use carma_gpu::telemetry::Snapshot;
use carma_gpu::uds::uds_channel;
use carma_http::health::{Check, Endpoints};
use parking_lot::Mutex;
use tokio::sync::watch;
use tonic_health::pb::HealthCheckRequest;
use tonic_health::pb::health_check_response::ServingStatus;
use tonic_health::pb::health_client::HealthClient;
use tracing::{info, warn};

use crate::metrics::Metrics;
use crate::registration::RegistrationState;
use crate::stopped;

/// Name of the DRA socket in texts and the `socket` label.
pub const SOCKET_DRA: &str = "dra";
/// Name of the registration socket in texts and the `socket` label.
pub const SOCKET_REGISTRATION: &str = "registration";

/// Longest wait for one health check's answer.
pub const CHECK_TIMEOUT: Duration = Duration::from_secs(3);

/// Call `grpc.health.v1.Health/Check` (the whole server: service `""`) over the Unix socket at
/// `path`; `Ok` when it answers SERVING within `timeout`.
pub async fn check_socket(path: &Path, timeout: Duration) -> Result<(), String> {
    let call = async {
        let channel = uds_channel(path)
            .await
            .map_err(|e| format!("cannot connect: {e}"))?;
        let answer = HealthClient::new(channel)
            .check(HealthCheckRequest {
                service: String::new(),
            })
            .await
            .map_err(|s| format!("Check failed: {}: {}", s.code(), s.message()))?;
        match answer.into_inner().status() {
            ServingStatus::Serving => Ok(()),
            other => Err(format!("answered {}", other.as_str_name())),
        }
    };
    match tokio::time::timeout(timeout, call).await {
        Ok(r) => r,
        Err(_) => Err(format!("no answer within {timeout:?}")),
    }
}

#[derive(Debug, Clone)]
struct Outcome {
    at: Instant,
    result: Result<(), String>,
}

/// What the checks found, and the facts readiness needs.
#[derive(Debug)]
pub struct Health {
    started: Instant,
    stale_after: Duration,
    checks: Mutex<BTreeMap<&'static str, Outcome>>,
    snapshots: watch::Receiver<Option<Arc<Snapshot>>>,
    registration: watch::Receiver<RegistrationState>,
    metrics: Arc<Metrics>,
}

impl Health {
    /// Health of a driver checked every `interval`.
    pub fn new(
        interval: Duration,
        snapshots: watch::Receiver<Option<Arc<Snapshot>>>,
        registration: watch::Receiver<RegistrationState>,
        metrics: Arc<Metrics>,
    ) -> Self {
        Self {
            started: Instant::now(),
            stale_after: Self::stale_after(interval),
            checks: Mutex::new(BTreeMap::new()),
            snapshots,
            registration,
            metrics,
        }
    }

    /// How old the last passing check may be: three intervals and a timeout, so one slow or lost
    /// check does not fail liveness by itself.
    pub fn stale_after(interval: Duration) -> Duration {
        interval * 3 + CHECK_TIMEOUT
    }

    /// Record a check of `socket`.
    pub fn record(&self, socket: &'static str, result: Result<(), String>) {
        self.metrics.set_serving(socket, result.is_ok());
        let mut checks = self.checks.lock();
        let was_ok = checks.get(socket).map(|o| o.result.is_ok());
        match (&result, was_ok) {
            (Err(e), Some(true) | None) => {
                warn!(socket, "gRPC health check failed: {e}")
            }
            (Ok(()), Some(false)) => info!(socket, "gRPC health check passes again"),
            _ => {}
        }
        checks.insert(
            socket,
            Outcome {
                at: Instant::now(),
                result,
            },
        );
    }

    /// Liveness: the last check of each socket passed, recently. Before the first check of a
    /// socket it is `starting` for [`Health::stale_after`].
    pub fn live(&self) -> Result<String, String> {
        let checks = self.checks.lock();
        let mut text = Vec::new();
        let mut ok = true;
        for socket in [SOCKET_DRA, SOCKET_REGISTRATION] {
            let state = match checks.get(socket) {
                Some(o) => match &o.result {
                    Ok(()) if o.at.elapsed() <= self.stale_after => "serving".to_string(),
                    Ok(()) => {
                        ok = false;
                        format!("not checked for {:?}", o.at.elapsed())
                    }
                    Err(e) => {
                        ok = false;
                        e.clone()
                    }
                },
                None if self.started.elapsed() <= self.stale_after => "starting".to_string(),
                None => {
                    ok = false;
                    "never checked".to_string()
                }
            };
            text.push(format!("{socket}={state}"));
        }
        let text = text.join(" ");
        if ok { Ok(text) } else { Err(text) }
    }

    /// Readiness: live with both sockets checked, a telemetry sample taken and the driver
    /// registered by the kubelet.
    pub fn ready(&self) -> Result<String, String> {
        let live = self.live();
        let checked = {
            let checks = self.checks.lock();
            [SOCKET_DRA, SOCKET_REGISTRATION]
                .iter()
                .all(|s| checks.contains_key(s))
        };
        let sampled = self.snapshots.borrow().is_some();
        let registered = *self.registration.borrow() == RegistrationState::Registered;
        self.metrics.set_registered(registered);
        let serving = match &live {
            Ok(t) | Err(t) => t.clone(),
        };
        let text = format!("{serving} sampled={sampled} registered={registered}");
        if live.is_ok() && checked && sampled && registered {
            Ok(text)
        } else {
            Err(text)
        }
    }
}

/// Check each socket every `interval` until `stop`, recording into `health`.
pub async fn check_loop(
    health: Arc<Health>,
    sockets: Vec<(&'static str, PathBuf)>,
    interval: Duration,
    mut stop: watch::Receiver<bool>,
) {
    let mut ticker = tokio::time::interval(interval);
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = ticker.tick() => {}
            _ = stopped(&mut stop) => return,
        }
        for (socket, path) in &sockets {
            let result = check_socket(path, CHECK_TIMEOUT.min(interval * 2)).await;
            health.record(socket, result);
        }
    }
}

/// What the driver serves on `/healthz`, `/readyz` and `/metrics`.
#[derive(Debug)]
struct Served {
    health: Arc<Health>,
    metrics: Arc<Metrics>,
}

fn line(r: Result<String, String>) -> Check {
    r.map(|t| Cow::Owned(t + "\n"))
        .map_err(|t| Cow::Owned(t + "\n"))
}

impl Endpoints for Served {
    fn live(&self) -> Check {
        line(self.health.live())
    }

    fn ready(&self) -> Check {
        line(self.health.ready())
    }

    fn metrics(&self) -> Result<String, std::fmt::Error> {
        self.metrics
            .set_registered(*self.health.registration.borrow() == RegistrationState::Registered);
        self.metrics.encode()
    }
}

/// The HTTP router of `/healthz`, `/readyz` and `/metrics`.
pub fn router(health: Arc<Health>, metrics: Arc<Metrics>) -> Router {
    carma_http::health::router(Arc::new(Served { health, metrics }))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn health(interval: Duration) -> (Arc<Health>, watch::Sender<RegistrationState>) {
        let (_snap_tx, snaps) = watch::channel(None);
        let (reg_tx, reg) = watch::channel(RegistrationState::Pending);
        (
            Arc::new(Health::new(interval, snaps, reg, Arc::new(Metrics::new()))),
            reg_tx,
        )
    }

    #[test]
    fn liveness_follows_the_last_check_of_each_socket() {
        let (h, _reg) = health(Duration::from_secs(5));
        assert_eq!(
            h.live(),
            Ok("dra=starting registration=starting".to_string())
        );
        h.record(SOCKET_DRA, Ok(()));
        h.record(SOCKET_REGISTRATION, Err("no answer within 3s".into()));
        assert_eq!(
            h.live(),
            Err("dra=serving registration=no answer within 3s".to_string())
        );
        h.record(SOCKET_REGISTRATION, Ok(()));
        assert_eq!(h.live(), Ok("dra=serving registration=serving".to_string()));
        let ready = h.ready().unwrap_err();
        assert!(ready.ends_with("sampled=false registered=false"), "{ready}");
    }

    #[test]
    fn a_check_that_stopped_coming_fails_liveness() {
        let (h, _reg) = health(Duration::ZERO);
        h.record(SOCKET_DRA, Ok(()));
        h.record(SOCKET_REGISTRATION, Ok(()));
        std::thread::sleep(CHECK_TIMEOUT + Duration::from_millis(50));
        let live = h.live().unwrap_err();
        assert!(live.starts_with("dra=not checked for "), "{live}");
    }
}
