#!/usr/bin/env bash
# CI check: the Python parts — the GPUMemNet training pipeline and the dataset
# generator (its configuration sampling and CSV writing run on the CPU, no PyTorch).
# Installs the pinned requirements into .tools/venv-py (gitignored).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
cd "$ROOT"
VENV=.tools/venv-py
if [ ! -x "$VENV/bin/python" ]; then
  python3 -m venv "$VENV"
fi
"$VENV/bin/pip" install -q --disable-pip-version-check \
  -r estimator/training/requirements-test.txt -r estimator/datagen/requirements-test.txt
"$VENV/bin/python" -m pytest -q estimator/training/tests estimator/datagen/tests
