#!/usr/bin/env bash
# Every fenced command block of the two READMEs a user follows is marked for the real-node run's
# first-hour step (`<!-- first-hour: run -->`, which runs it verbatim, or `<!-- first-hour: skip:
# <why> -->`): an unmarked block would be a documented command no run ever tries. The lister fails on
# one and names its file and line.
set -euo pipefail
cd "$(dirname "$0")/../.."
listed="$(python3 e2e/real-node/firsthour.py list README.md charts/carma/README.md)"
n="$(grep -c ' run: ' <<<"$listed" || true)"
echo "docs: every command block of README.md and charts/carma/README.md is marked; $n commands run verbatim by the real-node run"

# A measured figure a page promises but never received: a fenced line that is only a placeholder
# token (FOO_LINE, TODO, TBD, XXX) where the output of a run belongs.
placeholders="$(grep -nE '^(TODO|TBD|XXX|[A-Z][A-Z0-9_]*_(LINE|FIGURE|OUTPUT))$' README.md docs/*.md charts/carma/README.md || true)"
if [[ -n "$placeholders" ]]; then
  echo "FAIL: docs: placeholder lines where measured output belongs:"
  echo "$placeholders"
  exit 1
fi
echo "docs: no placeholder line where measured output belongs"
