#!/usr/bin/env bash
# CI check: the GitHub Actions workflows (.github/workflows/*.yaml, the release workflow among them).
#   1. actionlint v1.7.12 (built from its Go module, pinned, kept in ~/.cache/carma-ci) on every workflow,
#      with shellcheck on their run: scripts (Debian's shellcheck, installed with apt-get when missing)
#   2. every `uses:` pins an action by full commit SHA with its release in a comment
#   3. planted faults, on doctored copies of the release workflow, must fail actionlint: an unknown
#      top-level key, an expression naming an output no job has, an unquoted variable (shellcheck)
#   4. every run: script runs with pipefail (defaults.run.shell: bash; GitHub's implicit shell is bash -e)
#   5. the release's own steps that publish nothing: tools/release-tag.sh accepts v<chart version> and
#      refuses another tag; `helm package charts/carma` writes the package the workflow pushes
# Needs Go (the module proxy for the first build); under CI=true a missing Go or shellcheck fails the
# check, elsewhere it is skipped with a SKIP line. Nothing here logs in or pushes.
set -uo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
cd "$ROOT" || exit 1
ACTIONLINT_VERSION=v1.7.12
failures=()
step() { echo; echo "== $*"; }
fail() { echo "FAIL: $1"; failures+=("$1"); }
skip_or_fail() { # skip_or_fail <what did not run>: a FAIL under CI=true, a SKIP line elsewhere
  if [[ "${CI:-}" == true ]]; then fail "$1 (CI=true refuses the skip)"; else echo "SKIP: $1; under CI=true this fails"; fi
}
tmp="$(mktemp -d)"; trap 'rm -rf "$tmp"' EXIT

shopt -s nullglob
workflows=(.github/workflows/*.yaml .github/workflows/*.yml)
if ((${#workflows[@]} == 0)); then
  echo "FAIL: no workflows in .github/workflows"; exit 1
fi

step "actionlint $ACTIONLINT_VERSION"
bin_dir="${XDG_CACHE_HOME:-$HOME/.cache}/carma-ci/actionlint-$ACTIONLINT_VERSION"
AL="$bin_dir/actionlint"
if [[ ! -x "$AL" ]] && command -v go >/dev/null; then
  echo "building github.com/rhysd/actionlint/cmd/actionlint@$ACTIONLINT_VERSION into $bin_dir"
  GOBIN="$bin_dir" GOFLAGS="-buildvcs=false -trimpath" go install "github.com/rhysd/actionlint/cmd/actionlint@$ACTIONLINT_VERSION" \
    || fail "go install actionlint@$ACTIONLINT_VERSION"
fi
if [[ ! -x "$AL" ]]; then
  skip_or_fail "actionlint is not built (it needs Go and the Go module proxy): the workflows were NOT linted"
  AL=""
elif [[ "$("$AL" -version | head -n1)" != "$ACTIONLINT_VERSION" ]]; then
  fail "$AL reports version $("$AL" -version | head -n1), not $ACTIONLINT_VERSION"; AL=""
fi

# actionlint runs shellcheck on every run: script when it finds it on PATH.
if ! command -v shellcheck >/dev/null && [[ "$(id -u)" == 0 ]] && command -v apt-get >/dev/null; then
  echo "installing Debian's shellcheck"
  DEBIAN_FRONTEND=noninteractive apt-get -o DPkg::Lock::Timeout=600 install -y -q shellcheck >/dev/null 2>&1 \
    || { apt-get -o DPkg::Lock::Timeout=600 update -qq >/dev/null 2>&1 &&
         DEBIAN_FRONTEND=noninteractive apt-get -o DPkg::Lock::Timeout=600 install -y -q shellcheck >/dev/null 2>&1; }
fi
have_shellcheck=0
if command -v shellcheck >/dev/null; then
  have_shellcheck=1; echo "shellcheck: $(shellcheck --version | sed -n 's/^version: //p')"
else
  skip_or_fail "shellcheck is not installed: the workflows' run: scripts were NOT checked"
fi

if [[ -n "$AL" ]]; then
  if "$AL" -no-color "${workflows[@]}"; then
    echo "PASS: actionlint: ${workflows[*]}"
  else
    fail "actionlint on ${workflows[*]} (see above)"
  fi

  step "planted faults (doctored copies of .github/workflows/release.yaml) must fail actionlint"
  # expect_lint_failure <description> <text the report must contain> <sed expression>
  expect_lint_failure() {
    local desc="$1" want="$2" expr="$3" copy="$tmp/doctored/release.yaml"
    mkdir -p "$tmp/doctored"
    sed -e "$expr" .github/workflows/release.yaml > "$copy"
    if cmp -s "$copy" .github/workflows/release.yaml; then
      fail "planted fault '$desc': the sed expression changed nothing (the workflow changed: update the canary)"
    elif "$AL" -no-color "$copy" > "$tmp/lint.out" 2>&1; then
      fail "planted fault '$desc': actionlint passed the doctored copy"
    elif ! grep -qF -- "$want" "$tmp/lint.out"; then
      cat "$tmp/lint.out"; fail "planted fault '$desc': actionlint failed, but without '$want'"
    else
      echo "PASS: caught $desc: $(grep -F -m1 -- "$want" "$tmp/lint.out" | sed 's|^.*/doctored/||')"
    fi
  }
  expect_lint_failure "an unknown top-level key" 'unexpected key "permisions" for "workflow" section' \
    's/^permissions:/permisions:/'
  expect_lint_failure "an expression naming an output no job has" 'property "chart_pakage" is not defined' \
    's/needs\.tag\.outputs\.chart_package }}/needs.tag.outputs.chart_pakage }}/'
  if ((have_shellcheck)); then
    # shellcheck disable=SC2016 # the sed expression is literal text of the workflow
    expect_lint_failure "an unquoted variable in a run: script (shellcheck)" 'SC2086' \
      's|touch "$RUNNER_TEMP/digests/${DIGEST#sha256:}"|touch $RUNNER_TEMP/digests/${DIGEST#sha256:}|'
  fi
fi

step "every action is pinned by commit SHA, its release in a comment"
unpinned="$(grep -nE '^[[:space:]]*(-[[:space:]]*)?uses:' "${workflows[@]}" \
  | grep -vE 'uses:[[:space:]]*[A-Za-z0-9_.-]+/[A-Za-z0-9_./-]+@[0-9a-f]{40}[[:space:]]+#[[:space:]]*v[0-9]' || true)"
if [[ -n "$unpinned" ]]; then
  echo "$unpinned"; fail "actions not pinned as owner/name@<40-hex SHA> # vX.Y.Z"
else
  echo "PASS: $(cat "${workflows[@]}" | grep -cE '^[[:space:]]*(-[[:space:]]*)?uses:') uses: lines pinned by SHA"
fi

step "every workflow runs its scripts with pipefail (defaults.run.shell: bash)"
# GitHub runs a run: script with `bash -e` unless a shell is named; `shell: bash` adds -o pipefail.
pipefail_check() { python3 - "$@" <<'PY'
import sys, yaml
bad = 0
for path in sys.argv[1:]:
    w = yaml.safe_load(open(path))
    shell = ((w.get("defaults") or {}).get("run") or {}).get("shell")
    unnamed = [f"{job}: {st.get('name') or st['run'].splitlines()[0]}"
               for job, j in (w.get("jobs") or {}).items() for st in j.get("steps") or []
               if "run" in st and not st.get("shell") and not ((j.get("defaults") or {}).get("run") or {}).get("shell")]
    if shell != "bash" and unnamed:
        bad += 1
        print(f"  {path}: no defaults.run.shell: bash, and steps without a shell: {'; '.join(unnamed)}")
sys.exit(1 if bad else 0)
PY
}
if pipefail_check "${workflows[@]}"; then
  echo "PASS: every run: script runs under bash -eo pipefail"
else
  fail "run: scripts without pipefail (set defaults: run: shell: bash)"
fi
mkdir -p "$tmp/no-defaults"
sed '/^defaults:/,/^    shell: bash/d' .github/workflows/release.yaml > "$tmp/no-defaults/release.yaml"
if pipefail_check "$tmp/no-defaults/release.yaml" > /dev/null; then
  fail "planted fault: the release workflow without its defaults.run.shell passed the pipefail check"
else
  echo "PASS: caught the release workflow without defaults.run.shell: bash"
fi

step "the release's checks that publish nothing: tools/release-tag.sh, helm package"
version="$(sed -n 's/^version:[[:space:]]*//p' charts/carma/Chart.yaml | head -n1 | tr -d "\"'")"
if out="$(tools/release-tag.sh "v$version")"; then
  echo "PASS: tools/release-tag.sh v$version: $(echo "$out" | tr '\n' ' ')"
else
  fail "tools/release-tag.sh refuses v$version, the chart's own version"
fi
other="v$version-not.the.chart"
if tools/release-tag.sh "$other" > /dev/null 2> "$tmp/tag.err"; then
  fail "tools/release-tag.sh accepts $other, which is not the chart's version"
elif ! grep -qF "is not charts/carma/Chart.yaml's version" "$tmp/tag.err"; then
  cat "$tmp/tag.err"; fail "tools/release-tag.sh refuses $other, but not for its version"
else
  echo "PASS: tools/release-tag.sh refuses $other: $(head -n1 "$tmp/tag.err")"
fi
HELM="$(tools/install-helm.sh 2>/dev/null | tail -n1)"
package="$(echo "${out:-}" | sed -n 's/^chart_package=//p')"
if [[ -z "$HELM" || ! -x "$HELM" ]]; then
  fail "could not install helm (tools/install-helm.sh), so helm package was not tried"
elif "$HELM" package charts/carma --destination "$tmp/dist" > "$tmp/package.out" && [[ -n "$package" && -f "$tmp/dist/$package" ]]; then
  echo "PASS: helm package charts/carma wrote $package (what the workflow pushes), $(wc -c < "$tmp/dist/$package") bytes"
else
  cat "$tmp/package.out"; fail "helm package charts/carma did not write '$package'"
fi

echo
if ((${#failures[@]})); then
  echo "workflows.sh: ${#failures[@]} check(s) failed:"; printf '  - %s\n' "${failures[@]}"; exit 1
fi
echo "workflows.sh: all checks passed"
