#!/usr/bin/env bash
# Retrain carma's GPUMemNet estimator and rewrite estimator/models/ (ONNX, sidecar,
# fixture, model card). Creates/updates the virtual environment .venv at the
# repository root from the pinned requirements first.
#
#   estimator/training/retrain.sh [--data-dir DIR] [--threshold T]
#
# Data: $GPUMEMNET_DATA or --data-dir, default ../shared/data/gpumemnet.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
repo="$(cd "$here/../.." && pwd)"
venv="${CARMA_VENV:-$repo/.venv}"
if [ ! -x "$venv/bin/python" ]; then
  python3 -m venv "$venv"
fi
"$venv/bin/pip" install --quiet --disable-pip-version-check -r "$here/requirements.txt"
# Single-threaded BLAS keeps the fits reproducible and polite on shared machines.
export OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1 MKL_NUM_THREADS=1
exec "$venv/bin/python" "$here/train.py" "$@"
