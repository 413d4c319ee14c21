#!/usr/bin/env bash
# The venv carma_profile's tests run in (PyTorch: a 3 GB download, 5 GB installed), one per version of
# estimator/profile/requirements-test.txt, under ${XDG_CACHE_HOME:-~/.cache}/carma. Made once and
# reused: `.complete` is written last, so an interrupted install is never used.
#
#   ci/lib/profile-venv.sh       # prints the venv's path on its last line
#
# A lock makes a second caller wait for an install in progress (CI starts one in the background at
# its beginning, and ci/checks/python.sh then waits for it) instead of installing beside it.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
REQ="$ROOT/estimator/profile/requirements-test.txt"
CACHE="${XDG_CACHE_HOME:-$HOME/.cache}/carma"
PVENV="$CACHE/venv-profile-$(sha256sum "$REQ" | cut -c1-12)"
mkdir -p "$CACHE"
exec 9>"$CACHE/venv-profile.lock"
if ! flock -n 9; then
  waited=$(date +%s)
  echo "carma_profile: waiting for the install in progress into $PVENV" >&2
  flock 9
  echo "carma_profile: waited $(( $(date +%s) - waited )) s" >&2
fi
if [ -f "$PVENV/.complete" ]; then
  echo "carma_profile: reusing $PVENV" >&2
else
  started=$(date +%s)
  rm -rf "$CACHE"/venv-profile-*/  # older requirements' venvs (5 GB each) and an interrupted one
  python3 -m venv "$PVENV"
  "$PVENV/bin/python" -m pip install -q --disable-pip-version-check -r "$REQ"
  touch "$PVENV/.complete"
  echo "carma_profile: installed $REQ into $PVENV in $(( $(date +%s) - started )) s" >&2
fi
echo "$PVENV"
