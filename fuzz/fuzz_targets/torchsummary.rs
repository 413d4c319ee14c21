//! torchsummary tables (`carma estimate --summary`, the simulator's model summaries): the first
//! byte picks the family, the next two the batch size; a table that parses is estimated.
#![no_main]

use std::sync::OnceLock;

use carma_estimator::{Estimator, Family, parse_torchsummary};
use libfuzzer_sys::fuzz_target;

fn estimator() -> &'static Estimator {
    static E: OnceLock<Estimator> = OnceLock::new();
    E.get_or_init(|| Estimator::new().expect("embedded models load"))
}

fuzz_target!(|data: &[u8]| {
    let [f, b0, b1, rest @ ..] = data else { return };
    let family = Family::ALL[*f as usize % Family::ALL.len()];
    let batch = u32::from(u16::from_le_bytes([*b0, *b1]));
    let Ok(text) = std::str::from_utf8(rest) else {
        return;
    };
    if let Ok(profile) = parse_torchsummary(text, family, batch) {
        let _ = estimator().estimate(&profile);
    }
});
