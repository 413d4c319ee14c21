//! The printout reader's rules for attention kinds, shared layer groups and the module types it
//! can size (the printout reader applies them). A pattern with no rule here is not read with the
//! generic rule in silence: it gets a conservative count and a [`Caveat`](crate::Caveat).
//!
//! * **Attention blocks** (the innermost module whose type contains `Attention`) by kind:
//!   - *fused*: a type of the Transformers CARMA and the held-out jobs run (BERT, RoBERTa,
//!     DistilBERT, ALBERT, GPT-2, OPT, Llama, `nn.MultiheadAttention`) or any `*Sdpa*` or
//!     `*FlashAttention*` type: PyTorch's fused attention keeps no `seq²` tensor;
//!   - *relative* (`*Relative*`, XLNet's): content, position and segment scores in eager
//!     operations, [`RELATIVE_SCORE_QUARTERS`] per head, and [`RELATIVE_EXTRA_WIDTHS`] tensors of
//!     the model's width no module outputs; an XLNet with its language-model head may train with
//!     the two-stream objective, which runs every relative block twice: counted twice;
//!   - *with a learned position bias* (an `Embedding(buckets, heads)` inside the block, T5's
//!     `relative_attention_bias`): eager, [`POSITION_BIAS_SCORE_QUARTERS`] per head in every block
//!     of that type, and the bias table once per sample. The table gives the head count;
//!   - *chunked delta rule* (`*Delta*Attention`, Kimi's delta attention and Bailing's hybrid): no
//!     `seq²` scores, but transformers' reference `chunk_kda` (what runs without the
//!     flash-linear-attention package) builds a per-channel decay between every two tokens of a
//!     chunk, [`DELTA_DECAY_TENSORS`] tensors of `seq × DELTA_CHUNK ×` the block's widest
//!     projection;
//!   - any other type: eager by assumption, [`EAGER_SCORE_QUARTERS`] per head, and a caveat.
//! * **Shared layer groups** (a type ending in `LayerGroup`, ALBERT's `AlbertLayerGroup`): printed
//!   once, run `num_hidden_layers` times with the same parameters. Its activations count that many
//!   times, its parameters once; the run count comes from the caller, else
//!   [`ASSUMED_SHARED_RUNS`] with a caveat.
//! * **Module types** a printout's leaf lines may have without a caveat (`known_leaf`): those the
//!   reader sizes (embeddings, linears, `Conv1D`, `Conv2d`, norms, dropouts, activations),
//!   `Identity`, rotary position tables and losses. Any other, and a container holding a
//!   parameter matrix of its own outside an attention block, makes the reading count every
//!   activation value [`FALLBACK_PERCENT`](crate::caveat::FALLBACK_PERCENT) %.

use std::collections::HashSet;

use crate::caveat::{CaveatKind, Caveats};

/// Score tensors per head, in quarters, of an attention block assumed eager because no rule
/// knows its type: the raw scores, the softmax output, the dropout output and its one-byte mask,
/// as relative attention ([`RELATIVE_SCORE_QUARTERS`]).
pub const EAGER_SCORE_QUARTERS: u128 = 13;
/// Score tensors per head, in quarters, of XLNet's relative attention, which builds a content, a
/// position and a segment score beside the probabilities in eager operations. Fitted on
/// XLNet-base; the traced XLNet steps hold 3,176 and 8,217 MiB beyond their state at batch 4
/// (docs/estimator-evaluation.md).
pub const RELATIVE_SCORE_QUARTERS: u128 = 13;
/// Tensors of the model's width per token that a relative-attention block keeps beyond one per
/// bare projection (q, k, v, o, r): the score einsums save the query with each of its three
/// biases (`r_w_bias`, `r_r_bias`, `r_s_bias`) while the bare query is freed (+2), the position
/// projection spans `klen + qlen`, twice the sequence (+1), and only a dropout reads the output
/// projection's result, which it does not save (−1). Read from `rel_attn_core` and
/// `post_attention` of transformers 5.23; without them the bound held 112 MiB less than
/// XLNet-large's traced step keeps beyond its state (docs/estimator-evaluation.md).
pub const RELATIVE_EXTRA_WIDTHS: u128 = 2;
/// Tokens per chunk of transformers' reference chunked delta rule (`chunk_kda`'s `chunk_size`).
pub const DELTA_CHUNK: u128 = 64;
/// Tensors of `seq × DELTA_CHUNK ×` the block's widest projection (its key width, `heads ×
/// head_dim`) that a chunked delta-rule attention block keeps for backward: the decay
/// `exp(g_i − g_j)` per channel between every two tokens of a chunk and its products with the
/// keys and queries. Bailing's hybrid (key width 4,096) keeps 895 MiB per sample of 128 tokens in
/// its two delta blocks at the end of forward, 3.5 such tensors per block; rounded up. Without
/// them the bound was under the traced floors of Bailing's hybrid and Kimi Linear at batch 32
/// by 18 and 19 GiB (docs/estimator-sweep.md).
pub const DELTA_DECAY_TENSORS: u128 = 4;
/// Score tensors per head, in quarters, of eager attention with a learned position bias (T5):
/// the softmax output and the dropout output, saved for backward, and the dropout's one-byte
/// mask. The raw scores take the bias in place and are freed after the softmax.
pub const POSITION_BIAS_SCORE_QUARTERS: u128 = 9;
/// Runs of a shared layer group when the caller does not say: ALBERT-large's and -xlarge's 24
/// layers, the most of ALBERT's published configurations (base and xxlarge run 12).
pub const ASSUMED_SHARED_RUNS: u32 = 24;

/// Attention types known to run PyTorch's fused attention in Transformers 5.
const FUSED_ATTENTIONS: [&str; 9] = [
    "BertSelfAttention",
    "RobertaSelfAttention",
    "DistilBertSelfAttention",
    "MultiHeadSelfAttention",
    "AlbertAttention",
    "GPT2Attention",
    "OPTAttention",
    "LlamaAttention",
    "MultiheadAttention",
];

/// How an attention block keeps its scores.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum AttentionRule {
    /// Fused (`scaled_dot_product_attention`): the output and one log-sum-exp per query, no
    /// `seq²` tensor. The traced BERT and GPT-2 steps keep none, and BERT-large measures below
    /// its module outputs with one score tensor per head.
    Fused,
    /// XLNet's relative attention.
    Relative,
    /// Eager with a learned position bias (T5).
    PositionBias,
    /// The chunked delta rule: no score tensor, per-channel decays within each chunk.
    DeltaChunked,
    /// No rule: eager by assumption.
    Unknown,
}

impl AttentionRule {
    /// Score tensors per head, in quarters.
    pub(crate) fn score_quarters(self) -> u128 {
        match self {
            AttentionRule::Fused => 0,
            AttentionRule::Relative => RELATIVE_SCORE_QUARTERS,
            AttentionRule::PositionBias => POSITION_BIAS_SCORE_QUARTERS,
            AttentionRule::DeltaChunked => 0,
            AttentionRule::Unknown => EAGER_SCORE_QUARTERS,
        }
    }
}

/// What the printout rules remember while a printout is read.
#[derive(Debug, Default)]
pub(crate) struct RuleState {
    /// What had no rule.
    pub caveats: Caveats,
    /// Attention types seen with a position-bias table: every block of such a type is eager.
    position_bias_kinds: HashSet<String>,
    /// Runs of a shared layer group, when the caller knows them.
    pub shared_runs: Option<u32>,
}

impl RuleState {
    /// State for a printout whose shared layer groups run `shared_runs` times, when known.
    pub(crate) fn new(shared_runs: Option<u32>) -> RuleState {
        RuleState {
            shared_runs,
            ..RuleState::default()
        }
    }

    /// The rule for an attention block of type `kind`; `has_bias` when the block holds a position
    /// bias table. Records a caveat for a type no rule knows.
    pub(crate) fn attention(&mut self, kind: &str, has_bias: bool) -> AttentionRule {
        if has_bias {
            self.position_bias_kinds.insert(kind.to_string());
        }
        if kind.contains("Relative") {
            AttentionRule::Relative
        } else if self.position_bias_kinds.contains(kind) {
            AttentionRule::PositionBias
        } else if kind.contains("Delta") {
            AttentionRule::DeltaChunked
        } else if kind == "NonDynamicallyQuantizableLinear"
            || FUSED_ATTENTIONS.contains(&kind)
            || kind.contains("Sdpa")
            || kind.contains("FlashAttention")
        {
            AttentionRule::Fused
        } else {
            self.caveats.note(
                CaveatKind::UnknownAttention,
                kind,
                format!(
                    "no rule says these run fused attention; counted as eager attention, {} score \
                     tensors per head",
                    quarters(EAGER_SCORE_QUARTERS)
                ),
            );
            AttentionRule::Unknown
        }
    }

    /// How many times a container of type `kind` runs per forward pass beyond what the printout
    /// shows: `Some(runs)` for a shared layer group (recording a caveat when the runs are
    /// assumed), `None` for any other.
    pub(crate) fn shared_runs(&mut self, kind: &str) -> Option<u32> {
        if !kind.ends_with("LayerGroup") {
            return None;
        }
        Some(match self.shared_runs {
            Some(runs) => runs,
            None => {
                self.caveats.note(
                    CaveatKind::SharedLayers,
                    kind,
                    format!(
                        "a shared layer group runs num_hidden_layers times but prints once; \
                         counted {ASSUMED_SHARED_RUNS} runs (give the model's layer count to count \
                         it exactly)"
                    ),
                );
                ASSUMED_SHARED_RUNS
            }
        })
    }

    /// Records a module that no rule sizes.
    pub(crate) fn unknown_module(&mut self, kind: &str, why: &str) {
        self.caveats.note(
            CaveatKind::UnknownModule,
            kind,
            format!(
                "{why}; every activation value counted {} %",
                crate::caveat::FALLBACK_PERCENT
            ),
        );
    }
}

/// `13` → `3.25`.
fn quarters(q: u128) -> String {
    match q % 4 {
        0 => format!("{}", q / 4),
        r => format!("{}.{}", q / 4, [0, 25, 5, 75][r as usize]),
    }
}

/// Whether an `Embedding(n, d)` inside an attention block is a position-bias table rather than a
/// token embedding: narrower than the model (`d` heads, not `d` features).
pub(crate) fn is_position_bias(kind: &str, dim: u64, width: Option<u64>) -> bool {
    kind.ends_with("Embedding") && width.is_some_and(|w| dim < w)
}

/// Whether the reader has a rule for a module of type `kind` closed on its line (see the module
/// docs).
pub(crate) fn known_leaf(kind: &str) -> bool {
    matches!(
        kind,
        "Linear" | "LazyLinear" | "NonDynamicallyQuantizableLinear" | "Conv1D" | "Conv2d"
    ) || kind.ends_with("Embedding")
        || kind.ends_with("LayerNorm")
        || kind.ends_with("RMSNorm")
        || kind.starts_with("Dropout")
        || kind.ends_with("Loss")
        || crate::profile::TORCH_ACTIVATIONS
            .iter()
            .any(|a| a.eq_ignore_ascii_case(kind))
        || kind.ends_with("Activation")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn attention_kinds() {
        let mut s = RuleState::default();
        assert_eq!(
            s.attention("BertSelfAttention", false),
            AttentionRule::Fused
        );
        assert_eq!(
            s.attention("BertSdpaSelfAttention", false),
            AttentionRule::Fused
        );
        assert_eq!(
            s.attention("XLNetRelativeAttention", false),
            AttentionRule::Relative
        );
        assert!(s.caveats.is_empty());
        // a T5 block without the table is eager once a block of its type showed one
        assert_eq!(
            s.attention("T5Attention", true),
            AttentionRule::PositionBias
        );
        assert_eq!(
            s.attention("T5Attention", false),
            AttentionRule::PositionBias
        );
        assert!(s.caveats.is_empty());
        // Kimi's and Bailing's chunked delta rule: a rule, no caveat, no score tensor
        assert_eq!(
            s.attention("KimiLinearDeltaAttention", false),
            AttentionRule::DeltaChunked
        );
        assert_eq!(AttentionRule::DeltaChunked.score_quarters(), 0);
        assert!(s.caveats.is_empty());
        assert_eq!(
            s.attention("MysteryAttention", false),
            AttentionRule::Unknown
        );
        assert!(s.caveats.has(CaveatKind::UnknownAttention));
        assert_eq!(quarters(13), "3.25");
        assert_eq!(quarters(12), "3");
    }

    #[test]
    fn shared_groups_run_as_told_or_as_assumed() {
        let mut told = RuleState::new(Some(12));
        assert_eq!(told.shared_runs("AlbertLayerGroup"), Some(12));
        assert_eq!(told.shared_runs("AlbertLayer"), None);
        assert!(told.caveats.is_empty());
        let mut assumed = RuleState::new(None);
        assert_eq!(
            assumed.shared_runs("AlbertLayerGroup"),
            Some(ASSUMED_SHARED_RUNS)
        );
        assert!(assumed.caveats.has(CaveatKind::SharedLayers));
    }

    /// A two-module printout with `attn` of type `kind` and, after it, `extra` lines.
    fn net(kind: &str, extra: &str, extra_params: u64) -> String {
        format!(
            "Net(
  (emb): Embedding(100, 128), 12,800 params
  (attn): {kind}(
    (o): Linear(in_features=128, out_features=128, bias=False), 16,384 params
  ), 16,384 params
  (norm): LayerNorm((128,), eps=1e-05, elementwise_affine=True), 256 params
{extra}), {} params
",
            29_440 + extra_params
        )
    }

    fn read(text: &str) -> (crate::analytic::SavedValues, Vec<CaveatKind>) {
        let (_, v, c) =
            crate::printout::parse_printout_reading(text, crate::Family::Transformer, 2, 10, None)
                .unwrap();
        (v, c.as_slice().iter().map(|c| c.kind).collect())
    }

    #[test]
    fn an_attention_of_no_known_kind_counts_as_eager_and_says_so() {
        let (fused, none) = read(&net("BertSelfAttention", "", 0));
        assert_eq!((fused.scores, none), (0, vec![]));
        let (eager, kinds) = read(&net("MysteryAttention", "", 0));
        // 2 heads (128 / 64) × 10² per head × 3.25
        assert_eq!(eager.scores, (EAGER_SCORE_QUARTERS * 2 * 100).div_ceil(4));
        assert_eq!(kinds, [CaveatKind::UnknownAttention]);
        assert_eq!(eager.saved, fused.saved);
    }

    #[test]
    fn a_module_of_no_known_type_scales_every_value() {
        let (plain, _) = read(&net("BertSelfAttention", "", 0));
        let (v, kinds) = read(&net(
            "BertSelfAttention",
            "  (mixer): Mamba2Mixer(d_model=128), 1,000 params\n",
            1_000,
        ));
        assert_eq!(kinds, [CaveatKind::UnknownModule]);
        let f = crate::caveat::with_fallback_factor;
        assert_eq!(
            (v.saved, v.kept_fp32, v.largest, v.scores),
            (f(plain.saved), f(plain.kept_fp32), f(plain.largest), 0)
        );
        // a container holding a matrix of its own outside an attention block
        let (_, kinds) = read(&net(
            "BertSelfAttention",
            "  (blk): Block(\n    (drop): Dropout(p=0.1, inplace=False), 0 params\n  ), 16,384 params\n",
            16_384,
        ));
        assert_eq!(kinds, [CaveatKind::UnknownModule]);
    }

    #[test]
    fn leaves() {
        for k in [
            "Linear",
            "Embedding",
            "OPTLearnedPositionalEmbedding",
            "LlamaRotaryEmbedding",
            "T5LayerNorm",
            "LlamaRMSNorm",
            "Dropout",
            "GELU",
            "NewGELUActivation",
            "CrossEntropyLoss",
            "Identity",
        ] {
            assert!(known_leaf(k), "{k}");
        }
        for k in ["Conv3d", "MoeRouter", "Mamba2Mixer"] {
            assert!(!known_leaf(k), "{k}");
        }
    }
}
