//! A small in-memory Kubernetes API behind `tower_test::mock::pair()`: enough of
//! pods, pod logs, GpuNodes, the TrainingTask status subresource (merge and
//! server-side apply patches), ResourceClaimTemplates (with a stand-in for the
//! garbage collector), Events and Leases for the operator's reconcile and
//! leader-election tests. Every request is recorded for assertions.

#![allow(dead_code)]

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use http::{Method, Request, Response, StatusCode};
use kube::Client;
use kube::client::Body;
use serde_json::{Value, json};

use carma_operator::status::apply_merge_patch;

/// One request the operator made.
#[derive(Debug, Clone)]
pub struct Recorded {
    /// HTTP method.
    pub method: Method,
    /// Path without the query.
    pub path: String,
    /// Decoded query parameters.
    pub query: BTreeMap<String, String>,
    /// The `content-type` header (empty when absent).
    pub content_type: String,
    /// JSON body (Null when empty or not JSON).
    pub body: Value,
}

/// The fake cluster's state.
#[derive(Debug, Default)]
pub struct Fake {
    /// The one TrainingTask (JSON).
    pub task: Value,
    /// Pods by name.
    pub pods: BTreeMap<String, Value>,
    /// GpuNodes by name.
    pub gpu_nodes: BTreeMap<String, Value>,
    /// Pod logs by pod name.
    pub logs: BTreeMap<String, String>,
    /// Leases by name.
    pub leases: BTreeMap<String, Value>,
    /// Pods left out of list results (a stale read).
    pub hidden_from_list: Vec<String>,
    /// The next lease replace fails with 409 (someone else wrote first).
    pub conflict_next_lease_replace: bool,
    /// MemoryHistories by name.
    pub memory_histories: BTreeMap<String, Value>,
    /// The next MemoryHistory status replace fails with 409 (another writer got there first).
    pub conflict_next_history_write: bool,
    /// Every MemoryHistory request is refused with 403 (RBAC not granted).
    pub forbid_history: bool,
    /// ResourceClaimTemplates by name (one namespace is enough here).
    pub claim_templates: BTreeMap<String, Value>,
    /// Every request, in order.
    pub requests: Vec<Recorded>,
    counter: u64,
}

impl Fake {
    /// A fake holding `task`.
    pub fn with_task(task: Value) -> Self {
        Self {
            task,
            ..Self::default()
        }
    }

    fn next(&mut self) -> u64 {
        self.counter += 1;
        self.counter
    }

    /// Requests with this method whose path ends with `suffix`.
    pub fn calls(&self, method: &Method, suffix: &str) -> Vec<&Recorded> {
        self.requests
            .iter()
            .filter(|r| r.method == *method && r.path.ends_with(suffix))
            .collect()
    }

    /// The Events posted (reason, type).
    pub fn events(&self) -> Vec<(String, String)> {
        self.requests
            .iter()
            .filter(|r| r.path.contains("/apis/events.k8s.io/") && r.method == Method::POST)
            .map(|r| {
                (
                    r.body["reason"].as_str().unwrap_or("").to_string(),
                    r.body["type"].as_str().unwrap_or("").to_string(),
                )
            })
            .collect()
    }

    /// What Kubernetes' garbage collector does to claim templates: delete each one that has owner
    /// references and none of whose owners is among `live_uids`.
    pub fn collect_garbage(&mut self, live_uids: &[&str]) {
        self.claim_templates.retain(|_, t| {
            let owners = t["metadata"]["ownerReferences"]
                .as_array()
                .cloned()
                .unwrap_or_default();
            owners.is_empty()
                || owners
                    .iter()
                    .any(|o| live_uids.contains(&o["uid"].as_str().unwrap_or("")))
        });
    }

    /// The uids of a claim template's owners.
    pub fn template_owners(&self, name: &str) -> Vec<String> {
        self.claim_templates[name]["metadata"]["ownerReferences"]
            .as_array()
            .into_iter()
            .flatten()
            .map(|o| o["uid"].as_str().unwrap_or("").to_string())
            .collect()
    }

    fn handle(
        &mut self,
        method: Method,
        path: &str,
        query: &str,
        content_type: &str,
        body: Value,
    ) -> (StatusCode, Value) {
        let query = parse_query(query);
        self.requests.push(Recorded {
            method: method.clone(),
            path: path.to_string(),
            query: query.clone(),
            content_type: content_type.to_string(),
            body: body.clone(),
        });
        let seg: Vec<&str> = path.trim_matches('/').split('/').collect();
        match (&method, seg.as_slice()) {
            (&Method::GET, ["apis", "carma.io", "v1alpha1", "trainingtasks"]) => (
                StatusCode::OK,
                json!({"apiVersion": "carma.io/v1alpha1", "kind": "TrainingTaskList",
                       "metadata": {"resourceVersion": "1"}, "items": [self.task.clone()]}),
            ),
            (&Method::GET, ["api", "v1", "pods"])
            | (&Method::GET, ["api", "v1", "namespaces", _, "pods"]) => {
                let selector = query.get("labelSelector").cloned().unwrap_or_default();
                let items: Vec<Value> = self
                    .pods
                    .iter()
                    .filter(|(name, _)| !self.hidden_from_list.contains(name))
                    .map(|(_, p)| p.clone())
                    .filter(|p| matches_selector(p, &selector))
                    .collect();
                (
                    StatusCode::OK,
                    json!({"apiVersion": "v1", "kind": "PodList", "metadata": {"resourceVersion": "1"}, "items": items}),
                )
            }
            (&Method::POST, ["api", "v1", "namespaces", ns, "pods"]) => {
                let name = body["metadata"]["name"].as_str().unwrap_or("").to_string();
                if self.pods.contains_key(&name) {
                    return already_exists("pods", &name);
                }
                let n = self.next();
                let mut pod = body.clone();
                pod["apiVersion"] = json!("v1");
                pod["kind"] = json!("Pod");
                pod["metadata"]["namespace"] = json!(ns);
                pod["metadata"]["uid"] = json!(format!("pod-uid-{n}"));
                pod["metadata"]["resourceVersion"] = json!(n.to_string());
                pod["metadata"]["creationTimestamp"] = json!("2027-01-15T08:00:00Z");
                pod["status"] = json!({"phase": "Pending"});
                self.pods.insert(name, pod.clone());
                (StatusCode::CREATED, pod)
            }
            (&Method::GET, ["api", "v1", "namespaces", _, "pods", name]) => {
                match self.pods.get(*name) {
                    Some(p) => (StatusCode::OK, p.clone()),
                    None => not_found("pods", name),
                }
            }
            (&Method::GET, ["api", "v1", "namespaces", _, "pods", name, "log"]) => {
                match self.logs.get(*name) {
                    Some(l) => (StatusCode::OK, Value::String(l.clone())),
                    None => not_found("pods", name),
                }
            }
            (&Method::GET, ["apis", "carma.io", "v1alpha1", "gpunodes", name]) => {
                match self.gpu_nodes.get(*name) {
                    Some(n) => (StatusCode::OK, n.clone()),
                    None => not_found("gpunodes.carma.io", name),
                }
            }
            (
                &Method::PATCH,
                [
                    "apis",
                    "carma.io",
                    "v1alpha1",
                    "namespaces",
                    _,
                    "trainingtasks",
                    name,
                    "status",
                ],
            ) => {
                if self.task["metadata"]["name"].as_str() != Some(*name) {
                    return not_found("trainingtasks.carma.io", name);
                }
                // The status subresource ignores everything but status.
                match content_type {
                    "application/merge-patch+json" => {
                        let patch = json!({"status": body["status"].clone()});
                        apply_merge_patch(&mut self.task, &patch);
                    }
                    "application/apply-patch+yaml" => {
                        // Server-side apply as it works out when one manager writes all of
                        // status: the applied status is the status (fields it left out were
                        // that manager's, so they go).
                        if !query.contains_key("fieldManager")
                            || body["apiVersion"] != self.task["apiVersion"]
                            || body["kind"] != self.task["kind"]
                        {
                            return (
                                StatusCode::UNPROCESSABLE_ENTITY,
                                status_body(
                                    422,
                                    "Invalid",
                                    "apply needs a fieldManager, apiVersion and kind",
                                ),
                            );
                        }
                        self.task["status"] = body["status"].clone();
                    }
                    other => {
                        return (
                            StatusCode::UNSUPPORTED_MEDIA_TYPE,
                            status_body(
                                415,
                                "UnsupportedMediaType",
                                &format!("fake API: status patch of type {other:?}"),
                            ),
                        );
                    }
                }
                let n = self.next();
                self.task["metadata"]["resourceVersion"] = json!(n.to_string());
                (StatusCode::OK, self.task.clone())
            }
            (
                &Method::POST,
                [
                    "apis",
                    "resource.k8s.io",
                    "v1",
                    "namespaces",
                    ns,
                    "resourceclaimtemplates",
                ],
            ) => {
                let name = body["metadata"]["name"].as_str().unwrap_or("").to_string();
                if self.claim_templates.contains_key(&name) {
                    return already_exists("resourceclaimtemplates.resource.k8s.io", &name);
                }
                let n = self.next();
                let mut t = body.clone();
                t["apiVersion"] = json!("resource.k8s.io/v1");
                t["kind"] = json!("ResourceClaimTemplate");
                t["metadata"]["namespace"] = json!(ns);
                t["metadata"]["uid"] = json!(format!("rct-uid-{n}"));
                t["metadata"]["resourceVersion"] = json!(n.to_string());
                self.claim_templates.insert(name, t.clone());
                (StatusCode::CREATED, t)
            }
            (
                &Method::GET,
                [
                    "apis",
                    "resource.k8s.io",
                    "v1",
                    "namespaces",
                    _,
                    "resourceclaimtemplates",
                    name,
                ],
            ) => match self.claim_templates.get(*name) {
                Some(t) => (StatusCode::OK, t.clone()),
                None => not_found("resourceclaimtemplates.resource.k8s.io", name),
            },
            (
                &Method::PATCH,
                [
                    "apis",
                    "resource.k8s.io",
                    "v1",
                    "namespaces",
                    _,
                    "resourceclaimtemplates",
                    name,
                ],
            ) => {
                // Only what the operator sends: a strategic merge patch of owner references,
                // which merge by uid.
                if content_type != "application/strategic-merge-patch+json" {
                    return (
                        StatusCode::UNSUPPORTED_MEDIA_TYPE,
                        status_body(415, "UnsupportedMediaType", content_type),
                    );
                }
                let n = self.next();
                let Some(t) = self.claim_templates.get_mut(*name) else {
                    return not_found("resourceclaimtemplates.resource.k8s.io", name);
                };
                let mut owners = t["metadata"]["ownerReferences"]
                    .as_array()
                    .cloned()
                    .unwrap_or_default();
                for added in body["metadata"]["ownerReferences"]
                    .as_array()
                    .into_iter()
                    .flatten()
                {
                    owners.retain(|o| o["uid"] != added["uid"]);
                    owners.push(added.clone());
                }
                t["metadata"]["ownerReferences"] = Value::Array(owners);
                t["metadata"]["resourceVersion"] = json!(n.to_string());
                (StatusCode::OK, t.clone())
            }
            (&Method::POST, ["apis", "events.k8s.io", "v1", "namespaces", _, "events"])
            | (&Method::PATCH, ["apis", "events.k8s.io", "v1", "namespaces", _, "events", _]) => {
                (StatusCode::CREATED, body)
            }
            (
                &Method::GET,
                [
                    "apis",
                    "coordination.k8s.io",
                    "v1",
                    "namespaces",
                    _,
                    "leases",
                    name,
                ],
            ) => match self.leases.get(*name) {
                Some(l) => (StatusCode::OK, l.clone()),
                None => not_found("leases.coordination.k8s.io", name),
            },
            (
                &Method::POST,
                [
                    "apis",
                    "coordination.k8s.io",
                    "v1",
                    "namespaces",
                    ns,
                    "leases",
                ],
            ) => {
                let name = body["metadata"]["name"].as_str().unwrap_or("").to_string();
                if self.leases.contains_key(&name) {
                    return already_exists("leases.coordination.k8s.io", &name);
                }
                let n = self.next();
                let mut lease = body.clone();
                lease["apiVersion"] = json!("coordination.k8s.io/v1");
                lease["kind"] = json!("Lease");
                lease["metadata"]["namespace"] = json!(ns);
                lease["metadata"]["resourceVersion"] = json!(n.to_string());
                self.leases.insert(name, lease.clone());
                (StatusCode::CREATED, lease)
            }
            (
                &Method::PUT,
                [
                    "apis",
                    "coordination.k8s.io",
                    "v1",
                    "namespaces",
                    _,
                    "leases",
                    name,
                ],
            ) => {
                let Some(current) = self.leases.get(*name).cloned() else {
                    return not_found("leases.coordination.k8s.io", name);
                };
                if std::mem::take(&mut self.conflict_next_lease_replace)
                    || current["metadata"]["resourceVersion"] != body["metadata"]["resourceVersion"]
                {
                    return conflict("leases.coordination.k8s.io", name);
                }
                let n = self.next();
                let mut lease = body.clone();
                lease["metadata"]["resourceVersion"] = json!(n.to_string());
                self.leases.insert(name.to_string(), lease.clone());
                (StatusCode::OK, lease)
            }
            (_, ["apis", "carma.io", "v1alpha1", "memoryhistories", ..]) if self.forbid_history => {
                (
                    StatusCode::FORBIDDEN,
                    status_body(403, "Forbidden", "memoryhistories.carma.io is forbidden"),
                )
            }
            (&Method::GET, ["apis", "carma.io", "v1alpha1", "memoryhistories", name]) => {
                match self.memory_histories.get(*name) {
                    Some(h) => (StatusCode::OK, h.clone()),
                    None => not_found("memoryhistories.carma.io", name),
                }
            }
            (&Method::POST, ["apis", "carma.io", "v1alpha1", "memoryhistories"]) => {
                let name = body["metadata"]["name"].as_str().unwrap_or("").to_string();
                if self.memory_histories.contains_key(&name) {
                    return already_exists("memoryhistories.carma.io", &name);
                }
                let n = self.next();
                let mut h = body.clone();
                // As the API server does with a status subresource: status is not set on create.
                if let Some(o) = h.as_object_mut() {
                    o.remove("status");
                }
                h["metadata"]["resourceVersion"] = json!(n.to_string());
                self.memory_histories.insert(name, h.clone());
                (StatusCode::CREATED, h)
            }
            (
                &Method::PUT,
                [
                    "apis",
                    "carma.io",
                    "v1alpha1",
                    "memoryhistories",
                    name,
                    "status",
                ],
            ) => {
                let Some(mut current) = self.memory_histories.get(*name).cloned() else {
                    return not_found("memoryhistories.carma.io", name);
                };
                if std::mem::take(&mut self.conflict_next_history_write)
                    || current["metadata"]["resourceVersion"] != body["metadata"]["resourceVersion"]
                {
                    return conflict("memoryhistories.carma.io", name);
                }
                let n = self.next();
                current["status"] = body["status"].clone();
                current["metadata"]["resourceVersion"] = json!(n.to_string());
                self.memory_histories
                    .insert(name.to_string(), current.clone());
                (StatusCode::OK, current)
            }
            _ => (
                StatusCode::NOT_FOUND,
                status_body(
                    404,
                    "NotFound",
                    &format!("fake API: no route for {method} {path}"),
                ),
            ),
        }
    }
}

fn status_body(code: u16, reason: &str, message: &str) -> Value {
    json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
           "message": message, "reason": reason, "code": code})
}

fn not_found(resource: &str, name: &str) -> (StatusCode, Value) {
    (
        StatusCode::NOT_FOUND,
        status_body(404, "NotFound", &format!("{resource} \"{name}\" not found")),
    )
}

fn already_exists(resource: &str, name: &str) -> (StatusCode, Value) {
    (
        StatusCode::CONFLICT,
        status_body(
            409,
            "AlreadyExists",
            &format!("{resource} \"{name}\" already exists"),
        ),
    )
}

fn conflict(resource: &str, name: &str) -> (StatusCode, Value) {
    (
        StatusCode::CONFLICT,
        status_body(
            409,
            "Conflict",
            &format!(
                "Operation cannot be fulfilled on {resource} \"{name}\": the object has been modified"
            ),
        ),
    )
}

fn matches_selector(obj: &Value, selector: &str) -> bool {
    selector.split(',').filter(|s| !s.is_empty()).all(|term| {
        let Some((k, v)) = term.split_once('=') else {
            return true;
        };
        obj["metadata"]["labels"][k].as_str() == Some(v)
    })
}

fn parse_query(q: &str) -> BTreeMap<String, String> {
    q.split('&')
        .filter(|p| !p.is_empty())
        .map(|p| {
            let (k, v) = p.split_once('=').unwrap_or((p, ""));
            (decode(k), decode(v))
        })
        .collect()
}

fn decode(s: &str) -> String {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            b'%' if i + 2 < bytes.len() => {
                let hex = std::str::from_utf8(&bytes[i + 1..i + 3]).unwrap_or("");
                match u8::from_str_radix(hex, 16) {
                    Ok(b) => {
                        out.push(b);
                        i += 3;
                    }
                    Err(_) => {
                        out.push(b'%');
                        i += 1;
                    }
                }
            }
            b'+' => {
                out.push(b' ');
                i += 1;
            }
            b => {
                out.push(b);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// A kube client served by `fake`.
pub fn client(fake: Arc<Mutex<Fake>>) -> Client {
    let (service, handle) = tower_test::mock::pair::<Request<Body>, Response<Body>>();
    tokio::spawn(async move {
        let mut handle = std::pin::pin!(handle);
        // Watches are never answered: they stay open, as on a quiet cluster.
        let mut open_watches = Vec::new();
        while let Some((req, send)) = handle.next_request().await {
            if req.uri().query().is_some_and(|q| q.contains("watch=true")) {
                open_watches.push(send);
                continue;
            }
            let (parts, body) = req.into_parts();
            let bytes = body.collect_bytes().await.unwrap_or_default();
            let body: Value = serde_json::from_slice(&bytes).unwrap_or(Value::Null);
            let content_type = parts
                .headers
                .get(http::header::CONTENT_TYPE)
                .and_then(|v| v.to_str().ok())
                .unwrap_or("")
                .to_string();
            let (code, value) = fake.lock().unwrap().handle(
                parts.method.clone(),
                parts.uri.path(),
                parts.uri.query().unwrap_or(""),
                &content_type,
                body,
            );
            let bytes = match value {
                Value::String(s) if parts.uri.path().ends_with("/log") => s.into_bytes(),
                v => serde_json::to_vec(&v).unwrap(),
            };
            let resp = Response::builder()
                .status(code)
                .header("content-type", "application/json")
                .body(Body::from(bytes))
                .unwrap();
            send.send_response(resp);
        }
    });
    Client::new(service, "default")
}

/// A client whose requests go to `inner`, except those `hang` picks: each of them is accepted and
/// never answered, as by an API server (or a proxy in front of it) that hangs.
pub fn hanging_client(
    inner: Client,
    hang: impl Fn(&Request<Body>) -> bool + Send + 'static,
) -> Client {
    let (service, handle) = tower_test::mock::pair::<Request<Body>, Response<Body>>();
    tokio::spawn(async move {
        let mut handle = std::pin::pin!(handle);
        let mut unanswered = Vec::new();
        while let Some((req, send)) = handle.next_request().await {
            if hang(&req) {
                unanswered.push(send);
                continue;
            }
            let inner = inner.clone();
            tokio::spawn(async move {
                match inner.send(req).await {
                    Ok(resp) => send.send_response(resp),
                    Err(e) => send.send_error(e),
                }
            });
        }
    });
    Client::new(service, "default")
}
