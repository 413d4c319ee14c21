//! Kubernetes memory quantities (`carma.io/gpu-memory`, resource limits): any text gives MiB or a
//! named error, and a parsed quantity printed back parses to the same MiB.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|text: &str| {
    if let Ok(mib) = carma_core::quantity::parse_mib(text) {
        let again = carma_core::quantity::parse_mib(&format!("{mib}Mi"));
        assert_eq!(again.ok(), Some(mib), "{text:?}");
    }
});
