#!/usr/bin/env bash
# CI check: the Grafana dashboards (deploy/grafana/*.json, copied into the chart) type-check against
# Grafana's schema as the Grafana Foundation SDK v0.0.22 encodes it (e2e/dashboards: its own Go module,
# go.sum committed). Each dashboard is decoded strictly, panels included: an unknown field, a field of
# the wrong type or a missing required field fails, with its path (panels[3].gridPos.h); each panel's
# options and fieldConfig (overrides included) decode into the SDK's type for its panel type, each query
# into the SDK's Prometheus query. (ci/checks/prometheus.sh evaluates the queries themselves.)
# Planted faults: doctored copies of a dashboard must fail, each naming the doctored path.
# Needs Go (the module proxy for the first build); under CI=true a missing Go fails the check, elsewhere
# it is skipped with a SKIP line.
set -uo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
cd "$ROOT" || exit 1
failures=()
step() { echo; echo "== $*"; }
fail() { echo "FAIL: $1"; failures+=("$1"); }
tmp="$(mktemp -d)"; trap 'rm -rf "$tmp"' EXIT

if ! command -v go >/dev/null; then
  if [[ "${CI:-}" == true ]]; then
    echo "FAIL: go is not installed: the dashboards were NOT type-checked (CI=true refuses the skip)"; exit 1
  fi
  echo "SKIP: go is not installed: the dashboards were NOT type-checked; under CI=true this fails"; exit 0
fi

shopt -s nullglob
dashboards=(deploy/grafana/*.json)
if ((${#dashboards[@]} == 0)); then echo "FAIL: no dashboards in deploy/grafana"; exit 1; fi

step "build e2e/dashboards (dashcheck, Grafana Foundation SDK $(sed -n 's/^require github.com\/grafana\/grafana-foundation-sdk\/go //p' e2e/dashboards/go.mod))"
export GOFLAGS="-buildvcs=false -trimpath"
if (cd e2e/dashboards && go vet ./... && go build -o "$tmp/dashcheck" .); then
  echo "PASS: go vet and go build"
else
  echo "FAIL: e2e/dashboards does not build"; exit 1
fi

step "every dashboard against Grafana's schema"
if "$tmp/dashcheck" "${dashboards[@]}"; then
  echo "PASS: ${#dashboards[@]} dashboards match Grafana's schema"
else
  fail "dashboards that do not match Grafana's schema (see above; edit tools/gen-dashboards.py, then tools/sync-chart.sh)"
fi

step "planted faults (doctored copies of ${dashboards[0]}) must fail, naming the path"
# Each line: <name> <tab> <path the report must name> <tab> <Python statement on the dashboard d>.
# first(t) is the first panel of type t.
python3 - "${dashboards[0]}" "$tmp/doctored" > "$tmp/cases.tsv" <<'PY' || fail "could not write the doctored copies"
import copy, json, sys
from pathlib import Path
src, out = json.loads(Path(sys.argv[1]).read_text()), Path(sys.argv[2])
out.mkdir()
def index(d, t):
    return next(i for i, p in enumerate(d["panels"]) if p["type"] == t)
cases = [
    ("a gridPos height that is a string", lambda d: ("panels[0].gridPos.h", d["panels"][0]["gridPos"].__setitem__("h", "tall"))),
    ("an unknown top-level key", lambda d: ("refreshInterval", d.__setitem__("refreshInterval", "30s"))),
    ("an unknown key in a timeseries legend", lambda d: (f"panels[{index(d, 'timeseries')}].options.legend.placment",
        d["panels"][index(d, "timeseries")]["options"]["legend"].__setitem__("placment", "right"))),
    ("an unknown key in fieldConfig.defaults", lambda d: (f"panels[{index(d, 'timeseries')}].fieldConfig.defaults.unti",
        d["panels"][index(d, "timeseries")]["fieldConfig"]["defaults"].__setitem__("unti", "bytes"))),
    ("an unknown key in a query", lambda d: (f"panels[{index(d, 'timeseries')}].targets[0].exp",
        d["panels"][index(d, "timeseries")]["targets"][0].__setitem__("exp", "up"))),
    ("a panel type Grafana's schema does not have", lambda d: (f"panels[{index(d, 'timeseries')}].type",
        d["panels"][index(d, "timeseries")].__setitem__("type", "graph"))),
    ("an override of a custom field the panel type does not have",
        lambda d: (f"panels[{index(d, 'timeseries')}].fieldConfig.overrides[0].properties[0].id",
        d["panels"][index(d, "timeseries")]["fieldConfig"].__setitem__("overrides", [{
            "matcher": {"id": "byName", "options": "x"}, "properties": [{"id": "custom.lineWidht", "value": 2}]}]))),
]
for i, (name, plant) in enumerate(cases):
    d = copy.deepcopy(src)
    path, _ = plant(d)
    (out / f"{i}.json").write_text(json.dumps(d, indent=2))
    print(f"{i}\t{name}\t{path}")
PY
while IFS=$'\t' read -r i name path; do
  if "$tmp/dashcheck" "$tmp/doctored/$i.json" > "$tmp/out" 2>&1; then
    fail "planted fault '$name': dashcheck passed the doctored copy"
  elif ! grep -qF "  $path: " "$tmp/out"; then
    cat "$tmp/out"; fail "planted fault '$name': dashcheck failed without naming $path"
  else
    echo "PASS: caught $name: $(grep -F -m1 "  $path: " "$tmp/out" | sed 's/^ *//')"
  fi
done < "$tmp/cases.tsv"
[[ "$(wc -l < "$tmp/cases.tsv")" -eq 7 ]] || fail "expected 7 planted faults, wrote $(wc -l < "$tmp/cases.tsv")"

echo
if ((${#failures[@]})); then
  echo "dashboards.sh: ${#failures[@]} check(s) failed:"; printf '  - %s\n' "${failures[@]}"; exit 1
fi
echo "dashboards.sh: all checks passed"
