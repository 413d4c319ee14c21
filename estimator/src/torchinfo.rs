//! Features from a `torchinfo.summary` table, read as the torchsummary table it
//! restates.
//!
//! ```text
//! ==========================================================================================
//! Layer (type:depth-idx)                   Output Shape              Param #
//! ==========================================================================================
//! ResNet                                   [32, 1000]                --
//! ├─Conv2d: 1-1                            [32, 64, 112, 112]        9,408
//! ├─Sequential: 1-5                        [32, 64, 56, 56]          --
//! │    └─BasicBlock: 2-1                   [32, 64, 56, 56]          --
//! │    │    └─Conv2d: 3-1                  [32, 64, 56, 56]          36,864
//! ==========================================================================================
//! Total params: 11,689,512
//! ```
//!
//! Each row becomes the row torchsummary would print (`Conv2d-1  [32, 64, 112,
//! 112]  9,408`): torchsummary hooks every module but the outermost one and the
//! plain containers (`Sequential`, `ModuleList`, `ModuleDict`), so those rows are
//! dropped; `--` and `(recursive)` counts become 0 (torchinfo prints a module's
//! own parameters, and a reused module's once); a row without an output shape
//! (a module that did not run) adds no activations. The converted table keeps
//! every line where it was, so errors name the line of the original.

use crate::layer_reading::SavedValues;
use crate::profile::{Family, Profile};
use crate::torchsummary::{SummaryError, parse_torchsummary, parse_torchsummary_values};

/// Whether `text` has torchinfo's `Layer (type:depth-idx)` header.
pub fn looks_like_torchinfo(text: &str) -> bool {
    text.lines().any(|l| l.contains("Layer (type:depth-idx)"))
}

/// Parses a torchinfo table into a [`Profile`] of `family` at `batch_size`
/// (errors are torchsummary's, with the original line numbers).
pub fn parse_torchinfo(
    text: &str,
    family: Family,
    batch_size: u32,
) -> Result<Profile, SummaryError> {
    parse_torchsummary(&to_torchsummary(text), family, batch_size)
}

/// [`parse_torchinfo`] with what the detailed bound counts of the table.
pub(crate) fn parse_torchinfo_values(
    text: &str,
    family: Family,
    batch_size: u32,
) -> Result<(Profile, SavedValues), SummaryError> {
    parse_torchsummary_values(&to_torchsummary(text), family, batch_size)
}

/// [`parse_torchinfo_values`] with what the table had no rule for (see
/// [`crate::torchsummary::parse_torchsummary_reading`]).
pub(crate) fn parse_torchinfo_reading(
    text: &str,
    family: Family,
    batch_size: u32,
) -> Result<(Profile, SavedValues, crate::Caveats), SummaryError> {
    crate::torchsummary::parse_torchsummary_reading(&to_torchsummary(text), family, batch_size)
}

/// Rewrites the table line by line (see the module docs).
fn to_torchsummary(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut in_rows = false;
    let mut rows = 0usize;
    for line in text.lines() {
        let t = line.trim();
        let converted = if t.contains("Layer (type:depth-idx)") {
            in_rows = true;
            "Layer (type)   Output Shape   Param #".to_string()
        } else if !in_rows || t.is_empty() || t.starts_with('-') {
            line.to_string()
        } else if t.starts_with('=') {
            if rows > 0 {
                in_rows = false;
            }
            line.to_string()
        } else {
            rows += 1;
            row(t, rows)
        };
        out.push_str(&converted);
        out.push('\n');
    }
    out
}

/// `│    └─Conv2d: 3-1   [32, 64, 56, 56]   36,864` → `Conv2d-7 [32, 64, 56, 56] 36,864`;
/// the root and plain containers → an empty line. A row it cannot read is
/// passed on as it is, for torchsummary's parser to reject with its line.
fn row(t: &str, index: usize) -> String {
    let body = t.trim_start_matches(['│', '├', '└', '─', '|', ' ']);
    let Some((kind, rest)) = body.split_once(':') else {
        return String::new(); // the outermost module (depth 0)
    };
    let kind = kind.trim();
    if matches!(kind, "Sequential" | "ModuleList" | "ModuleDict") {
        return String::new();
    }
    let rest = rest.trim_start();
    // skip the depth-idx token
    let rest = rest
        .split_once(char::is_whitespace)
        .map_or("", |(_, r)| r)
        .trim();
    let (shape, params) = match (rest.find('['), rest.rfind(']')) {
        (Some(open), Some(close)) if open < close => {
            (&rest[open..=close], rest[close + 1..].trim())
        }
        _ => ("[1, 0]", rest.split_whitespace().last().unwrap_or("")),
    };
    let params = if params == "--" || params == "(recursive)" {
        "0"
    } else {
        params
    };
    if kind.is_empty() || kind.contains(char::is_whitespace) {
        return t.to_string();
    }
    format!("{kind}-{index}  {shape}  {params}")
}

#[cfg(test)]
mod tests {
    use super::*;

    const TABLE: &str = "\
==========================================================================================
Layer (type:depth-idx)                   Output Shape              Param #
==========================================================================================
Net                                      [8, 10]                   --
├─Sequential: 1-1                        [8, 16, 8, 8]             --
│    └─Conv2d: 2-1                       [8, 16, 8, 8]             448
│    └─BatchNorm2d: 2-2                  [8, 16, 8, 8]             32
│    └─ReLU: 2-3                         [8, 16, 8, 8]             --
├─AdaptiveAvgPool2d: 1-2                 [8, 16, 1, 1]             --
├─Linear: 1-3                            [8, 10]                   170
├─Dropout: 1-4                           --                        --
==========================================================================================
Total params: 650
Trainable params: 650
==========================================================================================
";

    #[test]
    fn small_cnn() {
        assert!(looks_like_torchinfo(TABLE));
        let p = parse_torchinfo(TABLE, Family::Cnn, 8).unwrap();
        assert_eq!(p.parameters, 650);
        assert_eq!(p.activations, 3 * 1024 + 16 + 10);
        assert_eq!(
            (
                p.layers.conv2d,
                p.layers.batch_norm,
                p.layers.linear,
                p.layers.dropout
            ),
            (1, 1, 1, 1)
        );
        assert_eq!(p.layers.adaptive_avg_pool, 1);
    }

    #[test]
    fn errors_keep_the_line() {
        let edited = TABLE.replace("Total params: 650", "Total params: 651");
        let e = parse_torchinfo(&edited, Family::Cnn, 8).unwrap_err();
        assert!(e.to_string().contains("line 13:"), "{e}");
        let garbled = TABLE.replace("[8, 16, 8, 8]             32", "[8, x, 8, 8]   32");
        let e = parse_torchinfo(&garbled, Family::Cnn, 8).unwrap_err();
        assert!(e.to_string().contains("line 7:"), "{e}");
    }
}
