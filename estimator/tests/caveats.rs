//! The bound on patterns it had no rule for, each against the job's measured peak: ALBERT's shared
//! layer group, T5's attention with a learned position bias and EfficientNet-B3's SiLU rows (the
//! H100 peaks of `data/h100-heldout-peaks.csv`; the printouts and the table in `data/held-out/`,
//! written by `data/describe_models.py`), XLNet with its language-model head, and what a module
//! type or attention with no rule does to the estimate (a fallback only where its bound sets the
//! reservation).

use std::path::PathBuf;

use carma_estimator::analytic::detailed_bound;
use carma_estimator::printout_rules::{
    ASSUMED_SHARED_RUNS, POSITION_BIAS_SCORE_QUARTERS, RELATIVE_SCORE_QUARTERS,
};
use carma_estimator::reading::{Reading, printout_reading, summary_reading};
use carma_estimator::{
    Caveat, CaveatKind, EstimateSource, Estimator, Family, LayerReading, parse_profile,
};

fn data(rel: &str) -> String {
    let p = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/data")
        .join(rel);
    std::fs::read_to_string(&p).unwrap_or_else(|e| panic!("{}: {e}", p.display()))
}

/// The measured peak (MiB) of a held-out job on the H100.
fn measured(job: &str) -> u64 {
    let csv = data("h100-heldout-peaks.csv");
    let mut lines = csv.lines();
    let header: Vec<&str> = lines.next().unwrap().split(',').collect();
    let col = header.iter().position(|h| *h == "measured_mib").unwrap();
    let prefix = format!("{job},");
    let quoted = format!("\"{job}\",");
    let row = lines
        .find(|l| l.starts_with(&prefix) || l.starts_with(&quoted))
        .unwrap_or_else(|| panic!("{job} not measured"));
    // the job's label may be quoted and hold commas: count columns from the end
    let cells: Vec<&str> = row.rsplit(',').collect();
    cells[header.len() - 1 - col].parse().unwrap()
}

fn bound(r: &Reading) -> u64 {
    detailed_bound(&r.profile, &r.values).total_mib
}

fn kinds(r: &Reading) -> Vec<CaveatKind> {
    r.caveats.iter().map(|c| c.kind).collect()
}

#[test]
fn the_measured_peaks_are_read() {
    assert_eq!(measured("albert-base (masked LM)"), 13_662);
    assert_eq!(measured("efficientnet_b3"), 11_828);
}

#[test]
fn albert_counts_its_shared_layer_once_per_run() {
    let text = data("held-out/albert_base_mlm_bs16_sl512.txt");
    // albert-base runs its one layer group num_hidden_layers = 12 times
    let told = printout_reading(&text, Family::Transformer, 16, 512, Some(12)).unwrap();
    assert!(told.caveats.is_empty(), "{:?}", told.caveats);
    // the parameters are the printout's: the shared layer's once
    assert_eq!(told.profile.parameters, 11_221_680);
    let peak = measured("albert-base (masked LM)");
    assert!(bound(&told) >= peak, "{} < {peak}", bound(&told));
    // one run is what the printout shows, and what the bound read before: under the peak
    let once = printout_reading(&text, Family::Transformer, 16, 512, Some(1)).unwrap();
    assert!(bound(&once) < peak, "{}", bound(&once));
    // without the count, the most runs of ALBERT's configurations, and a fallback that says so
    let assumed = printout_reading(&text, Family::Transformer, 16, 512, None).unwrap();
    assert_eq!(kinds(&assumed), [CaveatKind::SharedLayers]);
    let at =
        |runs| bound(&printout_reading(&text, Family::Transformer, 16, 512, Some(runs)).unwrap());
    assert_eq!(bound(&assumed), at(ASSUMED_SHARED_RUNS));
    let mut profile = assumed.profile.clone();
    profile.layer_reading = Some(LayerReading::from(&assumed.values));
    profile.caveats = assumed.caveats.clone();
    let e = Estimator::new().unwrap().estimate(&profile).unwrap();
    assert_eq!(e.source, EstimateSource::AnalyticFallback);
    assert_eq!(e.mib, bound(&assumed));
    assert!(
        e.warnings.len() == 1 && e.warnings[0].contains("AlbertLayerGroup"),
        "{:?}",
        e.warnings
    );
}

#[test]
fn t5_attention_with_a_position_bias_keeps_its_scores() {
    let text = data("held-out/t5_small_bs16_sl512.txt");
    let r = printout_reading(&text, Family::Transformer, 16, 512, None).unwrap();
    assert!(r.caveats.is_empty(), "{:?}", r.caveats);
    // 6 encoder blocks with self-attention, 6 decoder blocks with self- and cross-attention, each
    // 8 heads (the bias table's width, not 512 / 64 read off the table); one bias table per stack
    let per_head = 512 * 512;
    let quarters = 18 * POSITION_BIAS_SCORE_QUARTERS * 8 * per_head + 2 * 4 * 8 * per_head;
    assert_eq!(r.values.scores, quarters.div_ceil(4));
    let peak = measured("t5-small (seq2seq)");
    assert!(bound(&r) >= peak, "{} < {peak}", bound(&r));
}

#[test]
fn efficientnet_b3_silu_rows_count_in_full() {
    let text = data("held-out/efficientnet_b3_bs32.model");
    let r = summary_reading(&text, Family::Cnn, 32, false).unwrap();
    assert!(r.caveats.is_empty(), "{:?}", r.caveats);
    let peak = measured("efficientnet_b3");
    assert!(bound(&r) >= peak, "{} < {peak}", bound(&r));
    // the same table with ReLU in place of SiLU: an in-place ReLU keeps nothing of its own
    let relu = summary_reading(&text.replace("SiLU-", "ReLU-"), Family::Cnn, 32, false).unwrap();
    assert!(relu.values.saved < r.values.saved);
}

#[test]
fn xlnet_with_its_lm_head_runs_relative_attention_twice() {
    let text = data("held-out/xlnet_base_lm_head.txt");
    let r = printout_reading(&text, Family::Transformer, 1, 512, None).unwrap();
    assert!(r.caveats.is_empty(), "{:?}", r.caveats);
    // 12 relative blocks of 12 heads, once for the content stream and once for the query stream
    let once = 12 * RELATIVE_SCORE_QUARTERS * 12 * 512 * 512;
    assert_eq!(r.values.scores, (2 * once).div_ceil(4));
    // the sequence classifier runs the content stream only
    let classifier = std::fs::read_to_string(
        PathBuf::from(env!("CARGO_MANIFEST_DIR"))
            .join("../../shared/data/model-printouts/xlnet_base_cased_bs8_sl512.txt"),
    )
    .unwrap();
    let c = printout_reading(&classifier, Family::Transformer, 1, 512, None).unwrap();
    assert_eq!(c.values.scores, once.div_ceil(4));
}

/// A profile whose reading had caveats gets the larger of GPUMemNet's class and the conservative
/// bound, and is a fallback, with warnings, only where the bound is the larger.
#[test]
fn a_profiles_caveats_make_a_fallback_only_where_the_bound_sets_the_reservation() {
    let est = Estimator::new().unwrap();
    let mut p = parse_profile(
        r#"{"family":"mlp","batchSize":64,"parameters":100000,"activations":2000,"depth":3}"#,
    )
    .unwrap();
    let class = est.estimate(&p).unwrap();
    assert_eq!(
        (class.mib, class.source),
        (2000, EstimateSource::GpumemnetMlp)
    );
    let caveat = Caveat {
        kind: CaveatKind::UnknownModule,
        modules: vec!["FooBlock".into()],
        counted: "every activation value counted 150 %".into(),
    };
    // a small reading: its bound is below the class edge, so the class stands and says nothing
    let small = LayerReading {
        saved_values: 2_000,
        kept_fp32_values: 0,
        largest_values: 512,
        score_values: 0,
    };
    p.layer_reading = Some(small);
    p.caveats = vec![caveat.clone()];
    assert!(detailed_bound(&p, &small.values()).total_mib < 2000);
    let e = est.estimate(&p).unwrap();
    assert_eq!(e, class);
    // a large one: the bound is above the class edge; it sets the reservation, as a fallback
    let large = LayerReading {
        saved_values: 20_000_000,
        largest_values: 1_000_000,
        ..small
    };
    p.layer_reading = Some(large);
    let bound = detailed_bound(&p, &large.values()).total_mib;
    assert!(bound > 2000, "{bound}");
    let e = est.estimate(&p).unwrap();
    assert_eq!((e.mib, e.source), (bound, EstimateSource::AnalyticFallback));
    assert_eq!(e.class, format!("(0,{bound}]"));
    assert_eq!(
        e.warnings,
        ["unknown-module: FooBlock: every activation value counted 150 %"]
    );
    // without the caveat the model's class is the reservation, as before
    p.caveats.clear();
    assert_eq!(
        est.estimate(&p).unwrap().source,
        EstimateSource::GpumemnetMlp
    );
    // an analytic family: the bound is the reservation, a fallback with the caveat
    let mut t = p.clone();
    t.family = Family::Transformer;
    assert_eq!(
        est.estimate(&t).unwrap().source,
        EstimateSource::AnalyticUpperBound
    );
    t.caveats = vec![caveat];
    let e = est.estimate(&t).unwrap();
    assert_eq!(e.source, EstimateSource::AnalyticFallback);
    assert_eq!(e.warnings.len(), 1);
}

#[test]
fn a_profiles_caveats_are_validated_by_name() {
    let base =
        r#""family":"transformer","batchSize":8,"parameters":1000,"activations":1000,"depth":3"#;
    let with = |caveats: &str| parse_profile(&format!("{{{base},\"caveats\":{caveats}}}"));
    let ok =
        with(r#"[{"kind":"shared-layers","modules":["AlbertLayerGroup"],"counted":"24 runs"}]"#)
            .unwrap();
    assert_eq!(ok.caveats[0].kind, CaveatKind::SharedLayers);
    // the emitted form reads back the same
    let again = parse_profile(&serde_json::to_string(&ok).unwrap()).unwrap();
    assert_eq!(again, ok);
    let err = |caveats: &str| with(caveats).unwrap_err().to_string();
    assert!(err(r#"[{"kind":"odd","modules":["A"],"counted":""}]"#).contains("caveats"));
    assert!(
        err(r#"[{"kind":"unknown-module","modules":[],"counted":""}]"#)
            .contains("caveats[0].modules")
    );
    let twice = r#"[{"kind":"unknown-module","modules":["A"],"counted":""},
                    {"kind":"unknown-module","modules":["B"],"counted":""}]"#;
    assert!(err(twice).contains("caveats[1]"), "{}", err(twice));
    assert!(
        err(r#"[{"kind":"unknown-module","modules":["A"],"counted":"","x":1}]"#).contains("`x`")
    );
}
