//! What each module of an annotated module printout adds to the parser's running totals
//! ([`crate::printout`] reads the lines and keeps the stack of open modules): a module closed on
//! its line ([`leaf`]), a container when its `)` closes it ([`close_module`]), an attention
//! block and its score tensors, and the constants those counts use (the module docs of
//! [`crate::printout`] say where each comes from).

use crate::printout_error::PrintoutError;
use crate::printout_line::{first_dim, keyword, positional};
use crate::printout_rules::{
    AttentionRule, DELTA_CHUNK, DELTA_DECAY_TENSORS, RELATIVE_EXTRA_WIDTHS, RuleState,
};
use crate::printout_scan::{MixerParts, Scan, UNSIZED_STATE};
use crate::profile::TORCH_ACTIVATIONS;

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

/// Running totals; snapshots of them let a repeated block add its copies.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct Totals {
    pub(crate) activations: u128,
    /// What the detailed bound counts: module outputs and bare projections…
    pub(crate) saved: u128,
    /// …the part of it kept in fp32 under mixed precision (see [`SavedValues::kept_fp32`])…
    pub(crate) kept_fp32: u128,
    /// …and score values in quarters of a tensor per head ([`AttentionRule::score_quarters`]).
    pub(crate) score_quarters: u128,
    pub(crate) largest: u128,
    /// What relative-attention blocks add to `saved` and `score_quarters`: a two-stream XLNet
    /// runs them twice.
    pub(crate) relative_saved: u128,
    pub(crate) relative_quarters: u128,
    pub(crate) linear: u64,
    pub(crate) attention: u64,
    pub(crate) layer_norm: u64,
    pub(crate) dropout: u64,
    pub(crate) conv2d: u64,
}

impl Totals {
    /// `self + (self - before) × extra`.
    pub(crate) fn repeat(&mut self, before: &Totals, extra: u128) {
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
pub(crate) struct Open {
    pub(crate) kind: String,
    pub(crate) line: usize,
    pub(crate) repeat: u32,
    pub(crate) children_params: u128,
    pub(crate) before: Totals,
    /// The widest output of the modules closed on their line directly inside it.
    pub(crate) max_width: u64,
    /// How many linears directly inside it have that widest output, and whether an activation
    /// is among its modules: two and one make a gated feed-forward.
    pub(crate) widest_linears: u32,
    pub(crate) activation: bool,
    /// The heads of a position-bias table inside it (T5's `relative_attention_bias`).
    pub(crate) bias_heads: Option<u64>,
    /// Where its modules closed on their line start in the parser's list of their counts.
    pub(crate) leaves_from: usize,
    /// Its children that size a Mamba-style mixer's scan ([`crate::printout_scan`]).
    pub(crate) mixer: MixerParts,
}

/// Ends a container: checks its count against its children, counts it as an
/// attention block when it is the innermost one, multiplies a repeated block.
/// Returns the parameters it adds to its parent.
pub(crate) fn close_module(
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
        if rule == AttentionRule::DeltaChunked {
            // the decays between the tokens of each chunk, per channel of the widest projection
            let decays = DELTA_DECAY_TENSORS
                .saturating_mul(seq)
                .saturating_mul(DELTA_CHUNK)
                .saturating_mul(u128::from(open.max_width.max(width.unwrap_or(0))));
            totals.saved = totals.saved.saturating_add(decays);
        }
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
    }
    if let Some(scan) = open.mixer.scan(own) {
        // a Mamba-style mixer's scan keeps its states in fp32 (crate::printout_scan)
        if let Scan::Unsized { .. } = scan {
            rules.unknown_module(
                &open.kind,
                &format!(
                    "a state-space mixer whose d_state the printout does not give; its scan \
                     counted with {UNSIZED_STATE} states per channel"
                ),
            );
        }
        totals.kept_fp32 = totals.kept_fp32.saturating_add(scan.values(seq));
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
pub(crate) fn kept_beyond_output(
    kind: &str,
    args: &str,
    vocab: Option<u64>,
    block_width: u64,
) -> u128 {
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
pub(crate) fn is_lm_head(kind: &str, args: &str, vocab: Option<u64>) -> bool {
    matches!(kind, "Linear" | "LazyLinear")
        && vocab.is_some()
        && keyword(args, "out_features") == vocab
}

/// A `torch.nn` activation or a Hugging Face `*Activation` (not `Identity`, which allocates
/// nothing).
pub(crate) fn is_activation(kind: &str) -> bool {
    let named = TORCH_ACTIVATIONS
        .iter()
        .any(|a| a.eq_ignore_ascii_case(kind))
        || kind.ends_with("Activation");
    named && kind != "Identity"
}

/// Counts one module closed on its line of `params` parameters; `siblings_width` is the widest
/// output of the modules closed before it in the same block.
pub(crate) fn leaf(
    kind: &str,
    args: &str,
    params: u64,
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
            // T5's `T5LayerNorm()` prints no size: it normalises the current width. Before any
            // module has given one (CpmAnt's encoder norms, printed before its embeddings), its
            // parameters do: a weight of the width, or with a bias twice it, counted over.
            Some(
                first_dim(args)
                    .or(*width)
                    .or((params > 0).then_some(params))
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
