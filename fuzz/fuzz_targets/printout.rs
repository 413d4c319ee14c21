//! Annotated PyTorch module printouts (`carma estimate --summary` for transformers): the first
//! two bytes pick the batch size, the next two the sequence length; a printout that parses is
//! estimated.
#![no_main]

use std::sync::OnceLock;

use carma_estimator::{Estimator, Family, looks_like_printout, parse_printout};
use libfuzzer_sys::fuzz_target;

fn estimator() -> &'static Estimator {
    static E: OnceLock<Estimator> = OnceLock::new();
    E.get_or_init(|| Estimator::new().expect("embedded models load"))
}

fuzz_target!(|data: &[u8]| {
    let [b0, b1, s0, s1, rest @ ..] = data else {
        return;
    };
    let batch = u32::from(u16::from_le_bytes([*b0, *b1]));
    let seq = u32::from(u16::from_le_bytes([*s0, *s1]));
    let Ok(text) = std::str::from_utf8(rest) else {
        return;
    };
    let _ = looks_like_printout(text);
    if let Ok(profile) = parse_printout(text, Family::Transformer, batch, seq) {
        let _ = estimator().estimate(&profile);
    }
});
