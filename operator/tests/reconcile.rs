//! Reconcile against a scripted API server (tower-test): every API call the
//! operator makes is served by an in-memory fake and recorded.

mod common;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use chrono::{DateTime, Utc};
use http::Method;
use kube::runtime::controller::Action;
use serde_json::{Value, json};

use carma_api::TrainingTask;
use carma_operator::attempt::GpuClaims;
use carma_operator::reconcile::{Context, error_policy};
use carma_operator::{Metrics, Settings, reconcile};

use common::{Fake, client};

const OOM_MESSAGE: &str = "Traceback (most recent call last):\n  File \"train.py\", line 80, in <module>\ntorch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity of 39.39 GiB";

fn task_json(recovery: Value) -> Value {
    json!({
        "apiVersion": "carma.io/v1alpha1",
        "kind": "TrainingTask",
        "metadata": {"name": "train", "namespace": "default", "uid": "task-uid", "generation": 1, "resourceVersion": "1"},
        "spec": {
            "gpus": 1,
            "template": {"spec": {"containers": [{"name": "train", "image": "pytorch", "command": ["python", "train.py"]}]}},
            "modelProfile": {"family": "cnn", "batchSize": 64, "parameters": 25557032, "activations": 11000000},
            "recovery": recovery
        }
    })
}

fn at(secs: i64) -> DateTime<Utc> {
    DateTime::from_timestamp(1_800_000_000 + secs, 0).unwrap()
}

struct Harness {
    fake: Arc<Mutex<Fake>>,
    ctx: Arc<Context>,
    now: Arc<Mutex<DateTime<Utc>>>,
}

impl Harness {
    fn new(task: Value) -> Self {
        Self::with_settings(task, Settings::default())
    }

    /// Attempt pods on DRA claims of DeviceClass `carma-gpu`.
    fn dra(task: Value) -> Self {
        let settings = Settings {
            gpu_claims: GpuClaims::Dra {
                device_class: "carma-gpu".into(),
            },
            ..Settings::default()
        };
        Self::with_settings(task, settings)
    }

    fn with_settings(task: Value, settings: Settings) -> Self {
        let fake = Arc::new(Mutex::new(Fake::with_task(task)));
        let now = Arc::new(Mutex::new(at(0)));
        let clock_now = now.clone();
        let ctx = Context::new(
            client(fake.clone()),
            Arc::new(Metrics::new()),
            settings,
            Some("test".into()),
        )
        .with_clock(Arc::new(move || *clock_now.lock().unwrap()));
        Self {
            fake,
            ctx: Arc::new(ctx),
            now,
        }
    }

    fn set_now(&self, secs: i64) {
        *self.now.lock().unwrap() = at(secs);
    }

    fn task(&self) -> TrainingTask {
        serde_json::from_value(self.fake.lock().unwrap().task.clone()).unwrap()
    }

    async fn reconcile(&self) -> Result<Action, carma_operator::Error> {
        reconcile(Arc::new(self.task()), self.ctx.clone()).await
    }

    fn status(&self) -> Value {
        self.fake.lock().unwrap().task["status"].clone()
    }

    fn pod(&self, name: &str) -> Value {
        self.fake.lock().unwrap().pods[name].clone()
    }

    fn pod_count(&self) -> usize {
        self.fake.lock().unwrap().pods.len()
    }

    fn with_pod(&self, name: &str, f: impl FnOnce(&mut Value)) {
        f(self.fake.lock().unwrap().pods.get_mut(name).unwrap())
    }

    /// The extender bound the pod and kubelet started it.
    fn run_pod(&self, name: &str, node: &str, estimate_mib: u64) {
        self.with_pod(name, |p| {
            p["spec"]["nodeName"] = json!(node);
            let ann = p["metadata"]["annotations"].as_object_mut().unwrap();
            ann.insert("carma.io/assigned-gpus".into(), json!("GPU-0"));
            ann.insert("carma.io/assigned-node".into(), json!(node));
            ann.insert("carma.io/assigned-at".into(), json!("2027-01-15T08:00:05Z"));
            ann.insert(
                "carma.io/estimate".into(),
                json!(format!("{{\"mib\":{estimate_mib},\"source\":\"gpumemnet-cnn\"}}")),
            );
            p["status"] = json!({"phase": "Running", "containerStatuses": [{
                "name": "train", "image": "pytorch", "imageID": "", "ready": true, "restartCount": 0,
                "state": {"running": {"startedAt": "2027-01-15T08:00:06Z"}}}]});
        });
    }

    fn end_pod(&self, name: &str, exit: i32, message: &str) {
        self.with_pod(name, |p| {
            p["status"] = json!({"phase": if exit == 0 { "Succeeded" } else { "Failed" }, "containerStatuses": [{
                "name": "train", "image": "pytorch", "imageID": "", "ready": false, "restartCount": 0,
                "state": {"terminated": {"exitCode": exit, "reason": if exit == 0 { "Completed" } else { "Error" },
                          "message": message, "finishedAt": "2027-01-15T08:01:40Z"}}}]});
        });
    }

    fn gpu_node(&self, node: &str, pod: &str, observed_mib: u64) {
        let uid = self.pod(pod)["metadata"]["uid"].clone();
        self.fake.lock().unwrap().gpu_nodes.insert(
            node.into(),
            json!({"apiVersion": "carma.io/v1alpha1", "kind": "GpuNode", "metadata": {"name": node}, "spec": {},
                   "status": {"gpus": [{"index": 0, "uuid": "GPU-0", "memoryTotalMiB": 40960, "memoryFreeMiB": 20000,
                     "pods": [{"namespace": "default", "name": pod, "uid": uid, "reservedMiB": 8000, "observedMiB": observed_mib}]}]}}),
        );
    }

    fn calls(&self, method: Method, suffix: &str) -> usize {
        self.fake.lock().unwrap().calls(&method, suffix).len()
    }

    fn events(&self) -> Vec<(String, String)> {
        self.fake.lock().unwrap().events()
    }

    fn clear_requests(&self) {
        self.fake.lock().unwrap().requests.clear();
    }

    fn metrics(&self) -> String {
        self.ctx.metrics.encode()
    }
}

fn has_line(text: &str, line: &str) -> bool {
    text.lines().any(|l| l == line)
}

#[tokio::test]
async fn creates_the_first_attempt() {
    let h = Harness::new(task_json(json!({})));
    let action = h.reconcile().await.unwrap();
    assert_eq!(action, Action::await_change());

    let f = h.fake.lock().unwrap();
    let order: Vec<(String, String)> = f
        .requests
        .iter()
        .map(|r| (r.method.to_string(), r.path.clone()))
        .collect();
    assert_eq!(
        order[..3],
        [
            (
                "GET".to_string(),
                "/api/v1/namespaces/default/pods".to_string()
            ),
            (
                "POST".to_string(),
                "/api/v1/namespaces/default/pods".to_string()
            ),
            (
                "PATCH".to_string(),
                "/apis/carma.io/v1alpha1/namespaces/default/trainingtasks/train/status".to_string()
            ),
        ]
    );
    assert_eq!(f.requests[0].query["labelSelector"], "carma.io/task=train");

    let pod = &f.calls(&Method::POST, "/pods")[0].body;
    assert_eq!(pod["metadata"]["name"], "train-a1");
    assert_eq!(pod["metadata"]["labels"]["carma.io/task"], "train");
    assert_eq!(pod["metadata"]["labels"]["carma.io/attempt"], "1");
    assert_eq!(
        pod["metadata"]["labels"]["app.kubernetes.io/managed-by"],
        "carma-operator"
    );
    let profile: Value = serde_json::from_str(
        pod["metadata"]["annotations"]["carma.io/model-profile"]
            .as_str()
            .unwrap(),
    )
    .unwrap();
    assert_eq!(profile["family"], "cnn");
    let owner = &pod["metadata"]["ownerReferences"][0];
    assert_eq!(owner["kind"], "TrainingTask");
    assert_eq!(owner["uid"], "task-uid");
    assert_eq!(owner["controller"], true);
    assert_eq!(owner["blockOwnerDeletion"], true);
    assert_eq!(pod["spec"]["schedulerName"], "carma-scheduler");
    assert_eq!(pod["spec"]["restartPolicy"], "Never");
    assert_eq!(pod["spec"]["priorityClassName"], Value::Null);
    let c = &pod["spec"]["containers"][0];
    assert_eq!(c["terminationMessagePolicy"], "FallbackToLogsOnError");
    assert_eq!(c["resources"]["limits"]["carma.io/gpu"], "1");

    let status = &f.task["status"];
    assert_eq!(status["phase"], "Pending");
    assert_eq!(status["attemptCount"], 1);
    assert_eq!(status["attempts"][0]["pod"], "train-a1");
    assert_eq!(status["observedGeneration"], 1);
    assert_eq!(
        f.events(),
        [("AttemptCreated".to_string(), "Normal".to_string())]
    );
    let event = f
        .requests
        .iter()
        .find(|r| r.path.ends_with("/events"))
        .unwrap();
    assert_eq!(event.body["regarding"]["kind"], "TrainingTask");
    assert_eq!(event.body["related"]["name"], "train-a1");
    assert_eq!(event.body["reportingController"], "carma-operator");
}

#[tokio::test]
async fn oom_is_recovered_with_a_larger_reservation_and_the_recovery_class() {
    let h = Harness::new(task_json(json!({"backoffSeconds": 0})));
    h.reconcile().await.unwrap();

    h.run_pod("train-a1", "gpu-1", 8000);
    h.gpu_node("gpu-1", "train-a1", 7400);
    h.set_now(30);
    let action = h.reconcile().await.unwrap();
    assert_eq!(action, Action::requeue(Duration::from_secs(15)));
    assert_eq!(h.calls(Method::GET, "/gpunodes/gpu-1"), 1);
    let s = h.status();
    assert_eq!(s["phase"], "Running");
    assert_eq!(s["node"], "gpu-1");
    assert_eq!(s["reservedMiB"], 8000);
    assert_eq!(s["attempts"][0]["observedPeakMiB"], 7400);

    // The crash: telemetry no longer lists the pod, its message names the OOM.
    h.fake.lock().unwrap().gpu_nodes.clear();
    h.end_pod("train-a1", 1, OOM_MESSAGE);
    h.set_now(101);
    h.clear_requests();
    h.reconcile().await.unwrap();

    assert_eq!(
        h.calls(Method::GET, "/log"),
        0,
        "the termination message sufficed"
    );
    assert_eq!(h.pod_count(), 2);
    let a2 = h.pod("train-a2");
    assert_eq!(
        a2["metadata"]["annotations"]["carma.io/gpu-memory"],
        "16000Mi"
    );
    assert_eq!(a2["spec"]["priorityClassName"], "carma-recovery");
    assert_eq!(a2["metadata"]["labels"]["carma.io/attempt"], "2");
    assert_eq!(
        a2["metadata"]["annotations"]["carma.io/exclusive"],
        Value::Null
    );

    let s = h.status();
    assert_eq!(s["phase"], "Recovering");
    assert_eq!(s["attemptCount"], 2);
    let a1 = &s["attempts"][0];
    assert_eq!(a1["outcome"], "GpuOutOfMemory");
    assert!(
        a1["reason"]
            .as_str()
            .unwrap()
            .contains("CUDA out of memory")
    );
    assert_eq!(a1["node"], "gpu-1");
    assert_eq!(a1["gpus"][0], "GPU-0");
    assert_eq!(a1["reservedMiB"], 8000);
    assert_eq!(a1["observedPeakMiB"], 7400);
    assert_eq!(a1["finishedAt"], "2027-01-15T08:01:40Z");
    assert_eq!(s["attempts"][1]["reservedMiB"], 16000);
    assert_eq!(s["estimate"]["source"], "recovery");
    assert_eq!(s["nextAttemptAt"], Value::Null);
    let recovering = s["conditions"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["type"] == "Recovering")
        .unwrap();
    assert_eq!(recovering["status"], "True");
    assert_eq!(recovering["reason"], "GpuOutOfMemory");
    assert_eq!(
        h.events(),
        [
            ("AttemptOutOfMemory".to_string(), "Warning".to_string()),
            ("RecoveryAttemptCreated".to_string(), "Normal".to_string())
        ]
    );
    let m = h.metrics();
    assert!(
        has_line(
            &m,
            "carma_operator_attempts_total{outcome=\"GpuOutOfMemory\"} 1"
        ),
        "{m}"
    );
    assert!(has_line(&m, "carma_operator_oom_recoveries_total 1"), "{m}");

    // The recovery attempt runs 45 s after the crash.
    h.run_pod("train-a2", "gpu-2", 16000);
    h.set_now(145);
    h.reconcile().await.unwrap();
    assert_eq!(h.status()["phase"], "Running");
    let m = h.metrics();
    assert!(
        has_line(&m, "carma_operator_recovery_duration_seconds_sum 45.0"),
        "{m}"
    );

    h.end_pod("train-a2", 0, "");
    h.set_now(300);
    assert_eq!(h.reconcile().await.unwrap(), Action::await_change());
    let s = h.status();
    assert_eq!(s["phase"], "Succeeded");
    assert_eq!(s["attempts"][1]["outcome"], "Succeeded");
    assert!(has_line(
        &h.metrics(),
        "carma_operator_attempts_total{outcome=\"Succeeded\"} 1"
    ));

    // Settled: no API call at all.
    h.clear_requests();
    assert_eq!(h.reconcile().await.unwrap(), Action::await_change());
    assert!(h.fake.lock().unwrap().requests.is_empty());
}

#[tokio::test]
async fn the_log_is_read_when_the_termination_message_is_empty() {
    let h = Harness::new(task_json(json!({"backoffSeconds": 0})));
    h.reconcile().await.unwrap();
    h.run_pod("train-a1", "gpu-1", 8000);
    h.end_pod("train-a1", 1, "");
    h.fake
        .lock()
        .unwrap()
        .logs
        .insert("train-a1".into(), format!("epoch 1\n{OOM_MESSAGE}\n"));
    h.set_now(101);
    h.reconcile().await.unwrap();
    {
        let f = h.fake.lock().unwrap();
        let logs = f.calls(&Method::GET, "/pods/train-a1/log");
        assert_eq!(logs.len(), 1);
        assert_eq!(logs[0].query["tailLines"], "50");
        assert_eq!(logs[0].query["container"], "train");
    }
    assert_eq!(h.status()["attempts"][0]["outcome"], "GpuOutOfMemory");
    assert_eq!(
        h.pod("train-a2")["metadata"]["annotations"]["carma.io/gpu-memory"],
        "16000Mi"
    );
}

#[tokio::test]
async fn gives_up_after_the_attempt_limit() {
    let h = Harness::new(task_json(
        json!({"backoffSeconds": 0, "maxAttempts": 2, "exclusiveAfterOoms": 5}),
    ));
    h.reconcile().await.unwrap();
    h.run_pod("train-a1", "gpu-1", 8000);
    h.end_pod("train-a1", 1, OOM_MESSAGE);
    h.set_now(101);
    h.reconcile().await.unwrap();
    assert_eq!(h.pod_count(), 2);

    h.run_pod("train-a2", "gpu-1", 16000);
    h.end_pod(
        "train-a2",
        1,
        "RuntimeError: CUDA error: CUBLAS_STATUS_ALLOC_FAILED when calling `cublasCreate(handle)`",
    );
    h.clear_requests();
    assert_eq!(h.reconcile().await.unwrap(), Action::await_change());
    assert_eq!(h.pod_count(), 2, "no third attempt");
    assert_eq!(h.calls(Method::POST, "/pods"), 0);
    let s = h.status();
    assert_eq!(s["phase"], "Failed");
    assert!(
        s["message"]
            .as_str()
            .unwrap()
            .contains("2 attempt(s) used of 2")
    );
    let failed = s["conditions"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["type"] == "Failed")
        .unwrap();
    assert_eq!(failed["status"], "True");
    assert_eq!(failed["reason"], "AttemptsExhausted");
    assert_eq!(
        h.events(),
        [
            ("AttemptOutOfMemory".to_string(), "Warning".to_string()),
            ("TaskFailed".to_string(), "Warning".to_string())
        ]
    );
    assert!(has_line(
        &h.metrics(),
        "carma_operator_attempts_total{outcome=\"GpuOutOfMemory\"} 2"
    ));
}

#[tokio::test]
async fn a_restart_adopts_the_existing_pod_instead_of_duplicating_it() {
    // First operator: created the pod, then died before writing the status.
    let h = Harness::new(task_json(json!({})));
    h.reconcile().await.unwrap();
    h.fake
        .lock()
        .unwrap()
        .task
        .as_object_mut()
        .unwrap()
        .remove("status");

    // Second operator.
    h.clear_requests();
    h.reconcile().await.unwrap();
    assert_eq!(h.calls(Method::POST, "/pods"), 0);
    assert_eq!(h.pod_count(), 1);
    let s = h.status();
    assert_eq!(s["attempts"].as_array().unwrap().len(), 1);
    assert_eq!(s["attempts"][0]["pod"], "train-a1");
    assert_eq!(
        h.events(),
        [("AttemptAdopted".to_string(), "Normal".to_string())]
    );

    // Reconciling again and again changes nothing.
    h.clear_requests();
    h.reconcile().await.unwrap();
    h.reconcile().await.unwrap();
    assert_eq!(h.calls(Method::POST, "/pods"), 0);
    assert_eq!(h.calls(Method::PATCH, "/status"), 0);
    assert_eq!(h.pod_count(), 1);
}

#[tokio::test]
async fn already_exists_on_create_is_adopted() {
    let h = Harness::new(task_json(json!({})));
    h.reconcile().await.unwrap();
    // A stale read: the list misses the pod and the status was lost.
    {
        let mut f = h.fake.lock().unwrap();
        f.task.as_object_mut().unwrap().remove("status");
        f.hidden_from_list.push("train-a1".into());
        f.requests.clear();
    }
    h.reconcile().await.unwrap();
    let f = h.fake.lock().unwrap();
    assert_eq!(f.calls(&Method::POST, "/pods").len(), 1);
    assert_eq!(f.calls(&Method::GET, "/pods/train-a1").len(), 1);
    assert_eq!(f.pods.len(), 1);
    assert_eq!(f.task["status"]["attempts"][0]["pod"], "train-a1");
}

#[tokio::test]
async fn a_foreign_pod_with_the_attempt_name_is_an_error() {
    let h = Harness::new(task_json(json!({})));
    {
        let mut f = h.fake.lock().unwrap();
        f.pods.insert(
            "train-a1".into(),
            json!({"apiVersion": "v1", "kind": "Pod",
                   "metadata": {"name": "train-a1", "namespace": "default", "uid": "x",
                                "labels": {"carma.io/task": "train"},
                                "ownerReferences": [{"apiVersion": "carma.io/v1alpha1", "kind": "TrainingTask",
                                                     "name": "train", "uid": "older-task-uid", "controller": true}]},
                   "spec": {"containers": [{"name": "c", "image": "i"}]}}),
        );
    }
    let err = h.reconcile().await.unwrap_err();
    assert_eq!(err.kind(), "pod_conflict");
    assert_eq!(h.calls(Method::PATCH, "/status"), 0);
    assert_eq!(
        h.events(),
        [("AttemptCreateFailed".to_string(), "Warning".to_string())]
    );
    let action = error_policy(Arc::new(h.task()), &err, h.ctx.clone());
    assert_eq!(action, Action::requeue(Duration::from_secs(15)));
    assert!(has_line(
        &h.metrics(),
        "carma_operator_reconcile_errors_total{kind=\"pod_conflict\"} 1"
    ));
}

#[tokio::test]
async fn backoff_requeues_until_the_next_attempt_is_due() {
    let h = Harness::new(task_json(json!({})));
    h.reconcile().await.unwrap();
    h.run_pod("train-a1", "gpu-1", 8000);
    h.end_pod("train-a1", 1, OOM_MESSAGE);
    // The crash was at 2027-01-15T08:01:40Z = at(100); backoff 10 s.
    let finished: DateTime<Utc> = "2027-01-15T08:01:40Z".parse().unwrap();
    let offset = (finished - at(0)).num_seconds();
    h.set_now(offset + 1);
    let action = h.reconcile().await.unwrap();
    assert_eq!(action, Action::requeue(Duration::from_secs(9)));
    assert_eq!(h.pod_count(), 1);
    assert_eq!(h.status()["phase"], "Recovering");
    assert_eq!(h.status()["nextAttemptAt"], "2027-01-15T08:01:50Z");

    h.set_now(offset + 10);
    h.reconcile().await.unwrap();
    assert_eq!(h.pod_count(), 2);
    assert_eq!(h.status()["nextAttemptAt"], Value::Null);
}

#[tokio::test]
async fn a_deleted_attempt_pod_is_rerun_as_an_eviction() {
    let h = Harness::new(task_json(json!({})));
    h.reconcile().await.unwrap();
    h.fake.lock().unwrap().pods.clear();
    h.reconcile().await.unwrap();
    let s = h.status();
    assert_eq!(s["attempts"][0]["outcome"], "Evicted");
    assert_eq!(s["phase"], "Recovering");
    assert!(has_line(
        &h.metrics(),
        "carma_operator_attempts_total{outcome=\"Evicted\"} 1"
    ));
}

#[tokio::test]
async fn oomkilled_is_a_host_memory_kill_that_keeps_the_gpu_reservation() {
    let mut task = task_json(json!({"retriesOnFailure": 1, "backoffSeconds": 0}));
    task["spec"]["template"]["spec"]["containers"][0]["resources"] =
        json!({"limits": {"memory": "8Gi"}});
    let h = Harness::new(task);
    h.reconcile().await.unwrap();
    h.run_pod("train-a1", "gpu-1", 8000);
    h.set_now(30);
    h.reconcile().await.unwrap();

    // The kernel kills the training container for host memory.
    h.with_pod("train-a1", |p| {
        p["status"] = json!({"phase": "Failed", "containerStatuses": [{
            "name": "train", "image": "pytorch", "imageID": "", "ready": false, "restartCount": 0,
            "state": {"terminated": {"exitCode": 137, "reason": "OOMKilled",
                      "finishedAt": "2027-01-15T08:01:40Z"}}}]});
    });
    h.set_now(101);
    h.clear_requests();
    h.reconcile().await.unwrap();

    assert_eq!(h.calls(Method::GET, "/log"), 0, "OOMKilled needs no log");
    let s = h.status();
    let a1 = &s["attempts"][0];
    assert_eq!(a1["outcome"], "HostOOMKilled");
    let reason = a1["reason"].as_str().unwrap();
    assert!(reason.contains("host memory"), "{reason}");
    assert!(
        reason.contains("resources.limits.memory 8Gi") && reason.contains("raise that limit"),
        "{reason}"
    );
    // Retried per spec.recovery with the same reservation: no growth, no
    // exclusive GPU, no recovery priority.
    let a2 = h.pod("train-a2");
    assert_eq!(
        a2["metadata"]["annotations"]["carma.io/gpu-memory"],
        "8000Mi"
    );
    assert_eq!(
        a2["metadata"]["annotations"]["carma.io/exclusive"],
        Value::Null
    );
    assert_eq!(a2["spec"]["priorityClassName"], Value::Null);
    assert_eq!(s["attempts"][1]["reservedMiB"], 8000);
    assert_eq!(s["phase"], "Recovering");
    let recovering = s["conditions"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["type"] == "Recovering")
        .unwrap();
    assert_eq!(recovering["reason"], "HostOOMKilled");
    assert_eq!(
        h.events(),
        [
            ("AttemptHostOOMKilled".to_string(), "Warning".to_string()),
            ("RecoveryAttemptCreated".to_string(), "Normal".to_string())
        ]
    );
    let note = {
        let f = h.fake.lock().unwrap();
        let posted = f.calls(&Method::POST, "/events");
        posted[0].body["note"].as_str().unwrap_or("").to_string()
    };
    assert!(note.contains("resources.limits.memory 8Gi"), "{note}");
    let m = h.metrics();
    assert!(
        has_line(
            &m,
            "carma_operator_attempts_total{outcome=\"HostOOMKilled\"} 1"
        ),
        "{m}"
    );
    assert!(
        has_line(
            &m,
            "carma_operator_attempts_total{outcome=\"GpuOutOfMemory\"} 0"
        ),
        "{m}"
    );
    assert!(has_line(&m, "carma_operator_oom_recoveries_total 0"), "{m}");
}

/// Learned reservations: an attempt that ran out of GPU memory and one that succeeded are
/// recorded, once each, in the MemoryHistory named by the profile's fingerprint; a write conflict
/// is retried.
#[tokio::test]
async fn ended_attempts_are_recorded_once_under_their_profile_fingerprint() {
    let mut task = task_json(json!({"backoffSeconds": 0}));
    task["spec"]["modelProfile"]["layers"] = json!({"conv2d": 53, "batchNorm": 53, "linear": 1});
    let h = Harness::new(task);
    h.reconcile().await.unwrap();
    let profile = h.pod("train-a1")["metadata"]["annotations"]["carma.io/model-profile"]
        .as_str()
        .unwrap()
        .to_string();
    let name = carma_estimator::parse_profile(&profile)
        .unwrap()
        .fingerprint(1);

    h.run_pod("train-a1", "gpu-1", 8000);
    h.gpu_node("gpu-1", "train-a1", 7400);
    h.set_now(30);
    h.reconcile().await.unwrap();
    assert!(
        h.fake.lock().unwrap().memory_histories.is_empty(),
        "nothing is recorded while the attempt runs"
    );
    h.fake.lock().unwrap().gpu_nodes.clear();
    h.end_pod("train-a1", 1, OOM_MESSAGE);
    h.set_now(101);
    h.reconcile().await.unwrap();
    let record = h.fake.lock().unwrap().memory_histories[&name].clone();
    assert_eq!(record["spec"]["family"], "cnn");
    assert_eq!(record["spec"]["profile"], profile.as_str());
    let st = &record["status"];
    assert_eq!(st["completed"], 0, "a crash is not a completed sample");
    assert_eq!(st["maxPeakMiB"], 7400);
    assert_eq!(st["largestOomReservationMiB"], 8000);
    assert_eq!(st["samples"][0]["outcome"], "GpuOutOfMemory");
    assert_eq!(st["samples"][0]["reservationSource"], "gpumemnet-cnn");
    assert_eq!(st["samples"][0]["taskUid"], "task-uid");

    // The recovery attempt succeeds at a higher peak; the first status write conflicts.
    h.run_pod("train-a2", "gpu-1", 16000);
    h.gpu_node("gpu-1", "train-a2", 9100);
    h.set_now(130);
    h.reconcile().await.unwrap();
    h.end_pod("train-a2", 0, "");
    h.fake.lock().unwrap().conflict_next_history_write = true;
    h.set_now(200);
    h.reconcile().await.unwrap();
    let st = h.fake.lock().unwrap().memory_histories[&name]["status"].clone();
    assert_eq!(st["completed"], 1);
    assert_eq!(st["maxPeakMiB"], 9100);
    assert_eq!(st["samples"].as_array().unwrap().len(), 2);
    assert_eq!(st["samples"][1]["attempt"], 2);
    assert_eq!(st["samples"][1]["reservedMiB"], 16000);
    assert_eq!(st["samples"][1]["peakMiB"], 9100);
    assert_eq!(h.status()["phase"], "Succeeded");

    // The operator's metrics saw one underestimate (the OOM) and two peak ratios.
    let metrics = h.ctx.metrics.encode();
    assert!(
        metrics.contains("carma_operator_underestimates_total{source=\"gpumemnet-cnn\"} 1"),
        "{metrics}"
    );
    assert!(
        metrics.contains("carma_operator_attempt_peak_ratio_count{source=\"gpumemnet-cnn\"} 2"),
        "{metrics}"
    );
    assert!(metrics.contains("carma_operator_history_writes_total{result=\"added\"} 2"));
}

/// A retried step (its status write lost) finds the attempt recorded and adds nothing.
#[tokio::test]
async fn a_retried_step_records_nothing_twice() {
    let mut task = task_json(json!({"backoffSeconds": 0}));
    task["spec"]["modelProfile"]["depth"] = json!(107);
    let h = Harness::new(task);
    h.reconcile().await.unwrap();
    h.run_pod("train-a1", "gpu-1", 8000);
    h.gpu_node("gpu-1", "train-a1", 5200);
    h.set_now(30);
    h.reconcile().await.unwrap();
    let before = h.task();
    h.end_pod("train-a1", 0, "");
    h.set_now(60);
    h.reconcile().await.unwrap();
    // Reconcile the same stale task again, as after a lost status write.
    reconcile(Arc::new(before), h.ctx.clone()).await.unwrap();
    let f = h.fake.lock().unwrap();
    let st = &f.memory_histories.values().next().unwrap()["status"];
    assert_eq!(st["completed"], 1);
    assert_eq!(st["samples"].as_array().unwrap().len(), 1);
    drop(f);
    assert!(
        h.ctx
            .metrics
            .encode()
            .contains("carma_operator_history_writes_total{result=\"unchanged\"} 1")
    );
}

/// A crash that could not be recorded (403) is marked and written by a later reconcile: losing it
/// would leave the next tasks of the model reserved at the size that crashed.
#[tokio::test]
async fn an_unrecorded_crash_is_retried() {
    let mut task = task_json(json!({"backoffSeconds": 600}));
    task["spec"]["modelProfile"]["depth"] = json!(107);
    let h = Harness::new(task);
    h.reconcile().await.unwrap();
    h.run_pod("train-a1", "gpu-1", 8000);
    h.gpu_node("gpu-1", "train-a1", 7400);
    h.set_now(30);
    h.reconcile().await.unwrap();
    h.fake.lock().unwrap().forbid_history = true;
    h.end_pod("train-a1", 1, OOM_MESSAGE);
    h.set_now(101);
    let action = h.reconcile().await.unwrap();
    assert_eq!(h.status()["attempts"][0]["outcome"], "GpuOutOfMemory");
    assert_eq!(h.status()["attempts"][0]["historyRecorded"], false);
    assert_eq!(action, Action::requeue(Duration::from_secs(15)));
    assert!(h.fake.lock().unwrap().memory_histories.is_empty());

    h.fake.lock().unwrap().forbid_history = false;
    h.set_now(120);
    h.reconcile().await.unwrap();
    assert_eq!(h.status()["attempts"][0]["historyRecorded"], true);
    let f = h.fake.lock().unwrap();
    let st = &f.memory_histories.values().next().unwrap()["status"];
    assert_eq!(st["largestOomReservationMiB"], 8000);
    assert_eq!(st["samples"].as_array().unwrap().len(), 1);
}

/// The last attempt's crash is the one the floor needs most: a task that failed with it
/// unrecorded is not settled until a later reconcile has written it.
#[tokio::test]
async fn a_failed_task_still_records_its_last_crash() {
    let mut task = task_json(json!({"maxAttempts": 1}));
    task["spec"]["modelProfile"]["depth"] = json!(107);
    let h = Harness::new(task);
    h.reconcile().await.unwrap();
    h.run_pod("train-a1", "gpu-1", 8000);
    h.set_now(30);
    h.reconcile().await.unwrap();
    h.fake.lock().unwrap().forbid_history = true;
    h.end_pod("train-a1", 1, OOM_MESSAGE);
    h.set_now(101);
    h.reconcile().await.unwrap();
    assert_eq!(h.status()["phase"], "Failed");
    assert_eq!(h.status()["attempts"][0]["historyRecorded"], false);
    assert!(!carma_operator::plan::is_settled(&h.task()));

    h.fake.lock().unwrap().forbid_history = false;
    h.set_now(120);
    h.reconcile().await.unwrap();
    assert_eq!(
        h.status()["phase"],
        "Failed",
        "nothing else happens to a failed task"
    );
    assert_eq!(h.pod_count(), 1);
    assert_eq!(h.status()["attempts"][0]["historyRecorded"], true);
    assert!(carma_operator::plan::is_settled(&h.task()));
    let f = h.fake.lock().unwrap();
    assert_eq!(
        f.memory_histories.values().next().unwrap()["status"]["largestOomReservationMiB"],
        8000
    );
}

#[tokio::test]
async fn a_pending_attempt_says_why_it_waits_in_the_status() {
    let h = Harness::new(task_json(json!({})));
    h.reconcile().await.unwrap();

    // kube-scheduler found no node: its message, the extender's per-node reasons in it.
    let refusal = "0/2 nodes are available: 1 carma: gpu-1: no GPU has 8000 MiB free (largest 5120 MiB), \
                   1 node(s) didn't match Pod's node affinity/selector.";
    h.with_pod("train-a1", |p| {
        p["status"] = json!({"phase": "Pending", "conditions": [{
            "type": "PodScheduled", "status": "False", "reason": "Unschedulable",
            "message": refusal, "lastTransitionTime": "2027-01-15T08:00:01Z"}]});
    });
    h.set_now(10);
    h.reconcile().await.unwrap();
    let s = h.status();
    let want = format!("attempt 1 (train-a1) cannot be scheduled: {refusal}");
    assert_eq!(s["phase"], "Pending");
    assert_eq!(s["message"], json!(want));
    let condition = |s: &Value, t: &str| {
        s["conditions"]
            .as_array()
            .unwrap()
            .iter()
            .find(|c| c["type"] == t)
            .cloned()
            .unwrap_or(Value::Null)
    };
    let scheduled = condition(&s, "Scheduled");
    assert_eq!(scheduled["status"], "False");
    assert_eq!(scheduled["reason"], "Unschedulable");
    assert_eq!(scheduled["message"], json!(want));

    // Bound, but kubelet cannot pull the image.
    h.with_pod("train-a1", |p| {
        p["spec"]["nodeName"] = json!("gpu-1");
        p["status"] = json!({"phase": "Pending",
            "conditions": [{"type": "PodScheduled", "status": "True"}],
            "containerStatuses": [{
                "name": "train", "image": "pytorch", "imageID": "", "ready": false, "restartCount": 0,
                "state": {"waiting": {"reason": "ImagePullBackOff",
                                      "message": "Back-off pulling image \"pytorch\""}}}]});
    });
    h.set_now(20);
    h.reconcile().await.unwrap();
    let s = h.status();
    let want = "attempt 1 (train-a1) cannot start on node gpu-1: container train: ImagePullBackOff: \
                Back-off pulling image \"pytorch\"";
    assert_eq!(s["message"], want);
    assert_eq!(condition(&s, "Scheduled")["status"], "True");
    let started = condition(&s, "AttemptStarted");
    assert_eq!(started["status"], "False");
    assert_eq!(started["reason"], "ImagePullBackOff");
    assert_eq!(started["message"], want);

    // Running: the message says so and AttemptStarted turns True.
    h.run_pod("train-a1", "gpu-1", 8000);
    h.set_now(30);
    h.reconcile().await.unwrap();
    let s = h.status();
    assert_eq!(s["phase"], "Running");
    assert_eq!(s["message"], "attempt 1 (train-a1) runs on node gpu-1");
    let started = condition(&s, "AttemptStarted");
    assert_eq!(started["status"], "True");
    assert_eq!(started["reason"], "Running");
}

/// A DRA task booking 10 GiB per GPU, named `name` with uid `uid`.
fn dra_task(name: &str, uid: &str) -> Value {
    let mut t = task_json(json!({}));
    t["metadata"]["name"] = json!(name);
    t["metadata"]["uid"] = json!(uid);
    t["spec"]["gpuMemory"] = json!("10Gi");
    t
}

/// The claim template the attempt pod `pod` references.
fn template_of(h: &Harness, pod: &str) -> String {
    h.pod(pod)["spec"]["resourceClaims"][0]["resourceClaimTemplateName"]
        .as_str()
        .unwrap()
        .to_string()
}

#[tokio::test]
async fn a_claim_template_is_owned_by_every_task_that_uses_it_and_goes_with_the_last() {
    let h = Harness::dra(dra_task("train", "task-uid"));
    h.reconcile().await.unwrap();
    let name = template_of(&h, "train-a1");
    assert!(name.starts_with("carma-gpu-g1-m10240-"), "{name}");
    {
        let f = h.fake.lock().unwrap();
        assert_eq!(f.template_owners(&name), ["task-uid"]);
        let owner = &f.claim_templates[&name]["metadata"]["ownerReferences"][0];
        assert_eq!(owner["kind"], "TrainingTask");
        assert_eq!(owner["apiVersion"], "carma.io/v1alpha1");
        assert_eq!(owner["name"], "train");
        // Not a controller: one object has at most one, and this one is shared.
        assert_eq!(owner["controller"], Value::Null);
    }

    // A second task of the same booking shares the template and becomes an owner too.
    h.fake.lock().unwrap().task = dra_task("other", "other-uid");
    h.clear_requests();
    h.reconcile().await.unwrap();
    assert_eq!(template_of(&h, "other-a1"), name);
    {
        let f = h.fake.lock().unwrap();
        assert_eq!(f.claim_templates.len(), 1);
        assert_eq!(f.template_owners(&name), ["task-uid", "other-uid"]);
        let patch = f.calls(&Method::PATCH, &format!("/resourceclaimtemplates/{name}"));
        assert_eq!(patch.len(), 1);
        assert_eq!(
            patch[0].content_type,
            "application/strategic-merge-patch+json"
        );
    }
    // Reconciling again adds nothing.
    h.clear_requests();
    h.fake.lock().unwrap().pods.remove("other-a1");
    h.fake.lock().unwrap().task["status"] = json!(null);
    h.reconcile().await.unwrap();
    assert_eq!(
        h.calls(Method::PATCH, &format!("/resourceclaimtemplates/{name}")),
        0
    );
    assert_eq!(
        h.calls(Method::GET, &format!("/resourceclaimtemplates/{name}")),
        1
    );
    assert_eq!(
        h.fake.lock().unwrap().template_owners(&name),
        ["task-uid", "other-uid"]
    );

    // The garbage collector keeps it while one owner exists and deletes it after the last.
    let mut f = h.fake.lock().unwrap();
    f.collect_garbage(&["other-uid"]);
    assert!(f.claim_templates.contains_key(&name));
    f.collect_garbage(&[]);
    assert!(f.claim_templates.is_empty());
}

#[tokio::test]
async fn a_collected_template_is_created_again() {
    let h = Harness::dra(dra_task("train", "task-uid"));
    h.reconcile().await.unwrap();
    let name = template_of(&h, "train-a1");
    // The task that made it is gone and the collector took the template; a new task wants it.
    {
        let mut f = h.fake.lock().unwrap();
        f.collect_garbage(&[]);
        assert!(f.claim_templates.is_empty());
        f.task = dra_task("later", "later-uid");
    }
    h.reconcile().await.unwrap();
    assert_eq!(template_of(&h, "later-a1"), name);
    assert_eq!(h.fake.lock().unwrap().template_owners(&name), ["later-uid"]);
}

#[tokio::test]
async fn a_template_of_the_wanted_name_that_says_otherwise_is_never_used() {
    // Learn the wanted template from one run, then plant a different one under its name.
    let first = Harness::dra(dra_task("train", "task-uid"));
    first.reconcile().await.unwrap();
    let name = template_of(&first, "train-a1");
    let wanted = first.fake.lock().unwrap().claim_templates[&name].clone();
    let plants = [
        ("more memory", {
            let mut t = wanted.clone();
            t["spec"]["spec"]["devices"]["requests"][0]["exactly"]["capacity"]["requests"]["memory"] =
                json!("20Gi");
            t
        }),
        ("a toleration", {
            let mut t = wanted.clone();
            t["spec"]["spec"]["devices"]["requests"][0]["exactly"]["tolerations"] = json!([{"key": "gpu.carma.io/utilization-gate", "operator": "Exists", "effect": "NoSchedule"}]);
            t
        }),
        ("not carma's", {
            let mut t = wanted.clone();
            t["metadata"]["labels"] = json!({});
            t
        }),
    ];
    for (what, plant) in plants {
        let h = Harness::dra(dra_task("train", "task-uid"));
        h.fake
            .lock()
            .unwrap()
            .claim_templates
            .insert(name.clone(), plant.clone());
        let err = h.reconcile().await.unwrap_err();
        assert_eq!(err.kind(), "claim_template", "{what}: {err}");
        assert_eq!(h.pod_count(), 0, "{what}");
        assert_eq!(h.calls(Method::PATCH, "/status"), 0, "{what}");
        assert_eq!(
            h.events(),
            [(
                "ClaimTemplateCreateFailed".to_string(),
                "Warning".to_string()
            )],
            "{what}"
        );
        // Left as it was: no owner added to a template the operator does not use.
        assert_eq!(
            h.fake.lock().unwrap().claim_templates[&name],
            plant,
            "{what}"
        );
    }

    // The API server's canonical form of the same quantity, and the empty claim metadata it
    // stores where none was sent (both seen from a real kube-apiserver 1.36), are the same template.
    let h = Harness::dra(dra_task("train", "task-uid"));
    let mut canonical = wanted.clone();
    canonical["spec"]["metadata"] = json!({});
    canonical["spec"]["spec"]["devices"]["requests"][0]["exactly"]["capacity"]["requests"]["memory"] =
        json!("10Gi");
    canonical["metadata"]["ownerReferences"] = json!([]);
    h.fake
        .lock()
        .unwrap()
        .claim_templates
        .insert(name.clone(), canonical);
    h.reconcile().await.unwrap();
    assert_eq!(h.pod_count(), 1);
    assert_eq!(h.fake.lock().unwrap().template_owners(&name), ["task-uid"]);
}

/// The status PATCH requests, by content type.
fn status_writes(h: &Harness) -> Vec<(String, Value)> {
    h.fake
        .lock()
        .unwrap()
        .calls(&Method::PATCH, "/trainingtasks/train/status")
        .iter()
        .map(|r| (r.content_type.clone(), r.body.clone()))
        .collect()
}

#[tokio::test]
async fn the_status_is_written_whole_by_server_side_apply() {
    let h = Harness::new(task_json(json!({})));
    h.reconcile().await.unwrap();
    let f = h.fake.lock().unwrap();
    let writes = f.calls(&Method::PATCH, "/trainingtasks/train/status");
    assert_eq!(writes.len(), 1);
    let w = writes[0];
    assert_eq!(w.content_type, "application/apply-patch+yaml");
    assert_eq!(w.query["fieldManager"], "carma-operator");
    assert_eq!(w.query["force"], "true");
    assert_eq!(w.body["apiVersion"], "carma.io/v1alpha1");
    assert_eq!(w.body["kind"], "TrainingTask");
    // Only the status, and all of it: what the planner wrote is what the task now holds.
    let keys: Vec<&String> = w.body.as_object().unwrap().keys().collect();
    assert_eq!(keys, ["apiVersion", "kind", "status"]);
    assert_eq!(w.body["status"], f.task["status"]);
    assert_eq!(w.body["status"]["phase"], "Pending");
    assert_eq!(w.body["status"]["attempts"][0]["pod"], "train-a1");
    assert!(w.body["status"]["conditions"].as_array().unwrap().len() >= 2);
}

#[tokio::test]
async fn fields_an_earlier_releases_merge_patch_wrote_are_removed_before_the_apply() {
    let run = |legacy: bool| async move {
        let mut task = task_json(json!({}));
        if legacy {
            task["metadata"]["managedFields"] = json!([
                {"manager": "carma-operator", "operation": "Update", "apiVersion": "carma.io/v1alpha1",
                 "time": "2027-01-15T07:00:00Z", "fieldsType": "FieldsV1", "subresource": "status",
                 "fieldsV1": {"f:status": {"f:nextAttemptAt": {}}}}
            ]);
        }
        let h = Harness::new(task);
        h.reconcile().await.unwrap();
        h.run_pod("train-a1", "gpu-1", 8000);
        h.end_pod("train-a1", 1, OOM_MESSAGE);
        let finished: DateTime<Utc> = "2027-01-15T08:01:40Z".parse().unwrap();
        let offset = (finished - at(0)).num_seconds();
        h.set_now(offset + 1);
        h.reconcile().await.unwrap();
        assert_eq!(h.status()["nextAttemptAt"], "2027-01-15T08:01:50Z");
        h.clear_requests();
        // The recovery attempt is due: the step drops nextAttemptAt.
        h.set_now(offset + 10);
        h.reconcile().await.unwrap();
        assert_eq!(h.pod_count(), 2);
        assert_eq!(h.status()["nextAttemptAt"], Value::Null);
        status_writes(&h)
    };
    let writes = run(true).await;
    assert_eq!(writes.len(), 2, "{writes:?}");
    assert_eq!(writes[0].0, "application/merge-patch+json");
    // Only the removals (the backoff's due time, the crashed attempt's node): every other field
    // is left to the apply.
    assert_eq!(
        writes[0].1,
        json!({"status": {"nextAttemptAt": null, "node": null}})
    );
    assert_eq!(writes[1].0, "application/apply-patch+yaml");
    assert!(writes[1].1["status"].get("nextAttemptAt").is_none());

    // Without the earlier release's entry the apply alone drops it.
    let writes = run(false).await;
    let types: Vec<&str> = writes.iter().map(|w| w.0.as_str()).collect();
    assert_eq!(types, ["application/apply-patch+yaml"]);
}
