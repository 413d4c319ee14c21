//! CARMA's own files as the simulator imports them: the first byte picks a trace script
//! (`philly_*.sh`), a `.rad` task file or the task-durations CSV.
#![no_main]

use std::path::Path;

use carma_simulator::trace::carma::{parse_durations, parse_rad, parse_script};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let [which, rest @ ..] = data else { return };
    let Ok(text) = std::str::from_utf8(rest) else {
        return;
    };
    match which % 3 {
        0 => {
            let _ = parse_script(Path::new("fuzz.sh"), text);
        }
        1 => {
            let _ = parse_rad(Path::new("fuzz.rad"), text);
        }
        _ => {
            let _ = parse_durations(Path::new("fuzz.csv"), text);
        }
    }
});
