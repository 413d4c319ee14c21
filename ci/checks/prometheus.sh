#!/usr/bin/env bash
# CI check: alert rules and dashboards against a real Prometheus scraping real carma processes.
#   1. promtool check rules + promtool test rules (deploy/prometheus/)
#   2. start `carma device-plugin --backend simulated`, `carma scheduler-extender --cluster-snapshot
#      deploy/examples/snapshot.yaml`, `carma operator` and `carma dra-driver --backend simulated`
#      (both with their API server unreachable) on 127.0.0.1, drive the extender with
#      kube-scheduler-shaped filter/prioritize/bind calls, start the
#      Debian `prometheus` on 127.0.0.1 scraping them with carma-rules.yaml loaded;
#   3. evaluate every Grafana panel query and variable (must return data), every annotation query and
#      every alert expression (must evaluate) over the HTTP API; Prometheus' own rule evaluation must
#      be healthy; every dashboard variable must be defined and used (ci/checks/lib/eval_queries.py);
#   4. render the chart's dashboard ConfigMaps with non-default placement values: each dashboard constant
#      (the telemetry reserve, ...) must take its value, and the rendered dashboards' queries evaluate;
#   5. stop everything it started (by PID). Bounded: the whole check takes about a minute.
# Env: CARMA_BIN (default target/debug/carma; build with `cargo build -p carma`),
#      SCRAPE_SECONDS (default 40: how long to collect before evaluating).
set -uo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
cd "$ROOT" || exit 1
CARMA_BIN="${CARMA_BIN:-target/debug/carma}"
SCRAPE_SECONDS="${SCRAPE_SECONDS:-40}"
SNAPSHOT="${CARMA_SNAPSHOT:-deploy/examples/snapshot.yaml}"
failures=()
pids=()
step() { echo; echo "== $*"; }
fail() { echo "FAIL: $*"; failures+=("$*"); }
tmp="$(mktemp -d)"
cleanup() {
  for pid in "${pids[@]}"; do kill "$pid" 2>/dev/null; done
  for pid in "${pids[@]}"; do
    for _ in 1 2 3 4 5 6 7 8 9 10; do kill -0 "$pid" 2>/dev/null || break; sleep 0.3; done
    kill -9 "$pid" 2>/dev/null
  done
  rm -rf "$tmp"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

tools/install-prometheus.sh >/dev/null || { echo "FAIL: could not install prometheus"; exit 1; }
VENV="$(tools/install-ci-venv.sh | tail -n1)" || { echo "FAIL: could not create the CI venv"; exit 1; }
PY="$VENV/bin/python"
prometheus --version 2>&1 | head -n1

step "promtool check rules / test rules"
if promtool check rules deploy/prometheus/carma-rules.yaml; then echo "PASS: promtool check rules"
else fail "promtool check rules"; fi
if (cd deploy/prometheus && promtool test rules carma-rules.test.yaml); then echo "PASS: promtool test rules"
else fail "promtool test rules"; fi

step "carma binary"
if [[ ! -x "$CARMA_BIN" ]]; then
  fail "carma binary $CARMA_BIN not found (build it: cargo build -p carma, or set CARMA_BIN)"
  echo; echo "prometheus.sh: ${#failures[@]} check(s) failed"; exit 1
fi
echo "using $CARMA_BIN"

free_port() { "$PY" -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
P_DP=$(free_port); P_EX=$(free_port); P_OP=$(free_port); P_PROM=$(free_port); P_DRA=$(free_port)
# No cluster: make sure nothing reaches a real API server from this machine.
export KUBECONFIG="$tmp/no-kubeconfig"
unset KUBERNETES_SERVICE_HOST KUBERNETES_SERVICE_PORT
export CARMA_LOG="${CARMA_LOG:-info}"

wait_http() { # wait_http <url> <seconds> <pid>
  local end=$((SECONDS + $2))
  while ((SECONDS < end)); do
    curl -fsS -o /dev/null "$1" 2>/dev/null && return 0
    kill -0 "$3" 2>/dev/null || return 1
    sleep 0.5
  done
  return 1
}

step "start carma device-plugin (simulated) on 127.0.0.1:$P_DP"
mkdir -p "$tmp/device-plugins"
"$CARMA_BIN" device-plugin --backend simulated --simulated-gpus 4x40GiB --replicas 8 \
  --device-plugin-dir "$tmp/device-plugins" --metrics-addr "127.0.0.1:$P_DP" \
  --node-name sim-node-1 --sample-interval 1s > "$tmp/device-plugin.log" 2>&1 &
pids+=($!); DP_PID=$!
if wait_http "http://127.0.0.1:$P_DP/metrics" 30 "$DP_PID"; then echo "PASS: device plugin serves /metrics"
else fail "device plugin did not serve /metrics"; tail -n 30 "$tmp/device-plugin.log"; fi

step "start carma scheduler-extender (snapshot $SNAPSHOT) on 127.0.0.1:$P_EX"
"$CARMA_BIN" scheduler-extender --listen "127.0.0.1:$P_EX" --cluster-snapshot "$SNAPSHOT" \
  > "$tmp/extender.log" 2>&1 &
pids+=($!); EX_PID=$!
if wait_http "http://127.0.0.1:$P_EX/healthz" 30 "$EX_PID"; then echo "PASS: extender serves /healthz"
else fail "extender did not start"; tail -n 30 "$tmp/extender.log"; fi

step "start carma operator on 127.0.0.1:$P_OP (API server unreachable: metrics at their initial values)"
# The operator needs a Kubernetes client; give it one whose API server (a closed local port) never
# answers. It still serves /metrics with every pre-registered series at zero, which checks the metric
# names and the dashboard queries, not non-zero recovery figures (those come from the operator's tests).
P_NOAPI=$(free_port)
cat > "$tmp/operator-kubeconfig" <<EOF
apiVersion: v1
kind: Config
clusters: [{name: unreachable, cluster: {server: "http://127.0.0.1:$P_NOAPI"}}]
users: [{name: none, user: {}}]
contexts: [{name: unreachable, context: {cluster: unreachable, user: none, namespace: carma-system}}]
current-context: unreachable
EOF
OPERATOR_TARGET=""
# shellcheck disable=SC2086 # CARMA_OPERATOR_ARGS is a list of extra arguments
KUBECONFIG="$tmp/operator-kubeconfig" "$CARMA_BIN" operator --metrics-addr "127.0.0.1:$P_OP" \
  ${CARMA_OPERATOR_ARGS:-} > "$tmp/operator.log" 2>&1 &
pids+=($!); OP_PID=$!
if wait_http "http://127.0.0.1:$P_OP/metrics" 20 "$OP_PID"; then
  echo "PASS: operator serves /metrics"; OPERATOR_TARGET="'127.0.0.1:$P_OP'"
else
  fail "the operator did not serve /metrics without a reachable API server"
  tail -n 10 "$tmp/operator.log"
fi

step "start carma dra-driver (simulated) on 127.0.0.1:$P_DRA (API server unreachable)"
# The driver's sockets and CDI specs go under $tmp; no kubelet registers it and its ResourceSlice is
# never written, so /metrics has its pre-registered series at their initial values and /healthz
# answers from its own gRPC health checks over the sockets.
DRA_TARGET=""
KUBECONFIG="$tmp/operator-kubeconfig" "$CARMA_BIN" dra-driver --backend simulated --simulated-gpus 2x40GiB \
  --node-name sim-node-2 --registry-dir "$tmp/dra/plugins_registry" --plugin-dir "$tmp/dra/plugins/gpu.carma.io" \
  --cdi-dir "$tmp/dra/cdi" --metrics-addr "127.0.0.1:$P_DRA" > "$tmp/dra-driver.log" 2>&1 &
pids+=($!); DRA_PID=$!
if wait_http "http://127.0.0.1:$P_DRA/healthz" 30 "$DRA_PID"; then
  echo "PASS: DRA driver serves /healthz"; DRA_TARGET="'127.0.0.1:$P_DRA'"
else
  fail "the DRA driver did not serve /healthz without a reachable API server"
  tail -n 10 "$tmp/dra-driver.log"
fi

step "start prometheus on 127.0.0.1:$P_PROM"
cp deploy/prometheus/carma-rules.yaml "$tmp/carma-rules.yaml"
cat > "$tmp/prometheus.yml" <<EOF
global:
  scrape_interval: 2s
  scrape_timeout: 1s
  evaluation_interval: 2s
rule_files:
  - $tmp/carma-rules.yaml
scrape_configs:
  - job_name: carma-device-plugin
    honor_labels: true
    static_configs: [{targets: ['127.0.0.1:$P_DP']}]
  - job_name: carma-scheduler-extender
    static_configs: [{targets: ['127.0.0.1:$P_EX']}]
EOF
if [[ -n "$OPERATOR_TARGET" ]]; then
  printf '  - job_name: carma-operator\n    static_configs: [{targets: [%s]}]\n' "$OPERATOR_TARGET" >> "$tmp/prometheus.yml"
fi
if [[ -n "$DRA_TARGET" ]]; then
  printf '  - job_name: carma-dra-driver\n    static_configs: [{targets: [%s]}]\n' "$DRA_TARGET" >> "$tmp/prometheus.yml"
fi
promtool check config "$tmp/prometheus.yml" >/dev/null || fail "generated prometheus.yml is invalid"
prometheus --config.file "$tmp/prometheus.yml" --storage.tsdb.path "$tmp/tsdb" \
  --web.listen-address "127.0.0.1:$P_PROM" --log.level warn > "$tmp/prometheus.log" 2>&1 &
pids+=($!); PROM_PID=$!
PROM="http://127.0.0.1:$P_PROM"
if wait_http "$PROM/-/ready" 30 "$PROM_PID"; then echo "PASS: prometheus ready"
else fail "prometheus did not start"; tail -n 30 "$tmp/prometheus.log"; fi

step "drive the extender for ${SCRAPE_SECONDS}s while Prometheus scrapes"
"$PY" ci/checks/lib/extender_traffic.py --url "http://127.0.0.1:$P_EX" --snapshot "$SNAPSHOT" \
  --seconds "$SCRAPE_SECONDS" || fail "extender traffic"

step "scrape targets"
"$PY" - "$PROM" <<'PY' || fail "some scrape targets are down"
import json, sys, urllib.request
t = json.load(urllib.request.urlopen(sys.argv[1] + "/api/v1/targets"))["data"]["activeTargets"]
bad = 0
for x in t:
    print(f"  {x['labels']['job']:28} {x['scrapeUrl']:40} {x['health']} {x.get('lastError','')}")
    bad += x["health"] != "up"
sys.exit(1 if bad or not t else 0)
PY

step "contract metric names present in the scrapes"
"$PY" - "$PROM" "${OPERATOR_TARGET:+operator}" <<'PY'
import json, sys, urllib.request
names = set(json.load(urllib.request.urlopen(sys.argv[1] + "/api/v1/label/__name__/values"))["data"])
contract = {
  "device plugin": ["carma_gpu_memory_total_bytes", "carma_gpu_memory_used_bytes", "carma_gpu_memory_reserved_bytes",
    "carma_gpu_sm_activity_ratio", "carma_gpu_sm_occupancy_ratio", "carma_gpu_dram_activity_ratio",
    "carma_gpu_sm_activity_risk_score", "carma_gpu_sm_occupancy_risk_score", "carma_gpu_dram_activity_risk_score",
    "carma_gpu_power_watts", "carma_gpu_energy_joules_total", "carma_gpu_pods", "carma_gpu_healthy",
    "carma_pod_gpu_info", "carma_pod_gpu_memory_reserved_bytes", "carma_pod_gpu_memory_used_bytes", "carma_pod_gpu_memory_peak_bytes",
    "carma_device_plugin_allocations_total", "carma_telemetry_last_sample_timestamp_seconds",
    "carma_gpunode_publish_total", "carma_gpunode_status_writes_total", "carma_gpu_sm_activity_cap_ratio"],
  "extender": ["carma_extender_requests_total", "carma_extender_request_duration_seconds_bucket",
    "carma_extender_rejections_total", "carma_extender_reservations_total", "carma_extender_placements_in_flight",
    "carma_extender_binds_total"],
  "operator": ["carma_operator_tasks", "carma_operator_attempts_total", "carma_operator_oom_recoveries_total",
    "carma_operator_recovery_duration_seconds_bucket", "carma_operator_reconcile_errors_total",
    "carma_operator_attempt_peak_ratio_bucket", "carma_operator_underestimates_total",
    "carma_operator_history_writes_total", "carma_operator_expected_duration_exceeded_total"],
  "dra driver": ["carma_dra_driver_prepares_total", "carma_dra_driver_unprepares_total",
    "carma_dra_driver_prepare_duration_seconds_bucket", "carma_dra_driver_unprepare_duration_seconds_bucket",
    "carma_dra_driver_devices_published", "carma_dra_driver_slice_publications_total",
    "carma_dra_driver_grpc_serving", "carma_dra_driver_kubelet_registered"],
}
for part, ms in contract.items():
    missing = [m for m in ms if m not in names]
    print(f"  {part}: {len(ms) - len(missing)}/{len(ms)} present" + (f"; not (yet) exposed: {', '.join(missing)}" if missing else ""))
extra = sorted(n for n in names if n.startswith("carma_") and not any(n.startswith(m.removesuffix("_bucket")) for ms in contract.values() for m in ms))
if extra:
    print(f"  other carma metrics: {', '.join(extra)}")
PY

step "evaluate every dashboard query and alert rule"
if "$PY" ci/checks/lib/eval_queries.py --prom "$PROM" --rules deploy/prometheus/carma-rules.yaml \
    --rate-interval 20s --range "$((SCRAPE_SECONDS > 60 ? 60 : SCRAPE_SECONDS))s" --interval 2s deploy/grafana/*.json; then
  echo "PASS: every dashboard query returns data and every rule evaluates"
else
  fail "dashboard queries or rule expressions (see above)"
fi

step "the chart's dashboard ConfigMaps: constants follow the chart's values; their queries evaluate"
# Each dashboard constant (a `constant` variable whose description names its chart value, e.g. the
# telemetry reserve) must take the release's value when the chart renders the ConfigMaps: render with
# values unlike the defaults, check each constant, check nothing else changed, and evaluate the rendered
# dashboards as above.
HELM="$(tools/install-helm.sh 2>/dev/null | tail -n1)"
if [[ -z "$HELM" || ! -x "$HELM" ]]; then
  fail "could not install helm (tools/install-helm.sh), so the chart's dashboards were not checked"
elif "$PY" - "$HELM" "$tmp/chart-dashboards" deploy/grafana/*.json <<'PY'; then
import json, re, subprocess, sys
from pathlib import Path
import yaml
helm, out, sources = sys.argv[1], Path(sys.argv[2]), sys.argv[3:]
out.mkdir(parents=True, exist_ok=True)
src = {Path(p).name: json.loads(Path(p).read_text()) for p in sources}
want = {}  # chart value -> (test value as Helm prints it, default)
for dash in src.values():
    for v in dash["templating"]["list"]:
        if v.get("type") == "constant":
            m = re.search(r"from (placement\.\w+)", v.get("description", ""))
            if not m:
                sys.exit(f"constant ${v['name']} does not name the chart value it comes from")
            d = float(v["query"])
            test = f"{d * 2 + 1:g}" if d == int(d) else f"{d / 2:g}"
            want[m.group(1)] = (test, v["query"])
args = [a for key, (test, _) in sorted(want.items()) for a in ("--set-json", f"{key}={test}")]
text = subprocess.run([helm, "template", "carma", "charts/carma", "-n", "carma-system", "--kube-version", "1.35.0",
                       "--show-only", "templates/dashboards.yaml", *args], check=True, capture_output=True, text=True).stdout
bad, seen = [], set()
for doc in yaml.safe_load_all(text):
    for name, body in (doc or {}).get("data", {}).items():
        seen.add(name)
        dash = json.loads(body)
        (out / name).write_text(body)
        for v in dash["templating"]["list"]:
            if v.get("type") == "constant":
                key = re.search(r"from (placement\.\w+)", v["description"]).group(1)
                if v["query"] != want[key][0]:
                    bad.append(f"{name}: ${v['name']} is {v['query']!r} with {key}={want[key][0]}")
                else:
                    print(f"  ok    {name}: ${v['name']} = {v['query']} with {key}={want[key][0]}")
                v["query"] = want[key][1]
        if name in src and dash != src[name]:
            bad.append(f"{name}: the rendered dashboard differs from deploy/grafana/{name} beyond its constants")
missing = set(src) - seen
bad += [f"{n}: not rendered by the chart" for n in sorted(missing)]
print("\n".join(bad) if bad else f"  {len(seen)} dashboards rendered; {len(want)} chart values followed")
sys.exit(1 if bad or not want else 0)
PY
  echo "PASS: the chart sets every dashboard constant from its value and changes nothing else"
  if "$PY" ci/checks/lib/eval_queries.py --prom "$PROM" --rate-interval 20s \
      --range "$((SCRAPE_SECONDS > 60 ? 60 : SCRAPE_SECONDS))s" --interval 2s "$tmp"/chart-dashboards/*.json > "$tmp/chart-eval.log"; then
    echo "PASS: every query of the chart-rendered dashboards returns data: $(grep -F 'evaluated ' "$tmp/chart-eval.log")"
  else
    cat "$tmp/chart-eval.log"; fail "queries of the chart-rendered dashboards (see above)"
  fi
else
  fail "the chart's dashboard constants do not follow its values (see above)"
fi

for p in "$DP_PID" "$EX_PID" "$PROM_PID"; do
  kill -0 "$p" 2>/dev/null || fail "process $p exited early"
done

echo
if ((${#failures[@]})); then
  for f in device-plugin extender operator prometheus; do
    [[ -s "$tmp/$f.log" ]] && { echo "---- $f.log (tail) ----"; tail -n 15 "$tmp/$f.log"; }
  done
  echo "prometheus.sh: ${#failures[@]} check(s) failed:"; printf '  - %s\n' "${failures[@]}"; exit 1
fi
echo "prometheus.sh: all checks passed"
