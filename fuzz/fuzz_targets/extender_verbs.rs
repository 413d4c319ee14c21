//! The extender's HTTP verbs as kube-scheduler calls them, through the real router (body limit,
//! JSON decoding, filter, choose, prioritize, bind in snapshot mode) on a 4-node × 4-GPU cluster. The
//! first byte picks the verb, the rest is the body. Every answer must be 200 or a 4xx: a 5xx or a
//! panic is a finding.
#![no_main]

use std::sync::{Arc, OnceLock};

use axum::Router;
use axum::body::Body;
use carma_core::{PlacementConfig, Policy};
use carma_scheduler_extender::{router, snapshot_extender, synthetic};
use libfuzzer_sys::fuzz_target;
use tower::ServiceExt;

struct Harness {
    runtime: tokio::runtime::Runtime,
    router: Router,
}

fn harness() -> &'static Harness {
    static H: OnceLock<Harness> = OnceLock::new();
    H.get_or_init(|| {
        // Timers on, as in the extender (the body-read timeout).
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .build()
            .expect("runtime");
        let ext = snapshot_extender(
            &synthetic::cluster(4, 4),
            Policy::Magm,
            PlacementConfig::default(),
            Default::default(),
        )
        .expect("embedded models load");
        let router = router(Arc::clone(&ext));
        Harness { runtime, router }
    })
}

fuzz_target!(|data: &[u8]| {
    let [verb, body @ ..] = data else { return };
    let path = ["/filter", "/choose", "/prioritize", "/bind"][*verb as usize % 4];
    let h = harness();
    let request = http::Request::post(path)
        .header("content-type", "application/json")
        .body(Body::from(body.to_vec()))
        .expect("request");
    let response = h
        .runtime
        .block_on(h.router.clone().oneshot(request))
        .expect("infallible");
    let status = response.status();
    assert!(
        status.is_success() || status.is_client_error(),
        "{path}: HTTP {status}"
    );
});
