//! Room kept for a starving multi-GPU pod: an option of `pack`, off by default
//! (docs/hold-for-multi-gpu.md evaluates it).
//!
//! Under kube-scheduler's queue a pod that does not fit is set aside and the pods behind it pass
//! it, so a pod that needs several GPUs on one node can wait without bound while single-GPU pods
//! take each GPU as it frees. Once such a pod has waited long enough, [`starving`] picks it (the
//! one that has waited longest, when several have) and [`hold_for`] the node it could use next
//! (the node where the most of its best GPUs are idle) and, on it, the GPUs kept for it: those of
//! its best GPUs that are idle. Every pod queued behind it sees that node without them
//! ([`without_held`]) until it is placed; pods ahead of it are not held back. Busy GPUs are not
//! kept: they go on taking pods that share them, and an idle GPU is kept as soon as it frees. The
//! kept GPUs are chosen again at every pass from the ledger. This is close to kube-scheduler's
//! own nominated node, which keeps room on a node for a pod that preemption made room for.
//!
//! The simulator applies it with its queues (`carma simulate --pack-hold-for-multi-gpu`). The
//! extender would read the pending pods it is asked about: each pod's GPU count, how long it has
//! waited (its `PodScheduled=False` condition's last transition time) and its place in
//! kube-scheduler's queue (priority, then the time it was queued), to hold only pods behind it.

use crate::Millis;
use crate::ledger::Ledger;
use crate::model::Node;

/// Idle GPUs kept on one node for one waiting pod.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Hold {
    /// Index of the node in the list [`hold_for`] was given.
    pub node: usize,
    /// UUIDs of the GPUs kept (idle, at most the pod's GPU count), in index order.
    pub gpus: Vec<String>,
}

/// The waiting pod to keep room for: among pods needing more than one GPU that have waited at
/// least `after_ms`, the one that has waited longest (the first such on a tie). `waiting` gives
/// each waiting pod's GPU count and wait so far, in queue order.
pub fn starving(
    waiting: impl IntoIterator<Item = (u32, Millis)>,
    after_ms: Millis,
) -> Option<usize> {
    let mut best: Option<(usize, Millis)> = None;
    for (i, (gpus, waited)) in waiting.into_iter().enumerate() {
        if gpus > 1 && waited >= after_ms && best.is_none_or(|(_, w)| waited > w) {
            best = Some((i, waited));
        }
    }
    best.map(|(i, _)| i)
}

/// The node and GPUs to keep for a pod needing `gpus` GPUs: on each node with that many healthy GPUs, its `gpus` best GPUs (fewest pods,
/// then least memory booked, then lowest index); the node where the fewest of them are busy, then
/// with the fewest pods on them, then the first; the idle ones among them are kept. `None` when no
/// node has that many GPUs, or the chosen node none of them idle.
pub fn hold_for(nodes: &[Node], ledger: &Ledger, gpus: u32) -> Option<Hold> {
    let wanted = gpus.max(1) as usize;
    // (busy GPUs, pods, MiB booked) among the best ones; the node; its idle ones.
    type Choice<'a> = ((usize, usize, u64), usize, Vec<&'a str>);
    let mut best: Option<Choice<'_>> = None;
    for (n, node) in nodes.iter().enumerate() {
        let mut ranked: Vec<(usize, u64, u32, &str)> = node
            .gpus
            .iter()
            .filter(|g| g.healthy)
            .map(|g| {
                (
                    ledger.pods_on(&g.uuid),
                    ledger.reserved_mib(&g.uuid),
                    g.index,
                    g.uuid.as_str(),
                )
            })
            .collect();
        if ranked.len() < wanted {
            continue;
        }
        ranked.sort_unstable();
        ranked.truncate(wanted);
        let key = (
            ranked.iter().filter(|g| g.0 > 0).count(),
            ranked.iter().map(|g| g.0).sum::<usize>(),
            ranked.iter().map(|g| g.1).sum::<u64>(),
        );
        if best.as_ref().is_none_or(|(k, _, _)| key < *k) {
            let idle = ranked.iter().filter(|g| g.0 == 0).map(|g| g.3).collect();
            best = Some((key, n, idle));
        }
    }
    let (_, node, idle) = best?;
    (!idle.is_empty()).then(|| Hold {
        node,
        gpus: idle.into_iter().map(str::to_string).collect(),
    })
}

/// Node `node` as every pod but the held-for one sees it: without the held GPUs.
pub fn without_held(node: &Node, hold: &Hold) -> Node {
    Node {
        name: node.name.clone(),
        gpus: node
            .gpus
            .iter()
            .filter(|g| !hold.gpus.contains(&g.uuid))
            .cloned()
            .collect(),
    }
}
