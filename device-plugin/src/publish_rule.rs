//! When the node's `GpuNode` status is worth writing: at once after a change that can move a
//! filter decision, beyond the deadbands, else once per (jittered) heartbeat. The status itself is
//! built by `carma_gpu::telemetry::Snapshot::to_status`; [`crate::publisher`] writes it.

use std::collections::BTreeSet;
use std::time::Duration;

use carma_api::{Condition, GpuNodeStatus, GpuStatus};

use crate::config::PublishConfig;

/// Why a status is written: the label of `carma_gpunode_status_writes_total{reason}`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum WriteKind {
    /// The first status this process writes.
    First,
    /// Something changed beyond the deadbands.
    Change,
    /// Nothing did; the heartbeat was due.
    Heartbeat,
}

impl WriteKind {
    /// Every kind, in label order.
    pub const ALL: [WriteKind; 3] = [WriteKind::First, WriteKind::Change, WriteKind::Heartbeat];

    /// The metric label.
    pub fn as_str(self) -> &'static str {
        match self {
            WriteKind::First => "first",
            WriteKind::Change => "change",
            WriteKind::Heartbeat => "heartbeat",
        }
    }
}

/// Why a status is written now: its kind and, for a change, what changed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PublishReason {
    /// First, change or heartbeat.
    pub kind: WriteKind,
    /// What changed (empty for the first publication and the heartbeat).
    pub detail: String,
}

impl PublishReason {
    fn change(detail: String) -> Self {
        Self {
            kind: WriteKind::Change,
            detail,
        }
    }
}

impl std::fmt::Display for PublishReason {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.kind {
            WriteKind::First => f.write_str("first publication"),
            WriteKind::Heartbeat => f.write_str("heartbeat"),
            WriteKind::Change => f.write_str(&self.detail),
        }
    }
}

/// Why `next` should be written now, or `None` to skip it. `since_last` is the time since the last
/// write, `heartbeat` the interval after which an unchanged status is written anyway (the
/// publisher's jittered [`PublishConfig::heartbeat`]).
///
/// At once (the next sample): the first status; a change of the GPU set, a GPU's health, the pods
/// on a GPU or which of them show memory (the extender's in-flight count and warm-up lock end on
/// it); a GPU's gate verdict (`sharingAllowed`, judged with the extender's caps on the figures as
/// published) or gate rule; a risk score appearing or expiring. These are the changes that move a
/// filter decision.
///
/// Deadbands, no sooner than `cfg.min_interval` after the last write: a GPU's free memory moved by
/// `cfg.free_mib_delta` MiB or a risk score by `cfg.risk_delta` since the last write. Inside them
/// the figures the extender holds stay within a known distance of the true ones: under the 512 MiB
/// its memory test holds back from every free figure, and well under the steps (0.15 or more)
/// between the SM-activity priors `pack` adds to them.
///
/// Otherwise only the heartbeat: power, energy, the summary, process counts and peaks ride along
/// with the next write (an ended pod's final peak leaves with its pod-set change).
pub fn publish_reason(
    prev: Option<&GpuNodeStatus>,
    next: &GpuNodeStatus,
    since_last: Duration,
    heartbeat: Duration,
    cfg: &PublishConfig,
) -> Option<PublishReason> {
    let Some(prev) = prev else {
        return Some(PublishReason {
            kind: WriteKind::First,
            detail: String::new(),
        });
    };
    if let Some(detail) = decisive_change(prev, next) {
        return Some(PublishReason::change(detail));
    }
    if since_last >= heartbeat {
        return Some(PublishReason {
            kind: WriteKind::Heartbeat,
            detail: String::new(),
        });
    }
    if since_last < cfg.min_interval {
        return None;
    }
    deadband_change(prev, next, cfg).map(PublishReason::change)
}

/// A change that can move a filter decision, written at once.
fn decisive_change(prev: &GpuNodeStatus, next: &GpuNodeStatus) -> Option<String> {
    let uuids = |s: &GpuNodeStatus| s.gpus.iter().map(|g| g.uuid.clone()).collect::<Vec<_>>();
    if uuids(prev) != uuids(next) {
        return Some("GPU set changed".to_string());
    }
    // A condition that turns (another device plugin found or gone) is news for operators at once;
    // its transition time alone never differs without its status.
    let same = |a: &Condition, b: &Condition| {
        a.type_ == b.type_ && a.status == b.status && a.message == b.message
    };
    if prev.conditions.len() != next.conditions.len()
        || prev
            .conditions
            .iter()
            .zip(&next.conditions)
            .any(|(a, b)| !same(a, b))
    {
        return Some("a condition changed".to_string());
    }
    for (a, b) in prev.gpus.iter().zip(&next.gpus) {
        if a.healthy != b.healthy {
            return Some(format!(
                "GPU {} health changed to {}",
                b.index,
                if b.healthy { "healthy" } else { "unhealthy" }
            ));
        }
        let pods = |g: &GpuStatus| {
            g.pods
                .iter()
                .map(|p| p.uid.clone())
                .collect::<BTreeSet<_>>()
        };
        if pods(a) != pods(b) {
            return Some(format!("pods on GPU {} changed", b.index));
        }
        let shown = |g: &GpuStatus| {
            g.pods
                .iter()
                .filter(|p| p.observed_mib.is_some())
                .map(|p| p.uid.clone())
                .collect::<BTreeSet<_>>()
        };
        // Only a pod starting to show counts: the extender's count of it in flight ends then,
        // and a pod whose figure drops out for a sample is not worth a write.
        if shown(b).difference(&shown(a)).next().is_some() {
            return Some(format!("memory of a pod on GPU {} shows", b.index));
        }
        if a.sharing_allowed != b.sharing_allowed || a.gate_rule != b.gate_rule {
            return Some(format!(
                "gate of GPU {} {}",
                b.index,
                match b.sharing_allowed {
                    Some(true) => "opened",
                    Some(false) => "closed",
                    None => "changed",
                }
            ));
        }
        let risks = [
            ("SM activity", a.sm_activity, b.sm_activity),
            ("SM occupancy", a.sm_occupancy, b.sm_occupancy),
            ("DRAM activity", a.dram_activity, b.dram_activity),
        ];
        for (what, x, y) in risks {
            if x.is_some() != y.is_some() {
                return Some(format!(
                    "{what} risk of GPU {} {}",
                    b.index,
                    if y.is_some() { "appeared" } else { "expired" }
                ));
            }
        }
    }
    None
}

/// A move beyond the deadbands since the last write.
fn deadband_change(
    prev: &GpuNodeStatus,
    next: &GpuNodeStatus,
    cfg: &PublishConfig,
) -> Option<String> {
    for (a, b) in prev.gpus.iter().zip(&next.gpus) {
        let delta = a.memory_free_mib.abs_diff(b.memory_free_mib);
        if delta >= cfg.free_mib_delta {
            return Some(format!(
                "free memory of GPU {} moved by {delta} MiB",
                b.index
            ));
        }
        let risks = [
            ("SM activity", a.sm_activity, b.sm_activity),
            ("SM occupancy", a.sm_occupancy, b.sm_occupancy),
            ("DRAM activity", a.dram_activity, b.dram_activity),
        ];
        for (what, x, y) in risks {
            // Both rounded to thousandths as published: compare in thousandths, so a move of
            // exactly the deadband counts whatever the float rounding.
            if let (Some(x), Some(y)) = (x, y)
                && ((x - y).abs() * 1000.0).round() >= (cfg.risk_delta * 1000.0).round()
            {
                return Some(format!("{what} risk of GPU {} moved", b.index));
            }
        }
    }
    None
}

/// The heartbeat interval of a node's `nth` heartbeat: `base` shortened by up to a tenth, by an
/// amount that differs between nodes and from one heartbeat to the next, so that nodes started
/// (or cut off from the API server) together spread their heartbeats over a tenth of the
/// interval instead of writing at the same moment.
pub fn jittered_heartbeat(base: Duration, node: &str, nth: u64) -> Duration {
    // FNV-1a over the node name and the count: no randomness to seed, reproducible in tests.
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in node.bytes().chain(nth.to_le_bytes()) {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    let fraction = (h % 1000) as u32;
    base.saturating_sub(base / 10 * fraction / 1000)
}

#[cfg(test)]
mod tests {
    use super::*;
    use carma_api::GpuPodStatus;
    use carma_gpu::backends::{Activity, ActivitySource, GpuSample};
    use carma_gpu::telemetry::Telemetry;
    use chrono::Utc;

    const MIB: u64 = 1024 * 1024;

    fn sample(index: u32, sm: f64) -> GpuSample {
        let mut s = GpuSample::basic(index, format!("GPU-{index}"), "m", 40 * 1024 * MIB, 0);
        s.sm_activity = Activity::new(sm, ActivitySource::Dcgm);
        s
    }

    #[test]
    fn publish_rule() {
        let cfg = PublishConfig::default();
        let hb = cfg.heartbeat;
        let mut t = Telemetry::new("n1", 1);
        let base = t.update(vec![sample(0, 0.3)], &[], Utc::now()).to_status();
        let s = Duration::from_secs;
        let why = |prev: Option<&GpuNodeStatus>, next: &GpuNodeStatus, since| {
            publish_reason(prev, next, since, hb, &cfg).map(|r| r.to_string())
        };
        assert_eq!(why(None, &base, s(0)).as_deref(), Some("first publication"));
        assert_eq!(why(Some(&base), &base, s(5)), None);
        assert_eq!(why(Some(&base), &base, hb - s(1)), None);
        assert_eq!(why(Some(&base), &base, hb).as_deref(), Some("heartbeat"));
        let mut next = base.clone();
        next.gpus[0].memory_free_mib -= 300;
        assert!(
            why(Some(&base), &next, s(1))
                .unwrap()
                .contains("free memory")
        );
        assert_eq!(
            why(Some(&base), &next, Duration::from_millis(500)),
            None,
            "rate-limited"
        );
        let mut next = base.clone();
        next.gpus[0].memory_free_mib -= 100;
        next.gpus[0].sm_activity = Some(base.gpus[0].sm_activity.unwrap() + 0.02);
        assert_eq!(why(Some(&base), &next, s(3)), None, "below thresholds");
        next.gpus[0].sm_activity = Some(base.gpus[0].sm_activity.unwrap() + 0.06);
        assert!(
            why(Some(&base), &next, s(3))
                .unwrap()
                .contains("SM activity")
        );
        let mut next = base.clone();
        next.gpus[0].healthy = false;
        assert!(why(Some(&base), &next, s(0)).unwrap().contains("health"));
        let mut next = base.clone();
        next.gpus[0].pods.push(GpuPodStatus {
            namespace: "a".into(),
            name: "b".into(),
            uid: "u".into(),
            reserved_mib: 1,
            observed_mib: None,
            peak_mib: None,
        });
        assert!(why(Some(&base), &next, s(0)).unwrap().contains("pods"));
    }

    #[test]
    fn decision_changes_are_written_at_once_and_noise_never() {
        let cfg = PublishConfig::default();
        let hb = cfg.heartbeat;
        let at_once = Duration::ZERO;
        let kind = |prev: &GpuNodeStatus, next: &GpuNodeStatus, since| {
            publish_reason(Some(prev), next, since, hb, &cfg).map(|r| r.kind)
        };
        let mut t = Telemetry::new("n1", 1);
        let base = t.update(vec![sample(0, 0.3)], &[], Utc::now()).to_status();
        // The gate closing is written at the next sample, even right after a write, and however
        // little the score moved to close it.
        let mut closed = base.clone();
        closed.gpus[0].sm_activity = Some(0.81);
        closed.gpus[0].sharing_allowed = Some(false);
        let mut open = closed.clone();
        open.gpus[0].sm_activity = Some(0.79);
        open.gpus[0].sharing_allowed = Some(true);
        assert_eq!(kind(&open, &closed, at_once), Some(WriteKind::Change));
        assert_eq!(kind(&closed, &open, at_once), Some(WriteKind::Change));
        // A risk score appearing (the window filled) or expiring, at once too.
        let mut warming = base.clone();
        warming.gpus[0].sm_activity = None;
        assert_eq!(kind(&warming, &base, at_once), Some(WriteKind::Change));
        assert_eq!(kind(&base, &warming, at_once), Some(WriteKind::Change));
        // A pod's memory starting to show (its in-flight count ends), not it dropping out.
        let mut with_pod = base.clone();
        with_pod.gpus[0].pods.push(GpuPodStatus {
            namespace: "a".into(),
            name: "b".into(),
            uid: "u".into(),
            reserved_mib: 1000,
            observed_mib: None,
            peak_mib: None,
        });
        let mut shown = with_pod.clone();
        shown.gpus[0].pods[0].observed_mib = Some(100);
        assert!(
            publish_reason(Some(&with_pod), &shown, at_once, hb, &cfg)
                .unwrap()
                .to_string()
                .contains("memory of a pod")
        );
        assert_eq!(kind(&shown, &with_pod, Duration::from_secs(5)), None);
        // Noise inside the deadbands is never written before the heartbeat.
        let mut noisy = base.clone();
        for step in 0..hb.as_secs() {
            let wobble = if step % 2 == 0 { 0.049 } else { -0.049 };
            noisy.gpus[0].sm_activity = Some(base.gpus[0].sm_activity.unwrap() + wobble);
            noisy.gpus[0].memory_free_mib = base.gpus[0].memory_free_mib - 255 * (step % 2);
            noisy.gpus[0].power_watts = Some(100.0 + step as f64);
            noisy.gpus[0].energy_joules = Some(1000.0 * step as f64);
            noisy.updated_at = Some(format!("t{step}"));
            assert_eq!(kind(&base, &noisy, Duration::from_secs(step)), None);
        }
        assert_eq!(kind(&base, &noisy, hb), Some(WriteKind::Heartbeat));
    }

    #[test]
    fn heartbeats_are_jittered_within_a_tenth() {
        let base = Duration::from_secs(300);
        let mut seen = BTreeSet::new();
        for node in ["n1", "n2", "gpu-node-17"] {
            for nth in 0..50 {
                let hb = jittered_heartbeat(base, node, nth);
                assert!(hb <= base && hb >= base - base / 10, "{hb:?}");
                assert_eq!(hb, jittered_heartbeat(base, node, nth));
                seen.insert(hb.as_millis() / 1000);
            }
        }
        assert!(seen.len() > 10, "spread over the tenth: {seen:?}");
    }
}
