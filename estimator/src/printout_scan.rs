//! The state-space scan of a Mamba-style mixer block, read from what its printout shows.
//!
//! A mixer is a container holding a `(conv1d): Conv1d(…)`, an `(in_proj): Linear(…)` and an
//! `(out_proj): Linear(…)` beside parameters of its own (`A_log`, `D`, `dt_bias`, which a
//! printout does not list): Mamba's, FalconMamba's, Jamba's and Zamba's `*MambaMixer`,
//! Mamba-2's, Bamba's, Zamba-2's, NemotronH's, GraniteMoeHybrid's and Falcon-H1's mixers. A short
//! convolution with the same children and no parameters of its own (LFM2's `*ShortConv`) runs no
//! scan. Without the `mamba-ssm` kernels, transformers (5.23) runs the scan in PyTorch, in fp32
//! whatever the activations' dtype (`.float()`), and autograd keeps far more than the mixer's
//! linears output:
//!
//! * **Selective scan** (Mamba-1: `mamba_selective_scan`'s reference path): the discretised `A`
//!   (`exp(A × dt)`) and `B × u` of the whole sequence, and the recurrence's state at every token,
//!   each `seq × d_inner × d_state`. [`SELECTIVE_STATE_TENSORS`] of them per mixer and sample.
//!   `d_inner` is `x_proj`'s input; `d_state` is half of what `x_proj` outputs beyond `dt_proj`'s
//!   input (`x_proj` outputs `dt_rank + 2 × d_state`). Zamba holds `x_proj` and `dt_proj` as bare
//!   per-head parameters: its mixer's own parameters are `d_inner × (2 × dt_rank + 3 × d_state +
//!   2)` (`x_proj_weight`, `dt_proj_weight`, `A_log`, `dt_proj_bias`, `D`), solved for `d_state`
//!   with Zamba's `dt_rank = ceil(hidden / 16)` (`mamba_dt_rank="auto"`); a count that does not
//!   solve to a whole `d_state` that way is not sized.
//! * **Chunked scan** (Mamba-2's state-space duality, `mamba2_chunk_scan`'s reference path): the
//!   sequence is padded to whole chunks; `B` and `C`, repeated from their groups to every head,
//!   and `B`'s decayed copy are `padded × heads × d_state` ([`CHUNKED_STATE_TENSORS`]); the
//!   intra-chunk decay `L`, the scores `G = C·B` and `M = G × L` are `padded × chunk × heads`
//!   ([`CHUNKED_SCORE_TENSORS`]); the padded inputs, their discretised copy and the partial
//!   outputs are `padded × d_inner` ([`CHUNKED_WIDTH_TENSORS`]). `in_proj` packs the gate
//!   (`d_inner`), the convolution's input (`d_inner + 2 × groups × d_state`, the `conv1d`'s
//!   channels) and `dt` (one per head): `d_inner` is `out_proj`'s input, `2 × groups × d_state` the
//!   channels beyond it, `heads` what `in_proj` outputs beyond both. The printout cannot split
//!   `groups × d_state`, so it counts as `d_state` (exact for one group; Mamba-2's and NemotronH's
//!   eight groups make it 8 × over). The chunk is [`ASSUMED_CHUNK`].
//! * A mixer whose parts do not add up either way is **not sized**: its states count as a selective
//!   scan's with [`UNSIZED_STATE`] states per channel, and the reading says so (an
//!   `unknown-module` caveat, which also counts every value 150 %).
//!
//! The states are counted in fp32, beside the mixer's linears' outputs.

use crate::printout_line::{keyword, positional};

/// `seq × d_inner × d_state` fp32 tensors a selective scan keeps per mixer and sample. Traced
/// (fake tensors, transformers 5.23, batch 2, 128 tokens), Zamba's 76 mixers (`d_inner` 7,424,
/// `d_state` 16) keep 203 MiB per mixer and sample at the end of forward: the states' `add` at
/// every token, `exp(A × dt)`, `B × u` and a `clone`, 3.5 such tensors (docs/estimator-sweep.md).
/// Rounded up. Without it the bound was 66,285 MiB under Zamba's traced floor at batch 8.
pub const SELECTIVE_STATE_TENSORS: u128 = 4;
/// Tokens per chunk assumed for a chunked (Mamba-2) scan: 256, the largest `chunk_size` of
/// transformers' Mamba-2-style configurations (Mamba-2, Bamba, Zamba-2, GraniteMoeHybrid; Falcon-H1
/// and NemotronH use 128). A printout does not show it; a larger chunk pads a short sequence
/// further, and every count below grows with it.
pub const ASSUMED_CHUNK: u128 = 256;
/// `padded × heads × d_state` fp32 tensors of a chunked scan: `B` and `C` repeated to every head
/// (each saved by its einsum) and `B × decay` (saved by the einsum that makes the chunk states).
pub const CHUNKED_STATE_TENSORS: u128 = 3;
/// `padded × chunk × heads` fp32 tensors of a chunked scan: `L = exp(segsum(A))`, `G = C·B` and
/// `M = G × L`, each saved by the product that reads it.
pub const CHUNKED_SCORE_TENSORS: u128 = 3;
/// `padded × d_inner` fp32 tensors of a chunked scan: the input in fp32, its padded and
/// discretised (`× dt`) copies, `C × states` and the `D` residual's input.
pub const CHUNKED_WIDTH_TENSORS: u128 = 5;
/// States per channel counted for a mixer whose `d_state` the printout does not give: 256, the
/// largest default of transformers' Mamba-style configurations (Bamba, Falcon-H1); Mamba's and
/// Zamba's are 16, Mamba-2's 128.
pub const UNSIZED_STATE: u128 = 256;
/// Zamba's `dt_rank` per hidden feature: `ceil(hidden / 16)`.
const DT_RANK_DIVISOR: u64 = 16;

/// The children of an open container that a mixer's scan is read from.
#[derive(Debug, Default, Clone, Copy)]
pub(crate) struct MixerParts {
    conv_channels: Option<u64>,
    /// `in_proj`'s `(in_features, out_features)`.
    in_proj: Option<(u64, u64)>,
    out_proj_in: Option<u64>,
    /// `x_proj`'s `(in_features, out_features)`.
    x_proj: Option<(u64, u64)>,
    dt_proj_in: Option<u64>,
}

/// A mixer's scan as the printout sizes it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Scan {
    /// Mamba-1's selective scan.
    Selective { d_inner: u64, d_state: u64 },
    /// Mamba-2's chunked scan; `group_state` is `groups × d_state`.
    Chunked {
        d_inner: u64,
        heads: u64,
        group_state: u64,
    },
    /// A mixer whose parts do not add up: counted with [`UNSIZED_STATE`] and a caveat.
    Unsized { d_inner: u64 },
}

impl MixerParts {
    /// Notes a module closed on its line directly inside the container.
    pub(crate) fn see(&mut self, key: &str, kind: &str, args: &str) {
        let linear = matches!(kind, "Linear" | "LazyLinear");
        let io = || {
            Some((
                keyword(args, "in_features")?,
                keyword(args, "out_features")?,
            ))
        };
        match key {
            "conv1d" if kind == "Conv1d" => self.conv_channels = positional(args, 1),
            "in_proj" if linear => self.in_proj = io(),
            "out_proj" if linear => self.out_proj_in = keyword(args, "in_features"),
            "x_proj" if linear => self.x_proj = io(),
            "dt_proj" if linear => self.dt_proj_in = keyword(args, "in_features"),
            _ => {}
        }
    }

    /// The scan of a container with these children and `own` parameters of its own, if it is a
    /// mixer (see the module docs).
    pub(crate) fn scan(&self, own: u128) -> Option<Scan> {
        let (conv, (hidden, in_out), out_in) =
            (self.conv_channels?, self.in_proj?, self.out_proj_in?);
        if own == 0 {
            return None; // a short convolution: no scan, no A_log
        }
        let unsized_ = Scan::Unsized {
            d_inner: conv.max(out_in),
        };
        if let (Some((d_inner, x_out)), Some(rank)) = (self.x_proj, self.dt_proj_in) {
            // Mamba, FalconMamba, Jamba: x_proj outputs dt_rank + 2 × d_state
            return Some(match x_out.checked_sub(rank) {
                Some(two_n) if two_n > 0 && two_n.is_multiple_of(2) => Scan::Selective {
                    d_inner,
                    d_state: two_n / 2,
                },
                _ => unsized_,
            });
        }
        if self.x_proj.is_some() || self.dt_proj_in.is_some() {
            return Some(unsized_);
        }
        if conv == out_in && in_out == 2 * conv {
            // Zamba: x_proj and dt_proj are bare parameters
            let d = u128::from(conv);
            let rank = u128::from(hidden.div_ceil(DT_RANK_DIVISOR));
            let per_channel = own.is_multiple_of(d).then_some(own / d);
            let three_n = per_channel.and_then(|k| k.checked_sub(2 + 2 * rank));
            return Some(match three_n {
                Some(t) if t > 0 && t.is_multiple_of(3) => Scan::Selective {
                    d_inner: conv,
                    d_state: u64::try_from(t / 3).unwrap_or(u64::MAX),
                },
                _ => unsized_,
            });
        }
        let two_gn = conv
            .checked_sub(out_in)
            .filter(|g| *g > 0 && g.is_multiple_of(2));
        let heads = in_out
            .checked_sub(out_in)
            .and_then(|r| r.checked_sub(conv))
            .filter(|h| *h > 0 && out_in % h == 0);
        Some(match (two_gn, heads) {
            (Some(two_gn), Some(heads)) => Scan::Chunked {
                d_inner: out_in,
                heads,
                group_state: two_gn / 2,
            },
            _ => unsized_,
        })
    }
}

impl Scan {
    /// fp32 values the scan keeps per sample of `seq` tokens.
    pub(crate) fn values(self, seq: u128) -> u128 {
        match self {
            Scan::Selective { d_inner, d_state } => SELECTIVE_STATE_TENSORS
                .saturating_mul(seq)
                .saturating_mul(u128::from(d_inner))
                .saturating_mul(u128::from(d_state)),
            Scan::Chunked {
                d_inner,
                heads,
                group_state,
            } => {
                let padded = seq.div_ceil(ASSUMED_CHUNK).saturating_mul(ASSUMED_CHUNK);
                let h = u128::from(heads);
                let states = CHUNKED_STATE_TENSORS
                    .saturating_mul(h)
                    .saturating_mul(u128::from(group_state));
                let scores = CHUNKED_SCORE_TENSORS
                    .saturating_mul(ASSUMED_CHUNK)
                    .saturating_mul(h);
                let widths = CHUNKED_WIDTH_TENSORS.saturating_mul(u128::from(d_inner));
                padded.saturating_mul(states.saturating_add(scores).saturating_add(widths))
            }
            Scan::Unsized { d_inner } => SELECTIVE_STATE_TENSORS
                .saturating_mul(seq)
                .saturating_mul(u128::from(d_inner))
                .saturating_mul(UNSIZED_STATE),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parts(lines: &[(&str, &str, &str)]) -> MixerParts {
        let mut p = MixerParts::default();
        for (k, kind, args) in lines {
            p.see(k, kind, args);
        }
        p
    }

    const CONV: &str = "7424, 7424, kernel_size=(4,), stride=(1,), padding=(3,), groups=7424";

    #[test]
    fn mamba_reads_x_proj() {
        let p = parts(&[
            (
                "conv1d",
                "Conv1d",
                "1536, 1536, kernel_size=(4,), groups=1536",
            ),
            (
                "in_proj",
                "Linear",
                "in_features=768, out_features=3072, bias=False",
            ),
            (
                "x_proj",
                "Linear",
                "in_features=1536, out_features=80, bias=False",
            ),
            (
                "dt_proj",
                "Linear",
                "in_features=48, out_features=1536, bias=True",
            ),
            (
                "out_proj",
                "Linear",
                "in_features=1536, out_features=768, bias=False",
            ),
        ]);
        let s = p.scan(1536 * 18).unwrap();
        assert_eq!(
            s,
            Scan::Selective {
                d_inner: 1536,
                d_state: 16
            }
        );
        assert_eq!(s.values(128), 4 * 128 * 1536 * 16);
    }

    #[test]
    fn zamba_solves_its_bare_projections() {
        let p = parts(&[
            ("conv1d", "Conv1d", CONV),
            (
                "in_proj",
                "Linear",
                "in_features=3712, out_features=14848, bias=False",
            ),
            (
                "out_proj",
                "Linear",
                "in_features=7424, out_features=3712, bias=False",
            ),
        ]);
        // 86,526,720 less its children: 7,424 × (2 × 232 + 3 × 16 + 2)
        let s = p.scan(3_815_936).unwrap();
        assert_eq!(
            s,
            Scan::Selective {
                d_inner: 7424,
                d_state: 16
            }
        );
        // 4 × 128 × 7,424 × 16 fp32 values: 232 MiB per mixer and sample, over the traced 203
        assert_eq!((s.values(128) * 4) >> 20, 232);
        // a count that does not solve is not sized
        assert_eq!(
            p.scan(3_815_936 + 7424),
            Some(Scan::Unsized { d_inner: 7424 })
        );
    }

    #[test]
    fn mamba2_unpacks_in_proj() {
        let p = parts(&[
            (
                "conv1d",
                "Conv1d",
                "10240, 10240, kernel_size=(4,), groups=10240",
            ),
            (
                "in_proj",
                "Linear",
                "in_features=4096, out_features=18560, bias=False",
            ),
            (
                "out_proj",
                "Linear",
                "in_features=8192, out_features=4096, bias=False",
            ),
        ]);
        assert_eq!(
            p.scan(384),
            Some(Scan::Chunked {
                d_inner: 8192,
                heads: 128,
                group_state: 1024
            })
        );
    }

    #[test]
    fn a_short_convolution_is_no_mixer() {
        let p = parts(&[
            (
                "conv",
                "Conv1d",
                "2048, 2048, kernel_size=(7,), groups=2048, bias=False",
            ),
            (
                "in_proj",
                "Linear",
                "in_features=2048, out_features=6144, bias=False",
            ),
            (
                "out_proj",
                "Linear",
                "in_features=2048, out_features=2048, bias=False",
            ),
        ]);
        assert_eq!(p.scan(0), None);
        assert_eq!(p.scan(100), None); // its convolution is not `conv1d`
        let named = parts(&[
            ("conv1d", "Conv1d", "2048, 2048, kernel_size=(7,)"),
            (
                "in_proj",
                "Linear",
                "in_features=2048, out_features=6144, bias=False",
            ),
            (
                "out_proj",
                "Linear",
                "in_features=2048, out_features=2048, bias=False",
            ),
        ]);
        assert_eq!(named.scan(0), None);
    }

    /// A one-mixer printout whose `x_proj` outputs `x_out` features.
    fn net(x_out: u64) -> String {
        let x = 64 * x_out;
        // conv1d, in_proj, x_proj, dt_proj, out_proj, and its own A_log (64 × 16) and D (64)
        let mixer = 320 + 4_096 + x + 192 + 2_048 + 1_088;
        format!(
            "Net(
  (emb): Embedding(100, 32), 3,200 params
  (norm): LayerNorm((32,), eps=1e-05, elementwise_affine=True), 64 params
  (mixer): MambaMixer(
    (conv1d): Conv1d(64, 64, kernel_size=(4,), stride=(1,), padding=(3,), groups=64), 320 params
    (in_proj): Linear(in_features=32, out_features=128, bias=False), 4,096 params
    (x_proj): Linear(in_features=64, out_features={x_out}, bias=False), {x} params
    (dt_proj): Linear(in_features=2, out_features=64, bias=True), 192 params
    (out_proj): Linear(in_features=64, out_features=32, bias=False), 2,048 params
  ), {mixer} params
), {} params
",
            3_264 + mixer
        )
    }

    fn read(text: &str) -> (crate::analytic::SavedValues, Vec<String>) {
        let (_, v, c) =
            crate::printout::parse_printout_reading(text, crate::Family::Transformer, 1, 10, None)
                .unwrap();
        (v, c.as_slice().iter().map(|c| c.to_string()).collect())
    }

    #[test]
    fn a_mixer_it_cannot_size_is_counted_conservatively_and_said() {
        // x_proj: dt_rank 2 + 2 × 16 states
        let (sized, said) = read(&net(34));
        assert!(said.iter().all(|w| !w.contains("MambaMixer")), "{said:?}");
        // dt_rank 2 + 31: no whole d_state
        let (unsized_, said) = read(&net(33));
        assert!(said.iter().any(|w| w.contains("MambaMixer")), "{said:?}");
        // 256 states per channel, and every value at 150 %
        // (the Conv1d has no rule: every value at 150 % in both); the embedding's and the norm's
        // outputs in fp32 beside the scan's states, 16 per channel read, 256 when not
        let f = crate::caveat::with_fallback_factor;
        assert_eq!(sized.kept_fp32, f(2 * 10 * 32 + 4 * 10 * 64 * 16));
        assert_eq!(
            unsized_.kept_fp32,
            f(2 * 10 * 32 + 4 * 10 * 64 * UNSIZED_STATE)
        );
    }
}
