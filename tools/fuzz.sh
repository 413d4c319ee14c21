#!/usr/bin/env bash
# Build carma's libFuzzer targets (fuzz/) with stable Rust and run each one.
#
#   tools/fuzz.sh [--seconds S | --runs N] [--max-len BYTES] [--jobs J] [TARGET...]
#
# --seconds S: each target runs S seconds (default 30: the short run CI does).
# --runs N:    each target runs N executions (the long campaign: --runs 10000000).
# --max-len:   longest input libFuzzer makes (default 16384; longer seeds are cut).
# --jobs J:    targets fuzzed at the same time (default: the number of CPUs); each is one process
#              on one core, so J = CPUs keeps every core busy without slowing any target down.
# Coverage instrumentation is LLVM's SanitizerCoverage, switched on with stable codegen flags
# (what cargo-fuzz passes, minus a sanitizer): no nightly toolchain and no cargo-fuzz needed.
# Seeds: fuzz/seeds/<target>/ (ours) plus, for the parsers of CARMA's files, samples copied from
# ../shared at run time. The working corpus lives outside the repository
# (${CARMA_FUZZ_DIR:-~/.cache/carma-fuzz}/corpus/<target>) and grows from run to run.
# Prints one line per target: `fuzz <target>: <runs> runs in <s> s, <n> crashes`; a crash fails
# the script, once every target has run, with the reproducer's path (turn it into a regression test).
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
seconds=30
runs=""
max_len=16384
jobs=$(nproc)
targets=()
while [ $# -gt 0 ]; do
  case "$1" in
    --seconds) seconds=$2; shift 2 ;;
    --runs) runs=$2; shift 2 ;;
    --max-len) max_len=$2; shift 2 ;;
    --jobs) jobs=$2; shift 2 ;;
    -h|--help) sed -n 2,18p "$0"; exit 0 ;;
    *) targets+=("$1"); shift ;;
  esac
done
all=(quantity torchsummary printout carma_trace cluster_snapshot pod_annotations extender_verbs)
[ ${#targets[@]} -gt 0 ] || targets=("${all[@]}")

work=${CARMA_FUZZ_DIR:-$HOME/.cache/carma-fuzz}
export CARGO_TARGET_DIR=$work/target
mkdir -p "$work"
t0=$(date +%s)
# Not --locked: fuzz/Cargo.lock pins what it lists, and cargo adds what a change of the main
# workspace's dependencies needs instead of failing. With an explicit --target, RUSTFLAGS reach the targets' code only, not build scripts and
# proc macros (which would not link against the instrumentation).
host=$(rustc -vV | sed -n 's/^host: //p')
RUSTFLAGS="-Cpasses=sancov-module \
-Cllvm-args=-sanitizer-coverage-level=4 \
-Cllvm-args=-sanitizer-coverage-inline-8bit-counters \
-Cllvm-args=-sanitizer-coverage-pc-table \
-Cllvm-args=-sanitizer-coverage-trace-compares \
--cfg fuzzing -Cdebug-assertions -Coverflow-checks" \
  cargo build --release --manifest-path fuzz/Cargo.toml --bins --target "$host"
echo "fuzz: targets built in $(( $(date +%s) - t0 )) s"

shared=$root/../shared
seed_shared() { # seed_shared <target> <dir>
  local d=$2
  case "$1" in
    carma_trace)
      # The first byte picks the parser: 0 trace script, 1 .rad, 2 durations CSV.
      local i=0
      for f in "$shared"/traces/carma/v2/*.sh; do
        [ -f "$f" ] && { printf '\x00'; cat "$f"; } > "$d/script-$i" && i=$((i+1))
      done
      i=0
      for f in $(ls "$shared"/traces/carma/v1/workloads/*.rad 2>/dev/null | head -20); do
        { printf '\x01'; cat "$f"; } > "$d/rad-$i"; i=$((i+1))
      done
      [ -f "$shared/traces/carma/task-durations.csv" ] &&
        { printf '\x02'; head -c 4000 "$shared/traces/carma/task-durations.csv"; } > "$d/durations"
      ;;
    torchsummary)
      # Family byte 1 (cnn), batch 32.
      local i=0
      for f in $(ls "$shared"/data/model-summaries/* 2>/dev/null | head -20); do
        { printf '\x01\x20\x00'; head -c 8000 "$f"; } > "$d/summary-$i"; i=$((i+1))
      done
      ;;
  esac
}

fuzz_one() { # fuzz_one <target>: fuzzes it, writes its line to $work/<target>.summary; rc 1 on a finding
  local target=$1 corpus=$work/corpus/$1 artifacts=$work/artifacts/$1/ log=$work/$1.log
  mkdir -p "$corpus" "$artifacts"
  [ -d "fuzz/seeds/$target" ] && cp -n fuzz/seeds/"$target"/* "$corpus"/ 2>/dev/null || true
  [ -d "$shared" ] && seed_shared "$target" "$corpus"
  local limit=(-max_total_time="$seconds")
  [ -n "$runs" ] && limit=(-runs="$runs")
  local start rc done_runs crashes
  start=$(date +%s)
  set +e
  "$CARGO_TARGET_DIR/$host/release/$target" "${limit[@]}" -max_len="$max_len" -rss_limit_mb=2048 \
    -timeout=10 -artifact_prefix="$artifacts" -print_final_stats=1 "$corpus" > "$log" 2>&1
  rc=$?
  set -e
  # -a: libFuzzer echoes inputs, so the log may hold any bytes.
  done_runs=$(grep -aoE 'stat::number_of_executed_units: *[0-9]+' "$log" | grep -oE '[0-9]+$' | tail -1 || true)
  # Findings: crash-, leak-, timeout-, oom- (slow-unit- files only report inputs slower than 10 s).
  crashes=$(find "$artifacts" -type f \( -name 'crash-*' -o -name 'leak-*' -o -name 'timeout-*' -o -name 'oom-*' \) | wc -l)
  echo "fuzz $target: ${done_runs:-0} runs in $(( $(date +%s) - start )) s, $crashes crashes (corpus $(ls "$corpus" | wc -l) inputs)" \
    > "$work/$target.summary"
  if [ "$rc" -ne 0 ] || [ "$crashes" -ne 0 ]; then
    { tail -40 "$log"; echo "fuzz $target FAILED (exit $rc); reproducers: $artifacts"; } >> "$work/$target.summary"
    return 1
  fi
}

# Up to $jobs targets at once; the lines come out in the targets' order once all have run.
t0=$(date +%s)
running=0
for target in "${targets[@]}"; do
  rm -f "$work/$target.summary"
  if [ "$running" -ge "$jobs" ]; then wait -n || true; running=$((running - 1)); fi
  fuzz_one "$target" &
  running=$((running + 1))
done
wait || true
failed=0
for target in "${targets[@]}"; do
  if [ -f "$work/$target.summary" ]; then
    head -1 "$work/$target.summary"
    if [ "$(wc -l < "$work/$target.summary")" -gt 1 ]; then tail -n +2 "$work/$target.summary" >&2; failed=1; fi
  else
    echo "fuzz $target FAILED: it wrote no result (see $work/$target.log)" >&2; failed=1
  fi
done
echo "fuzz: ${#targets[@]} targets fuzzed, $jobs at a time, in $(( $(date +%s) - t0 )) s"
exit "$failed"
