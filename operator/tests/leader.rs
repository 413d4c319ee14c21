//! Leader election through the Lease adapter, against a scripted API server
//! that enforces resourceVersion like the real one.

mod common;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use chrono::{DateTime, Utc};
use http::Method;
use k8s_openapi::api::coordination::v1::Lease;
use kube::Api;
use tokio::sync::watch;

use carma_operator::leader::{LeaseLock, LeaseTiming, run_elector};

use common::{Fake, client};

fn at(secs: i64) -> DateTime<Utc> {
    DateTime::from_timestamp(1_800_000_000 + secs, 0).unwrap()
}

fn lock(fake: &Arc<Mutex<Fake>>, identity: &str) -> LeaseLock {
    LeaseLock::new(
        Api::<Lease>::namespaced(client(fake.clone()), "carma-system"),
        "carma-operator",
        identity,
        LeaseTiming::default(),
    )
}

fn holder(fake: &Arc<Mutex<Fake>>) -> serde_json::Value {
    fake.lock().unwrap().leases["carma-operator"]["spec"]["holderIdentity"].clone()
}

#[tokio::test]
async fn one_leader_at_a_time_with_takeover_after_expiry() {
    let fake = Arc::new(Mutex::new(Fake::default()));
    let a = lock(&fake, "replica-a");
    let b = lock(&fake, "replica-b");

    assert!(a.try_acquire_or_renew(at(0)).await.unwrap());
    assert_eq!(holder(&fake), "replica-a");
    assert!(!b.try_acquire_or_renew(at(1)).await.unwrap());
    assert!(a.try_acquire_or_renew(at(2)).await.unwrap());
    assert!(
        !b.try_acquire_or_renew(at(16)).await.unwrap(),
        "renewed at 2, valid until 17"
    );

    // replica-a stops renewing; after the lease duration replica-b takes over.
    assert!(b.try_acquire_or_renew(at(17)).await.unwrap());
    let lease = fake.lock().unwrap().leases["carma-operator"].clone();
    assert_eq!(lease["spec"]["holderIdentity"], "replica-b");
    assert_eq!(lease["spec"]["leaseTransitions"], 1);
    assert_eq!(lease["spec"]["leaseDurationSeconds"], 15);
    assert!(!a.try_acquire_or_renew(at(18)).await.unwrap());
}

#[tokio::test]
async fn a_lost_race_is_not_leadership() {
    let fake = Arc::new(Mutex::new(Fake::default()));
    let a = lock(&fake, "replica-a");
    let b = lock(&fake, "replica-b");
    assert!(a.try_acquire_or_renew(at(0)).await.unwrap());
    // replica-b sees an expired lease, but someone writes first.
    fake.lock().unwrap().conflict_next_lease_replace = true;
    assert!(!b.try_acquire_or_renew(at(30)).await.unwrap());
    assert_eq!(holder(&fake), "replica-a");
}

#[tokio::test]
async fn release_hands_over_at_once() {
    let fake = Arc::new(Mutex::new(Fake::default()));
    let a = lock(&fake, "replica-a");
    let b = lock(&fake, "replica-b");
    assert!(a.try_acquire_or_renew(at(0)).await.unwrap());
    b.release(at(1)).await.unwrap();
    assert_eq!(holder(&fake), "replica-a", "only the holder may release");
    a.release(at(1)).await.unwrap();
    assert_eq!(holder(&fake), serde_json::Value::Null);
    assert!(b.try_acquire_or_renew(at(2)).await.unwrap());
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
