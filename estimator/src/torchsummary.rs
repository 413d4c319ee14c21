//! Features from a `torchsummary` table.
//!
//! ```text
//! ----------------------------------------------------------------
//!         Layer (type)               Output Shape         Param #
//! ================================================================
//!             Conv2d-1           [-1, 64, 112, 112]           9,408
//!        BatchNorm2d-2           [-1, 64, 112, 112]             128
//! ...
//! ================================================================
//! Total params: 11,689,512
//! ```
//!
//! Every row's output shape, without its first (batch) dimension, adds to the
//! per-sample activations (rows with several outputs, `[[-1, 10], [-1, 20]]`, add
//! each). Layer types are counted by name: `Linear`, `Conv2d*`, `BatchNorm*`,
//! `Dropout*`, `LayerNorm`, `NonDynamicallyQuantizableLinear` (attention),
//! `AdaptiveAvgPool*`. The activation function is the most frequent activation
//! layer of the family's list (`ReLU6` counts as `ReLU`; `ReLU` when there is
//! none). Parameters are the sum of the rows; a `Total params` line must agree
//! with it (torchsummary prints exactly that sum, so a difference means an
//! edited or truncated table). The layers must fit the family: an `mlp` has no
//! `Conv2d` or attention layer, a `cnn` has at least one `Conv2d`, a
//! `transformer` at least one attention or `LayerNorm` layer.

use std::collections::HashMap;

use crate::caveat::{CaveatKind, Caveats, FALLBACK_PERCENT, with_fallback_factor};
use crate::features::{CNN_ACTIVATIONS, MLP_ACTIVATIONS, activation_index};
use crate::layer_reading::SavedValues;
use crate::limits::MAX_BATCH_SIZE;
use crate::profile::{Family, Layers, Profile};

/// Why a `torchsummary` table was rejected.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SummaryError {
    /// No `Layer (type)  Output Shape  Param #` header.
    #[error("not a torchsummary table: no `Layer (type) / Output Shape / Param #` header")]
    MissingHeader,
    /// The table has no layer rows.
    #[error("torchsummary table has no layer rows")]
    NoLayers,
    /// A row could not be read.
    #[error("torchsummary line {line}: {reason}: `{text}`")]
    BadRow {
        /// 1-based line number.
        line: usize,
        /// The line.
        text: String,
        /// What is wrong.
        reason: String,
    },
    /// The `Total params` line is malformed.
    #[error("torchsummary line {line}: malformed `Total params`: `{text}`")]
    BadTotal {
        /// 1-based line number.
        line: usize,
        /// The line.
        text: String,
    },
    /// `Total params` disagrees with the sum of the rows.
    #[error(
        "torchsummary line {line}: `Total params` is {total} but the rows add up to {rows}; the table was edited or cut"
    )]
    TotalMismatch {
        /// 1-based line number of `Total params`.
        line: usize,
        /// The figure on that line.
        total: u64,
        /// The sum of the rows.
        rows: u64,
    },
    /// The layers do not fit the family.
    #[error("torchsummary table does not fit family `{family}`: {reason}")]
    WrongFamily {
        /// The family given.
        family: Family,
        /// What does not fit.
        reason: String,
    },
    /// Batch size out of range.
    #[error("batch size {0} is out of range: 1 to {MAX_BATCH_SIZE}")]
    BadBatchSize(u32),
    /// Parameters or activations add up to zero.
    #[error("torchsummary table yields no {0}")]
    Empty(&'static str),
}

/// Parses a `torchsummary` table into a [`Profile`] of `family` at `batch_size`.
pub fn parse_torchsummary(
    text: &str,
    family: Family,
    batch_size: u32,
) -> Result<Profile, SummaryError> {
    parse_torchsummary_values(text, family, batch_size).map(|(p, _)| p)
}

/// [`parse_torchsummary`] with what the detailed bound counts of the table (see
/// [`crate::reading::summary_values`]).
pub(crate) fn parse_torchsummary_values(
    text: &str,
    family: Family,
    batch_size: u32,
) -> Result<(Profile, SavedValues), SummaryError> {
    parse_torchsummary_reading(text, family, batch_size).map(|(p, v, _)| (p, v))
}

/// Activations whose backward reads only their output when they run in place (`relu_`,
/// `hardtanh_`, `leaky_relu_`, `elu_`) or always (`sigmoid`, `tanh`): in place they keep no
/// tensor beside the one their input had, so their rows count at half weight. Every other
/// activation reads its input in backward, and an in-place one (`nn.SiLU(inplace=True)`) saves a
/// copy of it: its output is a tensor of its own, and its row counts in full.
pub const OUTPUT_SAVING_ACTIVATIONS: [&str; 10] = [
    "ReLU",
    "ReLU6",
    "Hardtanh",
    "LeakyReLU",
    "ELU",
    "CELU",
    "SELU",
    "Sigmoid",
    "Tanh",
    "Threshold",
];

/// Weight matrices (with their bias) of width² of an `nn.MultiheadAttention` row that lists no
/// parameters: its input projection (`in_proj_weight`, three matrices) and its output projection,
/// which it calls functionally, so that torchsummary's hooks, which count a module's `weight` and
/// `bias`, see none of them, and the table's `Total params` lacks them too. The bound counts them
/// (weights, gradients, optimizer state): in the sweep (docs/estimator-sweep.md) ViT-L/32's table
/// listed 205.7 M of its 306.5 M parameters, and at batch 8 the bound fell 222 MiB under its traced
/// peak plus the CUDA context.
pub const UNLISTED_ATTENTION_PARAMS: u64 = 4;

/// The last dimension of an output shape (`[-1, 50, 1024]`, `[[-1, 50, 1024]]`): the width.
fn last_dim(shape: &str) -> Option<u64> {
    shape
        .trim_end_matches(|c: char| c == ']' || c.is_whitespace())
        .rsplit([',', '['])
        .next()?
        .trim()
        .parse()
        .ok()
}

/// The weight, in percent, of a CNN table's saved values when its SiLU rows (an activation that
/// saves its input) outnumber the activation rows that save only their output: 120, which lifts
/// the CNN family's fitted 0.8 per value to 0.96. Such a network keeps nearly every
/// row's output for backward — convolution, batch norm and activation outputs are each a tensor of
/// their own — where a ReLU network's in-place activations share theirs. In the sweep's traced
/// steps (docs/estimator-sweep.md) EfficientNet-V2-S holds 91 % of its row values alive at the end
/// of forward, and EfficientNet-B6, -B7, -V2-M and -V2-L grow faster per sample than 0.8 per value
/// covers (EfficientNet-V2-L by 1.10 ×): at batch 64 EfficientNet-V2-L fell 911 MiB under its traced
/// peak plus the CUDA context. 120 covers the steepest with a 9 % margin on the slope; 125 would
/// have raised the fitted CNN tables' mean over-reservation by 12.5 %, 120 raises it by 8.8 %.
/// Other activations that save their input (GELU: ConvNeXt; Hardswish: MobileNetV3) keep the
/// fitted factor: no such network fell under its traced floor in the sweep.
pub const INPUT_SAVING_PERCENT: u128 = 120;

/// torchvision's Swin window attentions and their window side (7 × 7 for Swin, 8 × 8 for Swin V2).
/// They run eagerly: per head and token they keep `window²` scores, which no row shows. The heads
/// are the row's channels / [`SWIN_HEAD_DIM`].
pub const WINDOW_ATTENTIONS: [(&str, u64); 2] = [
    ("ShiftedWindowAttention", 7),
    ("ShiftedWindowAttentionV2", 8),
];
/// Channels per head of torchvision's Swin models (96 channels and 3 heads in Swin-T's first stage).
pub const SWIN_HEAD_DIM: u64 = 32;
/// Score tensors per head a window attention keeps, in quarters: the softmax output and the
/// dropout output, saved for backward, and the dropout's one-byte mask (as
/// [`crate::printout_rules::POSITION_BIAS_SCORE_QUARTERS`]).
const WINDOW_SCORE_QUARTERS: u128 = 9;

/// The score values per sample a window-attention row of `per_sample` output values keeps beside
/// it: `tokens × heads × window²` = `per_sample × window² / SWIN_HEAD_DIM`, times the score
/// tensors. `None` for any other row.
fn window_attention_scores(kind: &str, per_sample: u64) -> Option<u128> {
    let (_, window) = WINDOW_ATTENTIONS.iter().find(|(k, _)| *k == kind)?;
    let per_token_head = u128::from(window * window);
    Some(
        u128::from(per_sample)
            .saturating_mul(per_token_head)
            .saturating_mul(WINDOW_SCORE_QUARTERS)
            .div_ceil(u128::from(SWIN_HEAD_DIM) * 4),
    )
}

/// [`parse_torchsummary_values`] with what the table had no rule for: an attention row other
/// than `MultiheadAttention` (which runs fused attention) and torchvision's window attentions
/// ([`WINDOW_ATTENTIONS`]) may keep score tensors that no row shows, so every value of such a
/// table counts [`FALLBACK_PERCENT`] %.
pub(crate) fn parse_torchsummary_reading(
    text: &str,
    family: Family,
    batch_size: u32,
) -> Result<(Profile, SavedValues, Caveats), SummaryError> {
    if !(1..=MAX_BATCH_SIZE).contains(&batch_size) {
        return Err(SummaryError::BadBatchSize(batch_size));
    }
    let lines: Vec<&str> = text.lines().collect();
    let header = lines
        .iter()
        .position(|l| {
            l.contains("Layer (type)") && l.contains("Output Shape") && l.contains("Param #")
        })
        .ok_or(SummaryError::MissingHeader)?;

    let mut layers = Layers::default();
    let mut activations: u64 = 0;
    let mut row_params: u64 = 0;
    let mut total_params: Option<(usize, u64)> = None;
    let mut act_counts: HashMap<usize, usize> = HashMap::new();
    let known: &[&str] = match family {
        Family::Cnn => &CNN_ACTIVATIONS,
        _ => &MLP_ACTIVATIONS,
    };
    let mut rows = 0usize;
    // saved values in halves: activation-function rows count one half
    let mut saved_halves: u128 = 0;
    let mut largest: u64 = 0;
    // the output shape of the row before, to tell which rows read a tensor no row shows
    let mut prev_shape: Option<&str> = None;
    let mut in_table = true;
    let mut caveats = Caveats::default();
    // activation rows whose backward reads only their output, and SiLU rows (which read their input)
    let (mut output_saving, mut input_saving) = (0usize, 0usize);
    // parameters the table does not list (see UNLISTED_ATTENTION_PARAMS)
    let mut unlisted_params: u64 = 0;
    for (i, raw) in lines.iter().enumerate().skip(header + 1) {
        let line_no = i + 1;
        let line = raw.trim();
        if line.is_empty() {
            continue;
        }
        if line.starts_with('=') {
            // the rule under the header opens the table; the next one closes it
            if rows > 0 {
                in_table = false;
            }
            continue;
        }
        if line.starts_with('-') {
            continue;
        }
        if let Some(rest) = line.strip_prefix("Total params:") {
            let t = parse_count(rest.trim()).ok_or_else(|| SummaryError::BadTotal {
                line: line_no,
                text: line.to_string(),
            })?;
            total_params = Some((line_no, t));
            continue;
        }
        if !in_table {
            continue; // "Trainable params", sizes, …
        }
        let bad = |reason: &str| SummaryError::BadRow {
            line: line_no,
            text: line.to_string(),
            reason: reason.to_string(),
        };
        let (name, shape, params) =
            split_row(line).ok_or_else(|| bad("expected `Type-N  [output shape]  params`"))?;
        let kind = layer_type(name).ok_or_else(|| bad("layer name must look like `Type-N`"))?;
        let per_sample = per_sample_size(shape).map_err(&bad)?;
        let p = parse_count(params).ok_or_else(|| bad("parameter count is not a number"))?;
        activations = activations
            .checked_add(per_sample)
            .ok_or_else(|| bad("activations overflow"))?;
        row_params = row_params
            .checked_add(p)
            .ok_or_else(|| bad("parameters overflow"))?;
        if kind == "MultiheadAttention" && p == 0 {
            let width = last_dim(shape).ok_or_else(|| bad("no output width"))?;
            unlisted_params = width
                .checked_mul(width)
                .and_then(|w2| w2.checked_add(width))
                .and_then(|w| w.checked_mul(UNLISTED_ATTENTION_PARAMS))
                .and_then(|w| unlisted_params.checked_add(w))
                .ok_or_else(|| bad("parameters overflow"))?;
        }
        count_layer(kind, &mut layers);
        if let Some(a) = activation_index(kind, known) {
            *act_counts.entry(a).or_default() += 1;
        }
        let is_activation = kind != "Identity"
            && crate::profile::TORCH_ACTIVATIONS
                .iter()
                .any(|a| a.eq_ignore_ascii_case(kind));
        let halves = if is_activation && OUTPUT_SAVING_ACTIVATIONS.contains(&kind) {
            output_saving += 1;
            1
        } else {
            if kind == "SiLU" {
                input_saving += 1;
            }
            2
        };
        if let Some(scores) = window_attention_scores(kind, per_sample) {
            saved_halves = saved_halves.saturating_add(2 * scores);
        } else if kind.contains("Attention") && kind != "MultiheadAttention" {
            caveats.note(
                CaveatKind::UnknownAttention,
                kind,
                format!(
                    "its score tensors are no row's output; every activation value counted \
                     {FALLBACK_PERCENT} %"
                ),
            );
        }
        saved_halves = saved_halves.saturating_add(halves * u128::from(per_sample));
        // A batch norm keeps its output's shape, so one whose input is not the row before it
        // normalises a tensor no row shows: a concatenation (DenseNet's dense layers), which
        // it saves for backward.
        if kind.starts_with("BatchNorm") && prev_shape.is_some_and(|s| s != shape) {
            saved_halves = saved_halves.saturating_add(2 * u128::from(per_sample));
        }
        prev_shape = Some(shape);
        largest = largest.max(per_sample);
        rows += 1;
    }
    if rows == 0 {
        return Err(SummaryError::NoLayers);
    }
    if let Some((line, total)) = total_params
        && total != row_params
    {
        return Err(SummaryError::TotalMismatch {
            line,
            total,
            rows: row_params,
        });
    }
    let wrong = |reason: String| Err(SummaryError::WrongFamily { family, reason });
    match family {
        Family::Mlp if layers.conv2d.saturating_add(layers.attention) > 0 => {
            return wrong(format!(
                "it has {} Conv2d and {} attention layers (use --family cnn or transformer)",
                layers.conv2d, layers.attention
            ));
        }
        Family::Cnn if layers.conv2d == 0 => {
            return wrong("it has no Conv2d layer".into());
        }
        Family::Transformer if layers.attention.saturating_add(layers.layer_norm) == 0 => {
            return wrong("it has no attention or LayerNorm layer".into());
        }
        _ => {}
    }
    let parameters = row_params.saturating_add(unlisted_params);
    if parameters == 0 {
        return Err(SummaryError::Empty("parameters"));
    }
    if activations == 0 {
        return Err(SummaryError::Empty("activations"));
    }
    // most frequent activation; ties go to the lower index (deterministic)
    let activation = act_counts
        .iter()
        .max_by(|a, b| a.1.cmp(b.1).then(b.0.cmp(a.0)))
        .map(|(i, _)| known[*i])
        .unwrap_or("ReLU");
    let mut profile = Profile {
        family,
        batch_size,
        parameters,
        activations,
        depth: None,
        activation: Some(activation.to_string()),
        layers,
        seq_length: None,
        optimizer: None,
        mixed_precision: None,
        traced: None,
        layer_reading: None,
        caveats: Vec::new(),
    };
    profile.depth = Some(profile.effective_depth());
    tracing::debug!(rows, parameters, activations, %family, "parsed torchsummary table");
    let mut values = SavedValues {
        saved: saved_halves.div_ceil(2),
        largest: u128::from(largest),
        scores: 0,
        kept_fp32: 0,
    };
    if family == Family::Cnn && input_saving > output_saving {
        // mostly SiLU: nearly every row's output is kept (see INPUT_SAVING_PERCENT)
        values.saved = values
            .saved
            .saturating_mul(INPUT_SAVING_PERCENT)
            .div_ceil(100);
    }
    if !caveats.is_empty() {
        values.saved = with_fallback_factor(values.saved);
        values.largest = with_fallback_factor(values.largest);
    }
    Ok((profile, values, caveats))
}

/// `Conv2d-12  [-1, 64, 8, 8]  36,864` → (`Conv2d-12`, `[-1, 64, 8, 8]`, `36,864`).
fn split_row(line: &str) -> Option<(&str, &str, &str)> {
    let open = line.find('[')?;
    let close = line.rfind(']')?;
    if close < open {
        return None;
    }
    let name = line[..open].trim();
    let shape = &line[open..=close];
    let params = line[close + 1..].trim();
    if name.is_empty() || name.contains(char::is_whitespace) || params.is_empty() {
        return None;
    }
    Some((name, shape, params))
}

/// `BatchNorm2d-14` → `BatchNorm2d`.
fn layer_type(name: &str) -> Option<&str> {
    let (kind, idx) = name.rsplit_once('-')?;
    (!kind.is_empty() && !idx.is_empty() && idx.bytes().all(|b| b.is_ascii_digit())).then_some(kind)
}

/// `1,234` → 1234.
pub(crate) fn parse_count(s: &str) -> Option<u64> {
    let s = s.trim();
    if s.is_empty() || !s.bytes().all(|b| b.is_ascii_digit() || b == b',') || s.starts_with(',') {
        return None;
    }
    s.replace(',', "").parse().ok()
}

/// Sum over the output tensors in `shape` of the product of their dimensions
/// after the first (the batch dimension, `-1` or a number).
fn per_sample_size(shape: &str) -> Result<u64, &'static str> {
    let inner = shape
        .strip_prefix('[')
        .and_then(|s| s.strip_suffix(']'))
        .ok_or("output shape must be in brackets")?
        .trim();
    let tensors: Vec<&str> = if inner.starts_with('[') {
        // several outputs: [[-1, 10], [-1, 20]]
        inner
            .split(']')
            .map(|t| t.trim().trim_start_matches(',').trim())
            .filter(|t| !t.is_empty())
            .map(|t| t.strip_prefix('[').ok_or("malformed list of output shapes"))
            .collect::<Result<_, _>>()?
    } else {
        vec![inner]
    };
    let mut total: u64 = 0;
    for t in tensors {
        let dims: Vec<&str> = t.split(',').map(str::trim).collect();
        if dims.is_empty() || dims[0].is_empty() {
            return Err("empty output shape");
        }
        let first = dims[0];
        if first != "-1" && first.parse::<u64>().is_err() {
            return Err("batch dimension must be -1 or a number");
        }
        let mut size: u64 = 1;
        for d in &dims[1..] {
            let v: u64 = d
                .parse()
                .map_err(|_| "output dimension is not a non-negative integer")?;
            size = size.checked_mul(v).ok_or("output shape overflows")?;
        }
        total = total.checked_add(size).ok_or("output shape overflows")?;
    }
    Ok(total)
}

fn count_layer(kind: &str, l: &mut Layers) {
    let bump = |c: &mut u32| *c = c.saturating_add(1);
    if kind == "Linear" || kind == "LazyLinear" {
        bump(&mut l.linear);
    } else if kind == "NonDynamicallyQuantizableLinear" {
        bump(&mut l.attention);
    } else if kind.starts_with("Conv2d") || kind == "LazyConv2d" {
        bump(&mut l.conv2d);
    } else if kind.starts_with("BatchNorm") || kind.starts_with("SyncBatchNorm") {
        bump(&mut l.batch_norm);
    } else if kind.starts_with("Dropout") || kind == "AlphaDropout" {
        bump(&mut l.dropout);
    } else if kind == "LayerNorm" {
        bump(&mut l.layer_norm);
    } else if kind.starts_with("AdaptiveAvgPool") {
        bump(&mut l.adaptive_avg_pool);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shapes() {
        assert_eq!(per_sample_size("[-1, 64, 8, 8]"), Ok(4096));
        assert_eq!(per_sample_size("[32, 10]"), Ok(10));
        assert_eq!(per_sample_size("[-1]"), Ok(1));
        assert_eq!(per_sample_size("[[-1, 10], [-1, 20, 2]]"), Ok(50));
        assert!(per_sample_size("[-1, x]").is_err());
        assert!(per_sample_size("[-1, -3]").is_err());
        assert!(per_sample_size("[]").is_err());
        assert!(per_sample_size("[-1, 99999999999, 99999999999]").is_err());
    }

    #[test]
    fn a_batch_norm_of_a_concatenation_keeps_it() {
        let table = |bn_channels: u32| {
            format!(
                "Layer (type)   Output Shape   Param #\n====\n\
                 Conv2d-1  [-1, 32, 8, 8]  864\n\
                 _DenseLayer-2  [-1, 32, 8, 8]  0\n\
                 BatchNorm2d-3  [-1, {bn_channels}, 8, 8]  {}\n\
                 ====\nTotal params: {}\n",
                2 * bn_channels,
                864 + 2 * bn_channels
            )
        };
        let saved = |text: &str| {
            parse_torchsummary_values(text, Family::Cnn, 1)
                .unwrap()
                .1
                .saved
        };
        // a 96-channel norm after a 32-channel row reads a concatenation no row shows: one more
        // 96 × 8 × 8 tensor beside the rows (2 × 32 + 96 channels)
        assert_eq!(saved(&table(96)), (2 * 32 + 96 + 96) * 64);
        // a norm of the row before it reads that row's output
        assert_eq!(saved(&table(32)), 3 * 32 * 64);
    }

    #[test]
    fn an_attention_row_of_no_known_kind_scales_every_value() {
        let table = |attention: &str| {
            format!(
                "Layer (type)   Output Shape   Param #\n====\n\
                 Linear-1  [-1, 49, 96]  9,312\n\
                 {attention}-2  [-1, 49, 96]  0\n\
                 LayerNorm-3  [-1, 49, 96]  192\n\
                 ====\nTotal params: 9,504\n"
            )
        };
        let read = |text: &str| parse_torchsummary_reading(text, Family::Transformer, 1).unwrap();
        let (_, fused, none) = read(&table("MultiheadAttention"));
        assert!(none.is_empty());
        assert_eq!((fused.saved, fused.largest), (3 * 49 * 96, 49 * 96));
        // an attention of no known kind: its scores are no row's output, every value half as much
        // again
        let (_, v, caveats) = read(&table("WindowAttention"));
        assert_eq!((v.saved, v.largest), (3 * 49 * 96 * 3 / 2, 49 * 96 * 3 / 2));
        assert_eq!(caveats.as_slice()[0].kind, CaveatKind::UnknownAttention);
        assert_eq!(caveats.as_slice()[0].modules, ["WindowAttention"]);
        // torchvision's Swin window attention: 96 / 32 = 3 heads, 7 × 7 scores per head and token,
        // 2.25 score tensors, beside the rows
        let (_, swin, caveats) = read(&table("ShiftedWindowAttention"));
        assert!(caveats.is_empty());
        let scores = (49_u128 * 3 * 49 * 9).div_ceil(4);
        assert_eq!(swin.saved, fused.saved + scores);
        assert_eq!(swin.largest, fused.largest);
    }

    #[test]
    fn activations_that_read_their_input_count_in_full() {
        let table = |act: &str| {
            format!(
                "Layer (type)   Output Shape   Param #\n====\n\
                 Conv2d-1  [-1, 8, 4, 4]  80\n\
                 {act}-2  [-1, 8, 4, 4]  0\n\
                 ====\nTotal params: 80\n"
            )
        };
        let saved = |act: &str| {
            parse_torchsummary_values(&table(act), Family::Cnn, 1)
                .unwrap()
                .1
                .saved
        };
        // an in-place ReLU keeps no tensor beside its input's; an in-place SiLU saves a copy,
        // and a network whose activations mostly save their input keeps every row's output (its
        // values weigh INPUT_SAVING_PERCENT %)
        assert_eq!(saved("ReLU"), 128 + 64);
        let full = ((128 + 128) * INPUT_SAVING_PERCENT).div_ceil(100);
        assert_eq!(saved("SiLU"), full);
        // Hardswish saves its input too, but no Hardswish network fell under its traced floor
        assert_eq!(saved("Hardswish"), 128 + 128);
        // as many activations that save their output: no weight
        let mixed = table("SiLU").replace(
            "====\nTotal params",
            "ReLU-3  [-1, 8, 4, 4]  0\n====\nTotal params",
        );
        let v = parse_torchsummary_values(&mixed, Family::Cnn, 1).unwrap().1;
        assert_eq!(v.saved, 128 + 128 + 64);
        // the weight is the CNN family's (a transformer table's values already count in full)
        let ln = table("SiLU").replace(
            "====\nTotal params: 80",
            "LayerNorm-3  [-1, 8, 4, 4]  16\n====\nTotal params: 96",
        );
        let t = parse_torchsummary_values(&ln, Family::Transformer, 1).unwrap();
        assert_eq!(t.1.saved, 128 + 128 + 128);
    }

    #[test]
    fn a_multihead_attention_row_without_parameters_counts_its_projections() {
        let table = |params: &str, total: &str| {
            format!(
                "Layer (type)   Output Shape   Param #\n====\n\
                 LayerNorm-1  [-1, 50, 64]  128\n\
                 MultiheadAttention-2  [[-1, 50, 64]]  {params}\n\
                 ====\nTotal params: {total}\n"
            )
        };
        let read = |t: &str| {
            parse_torchsummary(t, Family::Transformer, 1)
                .unwrap()
                .parameters
        };
        // torchsummary lists none: the input and output projections, 4 × (64² + 64)
        assert_eq!(read(&table("0", "128")), 128 + 4 * (64 * 64 + 64));
        // a table that lists them (torchinfo's) is read as it is
        assert_eq!(read(&table("16,640", "16,768")), 16_768);
        assert_eq!(last_dim("[-1, 50, 1024]"), Some(1024));
        assert_eq!(last_dim("[[-1, 50, 1024]]"), Some(1024));
    }

    #[test]
    fn counts() {
        assert_eq!(parse_count("1,179,776"), Some(1_179_776));
        assert_eq!(parse_count("0"), Some(0));
        assert_eq!(parse_count("--"), None);
        assert_eq!(parse_count(",1"), None);
        assert_eq!(layer_type("Conv2d-12"), Some("Conv2d"));
        assert_eq!(layer_type("Conv2d"), None);
        assert_eq!(layer_type("Conv2d-x"), None);
    }
}
