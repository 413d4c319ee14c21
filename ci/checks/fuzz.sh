#!/usr/bin/env bash
# CI check: a short run of every libFuzzer target in fuzz/ (tools/fuzz.sh, 30 s each by default;
# CARMA_FUZZ_SECONDS to change it) on the seed corpus plus what earlier runs on this machine found.
# Stable Rust: SanitizerCoverage through codegen flags, no nightly and no cargo-fuzz. The first build
# of the instrumented targets takes ~9.5 min on 2 cores (kept in ~/.cache/carma-fuzz/target).
# Any crash fails the check, with the reproducer's path.
set -euo pipefail
cd "$(dirname "$0")/../.."
cargo fmt --manifest-path fuzz/Cargo.toml -- --check
bash tools/fuzz.sh --seconds "${CARMA_FUZZ_SECONDS:-30}"
