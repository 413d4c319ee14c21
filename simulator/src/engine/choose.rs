//! Which node the simulator gives a task: kube-scheduler's choice over carma's answers, made
//! deterministic. Every node that `carma_core::place_on_node` accepts is a candidate; the highest
//! score wins and ties go to the first node (kube-scheduler breaks ties at random; the extender's
//! score is the only score that differs between carma's candidates).
//!
//! The engine memoizes `place_on_node` per node and applies the same [`better`] rule;
//! [`choose_node`] is the plain form, which the replay test in `e2e/tests/replay.rs` holds against
//! the extender's filter, prioritize and bind.

use carma_core::{Demand, Ledger, Millis, Node, NodePlacement, PlacementConfig, place_on_node};

/// Whether `candidate` beats the best placement so far.
pub fn better(candidate: &NodePlacement, best: Option<&NodePlacement>) -> bool {
    best.is_none_or(|b| candidate.score > b.score)
}

/// The node (index into `nodes`) and placement the simulator would choose for `demand`, or `None`
/// when no node accepts it. `rr_cursors[i]` is node `i`'s round-robin cursor.
pub fn choose_node(
    nodes: &[Node],
    ledger: &Ledger,
    demand: &Demand,
    cfg: &PlacementConfig,
    now: Millis,
    rr_cursors: &[usize],
) -> Option<(usize, NodePlacement)> {
    let mut best: Option<(usize, NodePlacement)> = None;
    for (i, node) in nodes.iter().enumerate() {
        let cursor = rr_cursors.get(i).copied().unwrap_or(0);
        if let Ok(p) = place_on_node(node, ledger, demand, cfg, now, cursor)
            && better(&p, best.as_ref().map(|(_, b)| b))
        {
            best = Some((i, p));
        }
    }
    best
}
