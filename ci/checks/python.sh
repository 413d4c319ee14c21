#!/usr/bin/env bash
# CI check: the Python parts — the GPUMemNet training pipeline, the dataset generator
# (its configuration sampling and CSV writing run on the CPU, no PyTorch), and
# carma_profile (estimator/profile) against real PyTorch.
# Installs the pinned requirements into .tools/venv-py (gitignored); PyTorch (a 3 GB
# download, 5 GB installed) goes into a venv under ~/.cache that later runs reuse (ci/lib/profile-venv.sh).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
cd "$ROOT"
VENV=.tools/venv-py
if [ ! -x "$VENV/bin/python" ]; then
  python3 -m venv "$VENV"
fi
"$VENV/bin/pip" install -q --disable-pip-version-check \
  -r estimator/training/requirements-test.txt -r estimator/datagen/requirements-test.txt
"$VENV/bin/python" -m pytest -q estimator/training/tests estimator/datagen/tests tools/tests

# carma_profile: its own venv with PyTorch, made once per version of its requirements (CI starts
# making it in the background at its beginning; this waits for that).
PVENV="$(bash ci/lib/profile-venv.sh | tail -n1)"
# the package as a user installs it (no dependencies: torch is the image's own)
"$PVENV/bin/python" -m pip install -q --disable-pip-version-check --no-deps --no-build-isolation \
  --force-reinstall ./estimator/profile
(cd /tmp && "$PVENV/bin/python" -c 'import carma_profile, sys; sys.exit("site-packages" not in carma_profile.__file__)')
"$PVENV/bin/carma-profile" --help >/dev/null
"$PVENV/bin/python" -m pytest -q -p no:cacheprovider estimator/profile/tests
