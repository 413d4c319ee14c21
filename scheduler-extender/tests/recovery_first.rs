//! CARMA's recovery-first rule in the extender: while a `carma-recovery` pod waits for GPUs, other
//! pods may take idle GPUs only. Before, only the simulator knew the rule, so its figures described
//! a cluster that did not exist.

mod common;

use std::sync::Arc;

use carma_api::names::ANNOTATION_GPU_MEMORY;
use carma_core::{PlacementConfig, Policy};
use carma_scheduler_extender::router;
use carma_scheduler_extender::synthetic::{self, pod_json};
use common::*;
use k8s_openapi::api::core::v1::Pod;
use serde_json::Value;

fn recovery(mut pod: Value) -> Value {
    pod["spec"]["priorityClassName"] = Value::from("carma-recovery");
    pod
}

#[tokio::test]
async fn a_waiting_recovery_holds_other_pods_to_idle_gpus() {
    // Two nodes of busy GPUs (a compute process each: nothing is idle), some with room to share.
    let snap = synthetic::cluster(2, 2);
    let names: Vec<String> = (0..2).map(synthetic::node_name).collect();
    let names: Vec<&str> = names.iter().map(String::as_str).collect();
    let rec = Arc::new(Recorder::default());
    let cfg = PlacementConfig {
        warmup_ms: 0,
        ..PlacementConfig::default()
    };
    let ext = extender_with(&snap, Policy::Magm, cfg, rec);
    let r = router(ext.clone());
    let small = [(ANNOTATION_GPU_MEMORY, "1Gi")];
    let sharer = pod_json("ml", "sharer", "uid-sharer", 1, &small);
    let (_, f) = post(&r, "/filter", &args_names(&sharer, &names)).await;
    assert!(
        !passing(&f).is_empty(),
        "it may share without a recovery: {f}"
    );

    // A recovery attempt of another task is pending.
    let retry = recovery(pod_json("ml", "retry", "uid-retry", 1, &small));
    ext.observe_pod(&serde_json::from_value::<Pod>(retry.clone()).unwrap());
    let (_, f) = post(&r, "/filter", &args_names(&sharer, &names)).await;
    assert!(passing(&f).is_empty(), "{f}");
    // The rule lifts when the recovery attempt is bound, an event kube-scheduler's plugins do not
    // requeue on: the answer asks for a retry after the backoff instead of naming failed nodes.
    let reason = f["Error"].as_str().unwrap();
    assert!(
        reason.starts_with(carma_scheduler_extender::verbs::RETRY_PREFIX)
            && reason.contains("carma-recovery"),
        "{reason}"
    );
    let (_, scores) = post(&r, "/prioritize", &args_names(&sharer, &names)).await;
    assert!(
        scores.as_array().unwrap().iter().all(|s| s["Score"] == 0),
        "{scores}"
    );
    // The recovery attempt itself may share.
    let (_, f) = post(&r, "/filter", &args_names(&retry, &names)).await;
    let fits = passing(&f);
    assert!(!fits.is_empty(), "{f}");
    // Once it is bound, sharing resumes.
    let (_, b) = post(&r, "/bind", &bind_args(&retry, &fits[0])).await;
    assert_eq!(b["Error"], "", "{b}");
    let (_, f) = post(&r, "/filter", &args_names(&sharer, &names)).await;
    assert!(!passing(&f).is_empty(), "{f}");
}
