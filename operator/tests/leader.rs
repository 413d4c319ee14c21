//! Leader election through the Lease adapter, against a scripted API server
//! that enforces resourceVersion like the real one. Every candidate reads one
//! shared timeline through clocks of its own: a monotonic clock with its own
//! origin, and a wall clock that may be skewed.

mod common;

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use chrono::{DateTime, Utc};
use http::Method;
use k8s_openapi::api::coordination::v1::Lease;
use kube::Api;
use tokio::sync::watch;

use carma_operator::leader::{Clock, LeaseLock, LeaseTiming, run_elector};

use common::{Fake, client, hanging_client};

fn at(secs: i64) -> DateTime<Utc> {
    DateTime::from_timestamp(1_800_000_000 + secs, 0).unwrap()
}

/// The true time, in seconds since the test began.
#[derive(Clone, Default)]
struct Timeline(Arc<Mutex<u64>>);

impl Timeline {
    fn set(&self, secs: u64) {
        *self.0.lock().unwrap() = secs;
    }

    fn secs(&self) -> u64 {
        *self.0.lock().unwrap()
    }

    /// A candidate's clocks: its wall clock is `skew` seconds off the true time.
    fn clock(&self, skew: i64) -> Arc<dyn Clock> {
        Arc::new(CandidateClock {
            timeline: self.clone(),
            origin: Instant::now(),
            skew,
        })
    }
}

struct CandidateClock {
    timeline: Timeline,
    origin: Instant,
    skew: i64,
}

impl Clock for CandidateClock {
    fn monotonic(&self) -> Instant {
        self.origin + Duration::from_secs(self.timeline.secs())
    }

    fn wall(&self) -> DateTime<Utc> {
        at(self.timeline.secs() as i64 + self.skew)
    }
}

fn lock(fake: &Arc<Mutex<Fake>>, identity: &str, clock: Arc<dyn Clock>) -> LeaseLock {
    LeaseLock::new(
        Api::<Lease>::namespaced(client(fake.clone()), "carma-system"),
        "carma-operator",
        identity,
        LeaseTiming::default(),
    )
    .with_clock(clock)
}

fn lease(fake: &Arc<Mutex<Fake>>) -> serde_json::Value {
    fake.lock().unwrap().leases["carma-operator"].clone()
}

fn holder(fake: &Arc<Mutex<Fake>>) -> serde_json::Value {
    lease(fake)["spec"]["holderIdentity"].clone()
}

#[tokio::test]
async fn one_leader_at_a_time_with_takeover_after_expiry() {
    let fake = Arc::new(Mutex::new(Fake::default()));
    let time = Timeline::default();
    let a = lock(&fake, "replica-a", time.clock(0));
    let b = lock(&fake, "replica-b", time.clock(0));

    assert!(a.try_acquire_or_renew().await.unwrap());
    assert_eq!(holder(&fake), "replica-a");
    time.set(1);
    assert!(!b.try_acquire_or_renew().await.unwrap());
    time.set(2);
    assert!(a.try_acquire_or_renew().await.unwrap());

    // replica-a stops renewing. replica-b saw the renewal at 3, so the lease is
    // valid for it until 3 + 15.
    for s in 3..18 {
        time.set(s);
        assert!(!b.try_acquire_or_renew().await.unwrap(), "took over at {s}");
    }
    time.set(18);
    assert!(b.try_acquire_or_renew().await.unwrap());
    let lease = lease(&fake);
    assert_eq!(lease["spec"]["holderIdentity"], "replica-b");
    assert_eq!(lease["spec"]["leaseTransitions"], 1);
    assert_eq!(lease["spec"]["leaseDurationSeconds"], 15);
    time.set(19);
    assert!(!a.try_acquire_or_renew().await.unwrap());
    assert!(b.try_acquire_or_renew().await.unwrap());
}

#[tokio::test]
async fn a_holder_whose_clock_is_behind_keeps_the_lease_while_it_renews() {
    let fake = Arc::new(Mutex::new(Fake::default()));
    let time = Timeline::default();
    // replica-a's wall clock is an hour behind: every renewTime it writes looks
    // long expired to replica-b's wall clock.
    let a = lock(&fake, "replica-a", time.clock(-3600));
    let b = lock(&fake, "replica-b", time.clock(0));

    assert!(a.try_acquire_or_renew().await.unwrap());
    for s in 1..=120 {
        time.set(s);
        if s % 2 == 0 {
            assert!(a.try_acquire_or_renew().await.unwrap(), "a lost it at {s}");
        }
        assert!(
            !b.try_acquire_or_renew().await.unwrap(),
            "b took over at {s}"
        );
    }
    assert_eq!(holder(&fake), "replica-a");
    assert_eq!(lease(&fake)["spec"]["leaseTransitions"], 0);

    // Once replica-a stops (last renewal at 120, seen by b at 120), replica-b
    // takes over one lease duration later.
    for s in 121..135 {
        time.set(s);
        assert!(
            !b.try_acquire_or_renew().await.unwrap(),
            "b took over at {s}"
        );
    }
    time.set(135);
    assert!(b.try_acquire_or_renew().await.unwrap());
    assert_eq!(holder(&fake), "replica-b");
}

#[tokio::test]
async fn a_holder_whose_clock_is_ahead_loses_the_lease_one_duration_after_it_stops() {
    let fake = Arc::new(Mutex::new(Fake::default()));
    let time = Timeline::default();
    // replica-a's wall clock is an hour ahead: its renewTime looks valid for an
    // hour to replica-b's wall clock.
    let a = lock(&fake, "replica-a", time.clock(3600));
    let b = lock(&fake, "replica-b", time.clock(0));

    assert!(a.try_acquire_or_renew().await.unwrap());
    assert!(!b.try_acquire_or_renew().await.unwrap());
    for s in 1..19 {
        time.set(s);
        // Renewals at 2 and 4, then replica-a hangs.
        if s == 2 || s == 4 {
            assert!(a.try_acquire_or_renew().await.unwrap());
        }
        assert!(
            !b.try_acquire_or_renew().await.unwrap(),
            "b took over at {s}"
        );
    }
    time.set(19);
    assert!(
        b.try_acquire_or_renew().await.unwrap(),
        "the last change was seen at 4: the lease expired at 4 + 15 on b's clock"
    );
    assert_eq!(holder(&fake), "replica-b");
    assert_eq!(lease(&fake)["spec"]["leaseTransitions"], 1);
}

#[tokio::test]
async fn a_lost_race_is_not_leadership() {
    let fake = Arc::new(Mutex::new(Fake::default()));
    let time = Timeline::default();
    let a = lock(&fake, "replica-a", time.clock(0));
    let b = lock(&fake, "replica-b", time.clock(0));
    assert!(a.try_acquire_or_renew().await.unwrap());
    assert!(!b.try_acquire_or_renew().await.unwrap());
    // replica-b sees an expired lease, but someone writes first.
    time.set(30);
    fake.lock().unwrap().conflict_next_lease_replace = true;
    assert!(!b.try_acquire_or_renew().await.unwrap());
    assert_eq!(holder(&fake), "replica-a");
    assert!(
        !fake
            .lock()
            .unwrap()
            .calls(&Method::PUT, "/leases/carma-operator")
            .is_empty(),
        "b did try to take over"
    );
}

#[tokio::test]
async fn release_hands_over_at_once() {
    let fake = Arc::new(Mutex::new(Fake::default()));
    let time = Timeline::default();
    let a = lock(&fake, "replica-a", time.clock(0));
    let b = lock(&fake, "replica-b", time.clock(0));
    assert!(a.try_acquire_or_renew().await.unwrap());
    time.set(1);
    b.release().await.unwrap();
    assert_eq!(holder(&fake), "replica-a", "only the holder may release");
    a.release().await.unwrap();
    assert_eq!(holder(&fake), serde_json::Value::Null);
    time.set(2);
    assert!(b.try_acquire_or_renew().await.unwrap());
    assert_eq!(holder(&fake), "replica-b");
}

#[tokio::test]
async fn elector_leads_and_releases_on_shutdown() {
    let fake = Arc::new(Mutex::new(Fake::default()));
    let a = LeaseLock::new(
        Api::<Lease>::namespaced(client(fake.clone()), "carma-system"),
        "carma-operator",
        "replica-a",
        LeaseTiming {
            lease_duration: Duration::from_secs(3),
            renew_deadline: Duration::from_secs(2),
            retry_period: Duration::from_millis(50),
        },
    );
    let (leading_tx, mut leading_rx) = watch::channel(false);
    let (shutdown_tx, shutdown_rx) = watch::channel(false);
    let contacts = Arc::new(Mutex::new(0u32));
    let c = contacts.clone();
    let task = tokio::spawn(run_elector(a, leading_tx, shutdown_rx, move || {
        *c.lock().unwrap() += 1;
    }));
    tokio::time::timeout(Duration::from_secs(5), leading_rx.wait_for(|l| *l))
        .await
        .unwrap()
        .unwrap();
    // Let it renew a few times.
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert!(*contacts.lock().unwrap() >= 2);
    shutdown_tx.send_replace(true);
    tokio::time::timeout(Duration::from_secs(5), task)
        .await
        .unwrap()
        .unwrap();
    assert!(!*leading_rx.borrow());
    assert_eq!(holder(&fake), serde_json::Value::Null);
    assert!(
        !fake
            .lock()
            .unwrap()
            .calls(&Method::PUT, "/leases/carma-operator")
            .is_empty()
    );
}

/// A leader whose API server stops answering stops leading within its renew deadline, before its
/// lease can expire for the others, instead of waiting for its client to time out.
#[tokio::test]
async fn a_leader_whose_api_server_hangs_stops_leading_within_the_renew_deadline() {
    use std::sync::atomic::{AtomicBool, Ordering};
    let fake = Arc::new(Mutex::new(Fake::default()));
    let hang = Arc::new(AtomicBool::new(false));
    let timing = LeaseTiming {
        lease_duration: Duration::from_secs(3),
        renew_deadline: Duration::from_secs(2),
        retry_period: Duration::from_millis(100),
    };
    let a = LeaseLock::new(
        Api::<Lease>::namespaced(
            {
                let hang = hang.clone();
                hanging_client(client(fake.clone()), move |_| hang.load(Ordering::SeqCst))
            },
            "carma-system",
        ),
        "carma-operator",
        "replica-a",
        timing,
    );
    let (leading_tx, mut leading_rx) = watch::channel(false);
    let (_shutdown_tx, shutdown_rx) = watch::channel(false);
    let _task = tokio::spawn(run_elector(a, leading_tx, shutdown_rx, || {}));
    tokio::time::timeout(Duration::from_secs(5), leading_rx.wait_for(|l| *l))
        .await
        .expect("replica-a leads")
        .unwrap();

    hang.store(true, Ordering::SeqCst);
    let hung_at = tokio::time::Instant::now();
    tokio::time::timeout(
        timing.renew_deadline + Duration::from_millis(500),
        leading_rx.wait_for(|l| !*l),
    )
    .await
    .expect("replica-a still leads after its renew deadline with no answer from the API server")
    .unwrap();
    let demoted_after = hung_at.elapsed();
    assert!(
        demoted_after <= timing.renew_deadline + Duration::from_millis(200),
        "{demoted_after:?}"
    );
    // It stopped before the lease it last renewed could expire for anyone else.
    assert!(demoted_after < timing.lease_duration);
}
