//! The misses of the architecture sweep (`python -m carma_profile.sweep`, docs/estimator-sweep.md),
//! each against its floor: the training step's largest phase peak of live tensors, traced on fake
//! tensors by `carma_profile.trace`, plus the CUDA context measured on the H100. A GPU run holds at
//! least that much, so the bound must not be below it. The descriptions are the sweep's own, written
//! by `carma_profile/describe.py` from the architectures (no weights); the peaks are in
//! `data/sweep/floors.csv`.

use std::path::PathBuf;

use carma_estimator::analytic::detailed_bound;
use carma_estimator::reading::{printout_reading, summary_reading};
use carma_estimator::{Family, INPUT_SAVING_PERCENT};

fn data(rel: &str) -> String {
    let p = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/data/sweep")
        .join(rel);
    std::fs::read_to_string(&p).unwrap_or_else(|e| panic!("{}: {e}", p.display()))
}

struct Floor {
    arch: String,
    description: String,
    family: Family,
    batch: u32,
    /// Tokens per sample of a module printout; none for a table.
    seq_len: Option<u32>,
    floor_mib: u64,
}

fn floors() -> Vec<Floor> {
    data("floors.csv")
        .lines()
        .skip(1)
        .map(|l| {
            let c: Vec<&str> = l.split(',').collect();
            Floor {
                arch: c[0].to_string(),
                description: c[1].to_string(),
                family: c[2].parse().unwrap(),
                batch: c[3].parse().unwrap(),
                seq_len: c[4].parse().ok(),
                floor_mib: c[5].parse::<u64>().unwrap() + c[6].parse::<u64>().unwrap(),
            }
        })
        .collect()
}

#[test]
fn every_miss_of_the_sweep_is_covered() {
    let all = floors();
    assert!(!all.is_empty());
    for f in all {
        let text = data(&f.description);
        let r = match f.seq_len {
            Some(seq) => printout_reading(&text, f.family, f.batch, seq, None).unwrap(),
            None => summary_reading(&text, f.family, f.batch, false).unwrap(),
        };
        let bound = detailed_bound(&r.profile, &r.values).total_mib;
        assert!(
            bound >= f.floor_mib,
            "{} at batch {}: {bound} MiB < {} MiB",
            f.arch,
            f.batch,
            f.floor_mib
        );
    }
}

/// EfficientNet's activations (SiLU) save their input: nearly every row's output is a tensor kept for
/// backward, and its values count in full rather than at the CNN family's fitted 0.8.
#[test]
fn a_table_of_input_saving_activations_keeps_every_row() {
    let text = data("efficientnet_v2_l.model");
    let silu = summary_reading(&text, Family::Cnn, 64, false).unwrap();
    let relu = summary_reading(&text.replace("SiLU-", "ReLU-"), Family::Cnn, 64, false).unwrap();
    // with ReLU rows at half weight and the fitted factor; with SiLU rows in full and 1.0
    assert!(silu.values.saved > relu.values.saved * INPUT_SAVING_PERCENT / 100);
    assert!(silu.caveats.is_empty(), "{:?}", silu.caveats);
}

/// XGLM's word embedding is a subclass (`XGLMScaledWordEmbedding(256008, 1024)`): its vocabulary
/// still marks the tied `lm_head` as a language-model head, whose loss keeps logit-sized tensors.
#[test]
fn an_embedding_subclass_gives_the_vocabulary_of_the_lm_head() {
    let text = data("XGLMForCausalLM.txt");
    let with_head = printout_reading(&text, Family::Transformer, 8, 128, None).unwrap();
    let plain = text.replace("XGLMScaledWordEmbedding", "Embedding");
    let plain = printout_reading(&plain, Family::Transformer, 8, 128, None).unwrap();
    assert_eq!(with_head.values, plain.values);
    // the loss's tensors over the vocabulary: beyond the logits themselves
    assert!(
        with_head.values.kept_fp32 >= 3 * 256_008 * 128,
        "{:?}",
        with_head.values
    );
}

/// The printouts the reader refused in the sweep (its "not estimated" rows): a module whose
/// arguments span lines (xLSTM's `xLSTMBackend(xLSTMConfig {…})`, a configuration printed as JSON;
/// Reformer's `ParameterList(  (0): Parameter containing: […]\n  (1): …)`, its parameters one a
/// line), and a norm that prints no size before any module has given a width (CpmAnt's
/// `CpmAntLayerNorm()`, first in its printout because the embeddings are defined after the
/// encoder). Each is read now; what no rule sizes is counted conservatively and said.
#[test]
fn the_printouts_the_reader_refused_are_read() {
    for (file, fallback) in [
        ("CpmAntForCausalLM.txt", None),
        ("xLSTMForCausalLM.txt", Some("xLSTMBackend")),
        ("ReformerForMaskedLM.txt", Some("ParameterList")),
    ] {
        let text = data(file);
        let r = printout_reading(&text, Family::Transformer, 2, 128, None)
            .unwrap_or_else(|e| panic!("{file}: {e}"));
        let root = text.lines().rfind(|l| l.starts_with("), ")).unwrap();
        let params: u64 = root[3..]
            .trim_end_matches(" params")
            .replace(',', "")
            .parse()
            .unwrap();
        assert_eq!(r.profile.parameters, params, "{file}");
        let said: Vec<String> = r.caveats.iter().map(|c| c.to_string()).collect();
        if let Some(module) = fallback {
            assert!(said.iter().any(|w| w.contains(module)), "{file}: {said:?}");
        }
    }
}

/// A norm with no printed size before any width is known normalises its own parameter count's
/// worth of features (a weight of that length; with a bias, half as many: counted over, not under).
#[test]
fn a_norm_before_any_width_is_sized_by_its_parameters() {
    let text = data("CpmAntForCausalLM.txt");
    let r = printout_reading(&text, Family::Transformer, 2, 128, None).unwrap();
    let sized = text.replacen(
        "CpmAntLayerNorm(), 4,096 params",
        "CpmAntLayerNorm((4096,)), 4,096 params",
        1,
    );
    let sized = printout_reading(&sized, Family::Transformer, 2, 128, None).unwrap();
    assert_eq!(r.values, sized.values);
    assert_eq!(r.profile, sized.profile);
}

/// A Mamba-style mixer's reference scan keeps its states for backward (`printout_scan`): Zamba's
/// selective scan `seq × d_inner × d_state` per token and mixer, Zamba-2's chunked scan its
/// repeated `B` and `C` and its intra-chunk scores. Read as plain modules (the `conv1d` renamed, so
/// no mixer is recognised: the reading the sweep had), both bounds are under their traced floors.
#[test]
fn a_mamba_mixer_keeps_its_scan_states() {
    for (file, batch, floor_mib) in [
        ("ZambaForSequenceClassification.txt", 8, 232_683 + 770),
        ("Zamba2ForSequenceClassification.txt", 16, 84_473 + 770),
    ] {
        let bound = |text: &str| {
            let r = printout_reading(text, Family::Transformer, batch, 128, None).unwrap();
            detailed_bound(&r.profile, &r.values).total_mib
        };
        let text = data(file);
        let plain = text.replace("(conv1d)", "(conv)");
        assert!(bound(&plain) < floor_mib, "{file}: {}", bound(&plain));
        assert!(bound(&text) >= floor_mib, "{file}: {}", bound(&text));
    }
}
