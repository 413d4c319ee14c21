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
//!   `T5LayerNorm()` prints none): `seq × d`;
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
//! [`crate::analytic::printout_values`]) differs from the profile's `activations`:
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

use crate::analytic::SavedValues;
use crate::caveat::{CaveatKind, Caveats, with_fallback_factor};
use crate::printout_line::{first_dim, keyword, module_line, params_suffix, positional};
use crate::printout_rules::{
    AttentionRule, RELATIVE_EXTRA_WIDTHS, RuleState, is_position_bias, known_leaf,
};
use crate::profile::{Family, Layers, MAX_BATCH_SIZE, MAX_SEQ_LENGTH, Profile, ProfileError};

/// Head size assumed to infer the number of attention heads from the width.
pub const HEAD_DIM: u64 = 64;
/// Score-sized tensors per head of an attention block (see the module docs).
pub const SCORE_TENSORS: u128 = 3;
/// GELU modules written as elementwise operations (the tanh approximation spelled out):
/// autograd saves their intermediates, where `nn.GELU` / `GELUActivation` save only the input.
pub const COMPOSITE_GELUS: [&str; 2] = ["NewGELUActivation", "FastGELUActivation"];
/// Tensors a composite GELU keeps beyond its output, each the size of its input:
/// `0.5 × x × (1 + tanh(√(2/π) × (x + 0.044715 × x³)))` saves the tanh output, `0.5 × x` and
/// `1 + tanh(…)` for backward (the products with constants save nothing).
pub const COMPOSITE_GELU_TENSORS: u128 = 3;
/// Logit-sized tensors a cross-entropy over the vocabulary keeps beyond the logits: the
/// log-probabilities (saved for backward), then in backward their gradient and the logits'
/// gradient, alive together at the start of backward.
pub const LM_LOSS_TENSORS: u128 = 3;
/// Logits-sized memory, in percent of one fp32 logits tensor, that the caching allocator keeps
/// beyond the loss's tensors: blocks freed in backward that later, smaller requests split, so no
/// tensor can use the rest. Replaying the allocator over the traced step of CARMA's BERT-base
/// (masked LM, batch 32; `python -m carma_profile.calibrate`) reserves 1,117 MiB beyond its peak
/// of live tensors, 59 % of its 1,908 MiB logits; BERT-large's (batch 8) 16 MiB, 3 %. The larger,
/// rounded up to a tenth. A printout shows no allocator, so this is the only cached memory it
/// counts.
pub const LM_CACHED_LOGITS_PERCENT: u128 = 60;
/// Residual sums per attention block that the norms after them save: one after the attention,
/// one after the feed-forward. A decoder layer with cross-attention has three for its two
/// blocks, so this counts one too many there.
pub const RESIDUAL_SUMS: u128 = 2;

/// Why a module printout was rejected.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PrintoutError {
    /// Empty input.
    #[error("module printout is empty")]
    Empty,
    /// A line could not be read.
    #[error("module printout line {line}: {reason}: `{text}`")]
    BadLine {
        /// 1-based line number.
        line: usize,
        /// The line, trimmed (at most 120 characters).
        text: String,
        /// What is wrong.
        reason: String,
    },
    /// The input ended with modules still open.
    #[error("module printout ends inside `{module}` (opened on line {line}): it was cut")]
    Unclosed {
        /// The innermost open module's type.
        module: String,
        /// Where it was opened.
        line: usize,
    },
    /// A module's count is below its children's by more than one shared module's count.
    #[error(
        "module printout line {line}: `{module}` has {count} params but its children have {children}"
    )]
    ParamMismatch {
        /// 1-based line of the module's count.
        line: usize,
        /// The module's type.
        module: String,
        /// Its count.
        count: u64,
        /// The sum of its children's counts.
        children: u128,
    },
    /// Only the transformer family is read from printouts.
    #[error(
        "module printouts are read for the transformer family only (got `{0}`); use a torchsummary table"
    )]
    WrongFamily(Family),
    /// No attention or layer-norm module: not a transformer.
    #[error("module printout has no attention or LayerNorm module; it is not a transformer")]
    NotTransformer,
    /// Batch size or sequence length out of range.
    #[error("{what} {value} is out of range: 1 to {max}")]
    OutOfRange {
        /// `batch size` or `sequence length`.
        what: &'static str,
        /// The value given.
        value: u32,
        /// The largest allowed.
        max: u32,
    },
    /// The derived profile is unusable (e.g. zero parameters).
    #[error("module printout yields an invalid profile: {0}")]
    Profile(#[from] ProfileError),
}

/// Whether `text` looks like a module printout (its first non-blank line is
/// `Name(`), as opposed to a torchsummary table.
pub fn looks_like_printout(text: &str) -> bool {
    text.lines()
        .map(str::trim)
        .find(|l| !l.is_empty())
        .and_then(|l| l.strip_suffix('('))
        .is_some_and(|name| !name.is_empty() && name.bytes().all(is_name_byte))
}

pub(crate) fn is_name_byte(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b == b'_' || b == b'.'
}

/// Running totals; snapshots of them let a repeated block add its copies.
#[derive(Debug, Clone, Copy, Default)]
struct Totals {
    activations: u128,
    /// What the detailed bound counts: module outputs and bare projections…
    saved: u128,
    /// …the part of it kept in fp32 under mixed precision (see [`SavedValues::kept_fp32`])…
    kept_fp32: u128,
    /// …and score values in quarters of a tensor per head ([`AttentionRule::score_quarters`]).
    score_quarters: u128,
    largest: u128,
    /// What relative-attention blocks add to `saved` and `score_quarters`: a two-stream XLNet
    /// runs them twice.
    relative_saved: u128,
    relative_quarters: u128,
    linear: u64,
    attention: u64,
    layer_norm: u64,
    dropout: u64,
    conv2d: u64,
}

impl Totals {
    /// `self + (self - before) × extra`.
    fn repeat(&mut self, before: &Totals, extra: u128) {
        let more = |now: u128, then: u128| now.saturating_add((now - then).saturating_mul(extra));
        let more64 = |now: u64, then: u64| {
            u64::try_from(more(u128::from(now), u128::from(then))).unwrap_or(u64::MAX)
        };
        self.activations = more(self.activations, before.activations);
        self.saved = more(self.saved, before.saved);
        self.kept_fp32 = more(self.kept_fp32, before.kept_fp32);
        self.score_quarters = more(self.score_quarters, before.score_quarters);
        self.relative_saved = more(self.relative_saved, before.relative_saved);
        self.relative_quarters = more(self.relative_quarters, before.relative_quarters);
        self.linear = more64(self.linear, before.linear);
        self.attention = more64(self.attention, before.attention);
        self.layer_norm = more64(self.layer_norm, before.layer_norm);
        self.dropout = more64(self.dropout, before.dropout);
        self.conv2d = more64(self.conv2d, before.conv2d);
    }
}

/// A module whose `(` is still open.
struct Open {
    kind: String,
    line: usize,
    repeat: u32,
    children_params: u128,
    before: Totals,
    /// The widest output of the modules closed on their line directly inside it.
    max_width: u64,
    /// How many linears directly inside it have that widest output, and whether an activation
    /// is among its modules: two and one make a gated feed-forward.
    widest_linears: u32,
    activation: bool,
    /// The heads of a position-bias table inside it (T5's `relative_attention_bias`).
    bias_heads: Option<u64>,
    /// Where its modules closed on their line start in the parser's list of their counts.
    leaves_from: usize,
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
    for (i, raw) in text.lines().enumerate() {
        let line_no = i + 1;
        let line = raw.trim();
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
            }),
            Some(args) => {
                let count = m
                    .params
                    .ok_or_else(|| bad("a module must end with `, <n> params`"))?;
                let before = totals;
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

/// Ends a container: checks its count against its children, counts it as an
/// attention block when it is the innermost one, multiplies a repeated block.
/// Returns the parameters it adds to its parent.
fn close_module(
    open: Open,
    leaves: &[(u64, u32)],
    count: u64,
    line: usize,
    (totals, rules): (&mut Totals, &mut RuleState),
    width: Option<u64>,
    seq: u128,
) -> Result<u128, PrintoutError> {
    // PyTorch counts a tensor several modules share once: a language model's output layer tied
    // to its embedding (RoBERTa's head adds its own bias to the shared weight), T5's encoder,
    // decoder and head all on one embedding. So a parent may fall short of its children by whole
    // copies of one module's count, no more copies than modules inside it have that count; any
    // other shortfall means an edited or cut printout.
    let excess = open.children_params.saturating_sub(u128::from(count));
    let shared = excess > 0 && {
        let mut have: std::collections::HashMap<u64, u128> = std::collections::HashMap::new();
        for &(c, n) in leaves.iter().filter(|&&(c, _)| c > 0) {
            *have.entry(c).or_default() += u128::from(n);
        }
        have.iter()
            .any(|(&c, &n)| excess % u128::from(c) == 0 && excess / u128::from(c) <= n)
    };
    if excess > 0 && !shared {
        return Err(PrintoutError::ParamMismatch {
            line,
            module: open.kind,
            count,
            children: open.children_params,
        });
    }
    let own = u128::from(count).saturating_sub(open.children_params);
    let w = u128::from(width.unwrap_or(0));
    if open.kind.contains("Attention") && totals.attention == open.before.attention {
        let rule = rules.attention(&open.kind, open.bias_heads.is_some());
        add_attention(totals, width, seq, rule, open.bias_heads);
        // projections held as bare parameters (XLNet's q, k, v, o and r) are not
        // modules: their outputs are counted from the block's own parameters
        if w > 0 {
            let projections = own / (w * w);
            let mut outputs = projections.saturating_mul(seq).saturating_mul(w);
            if rule == AttentionRule::Relative {
                outputs = outputs
                    .saturating_add(RELATIVE_EXTRA_WIDTHS.saturating_mul(seq).saturating_mul(w));
                totals.relative_saved = totals.relative_saved.saturating_add(outputs);
            }
            totals.saved = totals.saved.saturating_add(outputs);
        }
    } else if w > 0 && own >= w * w && !open.kind.contains("Attention") {
        rules.unknown_module(
            &open.kind,
            "holds a parameter matrix of its own that no rule reads",
        );
    }
    if open.widest_linears >= 2 && open.activation {
        // A gated feed-forward (Llama's gate_proj, up_proj and act_fn; T5 v1.1's wi_0 and
        // wi_1) keeps act(gate(x)) × up(x), the down projection's input: no module's output.
        let product = seq.saturating_mul(u128::from(open.max_width));
        totals.saved = totals.saved.saturating_add(product);
    }
    // A shared layer group (ALBERT) runs its one set of parameters several times.
    let runs = rules.shared_runs(&open.kind).unwrap_or(1).max(1);
    let copies = u128::from(open.repeat).saturating_mul(u128::from(runs));
    if copies > 1 {
        totals.repeat(&open.before, copies - 1);
    }
    Ok(u128::from(count) * u128::from(open.repeat))
}

/// One attention block and its score tensors (see the module docs).
fn add_attention(
    totals: &mut Totals,
    width: Option<u64>,
    seq: u128,
    rule: AttentionRule,
    heads: Option<u64>,
) {
    let heads = u128::from(heads.unwrap_or(width.unwrap_or(0) / HEAD_DIM).max(1));
    let per_head = seq.saturating_mul(seq);
    totals.attention = totals.attention.saturating_add(1);
    totals.activations = totals
        .activations
        .saturating_add(SCORE_TENSORS.saturating_mul(heads).saturating_mul(per_head));
    let quarters = rule
        .score_quarters()
        .saturating_mul(heads)
        .saturating_mul(per_head);
    totals.score_quarters = totals.score_quarters.saturating_add(quarters);
    if rule == AttentionRule::Relative {
        totals.relative_quarters = totals.relative_quarters.saturating_add(quarters);
    }
    // Tensors of a Transformer layer that are no module's output: the attention's context (the
    // fused kernel's output, which the output projection saves as its input), and the two
    // residual sums around the attention and the feed-forward, which the norms after them save
    // (fp32 under autocast: a 16-bit output added to the fp32 stream).
    let w = u128::from(width.unwrap_or(0)).saturating_mul(seq);
    totals.saved = totals.saved.saturating_add(w);
    totals.kept_fp32 = totals
        .kept_fp32
        .saturating_add(RESIDUAL_SUMS.saturating_mul(w));
}

/// Values per token that a module closed on its line keeps beyond its output (see the module
/// docs): a composite GELU's intermediates at its block's widest output, an LM head's loss
/// tensors at the vocabulary.
fn kept_beyond_output(kind: &str, args: &str, vocab: Option<u64>, block_width: u64) -> u128 {
    if COMPOSITE_GELUS.contains(&kind) {
        return COMPOSITE_GELU_TENSORS.saturating_mul(u128::from(block_width));
    }
    match vocab {
        Some(v) if is_lm_head(kind, args, vocab) => {
            let v = u128::from(v);
            LM_LOSS_TENSORS
                .saturating_mul(v)
                .saturating_add(v.saturating_mul(LM_CACHED_LOGITS_PERCENT).div_ceil(100))
        }
        _ => 0,
    }
}

/// Whether a module is a language-model head: a `Linear` as wide as the first `Embedding`'s (or
/// sized `…Embedding` subclass's) vocabulary.
fn is_lm_head(kind: &str, args: &str, vocab: Option<u64>) -> bool {
    matches!(kind, "Linear" | "LazyLinear")
        && vocab.is_some()
        && keyword(args, "out_features") == vocab
}

/// A `torch.nn` activation or a Hugging Face `*Activation` (not `Identity`, which allocates
/// nothing).
fn is_activation(kind: &str) -> bool {
    let named = crate::profile::TORCH_ACTIVATIONS
        .iter()
        .any(|a| a.eq_ignore_ascii_case(kind))
        || kind.ends_with("Activation");
    named && kind != "Identity"
}

/// Counts one module closed on its line; `siblings_width` is the widest output of the modules
/// closed before it in the same block.
fn leaf(
    kind: &str,
    args: &str,
    seq: u128,
    width: &mut Option<u64>,
    siblings_width: u64,
    (t, rules): (&mut Totals, &mut RuleState),
) -> Result<(), &'static str> {
    let out: Option<u64> = match kind {
        "Embedding" => Some(positional(args, 1).ok_or("Embedding needs `(num, dim)`")?),
        // OPT's learned positions; a rotary table (`LlamaRotaryEmbedding()`) has no size
        k if k.ends_with("Embedding") => positional(args, 1),
        "Linear" | "LazyLinear" | "NonDynamicallyQuantizableLinear" => {
            Some(keyword(args, "out_features").ok_or("Linear needs `out_features=`")?)
        }
        "Conv1D" => keyword(args, "nf").or(*width), // older transformers print `Conv1D()`
        "Conv2d" => Some(positional(args, 1).ok_or("Conv2d needs `(in, out, …)`")?),
        k if k.ends_with("LayerNorm") || k.ends_with("RMSNorm") => {
            // T5's `T5LayerNorm()` prints no size: it normalises the current width.
            Some(
                first_dim(args)
                    .or(*width)
                    .ok_or("a norm layer needs its size first")?,
            )
        }
        _ => None,
    };
    let is_activation = is_activation(kind);
    let size = match out {
        Some(w) => {
            *width = Some(w);
            Some(w)
        }
        None if kind.starts_with("Dropout") || is_activation => *width,
        None => None,
    };
    if let Some(w) = size {
        let values = seq * u128::from(w);
        t.activations = t.activations.saturating_add(values);
        // Embeddings are not autocast and norms run in fp32 under it: their outputs stay
        // fp32 under mixed precision.
        if kind.ends_with("Embedding") || kind.ends_with("LayerNorm") || kind.ends_with("RMSNorm") {
            t.kept_fp32 = t.kept_fp32.saturating_add(values);
        } else if is_activation {
            // Printed order is definition order: an activation defined after its block's
            // second linear (GPT-2's `act`, Llama's `act_fn`) runs on the first one's output,
            // the block's widest.
            let w = u128::from(w.max(siblings_width));
            t.saved = t.saved.saturating_add(seq * w);
        } else {
            t.saved = t.saved.saturating_add(values);
        }
        t.largest = t.largest.max(values);
    }
    let bump = |c: &mut u64| *c = c.saturating_add(1);
    match kind {
        "Linear" | "LazyLinear" | "Conv1D" => bump(&mut t.linear),
        "Conv2d" => bump(&mut t.conv2d),
        "NonDynamicallyQuantizableLinear" => {
            add_attention(t, *width, seq, AttentionRule::Fused, None)
        }
        k if k.ends_with("LayerNorm") || k.ends_with("RMSNorm") => bump(&mut t.layer_norm),
        k if k.starts_with("Dropout") => bump(&mut t.dropout),
        k if k.contains("Attention") => {
            let rule = rules.attention(k, false);
            add_attention(t, *width, seq, rule, None)
        }
        _ => {}
    }
    Ok(())
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
