#!/usr/bin/env bash
# CI check: inside each crate listed below, the modules import one another without a circle.
# Sibling modules (the children of one module) must form a DAG: when `a` names something in
# `b` (or below it), nothing in `b` names anything in `a`. A circle means neither can be read,
# tested or moved without the other; the usual cure is a module below both that holds what they
# share. ci/checks/lib/module_cycles.py reads the module tree and the `crate::` / `super::` paths
# (comments and #[cfg(test)] code do not count) and prints each circle with its edges.
# Runs in about a second with python3; CARMA_BIN is not used.
# Every crate of the workspace with a src/ is listed.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
cd "$ROOT"
CRATES=(api cli core device-plugin dra-driver e2e estimator estimator-eval gpu http local operator scheduler-extender simulator workload)
srcs=()
for c in "${CRATES[@]}"; do srcs+=("$c/src"); done
if python3 ci/checks/lib/module_cycles.py "${srcs[@]}"; then
  echo "PASS: module-cycles: no import circle in ${CRATES[*]}"
else
  echo "FAIL: module-cycles: the circles above; put what the modules share in a module below them"
  exit 1
fi
