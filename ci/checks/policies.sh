#!/usr/bin/env bash
# CI check: the simulated figures in docs/ are what their commands print.
# Each table in docs/ sits under a marker naming the command that printed it; this check reruns that
# command on one row (the cheapest: CARMA's philly_trace-t1 trace, 1 node × 4 GPUs, a second or two
# each in a debug build) and fails when the row differs from the documented one, character for
# character:
#   1. docs/queues-on-carma-traces.md   python3 tools/compare-policies.py --table exclusive
#   2. docs/default-policy.md, γ = 1    python3 tools/compare-policies.py --table grid
#   3. docs/default-policy.md, γ = 2    (the same table)
#   4. docs/policies-under-measured-slowdown.md   ... --table grid --slowdown-model time-slicing
#   5. docs/grid-sensitivity.md        ... --table grid --lags 13,14,15,16,17 --candidate-args '...' (five runs of one row)
#   6. docs/estimator-evaluation.md     carma estimate eval --peaks --table (its summary lines and per-source tallies)
# (The README's `carma simulate` block is compared by `cargo test -p carma --test readme_simulate`.)
# Env: CARMA_BIN (default target/debug/carma; build with `cargo build -p carma`), SHARED (default
# ../shared: CARMA's traces and task files, never copied into the repository).
set -uo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
cd "$ROOT" || exit 1
CARMA="${CARMA_BIN:-target/debug/carma}"
SHARED="${SHARED:-../shared}"
failures=()
step() { echo; echo "== $*"; }
fail() { echo "FAIL: $1"; failures+=("$1"); }

if [ ! -x "$CARMA" ]; then
  echo "FAIL: $CARMA is not an executable (cargo build -p carma, or set CARMA_BIN)"; exit 1
fi
if [ ! -d "$SHARED/traces/carma/v2" ]; then
  echo "FAIL: $SHARED/traces/carma/v2 is missing (CARMA's traces; set SHARED)"; exit 1
fi

# doc_table_row <file> <marker> <row prefix>: the row of the table right under the marker line
# whose text starts with the prefix (empty when the marker or the row is missing).
doc_table_row() {
  awk -v marker="$2" -v prefix="$3" '
    $0 == marker { inside = 1; next }
    inside && /^\|/ { seen = 1; if (index($0, prefix) == 1) { print; exit } next }
    inside && seen { exit }
  ' "$1"
}

# check_row <description> <doc file> <documented command> <row prefix> <command...>
# Runs the command (a slice of the documented one) and compares its row with the documented row.
check_row() {
  local desc="$1" doc="$2" documented="$3" prefix="$4"; shift 4
  local marker="<!-- compare-policies: $documented -->" want got started
  step "$desc"
  echo "documented in $doc under: $marker"
  echo "regenerating: $*"
  if ! grep -qxF "$marker" "$doc"; then
    fail "$desc: $doc has no line '$marker'"; return
  fi
  want="$(doc_table_row "$doc" "$marker" "$prefix")"
  if [ -z "$want" ]; then
    fail "$desc: the table under the marker in $doc has no row starting '$prefix'"; return
  fi
  started=$(date +%s)
  if ! got="$("$@" | grep -F -- "$prefix")"; then
    fail "$desc: the command printed no row starting '$prefix'"; return
  fi
  if [ "$got" = "$want" ]; then
    echo "PASS: $desc ($(( $(date +%s) - started )) s): $got"
  else
    echo "  documented:  $want"
    echo "  regenerated: $got"
    fail "$desc: $doc differs from what the command prints (rerun the command and update the table and its text)"
  fi
}

compare=(python3 tools/compare-policies.py --carma "$CARMA" --shared "$SHARED")

check_row "CARMA's traces, exclusive against CARMA's best (philly_trace-t1, queue carma)" \
  docs/queues-on-carma-traces.md "python3 tools/compare-policies.py --table exclusive" \
  "| philly_trace-t1 | carma |" \
  "${compare[@]}" --table exclusive --workload philly_trace-t1 --queue carma

check_row "the default policy against CARMA's best, γ = 1 (philly_trace-t1, queue kube)" \
  docs/default-policy.md "python3 tools/compare-policies.py --table grid" \
  "| philly_trace-t1 (1×4) | kube | 1 |" \
  "${compare[@]}" --table grid --workload philly_trace-t1 --queue kube --gammas 1

check_row "the default policy against CARMA's best, γ = 2 (philly_trace-t1, queue carma)" \
  docs/default-policy.md "python3 tools/compare-policies.py --table grid" \
  "| philly_trace-t1 (1×4) | carma | 2 |" \
  "${compare[@]}" --table grid --workload philly_trace-t1 --queue carma --gammas 2

check_row "the default policy against CARMA's best, measured slowdown (philly_trace-t1, queue kube)" \
  docs/policies-under-measured-slowdown.md \
  "python3 tools/compare-policies.py --table grid --slowdown-model time-slicing" \
  "| philly_trace-t1 (1×4) | kube | time-slicing |" \
  "${compare[@]}" --table grid --slowdown-model time-slicing --workload philly_trace-t1 --queue kube

check_row "the order by class over five telemetry lags (philly_trace-t1, queue carma, γ = 1)" \
  docs/grid-sensitivity.md \
  "python3 tools/compare-policies.py --table grid --jobs 2 --lags 13,14,15,16,17 --candidate-args '--queue-order short-then-longest --queue-priority classes'" \
  "| philly_trace-t1 (1×4) | carma | 1 |" \
  "${compare[@]}" --table grid --jobs 2 --lags 13,14,15,16,17 \
  --candidate-args '--queue-order short-then-longest --queue-priority classes' \
  --workload philly_trace-t1 --queue carma --gammas 1

step "estimator evaluation: carma estimate eval --peaks --table, summary lines"
doc=docs/estimator-evaluation.md
marker="<!-- estimate-eval: cargo run -p carma -- estimate eval --peaks --table -->"
# The fenced block right under the marker.
want="$(awk -v marker="$marker" '
  $0 == marker { inside = 1; next }
  inside && /^```/ { if (open) exit; open = 1; next }
  inside && open { print }
' "$doc")"
if [ -z "$want" ]; then
  fail "estimator evaluation: $doc has no block under '$marker'"
elif ! out="$("$CARMA" --log warn estimate eval --peaks --table)"; then
  fail "estimator evaluation: carma estimate eval --peaks --table failed"
else
  got="$(printf '%s\n' "$out" | grep -E '^((carma|legacy bound|GPUMemNet recorded) \(.*\): [0-9]+ rows|(mlp|cnn|transformer) / |H100, .* / traced: )')"
  if [ "$got" = "$want" ]; then
    echo "PASS: estimator evaluation: $(printf '%s\n' "$got" | head -n1) (and $(( $(printf '%s\n' "$got" | wc -l) - 1 )) more lines)"
  else
    echo "  documented:"; printf '%s\n' "$want" | sed 's/^/    /'
    echo "  regenerated:"; printf '%s\n' "$got" | sed 's/^/    /'
    fail "estimator evaluation: $doc differs from what the command prints"
  fi
fi

echo
if ((${#failures[@]})); then
  echo "policies: ${#failures[@]} check(s) FAILED:"; printf '  - %s\n' "${failures[@]}"
  exit 1
fi
echo "policies: every regenerated row matches docs/"
