//! What a layer-by-layer reading met that the detailed bound has no measured rule for, and what
//! it counted instead.
//!
//! The detailed bound ([`crate::analytic::detailed_bound`]) was fitted on the module types and
//! attention kinds of CARMA's jobs. A table or printout can hold others: an attention block of a
//! type no rule covers (it may keep its score tensors, or not), a layer group that runs more often
//! than it is printed (ALBERT), a module whose outputs the reader cannot size. The generic rule
//! would under-count such a model without saying so, and an underestimate is the one error a
//! user pays for in a crash. So the readers record a [`Caveat`] for each and count the unknown part
//! conservatively; the profile carries them ([`crate::Profile::caveats`]), and an estimate whose
//! reservation that conservative bound sets says so: its source is
//! [`EstimateSource::AnalyticFallback`](crate::EstimateSource::AnalyticFallback) and its
//! `warnings` name what was unknown. Where a GPUMemNet class reserves more than the bound, the
//! class stands and nothing is said.

use std::fmt;

use serde::{Deserialize, Serialize};

/// The safety factor, in percent, on every activation value (saved values, values kept in fp32,
/// score values, the largest output) of a reading that holds a module type with no rule of its
/// own ([`CaveatKind::UnknownModule`], [`CaveatKind::UnknownAttention`] in a table). Not fitted:
/// before their patterns had rules, the held-out printouts fell short by at most a third of the
/// activations the bound counted for them (ALBERT-base 2,910 MiB on 8,907, T5-small 2,446 on
/// 9,470; docs/summaries-on-held-out.md), which half as much again covers.
pub const FALLBACK_PERCENT: u128 = 150;

/// What kind of thing a reading had no measured rule for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum CaveatKind {
    /// An attention block of a type that no rule says runs fused attention: counted as eager
    /// attention, with its score tensors ([`crate::printout_rules::EAGER_SCORE_QUARTERS`]).
    UnknownAttention,
    /// A layer group that a printout shows once but that runs several times (ALBERT's shared
    /// layers), with no run count given: counted [`crate::printout_rules::ASSUMED_SHARED_RUNS`]
    /// times.
    SharedLayers,
    /// A module of a type the reader cannot size, or one holding parameters of its own that no
    /// rule reads: every activation value counted [`FALLBACK_PERCENT`] %.
    UnknownModule,
}

impl CaveatKind {
    /// The kebab-case name, as serialised.
    pub fn as_str(self) -> &'static str {
        match self {
            CaveatKind::UnknownAttention => "unknown-attention",
            CaveatKind::SharedLayers => "shared-layers",
            CaveatKind::UnknownModule => "unknown-module",
        }
    }
}

/// Most module types one caveat of a profile may name ([`crate::Profile::caveats`]).
pub const MAX_CAVEAT_MODULES: usize = 64;
/// Longest module name or `counted` text of a profile's caveat, in bytes.
pub const MAX_CAVEAT_TEXT: usize = 256;

/// One thing a reading had no rule for: its kind, the module types it concerns and what the
/// bound counted in its place. A model profile carries them (`caveats`), so an estimate made from
/// the profile alone says what its reservation rests on.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Caveat {
    /// What kind of thing.
    pub kind: CaveatKind,
    /// The module types it concerns, in the order first met (e.g. `T5Attention`).
    pub modules: Vec<String>,
    /// What the bound counted instead, in words.
    pub counted: String,
}

impl fmt::Display for Caveat {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{}: {}: {}",
            self.kind.as_str(),
            self.modules.join(", "),
            self.counted
        )
    }
}

/// The caveats of one reading, one per kind, each listing its module types once.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Caveats(Vec<Caveat>);

impl Caveats {
    /// Records `module` under `kind`; the first caveat of a kind says what was counted.
    pub(crate) fn note(&mut self, kind: CaveatKind, module: &str, counted: impl Into<String>) {
        match self.0.iter_mut().find(|c| c.kind == kind) {
            Some(c) => {
                if !c.modules.iter().any(|m| m == module) {
                    c.modules.push(module.to_string());
                }
            }
            None => self.0.push(Caveat {
                kind,
                modules: vec![module.to_string()],
                counted: counted.into(),
            }),
        }
    }

    /// Whether any caveat of `kind` was recorded.
    pub fn has(&self, kind: CaveatKind) -> bool {
        self.0.iter().any(|c| c.kind == kind)
    }

    /// Whether nothing was recorded.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// The caveats, in the order their kinds were first met.
    pub fn as_slice(&self) -> &[Caveat] {
        &self.0
    }

    /// The caveats, owned.
    pub fn into_vec(self) -> Vec<Caveat> {
        self.0
    }
}

/// `value × FALLBACK_PERCENT / 100`, rounded up.
pub(crate) fn with_fallback_factor(value: u128) -> u128 {
    value.saturating_mul(FALLBACK_PERCENT).div_ceil(100)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_caveat_per_kind_each_module_once() {
        let mut c = Caveats::default();
        c.note(CaveatKind::UnknownModule, "Foo", "counted 150 %");
        c.note(CaveatKind::UnknownModule, "Bar", "ignored");
        c.note(CaveatKind::UnknownModule, "Foo", "ignored");
        c.note(CaveatKind::UnknownAttention, "T5Attention", "eager");
        assert_eq!(c.as_slice().len(), 2);
        assert_eq!(
            c.as_slice()[0].to_string(),
            "unknown-module: Foo, Bar: counted 150 %"
        );
        assert!(c.has(CaveatKind::UnknownAttention) && !c.has(CaveatKind::SharedLayers));
        assert_eq!(with_fallback_factor(3), 5);
    }
}
