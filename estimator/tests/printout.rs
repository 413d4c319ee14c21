//! The module-printout parser on the real XLNet-base printout in
//! ../shared/data/model-printouts (GPUMemNet's Transformer format), and the
//! analytic bound on it against the measured peak.

mod common;

use carma_estimator::{
    EstimateSource, Estimator, Family, PrintoutError, looks_like_printout, parse_printout,
};

fn xlnet() -> String {
    std::fs::read_to_string(common::shared_file(
        "model-printouts/xlnet_base_cased_bs8_sl512.txt",
    ))
    .unwrap()
}

#[test]
fn xlnet_base_features() {
    let text = xlnet();
    assert!(looks_like_printout(&text));
    let p = parse_printout(&text, Family::Transformer, 8, 512).unwrap();
    // the outermost module's count, not the footer's `Total params: 81,874,178`
    assert_eq!(p.parameters, 117_310_466);
    // per layer: attention, 2 LayerNorm, 2 Linear, 3 Dropout; plus the head
    assert_eq!(p.layers.attention, 12);
    assert_eq!(p.layers.layer_norm, 24);
    assert_eq!(p.layers.linear, 24 + 2);
    assert_eq!(p.layers.dropout, 36 + 2);
    assert_eq!(p.depth, Some(12 + 24 + 26 + 38));
    assert_eq!(p.seq_length, Some(512));
    // seq 512 × (embedding 768 + per layer 5 × 768 + 3072 + GELU at 768 + dropout
    // 768) + 12 layers × 3 × 12 heads × 512² scores + head: dropout, Linear,
    // Tanh, dropout (768 each; the Identity counts nothing) and the 2 logits
    let per_layer = 512 * (7 * 768 + 3072) + 3 * 12 * 512 * 512;
    assert_eq!(
        p.activations,
        512 * 768 + 12 * per_layer + 512 * (768 + 768 + 768 + 768 + 2)
    );
}

#[test]
fn xlnet_base_bound_covers_the_measured_peak() {
    // CARMA v2: xlnet_base_cased_2.rad, batch 8, measured 9,192 MiB per GPU.
    let p = parse_printout(&xlnet(), Family::Transformer, 8, 512).unwrap();
    let e = Estimator::new().unwrap().estimate(&p).unwrap();
    assert_eq!(e.source, EstimateSource::AnalyticUpperBound);
    assert!(e.mib >= 9192, "{}", e.mib);
    // and not GPUMemNet's recorded 16,000
    assert!(e.mib < 16_000, "{}", e.mib);
}

#[test]
fn malformed_printouts_are_rejected_with_the_line() {
    let text = xlnet();
    let lines: Vec<&str> = text.lines().collect();
    // cut inside the layers
    let cut = lines[..40].join("\n");
    assert!(matches!(
        parse_printout(&cut, Family::Transformer, 8, 512),
        Err(PrintoutError::Unclosed { .. })
    ));
    // a count edited below its children's
    let edited = text.replace("), 7,678,464 params", "), 7,000,000 params");
    let e = parse_printout(&edited, Family::Transformer, 8, 512).unwrap_err();
    assert!(e.to_string().contains("line 18:"), "{e}");
    // a garbled line
    let garbled = text.replacen("(ff): XLNetFeedForward(", "(ff) XLNetFeedForward(", 1);
    let e = parse_printout(&garbled, Family::Transformer, 8, 512).unwrap_err();
    assert!(e.to_string().contains("line 10:"), "{e}");
    // a plain print(model) without counts
    let plain = "Net(\n  (fc): Linear(in_features=2, out_features=3, bias=True)\n)\n";
    let e = parse_printout(plain, Family::Transformer, 8, 512).unwrap_err();
    assert!(e.to_string().contains("line 2:"), "{e}");
}

#[test]
fn xlnet_base_detailed_bound_covers_the_peak() {
    use carma_estimator::analytic::{analytic_upper_bound_mib, detailed_bound};
    use carma_estimator::reading::printout_values;
    let (p, v) = printout_values(&xlnet(), Family::Transformer, 8, 512).unwrap();
    // XLNet's q, k, v, o and r are bare parameters of each attention block: 5 projections
    // of 512 × 768 per layer beside the module outputs, and 2 more tensors of that size that the
    // relative scores keep (the query with each of its three biases and the position projection's
    // second half, less the bare query and the output projection's result, which are freed); 3.25
    // relative score tensors per head (the activation, printed after layer_2, runs on layer_1's
    // 3,072-wide output)
    let outputs = 512 * 768 + 12 * 512 * (6 * 768 + 2 * 3072) + 512 * (4 * 768 + 2);
    // and per attention block, tensors that are no module's output: the attention's context
    // and the two residual sums
    let beyond = 12 * 3 * 512 * 768;
    assert_eq!(
        v.saved + v.kept_fp32,
        outputs + 12 * (5 + 2) * 512 * 768 + beyond
    );
    assert_eq!(v.scores, 12 * 12 * 512 * 512 * 13 / 4);
    let t = detailed_bound(&p, &v);
    // CARMA v2: xlnet_base_cased_2.rad, batch 8, measured 9,192 MiB per GPU
    assert!(t.total_mib >= 9192, "{t:?}");
    // no looser than the bound from the profile's totals but for the relative blocks' 2 tensors
    // that no module outputs (12 × 2 × 512 × 768 values × 4 B × batch 8 = 288 MiB)
    assert!(
        t.total_mib <= analytic_upper_bound_mib(&p) + 288,
        "{t:?} {}",
        analytic_upper_bound_mib(&p)
    );
    assert_eq!(t.step_mib, 0, "activations outweigh Adam's temporary");
}

/// GPT-2 large's printout (the repository's, from its config class) at per-GPU batch 4 of the
/// 2-GPU task (CARMA v2 gpt2_large_2.rad: global batch 8, measured 28,356 MiB per GPU).
#[test]
fn gpt2_keeps_its_composite_gelu_and_lm_loss_and_no_scores() {
    use carma_estimator::analytic::{detailed_bound, detailed_bound_for};
    use carma_estimator::reading::printout_values;
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/data/model-printouts/gpt2_large_bs8_sl512.txt");
    let text = std::fs::read_to_string(&path).unwrap();
    let (p, v) = printout_values(&text, Family::Transformer, 4, 512).unwrap();
    // fused attention keeps no score tensor
    assert_eq!(v.scores, 0);
    // NewGELUActivation keeps 3 tensors of the 5,120-wide feed-forward per layer, the LM head's
    // cross-entropy 3 of the 50,257-wide logits and the allocator's 0.6 of one more, beyond the
    // module outputs
    let gelu = 3 * 36 * 512 * 5120;
    let loss = 3 * 512 * 50_257 + 512 * (50_257_u128 * 60).div_ceil(100);
    let (_, plain) = printout_values(
        &text.replace("NewGELUActivation", "GELUActivation"),
        Family::Transformer,
        4,
        512,
    )
    .unwrap();
    // the GELU's `pow` chain runs in fp32 under autocast
    assert_eq!(
        (plain.saved, plain.kept_fp32 + gelu),
        (v.saved, v.kept_fp32)
    );
    let (_, no_head) = printout_values(
        &text.replace("out_features=50257", "out_features=50256"),
        Family::Transformer,
        4,
        512,
    )
    .unwrap();
    // the logits are a Linear's output; the loss's tensors are fp32 under autocast
    assert_eq!(
        (no_head.saved + 512, no_head.kept_fp32 + loss),
        (v.saved, v.kept_fp32)
    );
    // what a second GPU holds is the multi-GPU term, not a doubled batch
    let one = detailed_bound(&p, &v);
    let two = detailed_bound_for(&p, &v, 2);
    assert_eq!(two.multi_gpu_mib, carma_estimator::MULTI_GPU_MIB);
    assert!(two.total_mib >= 28_356, "{two:?}");
    assert!(two.total_mib <= 28_356 + 4096, "{two:?}");
    assert!(one.total_mib < 28_356, "{one:?}");
}
