//! Features from a PyTorch module printout annotated with parameter counts: the
//! format of GPUMemNet's Transformer data (`print(model)` with `, <n> params` after
//! every module).
//!
//! ```text
//! XLNetForSequenceClassification(
//!   (transformer): XLNetModel(
//!     (word_embedding): Embedding(32000, 768), 24,576,000 params
//!     (layer): ModuleList(
//!       (0-11): 12 x XLNetLayer(
//!         (ff): XLNetFeedForward(
//!           (layer_1): Linear(in_features=768, out_features=3072, bias=True), 2,362,368 params
//!           …
//!       ), 7,678,464 params
//!     ), 92,141,568 params
//!   ), 116,718,336 params
//! ), 117,310,466 params
//! ```
//!
//! A printout has no output shapes, so the parser follows the hidden width
//! through the modules in printed order and counts, per sample of `seq_len`
//! tokens:
//!
//! * `Embedding(n, d)`: `seq × d`; `Linear` / `NonDynamicallyQuantizableLinear`
//!   (`out_features`), Hugging Face `Conv1D` (`nf`), `Conv2d` (out channels):
//!   `seq × out`; `LayerNorm` / `RMSNorm` (first dimension, else the current width, as
//!   `T5LayerNorm()` prints none, else, before any module has given a width, its parameter
//!   count: a weight of the width, or twice it with a bias, counted over): `seq × d`;
//!   `Dropout` and activation modules (`torch.nn` names, `*Activation`): `seq ×`
//!   the current width; anything else (`Identity`, containers): nothing.
//! * each attention block — the innermost module whose type name contains
//!   `Attention`, or a `NonDynamicallyQuantizableLinear` (the output projection of
//!   `nn.MultiheadAttention`) — adds its score tensors, which are not modules:
//!   `3 × heads × seq²` (the raw scores, alive while the softmax runs; the softmax
//!   output and the dropout output, both saved for backward), with `heads` = the
//!   width at the block's end / 64 (the head size of BERT, GPT-2 and XLNet), at
//!   least 1.
//!
//! A module's arguments may span lines (a multi-line `extra_repr`: xLSTM's backend prints its
//! configuration as JSON, a `ParameterList` one parameter a line): a line that opens more
//! parentheses than it closes, and does not end with the `(` of a container, is read together
//! with the lines after it until they balance.
//!
//! Printed order is definition order, not execution order, so the widths are an
//! approximation (an activation printed after the second feed-forward linear is
//! counted at that linear's width).
//!
//! Layer counts follow GPUMemNet's transformer features: `attention` (the blocks
//! above), `linear` (`Linear`, `LazyLinear`, `Conv1D`), `layerNorm`, `dropout`;
//! `conv2d` as well. A repeated block `(0-11): 12 x Layer(…), n params` stands for
//! 12 copies of one layer of `n` parameters (PyTorch prints one copy's repr).
//!
//! What a training step keeps (the detailed bound's reading,
//! [`crate::reading::printout_values`]) differs from the profile's `activations`:
//!
//! * module outputs as above, each once (no score tensors);
//! * an attention block whose own parameters (its count less its children's) hold
//!   whole `width × width` matrices — XLNet's q, k, v, o and r, which are bare
//!   parameters, not `Linear` modules — adds one `seq × width` output per matrix, and a
//!   relative-position block 2 more ([`crate::printout_rules::RELATIVE_EXTRA_WIDTHS`]: its
//!   biased queries and its position projection's second half, less what is freed);
//! * scores by the block's kind ([`crate::printout_rules`]): none for fused attention, 3.25
//!   `heads × seq²` tensors per relative-position block (twice with an LM head: two streams),
//!   2.25 per block with a learned position bias (T5), 3.25 and a caveat for a kind with no rule;
//!   a chunked delta-rule block (`*Delta*Attention`) none, but its per-channel decays within each
//!   chunk ([`crate::printout_rules::DELTA_DECAY_TENSORS`]);
//! * a Mamba-style mixer (a container of `conv1d`, `in_proj` and `out_proj` with parameters of its
//!   own) adds its reference scan's states in fp32 ([`crate::printout_scan`]): a selective scan's
//!   `seq × d_inner × d_state` tensors, a chunked scan's per-head states and intra-chunk scores; one
//!   whose parts do not size it counts 256 states per channel, with a caveat;
//! * a shared layer group (ALBERT's) counts once per run, its parameters once;
//! * a module type with no rule, or a container holding a parameter matrix no rule reads, makes
//!   every value count [`crate::FALLBACK_PERCENT`] %, with a caveat;
//! * a GELU written as elementwise operations ([`COMPOSITE_GELUS`], GPT-2's `NewGELUActivation`)
//!   keeps [`COMPOSITE_GELU_TENSORS`] more tensors for backward, each the size of the widest output
//!   in its block (the feed-forward's inner width);
//! * a language-model head — a `Linear` whose `out_features` is the vocabulary of the first
//!   `Embedding` (or of a subclass named `…Embedding` with its sizes) — feeds a cross-entropy over the vocabulary that keeps [`LM_LOSS_TENSORS`] more
//!   tensors of the logits' size (the log-probabilities, and in backward their gradient and the
//!   logits'), and 0.6 of a tensor more that the caching allocator keeps ([`LM_CACHED_LOGITS_PERCENT`]);
//! * tensors of a layer that are no module's output: each attention block's context (the fused
//!   kernel's output, which the output projection saves) and [`RESIDUAL_SUMS`] residual sums
//!   (which the norms after them save), and a gated feed-forward's product (two linears of the
//!   block's widest output beside an activation: `act(gate(x)) × up(x)`);
//! * an activation module at its block's widest output (the feed-forward's inner width), whatever
//!   its printed position.
//!
//! Under mixed precision, embeddings, norms, residual sums, a composite GELU's intermediates and
//! the loss's tensors stay fp32 (CUDA autocast's fp32 list; [`SavedValues::kept_fp32`]); the
//! rest counts at 16 bits. `python -m carma_profile.breakdown JOB` shows each of these in a
//! traced step.
//!
//! Parameters are the outermost module's count; every module's count must be at
//! least the sum of its children's (a module can hold parameters of its own, as
//! `XLNetRelativeAttention` does), unless it falls short by whole copies of one
//! module's count, no more copies than modules inside it have that count: a tensor
//! several modules share, counted once by `parameters()` (a head tied to the
//! embedding; T5's encoder, decoder and head on one embedding). Lines after the
//! outermost module closes (a `Total params` footer, say) are ignored.

use crate::caveat::{CaveatKind, Caveats, with_fallback_factor};
use crate::layer_reading::SavedValues;
use crate::limits::{MAX_BATCH_SIZE, MAX_SEQ_LENGTH};
pub use crate::printout_counts::{HEAD_DIM, SCORE_TENSORS};
use crate::printout_counts::{
    Open, Totals, close_module, is_activation, is_lm_head, kept_beyond_output, leaf,
};
pub use crate::printout_error::PrintoutError;
use crate::printout_line::{is_name_byte, logical_lines, module_line, params_suffix, positional};
use crate::printout_rules::{RuleState, is_position_bias, known_leaf};
use crate::printout_scan::MixerParts;
use crate::profile::{Family, Layers, Profile};

/// Whether `text` looks like a module printout (its first non-blank line is
/// `Name(`), as opposed to a torchsummary table.
pub fn looks_like_printout(text: &str) -> bool {
    text.lines()
        .map(str::trim)
        .find(|l| !l.is_empty())
        .and_then(|l| l.strip_suffix('('))
        .is_some_and(|name| !name.is_empty() && name.bytes().all(is_name_byte))
}

/// Parses a module printout into a transformer [`Profile`] at `batch_size` and
/// `seq_len` tokens per sample (see the module docs).
pub fn parse_printout(
    text: &str,
    family: Family,
    batch_size: u32,
    seq_len: u32,
) -> Result<Profile, PrintoutError> {
    parse_printout_values(text, family, batch_size, seq_len).map(|(p, _)| p)
}

/// [`parse_printout`] with what the detailed bound counts (see "What a training step
/// keeps" in the module docs).
pub(crate) fn parse_printout_values(
    text: &str,
    family: Family,
    batch_size: u32,
    seq_len: u32,
) -> Result<(Profile, SavedValues), PrintoutError> {
    parse_printout_reading(text, family, batch_size, seq_len, None).map(|(p, v, _)| (p, v))
}

/// [`parse_printout_values`] with what it had no rule for ([`crate::printout_rules`]); a shared
/// layer group runs `shared_runs` times when given.
pub(crate) fn parse_printout_reading(
    text: &str,
    family: Family,
    batch_size: u32,
    seq_len: u32,
    shared_runs: Option<u32>,
) -> Result<(Profile, SavedValues, Caveats), PrintoutError> {
    if family != Family::Transformer {
        return Err(PrintoutError::WrongFamily(family));
    }
    for (what, value, max) in [
        ("batch size", batch_size, MAX_BATCH_SIZE),
        ("sequence length", seq_len, MAX_SEQ_LENGTH),
    ] {
        if !(1..=max).contains(&value) {
            return Err(PrintoutError::OutOfRange { what, value, max });
        }
    }
    let seq = u128::from(seq_len);
    let mut stack: Vec<Open> = Vec::new();
    let mut totals = Totals::default();
    let mut width: Option<u64> = None;
    // the first Embedding's vocabulary: a Linear with that many outputs is an LM head
    let mut vocab: Option<u64> = None;
    let mut root_params: Option<u64> = None;
    let mut rules = RuleState::new(shared_runs);
    // whether a Linear as wide as the vocabulary (a language-model head) was read
    let mut lm_head = false;
    // Counts of the modules closed on their line, in order, with their repeats.
    let mut leaf_counts: Vec<(u64, u32)> = Vec::new();
    for (line_no, line) in logical_lines(text) {
        let line = &*line;
        if root_params.is_some() {
            break; // footer after the outermost module
        }
        if line.is_empty() {
            continue;
        }
        let bad = |reason: &str| PrintoutError::BadLine {
            line: line_no,
            text: line.chars().take(120).collect(),
            reason: reason.to_string(),
        };
        if let Some(rest) = line.strip_prefix(')') {
            let open = stack.pop().ok_or_else(|| bad("`)` closes no module"))?;
            let count = params_suffix(rest)
                .ok_or_else(|| bad("expected `)` followed by `, <n> params`"))?;
            let inside = &leaf_counts[open.leaves_from..];
            let own = close_module(
                open,
                inside,
                count,
                line_no,
                (&mut totals, &mut rules),
                width,
                seq,
            )?;
            match stack.last_mut() {
                Some(parent) => parent.children_params = parent.children_params.saturating_add(own),
                None => root_params = Some(count),
            }
            continue;
        }
        let is_root = stack.is_empty();
        let m = module_line(line, is_root).map_err(&bad)?;
        match m.args {
            None => stack.push(Open {
                kind: m.kind.to_string(),
                line: line_no,
                repeat: m.repeat,
                children_params: 0,
                before: totals,
                max_width: 0,
                widest_linears: 0,
                activation: false,
                bias_heads: None,
                leaves_from: leaf_counts.len(),
                mixer: MixerParts::default(),
            }),
            Some(args) => {
                let count = m
                    .params
                    .ok_or_else(|| bad("a module must end with `, <n> params`"))?;
                let before = totals;
                if let Some(parent) = stack.last_mut() {
                    parent.mixer.see(m.key, m.kind, args);
                }
                if !known_leaf(m.kind) {
                    rules.unknown_module(m.kind, "no rule sizes its output");
                }
                if let Some(parent) = stack.last_mut()
                    && parent.kind.contains("Attention")
                    && let Some(heads) = positional(args, 1)
                    && is_position_bias(m.kind, heads, width)
                {
                    // A learned position bias (T5): one `heads × seq²` table per sample, shared by
                    // the blocks after it; it sets the block's heads, not the width.
                    parent.bias_heads = Some(heads);
                    let table = u128::from(heads).saturating_mul(seq).saturating_mul(seq);
                    totals.score_quarters = totals.score_quarters.saturating_add(4 * table);
                    leaf_counts.push((count, m.repeat));
                    parent.children_params = parent
                        .children_params
                        .saturating_add(u128::from(count) * u128::from(m.repeat));
                    continue;
                }
                let siblings_width = stack.last().map_or(0, |p| p.max_width);
                leaf(
                    m.kind,
                    args,
                    count,
                    seq,
                    &mut width,
                    siblings_width,
                    (&mut totals, &mut rules),
                )
                .map_err(&bad)?;
                lm_head |= is_lm_head(m.kind, args, vocab);
                // `Embedding(n, d)` or a subclass of it (XGLM's, BART's `…ScaledWordEmbedding`);
                // a position table without sizes (`…SinusoidalPositionalEmbedding()`) is none
                if m.kind.ends_with("Embedding") && vocab.is_none() && positional(args, 1).is_some()
                {
                    vocab = positional(args, 0);
                }
                let block_width = match stack.last_mut() {
                    Some(parent) => {
                        let w = width.unwrap_or(0);
                        if matches!(m.kind, "Linear" | "LazyLinear" | "Conv1D") {
                            match w.cmp(&parent.max_width) {
                                std::cmp::Ordering::Greater => parent.widest_linears = 1,
                                std::cmp::Ordering::Equal => parent.widest_linears += 1,
                                std::cmp::Ordering::Less => {}
                            }
                        }
                        parent.activation |= is_activation(m.kind);
                        parent.max_width = parent.max_width.max(w);
                        parent.max_width
                    }
                    None => width.unwrap_or(0),
                };
                // a composite GELU's `pow` chain and a loss run in fp32 under autocast
                let kept = kept_beyond_output(m.kind, args, vocab, block_width);
                totals.kept_fp32 = totals.kept_fp32.saturating_add(kept.saturating_mul(seq));
                if m.repeat > 1 {
                    totals.repeat(&before, u128::from(m.repeat - 1));
                }
                leaf_counts.push((count, m.repeat));
                let own = u128::from(count) * u128::from(m.repeat);
                match stack.last_mut() {
                    Some(parent) => {
                        parent.children_params = parent.children_params.saturating_add(own)
                    }
                    None => root_params = Some(count),
                }
            }
        }
    }
    if let Some(open) = stack.pop() {
        return Err(PrintoutError::Unclosed {
            module: open.kind,
            line: open.line,
        });
    }
    let parameters = root_params.ok_or(PrintoutError::Empty)?;
    if totals.attention + totals.layer_norm == 0 {
        return Err(PrintoutError::NotTransformer);
    }
    let count = |n: u64| u32::try_from(n).unwrap_or(u32::MAX);
    let layers = Layers {
        linear: count(totals.linear),
        conv2d: count(totals.conv2d),
        dropout: count(totals.dropout),
        layer_norm: count(totals.layer_norm),
        attention: count(totals.attention),
        ..Layers::default()
    };
    let mut profile = Profile {
        family,
        batch_size,
        parameters,
        activations: u64::try_from(totals.activations).unwrap_or(u64::MAX),
        depth: None,
        activation: None,
        layers,
        seq_length: Some(seq_len),
        optimizer: None,
        mixed_precision: None,
        traced: None,
        layer_reading: None,
        caveats: Vec::new(),
    };
    profile.validate()?;
    profile.depth = Some(profile.effective_depth());
    tracing::debug!(
        parameters,
        activations = profile.activations,
        "parsed module printout"
    );
    if lm_head && totals.relative_quarters > 0 {
        // XLNet with its language-model head: the two-stream objective (permutation LM) runs
        // every relative block once for the content stream and once for the query stream.
        totals.saved = totals.saved.saturating_add(totals.relative_saved);
        totals.score_quarters = totals
            .score_quarters
            .saturating_add(totals.relative_quarters);
    }
    let mut values = SavedValues {
        saved: totals.saved,
        largest: totals.largest,
        scores: totals.score_quarters.div_ceil(4),
        kept_fp32: totals.kept_fp32,
    };
    if rules.caveats.has(CaveatKind::UnknownModule) {
        values = SavedValues {
            saved: with_fallback_factor(values.saved),
            largest: with_fallback_factor(values.largest),
            scores: with_fallback_factor(values.scores),
            kept_fp32: with_fallback_factor(values.kept_fp32),
        };
    }
    Ok((profile, values, rules.caveats))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(text: &str) -> Result<Profile, PrintoutError> {
        parse_printout(text, Family::Transformer, 2, 10)
    }

    const TINY: &str = "Net(
  (emb): Embedding(100, 128), 12,800 params
  (layers): ModuleList(
    (0-1): 2 x Block(
      (attn): MultiheadAttention(
        (out_proj): NonDynamicallyQuantizableLinear(in_features=128, out_features=128, bias=True), 16,512 params
      ), 66,048 params
      (norm): LayerNorm((128,), eps=1e-05, elementwise_affine=True), 256 params
      (ff): Linear(in_features=128, out_features=512, bias=True), 66,048 params
      (act): GELU(approximate='none'), 0 params
      (drop): Dropout(p=0.1, inplace=False), 0 params
    ), 132,352 params
  ), 264,704 params
), 277,504 params
Total params: 1
";

    #[test]
    fn tiny_model() {
        let p = parse(TINY).unwrap();
        assert_eq!(p.parameters, 277_504);
        // seq 10: emb 1280; per block: out_proj 1280 + 3 × 2 heads × 100 scores,
        // norm 1280, ff 5120, act 5120, drop 5120 → 18,520 × 2 blocks
        assert_eq!(p.activations, 1280 + 2 * 18_520);
        assert_eq!(p.layers.attention, 2);
        assert_eq!(p.layers.linear, 2);
        assert_eq!(p.layers.layer_norm, 2);
        assert_eq!(p.layers.dropout, 2);
        assert_eq!(p.seq_length, Some(10));
        assert_eq!(p.depth, Some(8));
    }

    #[test]
    fn tiny_model_values() {
        let (_, v) = parse_printout_values(TINY, Family::Transformer, 2, 10).unwrap();
        // seq 10, per block: out_proj 1280, ff 5120, act 5120, drop 5120 and the attention's
        // context 1280 in 16 bits under autocast; the norm 1280 and the two residual sums
        // 2 × 1280 in fp32, as the embedding's 1280; no score tensor
        assert_eq!(v.saved, 2 * 17_920);
        assert_eq!(v.kept_fp32, 1280 + 2 * 3840);
        // a plain block runs fused attention: no score tensor
        assert_eq!(v.scores, 0);
        assert_eq!(v.largest, 5120);
        // a relative-position block keeps 3.25 per head, and its bare projections
        // (own parameters / width²) count as outputs: 2 × 128² + 4 → 2 projections
        let relative = TINY.replace(
            "(attn): MultiheadAttention(\n        (out_proj): NonDynamicallyQuantizableLinear(in_features=128, out_features=128, bias=True), 16,512 params\n      ), 66,048 params",
            "(attn): RelativeAttention(\n        (norm): LayerNorm((128,), eps=1e-05, elementwise_affine=True), 256 params\n      ), 33,028 params",
        )
        .replace("132,352 params", "99,332 params")
        .replace("264,704 params", "198,664 params")
        .replace("277,504 params", "211,464 params");
        let (_, r) = parse_printout_values(&relative, Family::Transformer, 2, 10).unwrap();
        assert_eq!(r.scores, (2 * 13 * 2 * 100_u128).div_ceil(4));
        // the two projections (2 × 1280) in place of out_proj (1280), and the 2 tensors relative
        // scores keep beyond them (2 × 1280), per block
        assert_eq!(r.saved, v.saved + 2 * 10 * 128 + 2 * 2 * 10 * 128);
        // and the norm inside the attention block, in fp32
        assert_eq!(r.kept_fp32, v.kept_fp32 + 2 * 10 * 128);
    }

    #[test]
    fn a_module_shared_by_two_parents_counts_once() {
        // The output layer tied to the embedding: PyTorch's `parameters()` counts the shared
        // weight once, so the root has exactly the head's 12,800 less than its children.
        let tied = TINY.replace(
            "  ), 264,704 params\n), 277,504 params",
            "  ), 264,704 params\n  (head): Linear(in_features=128, out_features=100, bias=False), 12,800 params\n), 277,504 params",
        );
        assert_eq!(parse(&tied).unwrap().parameters, 277_504);
        // Shared three times (T5: encoder, decoder and head on one embedding): two copies less.
        let t5 = tied.replace(
            "), 277,504 params",
            "  (head2): Linear(in_features=128, out_features=100, bias=False), 12,800 params\n), 277,504 params",
        );
        assert_eq!(parse(&t5).unwrap().parameters, 277_504);
        // Copies of a count need that many modules with it: 2 × 256 short with one 256-param
        // LayerNorm inside is refused.
        let norms = TINY.replace("), 277,504 params", "), 276,992 params");
        assert!(matches!(
            parse(&norms),
            Err(PrintoutError::ParamMismatch { count: 276_992, .. })
        ));
        // Any other shortfall is still an edited or cut printout.
        let short = tied.replace("), 277,504 params", "), 277,000 params");
        assert!(matches!(
            parse(&short),
            Err(PrintoutError::ParamMismatch { count: 277_000, .. })
        ));
    }

    #[test]
    fn a_norm_without_its_size_normalises_the_current_width() {
        let t5 = TINY.replace(
            "(norm): LayerNorm((128,), eps=1e-05, elementwise_affine=True), 256 params",
            "(norm): T5LayerNorm(), 256 params",
        );
        assert_eq!(parse(&t5).unwrap(), parse(TINY).unwrap());
    }

    #[test]
    fn a_gated_feed_forward_keeps_its_product() {
        let mlp = |gate_out: u32| {
            format!(
                "Net(
  (emb): Embedding(100, 128), 12,800 params
  (attn): Attention(
    (o): Linear(in_features=128, out_features=128, bias=False), 16,384 params
  ), 16,384 params
  (mlp): Mlp(
    (gate): Linear(in_features=128, out_features={gate_out}, bias=False), {} params
    (up): Linear(in_features=128, out_features=512, bias=False), 65,536 params
    (down): Linear(in_features=512, out_features=128, bias=False), 65,536 params
    (act): SiLU(), 0 params
  ), {} params
), {} params
",
                128 * gate_out,
                128 * gate_out + 131_072,
                128 * gate_out + 131_072 + 29_184
            )
        };
        let values = |text: &str| {
            parse_printout_values(text, Family::Transformer, 1, 10)
                .unwrap()
                .1
        };
        // gate and up both 512 wide with an activation: act(gate) × up, 10 × 512 more values;
        // a 256-wide gate is no gate of the up projection's width
        let (gated, plain) = (values(&mlp(512)), values(&mlp(256)));
        assert_eq!(gated.saved, plain.saved + 256 * 10 + 10 * 512);
    }

    #[test]
    fn errors_name_the_line() {
        let cases = [
            (
                TINY.replace("), 66,048 params\n      (norm)", ")\n      (norm)"),
                7,
            ),
            (TINY.replace("(act): GELU", "act: GELU"), 10),
            (TINY.replace("277,504", "1,000"), 14),
            (TINY.replace("Embedding(100, 128)", "Embedding(100)"), 2),
            (TINY.replace("0-1): 2 x", "0-1): 0 x"), 4),
        ];
        for (text, line) in cases {
            let e = parse(&text).unwrap_err();
            let msg = e.to_string();
            assert!(msg.contains(&format!("line {line}:")), "{msg}");
        }
        let cut: Vec<&str> = TINY.lines().take(9).collect();
        assert_eq!(
            parse(&cut.join("\n")),
            Err(PrintoutError::Unclosed {
                module: "Block".into(),
                line: 4
            })
        );
        assert_eq!(parse("\n\n"), Err(PrintoutError::Empty));
        assert!(matches!(
            parse_printout(TINY, Family::Cnn, 2, 10),
            Err(PrintoutError::WrongFamily(Family::Cnn))
        ));
        assert!(matches!(
            parse_printout(TINY, Family::Transformer, 2, 0),
            Err(PrintoutError::OutOfRange { .. })
        ));
    }
}
