#!/usr/bin/env bash
# The architecture sweep of docs/estimator-sweep.md: carma's `--summary` bound for every torchvision
# classification model and every Hugging Face LM / sequence-classification class that builds from its
# default configuration, at two batch sizes, against the traced step's peak plus the CUDA context.
#
#   bash estimator/profile/sweep.sh [--out DIR] [--only vision|hf] [--match NAME] [--limit N] [--resume]
#
# Runs in carma_profile's torch venv (ci/lib/profile-venv.sh) with the carma binary built here; the
# rows go to DIR/sweep.csv (default /tmp/carma-sweep), the tallies to stdout.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
PVENV="$(bash "$ROOT/ci/lib/profile-venv.sh" | tail -n1)"
cargo build -q -p carma --manifest-path "$ROOT/Cargo.toml"
cd "$ROOT/estimator/profile"
PYTHONPATH="$PWD" exec "$PVENV/bin/python" -m carma_profile.sweep --carma "$ROOT/target/debug/carma" "$@"
