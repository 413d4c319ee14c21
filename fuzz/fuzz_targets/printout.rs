//! Annotated PyTorch module printouts and torchinfo tables (`carma estimate --summary`): the
//! first byte picks the parser (even: printout, odd: torchinfo), the next two the batch size,
//! the two after them the sequence length; a description that parses is estimated.
#![no_main]

use std::sync::OnceLock;

use carma_estimator::{
    Estimator, Family, looks_like_printout, looks_like_torchinfo, parse_printout, parse_torchinfo,
};
use libfuzzer_sys::fuzz_target;

fn estimator() -> &'static Estimator {
    static E: OnceLock<Estimator> = OnceLock::new();
    E.get_or_init(|| Estimator::new().expect("embedded models load"))
}

fuzz_target!(|data: &[u8]| {
    let [which, b0, b1, s0, s1, rest @ ..] = data else {
        return;
    };
    let batch = u32::from(u16::from_le_bytes([*b0, *b1]));
    let seq = u32::from(u16::from_le_bytes([*s0, *s1]));
    let Ok(text) = std::str::from_utf8(rest) else {
        return;
    };
    let parsed = if which % 2 == 0 {
        let _ = looks_like_printout(text);
        parse_printout(text, Family::Transformer, batch, seq).ok()
    } else {
        let _ = looks_like_torchinfo(text);
        let family = Family::ALL[usize::from(*which / 2) % Family::ALL.len()];
        parse_torchinfo(text, family, batch).ok()
    };
    if let Some(profile) = parsed {
        let _ = estimator().estimate(&profile);
    }
});
