//! The utilization gate per telemetry source: NVML without GPM (pre-Hopper), NVML with GPM
//! (Hopper and later), DCGM with and without its profiling counters; and the stale-telemetry rule.

use carma_core::{
    Demand, GateRule, Gpu, Ledger, Node, PlacementConfig, PlacementRecord, Policy, Reservation,
    place_on_node, utilization_gate,
};

const NOW: u64 = 1_000_000;

/// What a source delivers for one GPU: which risk scores it has (a value once its window filled).
struct Source {
    name: &'static str,
    has: (bool, bool, bool),
}

const NVML_NO_GPM: Source = Source {
    name: "nvml without GPM (A100, V100, L4, T4)",
    has: (true, false, true),
};
const NVML_GPM: Source = Source {
    name: "nvml with GPM (H100, H200)",
    has: (true, true, true),
};
const DCGM: Source = Source {
    name: "dcgm with profiling counters",
    has: (true, true, true),
};
const DCGM_NO_PROF: Source = Source {
    name: "dcgm without DCGM_FI_PROF_* (exporter's default counters)",
    has: (false, false, false),
};

fn gpu(src: &Source, smact: f64, smocc: f64, drama: f64) -> Gpu {
    let (a, o, d) = src.has;
    let mut g = Gpu::idle("GPU-0", 0, 81_920);
    g.gate_rule = GateRule::for_metrics(a, o, d);
    g.sm_activity = a.then_some(smact);
    g.sm_occupancy = o.then_some(smocc);
    g.dram_activity = d.then_some(drama);
    g
}

fn verdict(g: &Gpu) -> &'static str {
    match utilization_gate(g, &PlacementConfig::default(), NOW) {
        Ok(()) => "share",
        Err(e) => e.code(),
    }
}

#[test]
fn every_source_has_its_rule() {
    assert_eq!(
        GateRule::for_metrics(NVML_NO_GPM.has.0, NVML_NO_GPM.has.1, NVML_NO_GPM.has.2),
        GateRule::SmactDrama
    );
    assert_eq!(
        GateRule::for_metrics(NVML_GPM.has.0, NVML_GPM.has.1, NVML_GPM.has.2),
        GateRule::SmactSmoccDrama
    );
    assert_eq!(
        GateRule::for_metrics(DCGM.has.0, DCGM.has.1, DCGM.has.2),
        GateRule::SmactSmoccDrama
    );
    assert_eq!(
        GateRule::for_metrics(DCGM_NO_PROF.has.0, DCGM_NO_PROF.has.1, DCGM_NO_PROF.has.2),
        GateRule::NoActivity
    );
    assert_eq!(
        GateRule::for_metrics(true, true, false),
        GateRule::SmactSmocc
    );
    assert_eq!(GateRule::for_metrics(true, false, false), GateRule::Smact);
    for r in GateRule::ALL {
        assert_eq!(r.as_str().parse::<GateRule>().unwrap(), r);
        let json = serde_json::to_string(&r).unwrap();
        assert_eq!(json, format!("\"{}\"", r.as_str()));
    }
    assert!("smact+drama".parse::<GateRule>().is_err());
}

#[test]
fn gate_table_per_source() {
    // (source, smact, smocc, drama, verdict); caps 0.80 / 0.45 / 0.40.
    let table: [(&Source, f64, f64, f64, &str); 16] = [
        // A pre-Hopper GPU with only NVML shares while not busy: before this rule it waited for an
        // occupancy window that never fills.
        (&NVML_NO_GPM, 0.30, 0.0, 0.20, "share"),
        (&NVML_NO_GPM, 0.90, 0.0, 0.20, "share"),
        (&NVML_NO_GPM, 0.90, 0.0, 0.50, "utilization-gate"),
        (&NVML_NO_GPM, 0.50, 0.0, 0.90, "share"),
        // Hopper with GPM: CARMA's gate.
        (&NVML_GPM, 0.30, 0.10, 0.10, "share"),
        (&NVML_GPM, 0.90, 0.50, 0.10, "utilization-gate"),
        (&NVML_GPM, 0.90, 0.10, 0.50, "utilization-gate"),
        (&NVML_GPM, 0.90, 0.10, 0.10, "share"),
        (&NVML_GPM, 0.79, 0.90, 0.90, "share"),
        // DCGM: the same gate.
        (&DCGM, 0.30, 0.10, 0.10, "share"),
        (&DCGM, 0.80, 0.45, 0.00, "utilization-gate"),
        (&DCGM, 0.80, 0.00, 0.40, "utilization-gate"),
        (&DCGM, 0.80, 0.44, 0.39, "share"),
        // DCGM without profiling counters: nothing to judge by, said so.
        (&DCGM_NO_PROF, 0.0, 0.0, 0.0, "no-activity-telemetry"),
        (&DCGM_NO_PROF, 0.9, 0.9, 0.9, "no-activity-telemetry"),
        (&DCGM_NO_PROF, 0.1, 0.1, 0.1, "no-activity-telemetry"),
    ];
    for (src, a, o, d, want) in table {
        let g = gpu(src, a, o, d);
        assert_eq!(
            verdict(&g),
            want,
            "{} smact {a} smocc {o} drama {d}",
            src.name
        );
    }
}

#[test]
fn sm_activity_alone_gates_on_sm_activity() {
    let mut g = Gpu::idle("GPU-0", 0, 81_920);
    g.gate_rule = GateRule::Smact;
    g.sm_occupancy = None;
    g.dram_activity = None;
    g.sm_activity = Some(0.79);
    assert_eq!(verdict(&g), "share");
    g.sm_activity = Some(0.80);
    assert_eq!(verdict(&g), "utilization-gate");
}

#[test]
fn a_rule_waits_only_for_its_own_metrics() {
    // NVML without GPM: occupancy never arrives, and the gate does not wait for it.
    let mut g = gpu(&NVML_NO_GPM, 0.2, 0.0, 0.2);
    assert_eq!(g.sm_occupancy, None);
    assert_eq!(verdict(&g), "share");
    // Its DRAM window still filling: warming up, and the message names the rule.
    g.dram_activity = None;
    let err = utilization_gate(&g, &PlacementConfig::default(), NOW).unwrap_err();
    assert_eq!(err.code(), "telemetry-warming-up");
    assert!(err.to_string().contains("smact-drama"), "{err}");
    // CARMA's rule still waits for occupancy.
    let mut h = gpu(&DCGM, 0.2, 0.2, 0.2);
    h.sm_occupancy = None;
    assert_eq!(verdict(&h), "telemetry-warming-up");
}

#[test]
fn rejection_text_lists_only_the_metrics_of_the_rule() {
    let g = gpu(&NVML_NO_GPM, 0.95, 0.0, 0.60);
    let err = utilization_gate(&g, &PlacementConfig::default(), NOW).unwrap_err();
    let text = err.to_string();
    assert!(text.contains("(smact-drama)"), "{text}");
    assert!(text.contains("SM activity 0.95 ≥ 0.80"), "{text}");
    assert!(text.contains("DRAM activity 0.60 ≥ 0.40"), "{text}");
    assert!(!text.contains("occupancy"), "{text}");
}

#[test]
fn stale_telemetry_stops_sharing_but_not_exclusive_use() {
    let cfg = PlacementConfig {
        max_telemetry_age_ms: Some(60_000),
        ..PlacementConfig::default()
    };
    let mut g = Gpu::idle("GPU-0", 0, 81_920);
    g.telemetry_at = Some(NOW - 60_000);
    assert!(
        utilization_gate(&g, &cfg, NOW).is_ok(),
        "at the limit it is fresh"
    );
    g.telemetry_at = Some(NOW - 60_001);
    let err = utilization_gate(&g, &cfg, NOW).unwrap_err();
    assert_eq!(err.code(), "telemetry-stale");
    assert!(err.to_string().contains("device plugin"), "{err}");
    // No limit configured: never stale.
    let never = PlacementConfig {
        max_telemetry_age_ms: None,
        ..cfg.clone()
    };
    assert!(utilization_gate(&g, &never, NOW).is_ok());

    // Placement: a second sharer cannot join the GPU, an exclusive pod can still take an idle one.
    let node = Node {
        name: "n".into(),
        gpus: vec![g.clone()],
    };
    let mut ledger = Ledger::new();
    ledger.insert_unchecked(PlacementRecord {
        pod: "first".into(),
        node: "n".into(),
        gpus: vec!["GPU-0".into()],
        reserved_mib: 1000,
        exclusive: false,
        assigned_at: 0,
        visible: true,
        expected_sm_activity: 0.0,
    });
    let sharer = Demand::new(1, Reservation::Mib(1000), Policy::Ff);
    let err = place_on_node(&node, &ledger, &sharer, &cfg, NOW, 0).unwrap_err();
    assert_eq!(err.code(), "telemetry-stale");
    let alone = Demand::new(1, Reservation::WholeGpu, Policy::Ff);
    assert!(place_on_node(&node, &Ledger::new(), &alone, &cfg, NOW, 0).is_ok());
}
