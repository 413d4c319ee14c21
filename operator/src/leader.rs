//! Leader election on a `coordination.k8s.io/v1` Lease, so that two replicas never
//! reconcile at once.
//!
//! The rules are a pure state machine ([`LeaseObserver`], [`next_step`],
//! [`Leadership`]): a missing lease is created; a lease held by us is renewed; a
//! lease that has no holder is taken over at once; a lease held by someone else is
//! taken over (counting a transition) only when its record has not changed for its
//! whole duration **as measured on this replica's own monotonic clock**; otherwise
//! we follow. A leader that cannot renew keeps leading only until the renew deadline
//! has passed since its last successful renewal (again on its own clock), which is
//! shorter than the lease duration, so it stops before anyone may take over. Every
//! round is bounded by that deadline ([`Leadership::round_budget`]): a request that
//! never gets an answer ends the leadership on time, as client-go bounds its renewals.
//!
//! **Clock skew.** Like client-go, a candidate never compares the holder's
//! `renewTime` with its own wall clock: replicas' clocks may disagree by minutes or
//! hours. It records the local [`Instant`] at which it last saw the lease record
//! change (holder, acquire or renew time, duration, transitions or
//! `resourceVersion`), and judges the lease expired when `leaseDurationSeconds`
//! have passed locally since then. A holder whose clock runs behind but which keeps
//! renewing therefore keeps the lease, and one whose clock runs ahead loses it one
//! lease duration after it stopped renewing. The price is that a candidate that
//! just started waits a full lease duration before it takes over a lease it has not
//! seen change. Wall time only fills `acquireTime` and `renewTime` for people and
//! other tools.
//!
//! [`LeaseLock`] is the thin adapter: reads and writes go through optimistic
//! concurrency (`resourceVersion`), so two candidates racing for an expired lease
//! cannot both win.

use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use chrono::{DateTime, Utc};
use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};
use kube::Api;
use kube::api::PostParams;
use tokio::sync::watch;
use tracing::{debug, info, instrument, warn};

use crate::observe::{to_chrono, to_jiff};

/// The clocks of a candidate: a monotonic one that judges expiry, and the wall
/// clock whose time is written into the lease. Injectable for tests.
pub trait Clock: Send + Sync {
    /// Local monotonic time; lease expiry is judged on it alone.
    fn monotonic(&self) -> Instant;
    /// Wall time, written as `acquireTime` and `renewTime`; never compared.
    fn wall(&self) -> DateTime<Utc>;
}

/// The system clocks: [`Instant::now`] and [`Utc::now`].
#[derive(Debug, Clone, Copy, Default)]
pub struct SystemClock;

impl Clock for SystemClock {
    fn monotonic(&self) -> Instant {
        Instant::now()
    }

    fn wall(&self) -> DateTime<Utc> {
        Utc::now()
    }
}

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
    /// When the holder acquired it (the holder's wall clock: never compared).
    pub acquire_time: Option<DateTime<Utc>>,
    /// When the holder last renewed it (the holder's wall clock: never compared).
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

    /// How long the lease is valid after its record last changed: its own
    /// `leaseDurationSeconds`, or `default` when that is unset or not positive.
    pub fn duration(&self, default: Duration) -> Duration {
        self.lease_duration_seconds
            .filter(|s| *s > 0)
            .map_or(default, |s| Duration::from_secs(s.unsigned_abs().into()))
    }
}

/// What a candidate last saw of the lease, and when — on its own monotonic clock —
/// it saw the record change. This is the only input of expiry: the holder's
/// `renewTime` is never compared with the local clock.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct LeaseObserver {
    seen: Option<Seen>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
struct Seen {
    record: Option<LeaseRecord>,
    resource_version: Option<String>,
    changed_at: Instant,
}

impl LeaseObserver {
    /// Note the lease as read at local time `now` (`record` is `None` when it does
    /// not exist). Returns the local time at which its record last changed: `now`
    /// when it differs from the previous observation (or there was none), else the
    /// time of that earlier change.
    pub fn observe(
        &mut self,
        record: Option<&LeaseRecord>,
        resource_version: Option<&str>,
        now: Instant,
    ) -> Instant {
        if let Some(s) = &self.seen
            && s.record.as_ref() == record
            && s.resource_version.as_deref() == resource_version
        {
            return s.changed_at;
        }
        self.seen = Some(Seen {
            record: record.cloned(),
            resource_version: resource_version.map(str::to_string),
            changed_at: now,
        });
        now
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
        /// Local time left before we may take over, unless the record changes.
        expires_in: Duration,
    },
}

/// Decide the next lease step for `identity`. `unchanged_for` is how long, on this
/// candidate's monotonic clock, the record has been seen unchanged
/// ([`LeaseObserver::observe`]); `now` is only written into the lease.
pub fn next_step(
    current: Option<&LeaseRecord>,
    identity: &str,
    now: DateTime<Utc>,
    unchanged_for: Duration,
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
        Some(h) => {
            let valid = cur.duration(timing.lease_duration);
            if unchanged_for < valid {
                LeaseStep::Follow {
                    holder: h.to_string(),
                    expires_in: valid - unchanged_for,
                }
            } else {
                LeaseStep::TakeOver(fresh(cur.transitions.saturating_add(1)))
            }
        }
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
        // A lease without a holder is taken over at once; one second for other tools.
        lease_duration_seconds: Some(1),
        ..current.clone()
    })
}

/// Whether this replica leads, given the outcomes of its lease attempts, on its
/// own monotonic clock.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Leadership {
    leading: bool,
    last_renewed: Option<Instant>,
}

impl Leadership {
    /// We created, renewed or took over the lease at local time `now`.
    pub fn on_acquired(&mut self, now: Instant) {
        self.leading = true;
        self.last_renewed = Some(now);
    }

    /// Someone else holds the lease (or won a race for it).
    pub fn on_follow(&mut self) {
        self.leading = false;
        self.last_renewed = None;
    }

    /// The API could not be reached at local time `now`: a leader keeps leading
    /// until the renew deadline has passed since its last renewal.
    pub fn on_error(&mut self, now: Instant, timing: &LeaseTiming) {
        if let Some(last) = self.last_renewed {
            if now.saturating_duration_since(last) >= timing.renew_deadline {
                self.leading = false;
                self.last_renewed = None;
            }
        } else {
            self.leading = false;
        }
    }

    /// How long the lease round starting at local time `now` may take. A leader's round ends by its
    /// renew deadline, counted from its last renewal, so that a request that hangs (an API server
    /// that accepts the connection and never answers) cannot keep it leading past that deadline;
    /// a follower's round is given one renew deadline.
    pub fn round_budget(&self, now: Instant, timing: &LeaseTiming) -> Duration {
        match self.last_renewed {
            Some(last) if self.leading => timing
                .renew_deadline
                .saturating_sub(now.saturating_duration_since(last)),
            _ => timing.renew_deadline,
        }
    }

    /// The round ran out of its [`Self::round_budget`]: a leader has not renewed within its renew
    /// deadline and stops leading, whatever the request may still do.
    pub fn on_round_timeout(&mut self) {
        self.leading = false;
        self.last_renewed = None;
    }

    /// Whether this replica may reconcile.
    pub fn is_leading(&self) -> bool {
        self.leading
    }
}

/// A Lease object used as a lock.
pub struct LeaseLock {
    api: Api<Lease>,
    name: String,
    identity: String,
    timing: LeaseTiming,
    clock: Arc<dyn Clock>,
    observer: Mutex<LeaseObserver>,
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
    /// The lease `name` in the namespace of `api`, contended for as `identity`, on
    /// the [`SystemClock`].
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
            clock: Arc::new(SystemClock),
            observer: Mutex::new(LeaseObserver::default()),
        }
    }

    /// The same lock on another clock (tests).
    pub fn with_clock(mut self, clock: Arc<dyn Clock>) -> Self {
        self.clock = clock;
        self
    }

    /// This candidate's identity.
    pub fn identity(&self) -> &str {
        &self.identity
    }

    /// The timing.
    pub fn timing(&self) -> LeaseTiming {
        self.timing
    }

    /// Note `lease` as seen at local time `now`; the local time its record last changed.
    fn observe(&self, lease: Option<&Lease>, now: Instant) -> Instant {
        let record = lease.map(record_of);
        let version = lease.and_then(|l| l.metadata.resource_version.as_deref());
        self.observer
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .observe(record.as_ref(), version, now)
    }

    /// One round: create, renew or take over the lease if we may. `Ok(true)`
    /// when we hold it afterwards.
    #[instrument(skip_all, fields(lease = %self.name, identity = %self.identity))]
    pub async fn try_acquire_or_renew(&self) -> Result<bool, kube::Error> {
        let existing = self.api.get_opt(&self.name).await?;
        // Read the clocks after the read: a slow read only delays a takeover.
        let local = self.clock.monotonic();
        let now = self.clock.wall();
        let changed_at = self.observe(existing.as_ref(), local);
        let unchanged_for = local.saturating_duration_since(changed_at);
        let current = existing.as_ref().map(record_of);
        let step = next_step(
            current.as_ref(),
            &self.identity,
            now,
            unchanged_for,
            &self.timing,
        );
        let takeover = matches!(step, LeaseStep::TakeOver(_));
        match step {
            LeaseStep::Create(r) => {
                let lease = Lease {
                    metadata: ObjectMeta {
                        name: Some(self.name.clone()),
                        ..ObjectMeta::default()
                    },
                    spec: Some(spec_of(&r, None)),
                };
                match self.api.create(&PostParams::default(), &lease).await {
                    Ok(created) => {
                        self.observe(Some(&created), local);
                        Ok(true)
                    }
                    Err(e) if is_conflict(&e) => Ok(false),
                    Err(e) => Err(e),
                }
            }
            LeaseStep::Renew(r) | LeaseStep::TakeOver(r) => {
                let Some(mut lease) = existing else {
                    return Ok(false);
                };
                let previous = current
                    .as_ref()
                    .and_then(|c| c.holder().map(str::to_string));
                lease.spec = Some(spec_of(&r, lease.spec.take()));
                // `replace` sends the resourceVersion we read: a concurrent writer
                // makes it fail with 409 instead of both of us winning.
                match self
                    .api
                    .replace(&self.name, &PostParams::default(), &lease)
                    .await
                {
                    Ok(written) => {
                        self.observe(Some(&written), local);
                        if takeover {
                            info!(
                                previous = previous.as_deref().unwrap_or(""),
                                transitions = r.transitions,
                                "took over the lease"
                            );
                        }
                        Ok(true)
                    }
                    Err(e) if is_conflict(&e) => Ok(false),
                    Err(e) => Err(e),
                }
            }
            LeaseStep::Follow { holder, expires_in } => {
                debug!(%holder, expires_in_s = expires_in.as_secs_f64(), "following");
                Ok(false)
            }
        }
    }

    /// Step down: release the lease if we hold it.
    #[instrument(skip_all, fields(lease = %self.name, identity = %self.identity))]
    pub async fn release(&self) -> Result<(), kube::Error> {
        let Some(mut lease) = self.api.get_opt(&self.name).await? else {
            return Ok(());
        };
        let Some(r) = released(&record_of(&lease), &self.identity, self.clock.wall()) else {
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
        // The time the round started: a renewal counts from before its request.
        let started = lock.clock.monotonic();
        let budget = state.round_budget(started, &timing);
        match tokio::time::timeout(budget, lock.try_acquire_or_renew()).await {
            Ok(Ok(true)) => {
                state.on_acquired(started);
                on_contact();
            }
            Ok(Ok(false)) => {
                state.on_follow();
                on_contact();
            }
            Ok(Err(e)) => {
                warn!(error = %e, "lease round failed");
                state.on_error(lock.clock.monotonic(), &timing);
            }
            Err(_) => {
                warn!(
                    budget_ms = budget.as_millis() as u64,
                    "lease round got no answer within its budget"
                );
                state.on_round_timeout();
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
        match lock.release().await {
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

    fn secs(s: u64) -> Duration {
        Duration::from_secs(s)
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
        match next_step(None, "me", t(100), secs(0), &timing) {
            LeaseStep::Create(r) => {
                assert_eq!(r.holder.as_deref(), Some("me"));
                assert_eq!(r.renew_time, Some(t(100)));
                assert_eq!(r.transitions, 0);
            }
            other => panic!("{other:?}"),
        }
        // Ours: renew, keeping acquire time and transitions.
        match next_step(Some(&held_by("me", 90)), "me", t(100), secs(0), &timing) {
            LeaseStep::Renew(r) => {
                assert_eq!(r.acquire_time, Some(t(0)));
                assert_eq!(r.renew_time, Some(t(100)));
                assert_eq!(r.transitions, 3);
            }
            other => panic!("{other:?}"),
        }
        // Someone else's, seen unchanged for 10 s of the lease's 15: follow.
        assert_eq!(
            next_step(Some(&held_by("other", 90)), "me", t(100), secs(10), &timing),
            LeaseStep::Follow {
                holder: "other".into(),
                expires_in: secs(5)
            }
        );
        // Unchanged for exactly the lease duration: take over.
        match next_step(Some(&held_by("other", 90)), "me", t(105), secs(15), &timing) {
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
            next_step(Some(&free), "me", t(100), secs(0), &timing),
            LeaseStep::TakeOver(_)
        ));
        free.holder = Some(String::new());
        assert!(matches!(
            next_step(Some(&free), "me", t(100), secs(0), &timing),
            LeaseStep::TakeOver(_)
        ));
        // The lease's own duration wins over ours.
        let mut long = held_by("other", 90);
        long.lease_duration_seconds = Some(60);
        assert!(matches!(
            next_step(Some(&long), "me", t(140), secs(50), &timing),
            LeaseStep::Follow { .. }
        ));
        // Times in the record are never compared: without them, or far in the past
        // or future, only the locally observed age counts.
        for renewed in [None, Some(t(-86_400)), Some(t(86_400))] {
            let mut odd = held_by("other", 0);
            odd.renew_time = renewed;
            odd.acquire_time = renewed;
            assert!(
                matches!(
                    next_step(Some(&odd), "me", t(1), secs(14), &timing),
                    LeaseStep::Follow { .. }
                ),
                "{renewed:?}"
            );
            assert!(
                matches!(
                    next_step(Some(&odd), "me", t(1), secs(15), &timing),
                    LeaseStep::TakeOver(_)
                ),
                "{renewed:?}"
            );
        }
    }

    #[test]
    fn observer_dates_the_last_change_on_the_local_clock() {
        let t0 = Instant::now();
        let at = |s| t0 + secs(s);
        let mut o = LeaseObserver::default();
        let r = held_by("other", 0);
        // First sight counts as a change.
        assert_eq!(o.observe(Some(&r), Some("1"), at(0)), at(0));
        // Unchanged: the first sighting stays.
        assert_eq!(o.observe(Some(&r), Some("1"), at(7)), at(0));
        // Any field of the record, or the resourceVersion alone, is a change.
        let mut renewed = r.clone();
        renewed.renew_time = Some(t(-3600));
        assert_eq!(o.observe(Some(&renewed), Some("1"), at(9)), at(9));
        assert_eq!(o.observe(Some(&renewed), Some("2"), at(11)), at(11));
        let mut moved = renewed.clone();
        moved.transitions += 1;
        assert_eq!(o.observe(Some(&moved), Some("2"), at(12)), at(12));
        let mut other = moved.clone();
        other.holder = Some("third".into());
        assert_eq!(o.observe(Some(&other), Some("2"), at(13)), at(13));
        assert_eq!(o.observe(Some(&other), Some("2"), at(30)), at(13));
        // Gone and back.
        assert_eq!(o.observe(None, None, at(31)), at(31));
        assert_eq!(o.observe(Some(&other), Some("2"), at(32)), at(32));
    }

    #[test]
    fn release_only_our_own() {
        let r = released(&held_by("me", 90), "me", t(100)).unwrap();
        assert_eq!(r.holder, None);
        assert_eq!(r.lease_duration_seconds, Some(1));
        assert_eq!(released(&held_by("other", 90), "me", t(100)), None);
        // A released lease is taken over by the next candidate at once.
        assert!(matches!(
            next_step(Some(&r), "other", t(100), secs(0), &LeaseTiming::default()),
            LeaseStep::TakeOver(_)
        ));
    }

    #[test]
    fn leadership_survives_short_outages_only() {
        let timing = LeaseTiming::default();
        let t0 = Instant::now();
        let at = |s| t0 + secs(s);
        let mut l = Leadership::default();
        assert!(!l.is_leading());
        l.on_error(at(0), &timing);
        assert!(!l.is_leading());
        l.on_acquired(at(0));
        assert!(l.is_leading());
        l.on_error(at(5), &timing);
        assert!(l.is_leading());
        l.on_error(at(9), &timing);
        assert!(l.is_leading());
        l.on_error(at(10), &timing);
        assert!(!l.is_leading());
        l.on_acquired(at(20));
        l.on_follow();
        assert!(!l.is_leading());
    }

    #[test]
    fn a_leaders_round_may_last_only_until_its_renew_deadline() {
        let timing = LeaseTiming::default();
        let t0 = Instant::now();
        let at = |s| t0 + secs(s);
        let mut l = Leadership::default();
        assert_eq!(l.round_budget(at(0), &timing), timing.renew_deadline);
        l.on_acquired(at(0));
        assert_eq!(l.round_budget(at(0), &timing), secs(10));
        assert_eq!(l.round_budget(at(7), &timing), secs(3));
        assert_eq!(l.round_budget(at(12), &timing), Duration::ZERO);
        l.on_round_timeout();
        assert!(!l.is_leading());
        assert_eq!(l.round_budget(at(13), &timing), timing.renew_deadline);
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
        assert_eq!(r.duration(secs(7)), secs(15));
        let mut unset = r.clone();
        unset.lease_duration_seconds = Some(0);
        assert_eq!(unset.duration(secs(7)), secs(7));
    }
}
