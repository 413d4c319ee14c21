#!/usr/bin/env bash
# The previous release of carma, for the real-node run's upgrade under load (faults.sh): the newest
# commit whose charts/carma/Chart.yaml carries the version before the current one (the parent of the
# commit that changed the version to the current one), checked out as a git worktree, and its carma
# binary built there.
#
#   e2e/real-node/previous-release.sh          # prints: <commit> <chart version> <worktree> <binary>
#
# The binary is built once per commit into ~/.cache/carma-e2e/previous/<commit>/carma, with the
# repository's own target directory, so the dependencies the two commits share are compiled once (the
# workspace crates of the worktree hash apart from the repository's: another path). The repository's
# own target/debug/carma, which that build would overwrite, is put back. Exit 3 (and a reason on
# stderr) when the history has no previous version: a shallow clone, or a chart never versioned twice.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
CACHE="${CARMA_E2E_CACHE:-$HOME/.cache/carma-e2e}/previous"

version_at() { git -C "$ROOT" show "$1:charts/carma/Chart.yaml" 2>/dev/null | sed -n 's/^version:[[:space:]]*//p' | tr -d "\"'" | head -n1; }

current="$(version_at HEAD)"
[[ -n "$current" ]] || { echo "previous-release: no charts/carma/Chart.yaml at HEAD" >&2; exit 3; }
since="" # the oldest commit that changed Chart.yaml and already has the current version
for c in $(git -C "$ROOT" log --format=%H -- charts/carma/Chart.yaml); do
  if [[ "$(version_at "$c")" == "$current" ]]; then since="$c"; else break; fi
done
prev="$(git -C "$ROOT" rev-parse --verify -q "${since:-HEAD}^" || true)"
prev_version="$( [[ -n "$prev" ]] && version_at "$prev" || true)"
if [[ -z "$prev" || -z "$prev_version" || "$prev_version" == "$current" ]]; then
  echo "previous-release: no earlier chart version than $current in this history ($(git -C "$ROOT" rev-list --count HEAD) commits$( [[ -f "$ROOT/.git/shallow" ]] && echo ', a shallow clone'))" >&2
  exit 3
fi

dir="$CACHE/$prev"
bin="$dir/carma"
tree="$dir/tree"
mkdir -p "$dir"
if [[ ! -d "$tree/.git" && ! -f "$tree/.git" ]]; then
  rm -rf "$tree"
  git -C "$ROOT" worktree prune
  git -C "$ROOT" worktree add --detach -f "$tree" "$prev" >"$dir/worktree.log" 2>&1 ||
    { echo "previous-release: git worktree add $prev: $(tail -n 2 "$dir/worktree.log")" >&2; exit 1; }
fi
if [[ ! -x "$bin" ]]; then
  target="${CARGO_TARGET_DIR:-$ROOT/target}"
  saved=""
  if [[ -f "$target/debug/carma" ]]; then saved="$dir/current-carma"; cp -p "$target/debug/carma" "$saved"; fi
  t0=$(date +%s)
  if ! (cd "$tree" && CARGO_TARGET_DIR="$target" cargo build -q -p carma >"$dir/build.log" 2>&1); then
    [[ -z "$saved" ]] || mv -f "$saved" "$target/debug/carma"
    echo "previous-release: cargo build of $prev failed: $(tail -n 5 "$dir/build.log")" >&2
    exit 1
  fi
  cp "$target/debug/carma" "$bin.tmp" && mv "$bin.tmp" "$bin"
  [[ -z "$saved" ]] || mv -f "$saved" "$target/debug/carma"
  echo "previous-release: built carma $prev_version ($prev) in $(( $(date +%s) - t0 )) s" >&2
fi
echo "$prev $prev_version $tree $bin"
