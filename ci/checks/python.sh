#!/usr/bin/env bash
# CI check: the Python parts — the GPUMemNet training pipeline, the dataset generator
# (its configuration sampling and CSV writing run on the CPU, no PyTorch), and
# carma_profile (estimator/profile) against real PyTorch.
# Installs the pinned requirements into .tools/venv-py (gitignored); PyTorch (a 3 GB
# download, 5 GB installed) goes into a venv under ~/.cache that later runs reuse.
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

# carma_profile: one venv per version of its requirements; `.complete` is written last,
# so an interrupted install is never reused.
REQ=estimator/profile/requirements-test.txt
CACHE="${XDG_CACHE_HOME:-$HOME/.cache}/carma"
PVENV="$CACHE/venv-profile-$(sha256sum "$REQ" | cut -c1-12)"
if [ ! -f "$PVENV/.complete" ]; then
  started=$(date +%s)
  rm -rf "$CACHE"/venv-profile-*  # older requirements' venvs: 5 GB each
  mkdir -p "$CACHE"
  python3 -m venv "$PVENV"
  "$PVENV/bin/python" -m pip install -q --disable-pip-version-check -r "$REQ"
  touch "$PVENV/.complete"
  echo "carma_profile: installed $REQ into $PVENV in $(( $(date +%s) - started )) s"
else
  echo "carma_profile: reusing $PVENV"
fi
# the package as a user installs it (no dependencies: torch is the image's own)
"$PVENV/bin/python" -m pip install -q --disable-pip-version-check --no-deps --no-build-isolation \
  --force-reinstall ./estimator/profile
(cd /tmp && "$PVENV/bin/python" -c 'import carma_profile, sys; sys.exit("site-packages" not in carma_profile.__file__)')
"$PVENV/bin/carma-profile" --help >/dev/null
"$PVENV/bin/python" -m pytest -q -p no:cacheprovider estimator/profile/tests
