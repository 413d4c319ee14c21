#!/usr/bin/env bash
# Time `bash .ci/run` as a fresh machine would run it: a fresh clone of HEAD (so no cargo target
# directory), and empty caches for everything CI builds or downloads outside the repository:
#   Go's build cache (GOCACHE) and module cache (GOMODCACHE), the built Kubernetes binaries
#   (CARMA_E2E_CACHE), the instrumented fuzz targets (CARMA_FUZZ_DIR), pip's cache and the torch venv
#   of ci/checks/python.sh (XDG_CACHE_HOME), and Buildah's bases, images and cache mounts
#   (`ci/image.sh --clean`, which empties root's Buildah cache mounts for good).
# Kept: ~/.cargo/registry (crate downloads), the rustup toolchains, Debian packages already
# installed, and apt's lists. Needs about 50 GB free under WORK (default /tmp/carma-cold).
#
#   tools/ci-cold.sh            # prints CI's step lines, then `cold run: rc=<rc> in <s> s`
# Everything it made stays under WORK (remove it afterwards); the run's figures are in its output.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
WORK="${WORK:-/tmp/carma-cold}"
[[ -d "$ROOT/../shared" ]] || { echo "ci-cold: ../shared is missing beside the repository" >&2; exit 1; }
rm -rf "$WORK"; mkdir -p "$WORK"/{xdg,gomod,gocache,e2e,fuzz}
git clone -q "$ROOT" "$WORK/main"
ln -s "$(cd "$ROOT/../shared" && pwd)" "$WORK/shared"
bash "$ROOT/ci/image.sh" --clean >/dev/null
export XDG_CACHE_HOME="$WORK/xdg" GOCACHE="$WORK/gocache" GOMODCACHE="$WORK/gomod"
export CARMA_E2E_CACHE="$WORK/e2e" CARMA_FUZZ_DIR="$WORK/fuzz" CI=true
cd "$WORK/main"
echo "cold run of $(git rev-parse --short HEAD) starting $(date -u +%FT%TZ)"
t0=$(date +%s)
rc=0; bash .ci/run || rc=$?
echo "cold run: rc=$rc in $(( $(date +%s) - t0 )) s"
exit $rc
