#!/usr/bin/env bash
# carma's scheduling benchmark against the real control plane, all on loopback (see docs/scale.md):
#   etcd, kube-apiserver and kube-scheduler built from their Go modules as run.sh builds them
#   (build.sh), the chart rendered by `helm template` and applied with kubectl (cluster.sh, shared with
#   run.sh), N hollow nodes (Node + GpuNode each, cmd/scale/hollow.go), then two phases on the same
#   nodes with the same pods:
#     1. kube-scheduler alone: a second kube-scheduler, default profile (schedulerName
#        default-scheduler), its own KubeSchedulerConfiguration, ServiceAccount and the
#        system:kube-scheduler ClusterRole; pods ask for nvidia.com/gpu: 1;
#     2. carma: kube-scheduler from the chart's pod spec (its profile, the extender over mutual TLS)
#        and the extender from the chart's Deployment (podrun.py); pods ask for carma.io/gpu: 1 with a
#        model profile from deploy/examples;
#   both kube-schedulers with the same client rate limit (--client-qps, read back from each one's
#   /configz; their rate-limiter waits are printed), on a busy cluster (--filler-per-node other pods
#   bound to every node first), and prints, every figure read from the cluster or the processes:
#   scale <N>x<G>: kube-scheduler alone <a> pods/s, with carma <b> pods/s (<r> %), clients unthrottled (QPS <q>), p99 at <R> pods/s <x> ms alone / <y> ms with carma, extender RSS <m> MiB with <f> other pods, 0 over-committed GPUs
#   then the rate-limiter waits, CPU seconds per 1,000 pods, carma's API writes at rest and under
#   load, how soon a changed GpuNode reached a watcher, and with --repeats the min / median / max.
#
# Usage: e2e/control-plane/scale.sh --nodes N --gpus-per-node G --pods P [--latency-pods L]
#                                   [--latency-rate R]   # offer R pods/s to every latency batch
#                                                        # (default: half of the first saturated rate)
#                                   [--client-qps Q] [--client-burst B]   # both kube-schedulers'
#                                                        # client (default 1000, burst 2 × Q; 0: kube-scheduler's
#                                                        # own defaults, 50 and 100)
#                                   [--filler-per-node F]   # other pods per node (default 10)
#                                   [--filler-note TEXT]    # printed beside them (say why F is not 10)
#                                   [--repeats N]        # each phase N times, alternating (default 1)
#                                   [--quiet 60s]        # window for carma's API writes at rest (0: none)
#                                   [--churn [ROUNDS]] [--phases plain,carma] [--stall 90s]
#                                   # --phases dra-carma,dra-whole,dra-tainted: the DRA path (claims
#                                   # on ResourceSlices; adds kube-controller-manager and a scale-dra line)
#                                   [--backlog N [--backlog-window 60s]]   # after the phases: every GPU
#                                   # filled, N more carma pods wait; what their retries cost
#                                   [--publish-cost N]   # before the phases: N GpuNode status
#                                   # writes by merge patch, by update and lean (an experiment: fewer
#                                   # fields), kube-apiserver's CPU per write
#                                   # (--phases none: that alone)
#                                   [--plant-dra-overcommit]   # planted fault: a claim written past the
#                                   # allocator over-commits a device; the run must fail
#                                   [--set chart.value=x ...]   # more chart values for the carma phase
#        CARMA_E2E_KEEP=1 scale.sh ...        # keep the work directory (logs, kubeconfig)
#        scale.sh ctl <verb>                  # used by cmd/scale to start and stop the schedulers
# Needs: root (mount namespaces), go, openssl, python3 with PyYAML, cargo (unless CARMA_BIN is set).
# Exits 1 when a batch left pods unbound, the over-commit checker found anything, or a figure could
# not be read; the goals (throughput, latency, memory) are reported, not asserted.
set -euo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
ROOT="$(cd "$HERE/../.." && pwd)"
NS=carma-system
RELEASE=carma
LOG_TAG=scale
PLAIN=default-scheduler
# shellcheck source=cluster.sh
source "$HERE/cluster.sh"

# ---- process control (`scale.sh ctl ...`, from cmd/scale) --------------------------------------------

wait_ready() { # wait_ready <what> <url> [curl options...]
  local what="$1" url="$2"; shift 2
  for _ in $(seq 240); do
    [[ "$(curl -s -o /dev/null -w '%{http_code}' --max-time 2 "$@" "$url" || true)" == 200 ]] && return 0
    sleep 0.5
  done
  die "$what did not become ready ($url)"
}

start_plain() {
  "$BIN/kube-scheduler" --config "$WORK/$PLAIN.yaml" --secure-port "$PLAIN_PORT" --bind-address 127.0.0.1 \
    --authentication-kubeconfig "$WORK/kubeconfig-$PLAIN" --authorization-kubeconfig "$WORK/kubeconfig-$PLAIN" \
    --v=2 >>"$WORK/logs/$PLAIN.log" 2>&1 &
  echo $! >"$WORK/pids/$PLAIN"
}

stop() { # stop <pid-file name>...: TERM, and KILL whatever is left after kill_pod's 5 s (a phase's
  # scheduler must not outlive it)
  local f pid
  for f in "$@"; do
    pid="$(cat "$WORK/pids/$f" 2>/dev/null || true)"
    kill_pod "$f" TERM
    if [[ -n "$pid" ]] && kill -0 "$pid" 2>/dev/null; then kill -KILL "$pid" 2>/dev/null || true; fi
  done
}

ctl() {
  # shellcheck disable=SC1091
  source "$CARMA_E2E_WORK/env.sh"
  case "$1" in
    start-plain)
      start_plain
      wait_ready "kube-scheduler ($PLAIN)" "https://127.0.0.1:$PLAIN_PORT/readyz" -k
      log "kube-scheduler ($PLAIN, default profile) ready" ;;
    stop-plain) stop "$PLAIN" ;;
    start-carma)
      podrun "$WORK/logs/scheduler.log" "Deployment/$RELEASE-scheduler" kube-scheduler "$RELEASE-scheduler-0" "$WORK/sa/scheduler"
      start_extender
      wait_ready "the extender" "http://127.0.0.1:$EXT_METRICS_PORT/readyz"
      wait_ready "kube-scheduler (the chart's)" "https://127.0.0.1:$SCHED_PORT/readyz" -k
      log "kube-scheduler (the chart's profile) and the extender ready" ;;
    stop-carma) stop "$RELEASE-scheduler-0" "$RELEASE-scheduler-extender-0" ;;
    *) echo "scale.sh ctl: unknown verb $1" >&2; exit 2 ;;
  esac
}

if [[ "${1:-}" == ctl ]]; then shift; ctl "$@"; exit; fi

# ---- arguments ---------------------------------------------------------------------------------------

NODES=100; GPUS=8; PODS=200; LATENCY_PODS=0; LATENCY_RATE=0; CHURN=0; PHASES=plain,carma; STALL=90s; CHART_SETS=()
CLIENT_QPS=1000; CLIENT_BURST=""; FILLER=10; FILLER_NOTE=""; REPEATS=1; QUIET=60s; PLANT_DRA=false; BACKLOG=0; BACKLOG_WINDOW=60s; PUBLISH_COST=0
command_line="bash e2e/control-plane/scale.sh $*"
while [[ $# -gt 0 ]]; do
  case "$1" in
    --nodes) NODES="$2"; shift 2 ;;
    --gpus-per-node) GPUS="$2"; shift 2 ;;
    --pods) PODS="$2"; shift 2 ;;
    --latency-pods) LATENCY_PODS="$2"; shift 2 ;;
    --latency-rate) LATENCY_RATE="$2"; shift 2 ;;
    --churn) if [[ "${2:-}" =~ ^[0-9]+$ ]]; then CHURN="$2"; shift 2; else CHURN=10; shift; fi ;;
    --phases) PHASES="$2"; shift 2 ;;
    --stall) STALL="$2"; shift 2 ;;
    --set) CHART_SETS+=(--set "$2"); shift 2 ;;
    --client-qps) CLIENT_QPS="$2"; shift 2 ;;
    --client-burst) CLIENT_BURST="$2"; shift 2 ;;
    --filler-per-node) FILLER="$2"; shift 2 ;;
    --filler-note) FILLER_NOTE="$2"; shift 2 ;;
    --repeats) REPEATS="$2"; shift 2 ;;
    --quiet) QUIET="$2"; shift 2 ;;
    --plant-dra-overcommit) PLANT_DRA=true; shift ;;
    --backlog) BACKLOG="$2"; shift 2 ;;
    --publish-cost) PUBLISH_COST="$2"; shift 2 ;;
    --backlog-window) BACKLOG_WINDOW="$2"; shift 2 ;;
    -h|--help) sed -n '2,/^set -euo/p' "$0" | sed '$d'; exit 0 ;;
    *) die "unknown argument $1 (see --help)" ;;
  esac
done

[[ "$CLIENT_QPS" =~ ^[0-9]+$ ]] || die "--client-qps takes a whole number"
[[ -n "$CLIENT_BURST" ]] || CLIENT_BURST=$(( 2 * CLIENT_QPS ))
# The same client for both kube-schedulers: the plain one's KubeSchedulerConfiguration below, the
# chart's through its values (0: neither is set, kube-scheduler's defaults on both sides).
CLIENT_CONNECTION=""
if (( CLIENT_QPS > 0 )); then
  CHART_SETS=(--set "scheduler.clientConnection.qps=$CLIENT_QPS" --set "scheduler.clientConnection.burst=$CLIENT_BURST" "${CHART_SETS[@]}")
  CLIENT_CONNECTION=$'\n'"  qps: $CLIENT_QPS"$'\n'"  burst: $CLIENT_BURST"
fi

# ---- setup -------------------------------------------------------------------------------------------

cp_prereqs
t_start=$(date +%s)
log "$command_line"
cp_tools
(cd "$HERE" && GOFLAGS="${GOFLAGS:--buildvcs=false}" go build -trimpath -o "$BIN/scale" ./cmd/scale)
cp_workdir carma-scale

# Free loopback ports: etcd (2), API server, extender (verbs, metrics), the two kube-schedulers.
cp_free_ports 7
ETCD_PORT=${PORTS[0]}; ETCD_PEER=${PORTS[1]}; API_PORT=${PORTS[2]}; EXT_PORT=${PORTS[3]}
EXT_METRICS_PORT=${PORTS[4]}; PLAIN_PORT=${PORTS[5]}; SCHED_PORT=${PORTS[6]}
cat >"$WORK/env.sh" <<EOF
WORK=$WORK; BIN=$BIN; CARMA=$CARMA; API_PORT=$API_PORT; EXT_PORT=$EXT_PORT; EXT_METRICS_PORT=$EXT_METRICS_PORT
PLAIN_PORT=$PLAIN_PORT; SCHED_PORT=$SCHED_PORT; HELM=$HELM; KUBECTL=$KUBECTL; KUBECONFIG=$WORK/kubeconfig
EOF

cp_certs
cp_start_etcd
# CARMA_SCALE_APISERVER_FLAGS: more kube-apiserver flags, split on spaces (e.g. --profiling=true, to take
# a CPU profile of it with `kubectl get --raw '/debug/pprof/profile?seconds=20'` during a phase).
read -r -a apiserver_flags <<<"${CARMA_SCALE_APISERVER_FLAGS:-}"
cp_start_apiserver "${apiserver_flags[@]}"
# The chart as run.sh deploys it (values.yaml: TLS, the scheduler name), with the chart's own warm-up
# (run.sh shortens it; the hollow nodes show a pod's memory at their next sample anyway).
cp_apply_chart --set placement.warmupSeconds=30 "${CHART_SETS[@]}"
# The chart's kube-scheduler listens on its default secure port (10259), which run.sh's kube-scheduler
# also takes: like every other listen address here, it is moved to a free loopback port, in the local
# copy of the pod spec only (the cluster holds the chart's objects as rendered), so that a benchmark
# and a scenario run can share a machine.
python3 - "$WORK/rendered.yaml" "$SCHED_PORT" <<'PY'
import sys
path, port = sys.argv[1], sys.argv[2]
text = open(path).read()
old = "            - --config=/etc/kubernetes/carma-scheduler/config.yaml\n"
if text.count(old) != 1:
    sys.exit("scale.sh: the chart's kube-scheduler command changed; update the --secure-port rewrite")
open(path, "w").write(text.replace(old, old + f"            - --secure-port={port}\n            - --bind-address=127.0.0.1\n"))
PY

token_dir scheduler "$RELEASE-scheduler"
token_dir scheduler-extender "$RELEASE-scheduler-extender"

# kube-scheduler alone: its own ServiceAccount with the roles a kubeadm kube-scheduler has.
k -n "$NS" create serviceaccount "scale-$PLAIN" >/dev/null
k create clusterrolebinding "scale-$PLAIN" --clusterrole system:kube-scheduler --serviceaccount "$NS:scale-$PLAIN" >/dev/null
k create clusterrolebinding "scale-$PLAIN-volume" --clusterrole system:volume-scheduler --serviceaccount "$NS:scale-$PLAIN" >/dev/null
k -n kube-system create rolebinding "scale-$PLAIN-authn-reader" --role extension-apiserver-authentication-reader \
  --serviceaccount "$NS:scale-$PLAIN" >/dev/null
token_dir "$PLAIN" "scale-$PLAIN"
cat >"$WORK/kubeconfig-$PLAIN" <<EOF
apiVersion: v1
kind: Config
clusters: [{name: e2e, cluster: {server: "https://127.0.0.1:$API_PORT", certificate-authority: "$pki/ca.crt"}}]
users: [{name: u, user: {tokenFile: "$WORK/sa/$PLAIN/token"}}]
contexts: [{name: e2e, context: {cluster: e2e, user: u}}]
current-context: e2e
EOF
cat >"$WORK/$PLAIN.yaml" <<EOF
apiVersion: kubescheduler.config.k8s.io/v1
kind: KubeSchedulerConfiguration
clientConnection:
  kubeconfig: $WORK/kubeconfig-$PLAIN$CLIENT_CONNECTION
leaderElection:
  leaderElect: false
profiles:
  - schedulerName: $PLAIN
EOF

# The DRA phases need kube-controller-manager's resourceclaim controller, which makes each pod's
# ResourceClaim from its template (only that controller; the benchmark deletes the claims itself).
# Built as the real-node run builds it; its client gets the same limits as both kube-schedulers.
if [[ "$PHASES" == *dra* ]]; then
  kcm_bin="$(bash "$ROOT/e2e/real-node/build.sh" | tail -1)/kube-controller-manager"
  kcm_client=()
  (( CLIENT_QPS > 0 )) && kcm_client=(--kube-api-qps "$CLIENT_QPS" --kube-api-burst "$CLIENT_BURST")
  "$kcm_bin" --kubeconfig "$WORK/kubeconfig" --controllers resourceclaim-controller --leader-elect=false \
    --secure-port 0 "${kcm_client[@]}" --v=2 >>"$WORK/logs/controller-manager.log" 2>&1 &
  echo $! >"$WORK/pids/controller-manager"
  log "kube-controller-manager (resourceclaim-controller only${kcm_client[*]:+, ${kcm_client[*]}}) started"
fi

replicas="$(awk -F= '/- --replicas=/{print $2; exit}' "$WORK/rendered.yaml")"
[[ -n "$replicas" ]] || die "no --replicas in the rendered device plugin"
log "setup done after $(( $(date +%s) - t_start )) s; benchmark: $NODES nodes × $GPUS GPUs, $PODS pods per batch"
rc=0
"$BIN/scale" --kubeconfig "$WORK/kubeconfig" --work "$WORK" --ctl "$HERE/scale.sh ctl" \
  --examples "$ROOT/deploy/examples" --nodes "$NODES" --gpus-per-node "$GPUS" --replicas "$replicas" \
  --pods "$PODS" --latency-pods "$LATENCY_PODS" --latency-rate "$LATENCY_RATE" --churn "$CHURN" --phases "$PHASES" --stall "$STALL" \
  --filler-per-node "$FILLER" --filler-note "$FILLER_NOTE" --repeats "$REPEATS" --quiet "$QUIET" --plant-dra-overcommit="$PLANT_DRA" \
  --backlog "$BACKLOG" --backlog-window "$BACKLOG_WINDOW" --publish-cost "$PUBLISH_COST" \
  --carma-scheduler "$(awk '/schedulerName:/{print $2; exit}' "$HERE/values.yaml")" \
  --plain-scheduler-url "https://127.0.0.1:$PLAIN_PORT" --carma-scheduler-url "https://127.0.0.1:$SCHED_PORT" \
  --extender-metrics-url "http://127.0.0.1:$EXT_METRICS_PORT" || rc=$?
log "done in $(( $(date +%s) - t_start )) s: $command_line"
exit $rc
