#!/usr/bin/env bash
# CI check: ARCHITECTURE.md names only paths that exist, and its crate table lists every crate.
#   1. Every repository path the file names in inline code (`...`) or as a link target ([..](...))
#      exists in the working tree.
#   2. Every workspace member of Cargo.toml has a row in the "## Crates" table (first column `<member>/`).
# Runs in a fraction of a second with bash, awk and coreutils; CARMA_BIN is not used.
#
# What counts as a path. A code span is split into words (so `bash e2e/real-node/run.sh` yields
# e2e/real-node/run.sh); a link target is taken whole, without its #anchor. A word or target is a
# path when it
#   - consists only of letters, digits and . _ - / (so `carma_core::decide_next`, `<task>-a1`,
#     `~/.cache/...`, `KEY=value`, `…/warming-up` and anything with a space are not), and
#   - contains a / or ends in one of the extensions in EXTS below,
# and is none of:
#   - a URL or an absolute path (https://..., /var/lib/kubelet/...): not in the repository;
#   - a name under a DNS domain: a first segment with an inner dot (`carma.io/gpu`,
#     `nvidia.com/gpu`, `coordination.k8s.io/v1`, `gpu.carma.io/unhealthy`): API groups, resource,
#     annotation, label and taint names. Repository folders never have an inner dot (`.ci/` has a
#     leading one);
#   - an API group/version pair (`apps/v1`, `policy/v1beta1`): two segments, the second a
#     Kubernetes version.
# Fenced code blocks (```) are skipped: they hold diagrams and commands, not references.
#
# Where a path is looked for. First from the repository root. A path that is not there is read as
# relative to the folders named earlier in the same section (since the last heading), the most
# recent first, and to their parent folders: "`core/src/placement/mod.rs` ..., `judge.rs`" and
# "`scheduler-extender/src/server/` → `verbs/`" resolve to core/src/placement/judge.rs and
# scheduler-extender/src/verbs/. A path found nowhere fails the check, with its line number.
set -uo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
cd "$ROOT" || exit 1
DOC="${ARCHITECTURE_MD:-ARCHITECTURE.md}" # another copy can be checked (the check's own test)
EXTS='rs|go|sh|md|yaml|yml|toml|py|json|proto|lock|txt|onnx|tpl'
failures=()
fail() { echo "FAIL: $1"; failures+=("$1"); }

if [ ! -f "$DOC" ]; then
  echo "FAIL: $DOC is missing"; exit 1
fi

# 1. Paths. awk prints "<line>\t<section number>\t<candidate>" for every path-like word.
candidates="$(awk -v exts="$EXTS" '
  function consider(word) {
    sub(/#.*/, "", word)                     # a link anchor
    sub(/[.,;:]+$/, "", word)                # punctuation that ends a sentence inside the span
    if (word == "" || word ~ /[^A-Za-z0-9._\/-]/) return
    if (word !~ /\// && word !~ ("\\.(" exts ")$")) return
    if (word ~ /^\//) return                                  # absolute path
    if (word ~ /^[A-Za-z0-9_-]+\.[A-Za-z0-9.-]+\//) return     # under a DNS domain
    if (word ~ /^[a-z0-9.-]+\/v[0-9]+((alpha|beta)[0-9]+)?$/) return # API group/version
    printf "%d\t%d\t%s\n", NR, section, word
  }
  function code_span(text,   n, words, i) {
    n = split(text, words, /[ \t]+/)
    for (i = 1; i <= n; i++) consider(words[i])
  }
  /^```/ { fenced = !fenced; next }
  fenced { next }
  /^#/ { section++; incode = 0; span = ""; next }
  /^[ \t]*$/ { incode = 0; span = ""; next }    # a code span never crosses a blank line
  {
    line = $0
    # Link targets outside code spans: ](target) or ](target "title").
    rest = line
    while (match(rest, /\]\([^)]*\)/)) {
      target = substr(rest, RSTART + 2, RLENGTH - 3)
      sub(/[ \t].*/, "", target)
      if (target !~ /^[a-z]+:/) consider(target)
      rest = substr(rest, RSTART + RLENGTH)
    }
    # Code spans, which may run on to the next line of the same paragraph.
    n = split(line, pieces, "`")
    for (i = 1; i <= n; i++) {
      if (i > 1) {
        if (incode) { code_span(span); span = "" }
        incode = !incode
      }
      if (incode) span = span " " pieces[i]
    }
  }
' "$DOC")"

checked=0
missing=0
current_section=""
context=() # folders named so far in this section, most recent last
while IFS=$'\t' read -r line section path; do
  [ -n "$path" ] || continue
  if [ "$section" != "$current_section" ]; then
    context=()
    current_section="$section"
  fi
  checked=$((checked + 1))
  found=""
  if [ -e "$path" ]; then
    found="$path"
  else
    for ((i = ${#context[@]} - 1; i >= 0; i--)); do
      [ -z "$found" ] || break
      dir="${context[i]}"
      while [ -n "$dir" ] && [ "$dir" != "." ]; do
        if [ -e "$dir/$path" ]; then found="$dir/$path"; break; fi
        dir="$(dirname "$dir")"
      done
    done
  fi
  if [ -z "$found" ]; then
    fail "$DOC:$line names \`$path\`, which does not exist"
    missing=$((missing + 1))
    continue
  fi
  found="${found%/}"
  if [ -d "$found" ]; then context+=("$found"); else context+=("$(dirname "$found")"); fi
done <<<"$candidates"
if [ "$missing" -eq 0 ]; then
  echo "PASS: $DOC: all $checked path references exist"
fi

# 2. Every workspace member has a row in the crate table (rows start with | `member/` |).
members="$(awk '
  /^\[workspace\]/ { ws = 1; next }
  /^\[/ { ws = 0 }
  ws && /^members *=/ { inlist = 1 }
  inlist { line = $0; while (match(line, /"[^"]+"/)) { print substr(line, RSTART + 1, RLENGTH - 2); line = substr(line, RSTART + RLENGTH) } }
  inlist && /\]/ { inlist = 0 }
' Cargo.toml)"
if [ -z "$members" ]; then
  fail "no workspace members read from Cargo.toml"
fi
table="$(awk '/^## Crates/ { on = 1; next } /^## / { on = 0 } on && /^\|/' "$DOC")"
absent=()
for m in $members; do
  grep -q "^| \`$m/\` |" <<<"$table" || absent+=("$m") # member names are [a-z0-9-]: no regex escaping needed
done
if ((${#absent[@]})); then
  for m in "${absent[@]}"; do fail "$DOC: the crate table under \"## Crates\" has no row for workspace member $m"; done
elif [ -n "$members" ]; then
  echo "PASS: $DOC: the crate table lists every workspace member ($(wc -w <<<"$members") of $(wc -w <<<"$members"))"
fi

if ((${#failures[@]})); then
  echo "FAIL: architecture: ${#failures[@]} failure(s)"
  exit 1
fi
echo "PASS: architecture"
