//! Leader election on a `coordination.k8s.io/v1` Lease, so that two replicas never
//! reconcile at once.
//!
//! The rules are a pure state machine ([`next_step`], [`Leadership`]): a missing
//! lease is created; a lease held by us is renewed; a lease whose holder has not
//! renewed within its duration (or that has no holder) is taken over, counting a
//! transition; otherwise we follow. A leader that cannot renew keeps leading only
//! until the renew deadline has passed since its last successful renewal, which is
//! shorter than the lease duration, so it stops before anyone may take over.
//! [`LeaseLock`] is the thin adapter: reads and writes go through optimistic
//! concurrency (`resourceVersion`), so two candidates racing for an expired lease
//! cannot both win.

use std::time::Duration;

use chrono::{DateTime, Utc};
use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};
use kube::Api;
use kube::api::PostParams;
use tokio::sync::watch;
use tracing::{info, warn};

use crate::observe::{to_chrono, to_jiff};

/// Lease timing (client-go's defaults: 15 s, 10 s, 2 s).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LeaseTiming {
    /// How long a lease is valid after its last renewal.
    pub lease_duration: Duration,
    /// A leader that could not renew for this long stops leading.
    pub renew_deadline: Duration,
    /// Time between attempts to acquire or renew.
    pub retry_period: Duration,
}

impl Default for LeaseTiming {
    fn default() -> Self {
        Self {
            lease_duration: Duration::from_secs(15),
            renew_deadline: Duration::from_secs(10),
            retry_period: Duration::from_secs(2),
        }
    }
}

impl LeaseTiming {
    /// Check `retry_period < renew_deadline < lease_duration`, all positive.
    pub fn validate(&self) -> Result<(), String> {
        if self.retry_period.is_zero() {
            return Err("the retry period must be positive".into());
        }
        if self.renew_deadline <= self.retry_period {
            return Err("the renew deadline must be longer than the retry period".into());
        }
        if self.lease_duration <= self.renew_deadline {
            return Err("the lease duration must be longer than the renew deadline".into());
        }
        if self.lease_duration.as_secs() > i32::MAX as u64 {
            return Err("the lease duration is too long".into());
        }
        Ok(())
    }
}

/// The fields of a Lease that election uses.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct LeaseRecord {
    /// Who holds it; `None` or empty when released.
    pub holder: Option<String>,
    /// When the holder acquired it.
    pub acquire_time: Option<DateTime<Utc>>,
    /// When the holder last renewed it.
    pub renew_time: Option<DateTime<Utc>>,
    /// Validity after a renewal, in seconds.
    pub lease_duration_seconds: Option<i32>,
    /// How often the holder changed.
    pub transitions: i32,
}

impl LeaseRecord {
    fn holder(&self) -> Option<&str> {
        self.holder.as_deref().filter(|h| !h.is_empty())
    }

    /// When the lease runs out, if it is held.
    pub fn expires_at(&self, default: Duration) -> Option<DateTime<Utc>> {
        self.holder()?;
        let last = self.renew_time.or(self.acquire_time)?;
        let secs = self
            .lease_duration_seconds
            .filter(|s| *s > 0)
            .map_or(default.as_secs() as i64, i64::from);
        Some(last + chrono::Duration::seconds(secs))
    }
}

/// What to do with the lease now.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LeaseStep {
    /// No lease exists: create it, held by us.
    Create(LeaseRecord),
    /// We hold it: write this renewal.
    Renew(LeaseRecord),
    /// It expired or was released: write this takeover.
    TakeOver(LeaseRecord),
    /// Someone else holds it.
    Follow {
        /// The holder.
        holder: String,
        /// When their lease runs out unless renewed.
        expires_at: Option<DateTime<Utc>>,
    },
}

/// Decide the next lease step for `identity`.
pub fn next_step(
    current: Option<&LeaseRecord>,
    identity: &str,
    now: DateTime<Utc>,
    timing: &LeaseTiming,
) -> LeaseStep {
    let duration_secs = timing.lease_duration.as_secs().min(i32::MAX as u64) as i32;
    let fresh = |transitions| LeaseRecord {
        holder: Some(identity.to_string()),
        acquire_time: Some(now),
        renew_time: Some(now),
        lease_duration_seconds: Some(duration_secs),
        transitions,
    };
    let Some(cur) = current else {
        return LeaseStep::Create(fresh(0));
    };
    match cur.holder() {
        Some(h) if h == identity => LeaseStep::Renew(LeaseRecord {
            renew_time: Some(now),
            lease_duration_seconds: Some(duration_secs),
            acquire_time: cur.acquire_time.or(Some(now)),
            ..cur.clone()
        }),
        Some(h) => match cur.expires_at(timing.lease_duration) {
            Some(exp) if exp > now => LeaseStep::Follow {
                holder: h.to_string(),
                expires_at: Some(exp),
            },
            _ => LeaseStep::TakeOver(fresh(cur.transitions.saturating_add(1))),
        },
        None => LeaseStep::TakeOver(fresh(cur.transitions.saturating_add(1))),
    }
}

/// The lease after `identity` steps down; `None` when it does not hold it.
pub fn released(current: &LeaseRecord, identity: &str, now: DateTime<Utc>) -> Option<LeaseRecord> {
    if current.holder() != Some(identity) {
        return None;
    }
    Some(LeaseRecord {
        holder: None,
        renew_time: Some(now),
        // One second: whoever asks next may take over at once.
        lease_duration_seconds: Some(1),
        ..current.clone()
    })
}

/// Whether this replica leads, given the outcomes of its lease attempts.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Leadership {
    leading: bool,
    last_renewed: Option<DateTime<Utc>>,
}

impl Leadership {
    /// We created, renewed or took over the lease at `now`.
    pub fn on_acquired(&mut self, now: DateTime<Utc>) {
        self.leading = true;
        self.last_renewed = Some(now);
    }

    /// Someone else holds the lease (or won a race for it).
    pub fn on_follow(&mut self) {
        self.leading = false;
        self.last_renewed = None;
    }

    /// The API could not be reached: a leader keeps leading until the renew
    /// deadline has passed since its last renewal.
    pub fn on_error(&mut self, now: DateTime<Utc>, timing: &LeaseTiming) {
        let deadline = chrono::Duration::from_std(timing.renew_deadline).unwrap_or_default();
        if let Some(last) = self.last_renewed {
            if now - last >= deadline {
                self.leading = false;
                self.last_renewed = None;
            }
        } else {
            self.leading = false;
        }
    }

    /// Whether this replica may reconcile.
    pub fn is_leading(&self) -> bool {
        self.leading
    }
}

/// A Lease object used as a lock.
#[derive(Clone)]
pub struct LeaseLock {
    api: Api<Lease>,
    name: String,
    identity: String,
    timing: LeaseTiming,
}

impl std::fmt::Debug for LeaseLock {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LeaseLock")
            .field("name", &self.name)
            .field("identity", &self.identity)
            .field("timing", &self.timing)
            .finish_non_exhaustive()
    }
}

/// The Lease's election fields.
pub fn record_of(lease: &Lease) -> LeaseRecord {
    let spec = lease.spec.clone().unwrap_or_default();
    LeaseRecord {
        holder: spec.holder_identity,
        acquire_time: spec.acquire_time.and_then(|t| to_chrono(t.0)),
        renew_time: spec.renew_time.and_then(|t| to_chrono(t.0)),
        lease_duration_seconds: spec.lease_duration_seconds,
        transitions: spec.lease_transitions.unwrap_or(0),
    }
}

fn spec_of(r: &LeaseRecord, base: Option<LeaseSpec>) -> LeaseSpec {
    LeaseSpec {
        holder_identity: r.holder.clone(),
        acquire_time: r.acquire_time.and_then(to_jiff).map(MicroTime),
        renew_time: r.renew_time.and_then(to_jiff).map(MicroTime),
        lease_duration_seconds: r.lease_duration_seconds,
        lease_transitions: Some(r.transitions),
        ..base.unwrap_or_default()
    }
}

fn is_conflict(e: &kube::Error) -> bool {
    matches!(e, kube::Error::Api(s) if s.code == 409 || s.is_conflict() || s.is_already_exists())
}

impl LeaseLock {
    /// The lease `name` in the namespace of `api`, contended for as `identity`.
    pub fn new(
        api: Api<Lease>,
        name: impl Into<String>,
        identity: impl Into<String>,
        timing: LeaseTiming,
    ) -> Self {
        Self {
            api,
            name: name.into(),
            identity: identity.into(),
            timing,
        }
    }

    /// This candidate's identity.
    pub fn identity(&self) -> &str {
        &self.identity
    }

    /// The timing.
    pub fn timing(&self) -> LeaseTiming {
        self.timing
    }

    /// One round: create, renew or take over the lease if we may. `Ok(true)`
    /// when we hold it afterwards.
    pub async fn try_acquire_or_renew(&self, now: DateTime<Utc>) -> Result<bool, kube::Error> {
        let existing = self.api.get_opt(&self.name).await?;
        let current = existing.as_ref().map(record_of);
        match next_step(current.as_ref(), &self.identity, now, &self.timing) {
            LeaseStep::Create(r) => {
                let lease = Lease {
                    metadata: ObjectMeta {
                        name: Some(self.name.clone()),
                        ..ObjectMeta::default()
                    },
                    spec: Some(spec_of(&r, None)),
                };
                match self.api.create(&PostParams::default(), &lease).await {
                    Ok(_) => Ok(true),
                    Err(e) if is_conflict(&e) => Ok(false),
                    Err(e) => Err(e),
                }
            }
            LeaseStep::Renew(r) | LeaseStep::TakeOver(r) => {
                let Some(mut lease) = existing else {
                    return Ok(false);
                };
                lease.spec = Some(spec_of(&r, lease.spec.take()));
                // `replace` sends the resourceVersion we read: a concurrent writer
                // makes it fail with 409 instead of both of us winning.
                match self
                    .api
                    .replace(&self.name, &PostParams::default(), &lease)
                    .await
                {
                    Ok(_) => Ok(true),
                    Err(e) if is_conflict(&e) => Ok(false),
                    Err(e) => Err(e),
                }
            }
            LeaseStep::Follow { .. } => Ok(false),
        }
    }

    /// Step down: release the lease if we hold it.
    pub async fn release(&self, now: DateTime<Utc>) -> Result<(), kube::Error> {
        let Some(mut lease) = self.api.get_opt(&self.name).await? else {
            return Ok(());
        };
        let Some(r) = released(&record_of(&lease), &self.identity, now) else {
            return Ok(());
        };
        lease.spec = Some(spec_of(&r, lease.spec.take()));
        match self
            .api
            .replace(&self.name, &PostParams::default(), &lease)
            .await
        {
            Ok(_) => Ok(()),
            Err(e) if is_conflict(&e) => Ok(()),
            Err(e) => Err(e),
        }
    }
}

/// Contend for the lease until `shutdown` turns true, publishing whether we lead
/// on `leading`; `on_contact` is called after every successful round trip to the
/// API server. On shutdown a held lease is released.
pub async fn run_elector(
    lock: LeaseLock,
    leading: watch::Sender<bool>,
    mut shutdown: watch::Receiver<bool>,
    on_contact: impl Fn() + Send,
) {
    let timing = lock.timing();
    let mut state = Leadership::default();
    loop {
        let now = Utc::now();
        match lock.try_acquire_or_renew(now).await {
            Ok(true) => {
                state.on_acquired(now);
                on_contact();
            }
            Ok(false) => {
                state.on_follow();
                on_contact();
            }
            Err(e) => {
                warn!(error = %e, "lease round failed");
                state.on_error(now, &timing);
            }
        }
        let now_leading = state.is_leading();
        leading.send_if_modified(|l| {
            if *l == now_leading {
                return false;
            }
            if now_leading {
                info!(identity = lock.identity(), "became the leader");
            } else {
                warn!(identity = lock.identity(), "stopped leading");
            }
            *l = now_leading;
            true
        });
        if *shutdown.borrow() {
            break;
        }
        tokio::select! {
            _ = tokio::time::sleep(timing.retry_period) => {}
            _ = shutdown.changed() => {}
        }
        if *shutdown.borrow() {
            break;
        }
    }
    leading.send_replace(false);
    if state.is_leading() {
        match lock.release(Utc::now()).await {
            Ok(()) => info!(identity = lock.identity(), "released the lease"),
            Err(e) => warn!(error = %e, "releasing the lease failed"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t(secs: i64) -> DateTime<Utc> {
        DateTime::from_timestamp(1_800_000_000 + secs, 0).unwrap()
    }

    fn held_by(holder: &str, renewed: i64) -> LeaseRecord {
        LeaseRecord {
            holder: Some(holder.into()),
            acquire_time: Some(t(0)),
            renew_time: Some(t(renewed)),
            lease_duration_seconds: Some(15),
            transitions: 3,
        }
    }

    #[test]
    fn step_table() {
        let timing = LeaseTiming::default();
        // No lease: create.
        match next_step(None, "me", t(100), &timing) {
            LeaseStep::Create(r) => {
                assert_eq!(r.holder.as_deref(), Some("me"));
                assert_eq!(r.renew_time, Some(t(100)));
                assert_eq!(r.transitions, 0);
            }
            other => panic!("{other:?}"),
        }
        // Ours: renew, keeping acquire time and transitions.
        match next_step(Some(&held_by("me", 90)), "me", t(100), &timing) {
            LeaseStep::Renew(r) => {
                assert_eq!(r.acquire_time, Some(t(0)));
                assert_eq!(r.renew_time, Some(t(100)));
                assert_eq!(r.transitions, 3);
            }
            other => panic!("{other:?}"),
        }
        // Someone else's and fresh: follow.
        assert_eq!(
            next_step(Some(&held_by("other", 90)), "me", t(100), &timing),
            LeaseStep::Follow {
                holder: "other".into(),
                expires_at: Some(t(105))
            }
        );
        // Exactly at expiry: take over.
        match next_step(Some(&held_by("other", 90)), "me", t(105), &timing) {
            LeaseStep::TakeOver(r) => {
                assert_eq!(r.holder.as_deref(), Some("me"));
                assert_eq!(r.acquire_time, Some(t(105)));
                assert_eq!(r.transitions, 4);
            }
            other => panic!("{other:?}"),
        }
        // Released (no holder, or empty): take over at once.
        let mut free = held_by("other", 99);
        free.holder = None;
        assert!(matches!(
            next_step(Some(&free), "me", t(100), &timing),
            LeaseStep::TakeOver(_)
        ));
        free.holder = Some(String::new());
        assert!(matches!(
            next_step(Some(&free), "me", t(100), &timing),
            LeaseStep::TakeOver(_)
        ));
        // The lease's own duration wins over ours.
        let mut long = held_by("other", 90);
        long.lease_duration_seconds = Some(60);
        assert!(matches!(
            next_step(Some(&long), "me", t(140), &timing),
            LeaseStep::Follow { .. }
        ));
        // No renew time at all: acquire time counts; none of either: expired.
        let mut odd = held_by("other", 0);
        odd.renew_time = None;
        odd.acquire_time = None;
        assert!(matches!(
            next_step(Some(&odd), "me", t(1), &timing),
            LeaseStep::TakeOver(_)
        ));
    }

    #[test]
    fn release_only_our_own() {
        let r = released(&held_by("me", 90), "me", t(100)).unwrap();
        assert_eq!(r.holder, None);
        assert_eq!(r.lease_duration_seconds, Some(1));
        assert_eq!(released(&held_by("other", 90), "me", t(100)), None);
        // A released lease is taken over by the next candidate.
        assert!(matches!(
            next_step(Some(&r), "other", t(100), &LeaseTiming::default()),
            LeaseStep::TakeOver(_)
        ));
    }

    #[test]
    fn leadership_survives_short_outages_only() {
        let timing = LeaseTiming::default();
        let mut l = Leadership::default();
        assert!(!l.is_leading());
        l.on_error(t(0), &timing);
        assert!(!l.is_leading());
        l.on_acquired(t(0));
        assert!(l.is_leading());
        l.on_error(t(5), &timing);
        assert!(l.is_leading());
        l.on_error(t(9), &timing);
        assert!(l.is_leading());
        l.on_error(t(10), &timing);
        assert!(!l.is_leading());
        l.on_acquired(t(20));
        l.on_follow();
        assert!(!l.is_leading());
    }

    #[test]
    fn timing_validation() {
        assert!(LeaseTiming::default().validate().is_ok());
        let bad = LeaseTiming {
            lease_duration: Duration::from_secs(10),
            renew_deadline: Duration::from_secs(10),
            retry_period: Duration::from_secs(2),
        };
        assert!(bad.validate().is_err());
        let bad = LeaseTiming {
            retry_period: Duration::from_secs(10),
            ..LeaseTiming::default()
        };
        assert!(bad.validate().is_err());
        let bad = LeaseTiming {
            retry_period: Duration::ZERO,
            ..LeaseTiming::default()
        };
        assert!(bad.validate().is_err());
    }

    #[test]
    fn lease_round_trip() {
        let r = held_by("me", 90);
        let lease = Lease {
            metadata: ObjectMeta::default(),
            spec: Some(spec_of(&r, None)),
        };
        assert_eq!(record_of(&lease), r);
    }
}
