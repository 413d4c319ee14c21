//! Which pod and container an Allocate (or GetPreferredAllocation) request is for: kubelet names
//! device IDs only, so the pod is found among those bound to the node with a carma assignment, and
//! the container by how far kubelet has got in admitting it.

use std::collections::{HashMap, HashSet};

use crate::devices::distinct_gpus;
use crate::pods::PodInfo;

/// Why no pod could be matched to an Allocate request (sent to kubelet as the gRPC error message).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct NoMatch(pub String);

/// How far kubelet has got in admitting one pod. Kubelet calls Allocate once per container that
/// asks for `carma.io/gpu` — init containers first, then app containers, one pod at a time — so a
/// pod whose first GPU container was served is the one being admitted until its last is.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Progress {
    /// GPU containers served so far (an index into [`PodInfo::gpu_containers`]).
    pub served: usize,
    /// GPUs already given to the pod's app containers; each app container gets GPUs of its own.
    pub app_gpus: Vec<String>,
}

/// The pod and container an Allocate (or GetPreferredAllocation) request belongs to.
#[derive(Debug, Clone, PartialEq)]
pub struct Selected<'p> {
    /// The pod being admitted.
    pub pod: &'p PodInfo,
    /// Index of the container in the pod's `gpu_containers`.
    pub container: usize,
    /// The assigned GPUs this container may take: all of the pod's for an init container, those not
    /// yet given to an earlier app container otherwise.
    pub pool: Vec<String>,
}

impl Selected<'_> {
    /// Whether the container is an init container (its GPUs are reused by the app containers).
    pub fn is_init(&self) -> bool {
        self.container < self.pod.gpu_init_containers
    }

    /// The GPUs to expose to this container for `n` requested replicas on `requested_gpus`: the
    /// requested GPUs that are in the pool (kubelet followed GetPreferredAllocation), then further
    /// pool GPUs — never a GPU outside the pod's assignment — in the assignment's order.
    pub fn gpus_for(&self, requested_gpus: &[String], n: usize) -> Vec<String> {
        let mut chosen: Vec<&String> = requested_gpus
            .iter()
            .filter(|g| self.pool.contains(g))
            .take(n)
            .collect();
        for g in &self.pool {
            if chosen.len() >= n {
                break;
            }
            if !chosen.contains(&g) {
                chosen.push(g);
            }
        }
        self.pool
            .iter()
            .filter(|g| chosen.contains(g))
            .cloned()
            .collect()
    }
}

/// Choose the pod an Allocate request of `requested` replicas belongs to (`progress` empty).
pub fn select_pod<'p>(
    pods: &'p [PodInfo],
    node: &str,
    requested: &[String],
    skip: &HashSet<String>,
) -> Result<&'p PodInfo, NoMatch> {
    let (requested_gpus, _) = distinct_gpus(requested);
    select_container(
        pods,
        node,
        requested.len(),
        &requested_gpus,
        skip,
        &HashMap::new(),
    )
    .map(|s| s.pod)
}

/// Choose the pod and container a request for `n` replicas on `requested_gpus` (empty for
/// GetPreferredAllocation) belongs to.
///
/// Candidates: bound to `node`, not finished or terminating, with a well-formed carma assignment not
/// yet allocated (and not in `skip`, the pods this process finished allocating), whose next GPU
/// container asks for `n`. Order: the pod kubelet is in the middle of admitting; then a pod whose
/// assigned GPUs include every requested GPU; then the oldest `assigned-at` (the extender binds in
/// that order, and kubelet admits in the order pods are bound to it); then the name.
pub fn select_container<'p>(
    pods: &'p [PodInfo],
    node: &str,
    n: usize,
    requested_gpus: &[String],
    skip: &HashSet<String>,
    progress: &HashMap<String, Progress>,
) -> Result<Selected<'p>, NoMatch> {
    let candidate = pods
        .iter()
        .filter(|p| p.node_name.as_deref() == Some(node))
        .filter(|p| !p.finished() && !p.terminating && !skip.contains(&p.uid))
        .filter_map(|p| p.assignment().map(|a| (p, a)))
        .filter(|(_, a)| !a.allocated)
        .filter_map(|(p, a)| {
            let pr = progress.get(&p.uid);
            let container = pr.map_or(0, |x| x.served);
            let want = *p.gpu_containers.get(container)?;
            if want as usize != n {
                return None;
            }
            let pool: Vec<String> = if container < p.gpu_init_containers {
                a.gpus.clone()
            } else {
                a.gpus
                    .iter()
                    .filter(|g| pr.is_none_or(|x| !x.app_gpus.contains(g)))
                    .cloned()
                    .collect()
            };
            let in_progress = container > 0;
            let covers =
                !requested_gpus.is_empty() && requested_gpus.iter().all(|g| pool.contains(g));
            Some((
                (!in_progress, !covers, a.assigned_at, &p.namespace, &p.name),
                Selected {
                    pod: p,
                    container,
                    pool,
                },
            ))
        })
        .min_by(|(ka, _), (kb, _)| ka.cmp(kb))
        .map(|(_, s)| s);
    candidate.ok_or_else(|| explain_no_match(pods, node, n, skip))
}

/// The reason no pod matched, naming what was found instead.
fn explain_no_match(pods: &[PodInfo], node: &str, n: usize, skip: &HashSet<String>) -> NoMatch {
    let mut msg = format!(
        "no pod on node {node} with a carma GPU assignment awaits allocation of {n} GPU(s)"
    );
    let on_node: Vec<&PodInfo> = pods
        .iter()
        .filter(|p| p.node_name.as_deref() == Some(node) && !p.finished() && !p.terminating)
        .collect();
    let mut notes: Vec<String> = Vec::new();
    let foreign: Vec<String> = on_node
        .iter()
        .filter(|p| p.gpu_request > 0 && p.assignment().is_none() && p.assignment.is_ok())
        .map(|p| format!("{} (schedulerName {})", p.key(), p.scheduler_name))
        .collect();
    if !foreign.is_empty() {
        notes.push(format!(
            "pods requesting carma.io/gpu without a carma assignment: {}",
            foreign.join(", ")
        ));
    }
    let broken: Vec<String> = on_node
        .iter()
        .filter_map(|p| {
            p.assignment
                .as_ref()
                .err()
                .map(|e| format!("{}: {e}", p.key()))
        })
        .collect();
    if !broken.is_empty() {
        notes.push(format!(
            "pods with malformed assignments: {}",
            broken.join("; ")
        ));
    }
    let other_count: Vec<String> = on_node
        .iter()
        .filter(|p| !skip.contains(&p.uid))
        .filter_map(|p| p.assignment().map(|a| (p, a)))
        .filter(|(_, a)| !a.allocated && a.gpus.len() != n)
        .map(|(p, a)| format!("{} ({} GPU(s))", p.key(), a.gpus.len()))
        .collect();
    if !other_count.is_empty() {
        notes.push(format!(
            "pending carma pods with another GPU count: {}",
            other_count.join(", ")
        ));
    }
    if !notes.is_empty() {
        msg.push_str(" (");
        msg.push_str(&notes.join("; "));
        msg.push(')');
    }
    msg.push_str(
        "; pods scheduled by another scheduler cannot use carma.io/gpu: set spec.schedulerName to carma's scheduler profile (the chart's scheduler.schedulerName)",
    );
    NoMatch(msg)
}

#[cfg(test)]
mod tests {
    use super::*;
    use carma_api::Assignment;
    use carma_api::names::SCHEDULER_NAME;
    use carma_gpu::fixtures::{ids, shared_assignment};
    use chrono::{DateTime, Utc};

    fn at(s: &str) -> DateTime<Utc> {
        DateTime::parse_from_rfc3339(s).unwrap().with_timezone(&Utc)
    }

    fn pod(name: &str, node: &str, gpus: &[&str], assigned_at: &str, allocated: bool) -> PodInfo {
        PodInfo {
            namespace: "ml".into(),
            name: name.into(),
            uid: format!("uid-{name}"),
            node_name: Some(node.into()),
            scheduler_name: SCHEDULER_NAME.into(),
            phase: Some("Pending".into()),
            terminating: false,
            gpu_request: gpus.len() as u32,
            gpu_containers: vec![gpus.len() as u32],
            gpu_init_containers: 0,
            assignment: Ok(Some(Assignment {
                gpus: ids(gpus),
                assigned_at: at(assigned_at),
                allocated,
                ..shared_assignment()
            })),
            task: None,
            simulated: false,
        }
    }

    #[test]
    fn oldest_unallocated_pod_with_matching_count_wins() {
        let pods = vec![
            pod("new", "n1", &["GPU-a"], "2026-01-01T00:00:10Z", false),
            pod("old", "n1", &["GPU-b"], "2026-01-01T00:00:01Z", false),
            pod("done", "n1", &["GPU-a"], "2026-01-01T00:00:00Z", true),
            pod(
                "two",
                "n1",
                &["GPU-a", "GPU-b"],
                "2025-01-01T00:00:00Z",
                false,
            ),
            pod("elsewhere", "n2", &["GPU-a"], "2025-01-01T00:00:00Z", false),
        ];
        let got = select_pod(&pods, "n1", &ids(&["GPU-c::0"]), &HashSet::new()).unwrap();
        assert_eq!(got.name, "old");
        let got = select_pod(
            &pods,
            "n1",
            &ids(&["GPU-a::0", "GPU-a::1"]),
            &HashSet::new(),
        )
        .unwrap();
        assert_eq!(got.name, "two");
    }

    /// A pod with the given GPU containers (init containers first), assigned `gpus`.
    fn shaped(name: &str, gpus: &[&str], init: &[u32], app: &[u32], assigned_at: &str) -> PodInfo {
        let mut p = pod(name, "n1", gpus, assigned_at, false);
        p.gpu_containers = init.iter().chain(app).copied().collect();
        p.gpu_init_containers = init.len();
        p.gpu_request = app.iter().sum();
        p
    }

    /// Serve `n` replicas on `requested` GPUs the way the Allocator does; returns (pod, GPUs).
    fn serve(
        pods: &[PodInfo],
        requested: &[&str],
        n: usize,
        progress: &mut HashMap<String, Progress>,
        done: &mut HashSet<String>,
    ) -> (String, Vec<String>) {
        let req = ids(requested);
        let s = select_container(pods, "n1", n, &req, done, progress).unwrap();
        let gpus = s.gpus_for(&req, n);
        let e = progress.entry(s.pod.uid.clone()).or_default();
        e.served += 1;
        if !s.is_init() {
            e.app_gpus.extend(gpus.iter().cloned());
        }
        if e.served == s.pod.gpu_containers.len() {
            done.insert(s.pod.uid.clone());
            progress.remove(&s.pod.uid);
        }
        (s.pod.name.clone(), gpus)
    }

    #[test]
    fn every_container_of_a_multi_container_pod_gets_gpus_of_its_own() {
        // Seen with the kubelet's own device manager: one Allocate per container. The old plugin
        // matched one container's count against the pod's total and failed admission.
        let pods = vec![shaped(
            "two",
            &["GPU-a", "GPU-b"],
            &[],
            &[1, 1],
            "2026-01-01T00:00:01Z",
        )];
        let (mut progress, mut done) = (HashMap::new(), HashSet::new());
        assert_eq!(
            serve(&pods, &["GPU-b"], 1, &mut progress, &mut done),
            ("two".into(), ids(&["GPU-b"]))
        );
        // The second container: the GPU left, whatever replica kubelet offers.
        assert_eq!(
            serve(&pods, &["GPU-b"], 1, &mut progress, &mut done),
            ("two".into(), ids(&["GPU-a"]))
        );
        assert!(done.contains("uid-two"));
    }

    #[test]
    fn gpu_init_containers_come_first_and_share_the_assignment() {
        let pods = vec![shaped(
            "init",
            &["GPU-a", "GPU-b"],
            &[2],
            &[1, 1],
            "2026-01-01T00:00:01Z",
        )];
        let (mut progress, mut done) = (HashMap::new(), HashSet::new());
        assert_eq!(
            serve(&pods, &["GPU-a", "GPU-b"], 2, &mut progress, &mut done).1,
            ids(&["GPU-a", "GPU-b"])
        );
        // kubelet reuses the init container's devices for the app containers.
        assert_eq!(
            serve(&pods, &["GPU-a"], 1, &mut progress, &mut done).1,
            ids(&["GPU-a"])
        );
        assert_eq!(
            serve(&pods, &["GPU-a"], 1, &mut progress, &mut done).1,
            ids(&["GPU-b"])
        );
        assert!(done.contains("uid-init"));
    }

    #[test]
    fn the_pod_being_admitted_keeps_its_turn() {
        // Two pods of the same shape pending together: once kubelet started admitting one, its next
        // container is not given to the other (older) pod.
        let pods = vec![
            shaped(
                "older",
                &["GPU-a", "GPU-b"],
                &[],
                &[1, 1],
                "2026-01-01T00:00:01Z",
            ),
            shaped(
                "newer",
                &["GPU-c", "GPU-d"],
                &[],
                &[1, 1],
                "2026-01-01T00:00:02Z",
            ),
        ];
        let (mut progress, mut done) = (HashMap::new(), HashSet::new());
        assert_eq!(
            serve(&pods, &["GPU-c"], 1, &mut progress, &mut done),
            ("newer".into(), ids(&["GPU-c"]))
        );
        assert_eq!(
            serve(&pods, &["GPU-a"], 1, &mut progress, &mut done),
            ("newer".into(), ids(&["GPU-d"]))
        );
        assert_eq!(
            serve(&pods, &["GPU-a"], 1, &mut progress, &mut done),
            ("older".into(), ids(&["GPU-a"]))
        );
    }

    #[test]
    fn exact_gpu_match_beats_age_and_skip_is_honoured() {
        let pods = vec![
            pod("old", "n1", &["GPU-b"], "2026-01-01T00:00:01Z", false),
            pod("new", "n1", &["GPU-a"], "2026-01-01T00:00:10Z", false),
        ];
        let got = select_pod(&pods, "n1", &ids(&["GPU-a::3"]), &HashSet::new()).unwrap();
        assert_eq!(got.name, "new");
        let skip: HashSet<String> = ["uid-new".to_string()].into();
        let got = select_pod(&pods, "n1", &ids(&["GPU-a::3"]), &skip).unwrap();
        assert_eq!(got.name, "old");
    }

    #[test]
    fn finished_and_terminating_pods_are_not_candidates() {
        let mut a = pod("a", "n1", &["GPU-a"], "2026-01-01T00:00:01Z", false);
        a.phase = Some("Failed".into());
        let mut b = pod("b", "n1", &["GPU-a"], "2026-01-01T00:00:01Z", false);
        b.terminating = true;
        assert!(select_pod(&[a, b], "n1", &ids(&["GPU-a::0"]), &HashSet::new()).is_err());
    }

    #[test]
    fn no_match_explains_foreign_scheduler() {
        let mut foreign = pod("web", "n1", &[], "2026-01-01T00:00:01Z", false);
        foreign.assignment = Ok(None);
        foreign.scheduler_name = "default-scheduler".into();
        foreign.gpu_request = 1;
        let two = pod(
            "two",
            "n1",
            &["GPU-a", "GPU-b"],
            "2026-01-01T00:00:01Z",
            false,
        );
        let err =
            select_pod(&[foreign, two], "n1", &ids(&["GPU-a::0"]), &HashSet::new()).unwrap_err();
        let msg = err.to_string();
        assert!(
            msg.contains(
                "no pod on node n1 with a carma GPU assignment awaits allocation of 1 GPU(s)"
            ),
            "{msg}"
        );
        assert!(
            msg.contains("ml/web (schedulerName default-scheduler)"),
            "{msg}"
        );
        assert!(msg.contains("ml/two (2 GPU(s))"), "{msg}");
        assert!(
            msg.contains("pods scheduled by another scheduler cannot use carma.io/gpu"),
            "{msg}"
        );
    }
}
