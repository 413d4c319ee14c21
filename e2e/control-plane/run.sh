#!/usr/bin/env bash
# carma against a real Kubernetes control plane, all on loopback (see e2e/README.md):
#   etcd, kube-apiserver (RBAC + Node authorizers, admission on) and kube-scheduler built from their Go
#   modules (build.sh); the chart rendered by `helm template` and applied with kubectl; kube-scheduler,
#   the extender, two operators and one device plugin per node run from the rendered pod specs
#   (podrun.py), each with a token of its own ServiceAccount; node-harness plays each node's kubelet
#   around the kubelet's own device manager. Then the scenarios (cmd/scenarios, built with Go's race
#   detector) run and print their summary lines, every figure read from the cluster:
#   control-plane: <k> of <K> pods bound, <r> OOM recoveries, 0 over-committed GPUs in <c> checks, p99 bind <x> ms, leader failover <y> s
#   device-manager: ...
#   canary: <n> of <n> planted faults caught
#   (CARMA_E2E_ONLY=<scenario,...> runs a subset; figures of parts that did not run read "not run")
#
# Usage: e2e/control-plane/run.sh            # build what is missing, run everything, exit 0 on success
#        CARMA_E2E_KEEP=1 run.sh            # leave the work directory (logs, certs, kubeconfig) behind
#        CARMA_E2E_SET="k=v ..." run.sh      # more chart values (--set each), e.g. scheduler.extenderConfig.mode=rank
#        run.sh ctl <verb> ...               # used by the scenarios to kill and restart processes
# Needs: root (mount namespaces), go, openssl, python3 with PyYAML, cargo (unless CARMA_BIN is set).
set -euo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
ROOT="$(cd "$HERE/../.." && pwd)"
NS=carma-system
RELEASE=carma
NODES="${CARMA_E2E_NODES:-4}"

# shellcheck source=cluster.sh
source "$HERE/cluster.sh" # log, die, podrun, start_extender, kill_pod and the setup steps below

# ---- process control (also reachable as `run.sh ctl ...` from the scenarios) -----------------------

start_operator() { # start_operator <i>: reaches kube-apiserver through its own hangproxy.py
  API_PORT="$(nth "$OP_PROXY_PORTS" "$1")" podrun "$WORK/logs/operator-$1.log" "Deployment/$RELEASE-operator" \
    operator "$RELEASE-operator-$1" "$WORK/sa/operator" --addr "0.0.0.0:8080=127.0.0.1:$(nth "$OP_PORTS" "$1")"
}

start_operator_proxy() { # start_operator_proxy <i>: hangs while $WORK/hang-operator-<i> exists
  python3 "$HERE/hangproxy.py" "$(nth "$OP_PROXY_PORTS" "$1")" "$API_PORT" "$WORK/hang-operator-$1" \
    >>"$WORK/logs/operator-proxy-$1.log" 2>&1 &
  echo $! >"$WORK/pids/operator-proxy-$1"
}

start_device_plugin() { # start_device_plugin <i>: the plugin of node gpu-node-<i>
  local node="gpu-node-$1"
  podrun "$WORK/logs/device-plugin-$node.log" "DaemonSet/$RELEASE-device-plugin" device-plugin \
    "$RELEASE-device-plugin-$node" "$WORK/sa/device-plugin-$node" --node "$node" \
    --mount "$WORK/nodes/$node:/var/lib/kubelet/device-plugins" \
    --addr "0.0.0.0:9402=127.0.0.1:$(nth "$DP_PORTS" "$(($1 - 1))")"
}

start_node() { # start_node <i>: node-harness (kubelet stand-in around the real device manager)
  local node="gpu-node-$1"
  mkdir -p "$WORK/nodes/$node" /var/lib/kubelet/device-plugins
  unshare -m --propagation private -- sh -c \
    'mount --bind "$0" /var/lib/kubelet/device-plugins && exec "$@"' "$WORK/nodes/$node" \
    "$BIN/node-harness" --kubeconfig "$WORK/kubeconfig-$node" --node "$node" \
    --record "$WORK/nodes/$node.admitted.jsonl" >>"$WORK/logs/node-$node.log" 2>&1 &
  echo $! >"$WORK/pids/node-$node"
}

ctl() {
  # shellcheck disable=SC1091
  source "$CARMA_E2E_WORK/env.sh"
  case "$1" in
    kill-extender) kill_pod "$RELEASE-scheduler-extender-0" KILL ;;
    start-extender) start_extender ;;
    kill-operator) kill_pod "$2" KILL ;;           # <pod name, e.g. carma-operator-0>
    start-operator) start_operator "${2##*-}" ;;
    hang-operator-api) touch "$WORK/hang-operator-${2##*-}" ;;   # <pod name>: its API server stops answering
    unhang-operator-api) rm -f "$WORK/hang-operator-${2##*-}" ;;
    restart-device-plugin) kill_pod "$RELEASE-device-plugin-$2" TERM; start_device_plugin "${2##*-}" ;;
    restart-node) kill_pod "node-$2" TERM; start_node "${2##*-}" ;;
    *) echo "run.sh ctl: unknown verb $1" >&2; exit 2 ;;
  esac
}

if [[ "${1:-}" == ctl ]]; then shift; ctl "$@"; exit; fi

# ---- setup ------------------------------------------------------------------------------------------

cp_prereqs

t_start=$(date +%s)
cp_tools

cp_workdir carma-cp

# Free loopback ports: etcd (2), API server, extender (verbs, metrics), 2 operators and their API
# proxies, one device plugin per node.
cp_free_ports "$((9 + NODES))"
ETCD_PORT=${PORTS[0]}; ETCD_PEER=${PORTS[1]}; API_PORT=${PORTS[2]}; EXT_PORT=${PORTS[3]}
OP_PORTS="${PORTS[4]} ${PORTS[5]}"; EXT_METRICS_PORT=${PORTS[6]}; OP_PROXY_PORTS="${PORTS[7]} ${PORTS[8]}"
DP_PORTS="${PORTS[*]:9}"
cat >"$WORK/env.sh" <<EOF
WORK=$WORK; BIN=$BIN; CARMA=$CARMA; API_PORT=$API_PORT; EXT_PORT=$EXT_PORT; EXT_METRICS_PORT=$EXT_METRICS_PORT
OP_PORTS="$OP_PORTS"; OP_PROXY_PORTS="$OP_PROXY_PORTS"
DP_PORTS="$DP_PORTS"; HELM=$HELM; KUBECTL=$KUBECTL
EOF

nodes=(); for i in $(seq "$NODES"); do nodes+=("gpu-node-$i"); done
cp_certs "${nodes[@]}"
cp_start_etcd
cp_start_apiserver
chart_sets=(); for kv in ${CARMA_E2E_SET:-}; do chart_sets+=(--set "$kv"); done
cp_apply_chart "${chart_sets[@]}"

token_dir scheduler "$RELEASE-scheduler"
token_dir scheduler-extender "$RELEASE-scheduler-extender"
token_dir operator "$RELEASE-operator"

log "kube-scheduler (the chart's KubeSchedulerConfiguration), the extender, two operators"
podrun "$WORK/logs/scheduler.log" "Deployment/$RELEASE-scheduler" kube-scheduler "$RELEASE-scheduler-0" "$WORK/sa/scheduler"
start_extender
start_operator_proxy 0
start_operator_proxy 1
start_operator 0
start_operator 1

log "$NODES GPU nodes: node-harness (kubelet device manager) + carma device plugin each"
for i in $(seq "$NODES"); do start_node "$i"; done
for i in $(seq "$NODES"); do
  for _ in $(seq 60); do k get node "gpu-node-$i" >/dev/null 2>&1 && break; sleep 0.5; done
  # The API server taints new nodes not-ready; kube-controller-manager's node lifecycle controller
  # (not run here) lifts the taint once the kubelet reports Ready. The harness does that step as admin.
  k taint node "gpu-node-$i" node.kubernetes.io/not-ready:NoSchedule- >/dev/null 2>&1 || true
  # A token bound to the node, as a DaemonSet pod's projected token is: it carries the node's name.
  token_dir "device-plugin-gpu-node-$i" "$RELEASE-device-plugin" --bound-object-kind Node --bound-object-name "gpu-node-$i"
  start_device_plugin "$i"
done

log "scenarios"
"$BIN/scenarios" --kubeconfig "$WORK/kubeconfig" --kubectl "$KUBECTL" --ctl "$HERE/run.sh ctl" \
  --work "$WORK" --nodes "$NODES" --examples "$ROOT/deploy/examples" --namespace "$NS" \
  --scheduler-name "$(awk '/schedulerName:/{print $2; exit}' "$HERE/values.yaml")" \
  ${CARMA_E2E_ONLY:+--only "$CARMA_E2E_ONLY"} --extender "http://127.0.0.1:$EXT_METRICS_PORT"
log "mutual TLS: the verbs port answers kube-scheduler's client certificate only"
tls_dir="$WORK/volumes/$RELEASE-scheduler-0/extender-tls"
host="$RELEASE-scheduler-extender.$NS.svc"
ext_curl() { curl -s -o /dev/null -w '%{http_code}' --max-time 5 --resolve "$host:$EXT_PORT:127.0.0.1" "$@" "https://$host:$EXT_PORT/healthz" || true; }
code=$(ext_curl --cacert "$tls_dir/ca.crt" --cert "$tls_dir/client.crt" --key "$tls_dir/client.key")
[ "$code" = 200 ] || die "the extender did not answer kube-scheduler's client certificate (HTTP $code)"
code=$(ext_curl --cacert "$tls_dir/ca.crt")
[ "$code" = 000 ] || die "the extender answered a caller without a client certificate (HTTP $code)"
code=$(curl -s -o /dev/null -w '%{http_code}' --max-time 5 "http://127.0.0.1:$EXT_PORT/healthz" || true)
[ "$code" = 000 ] || die "the extender's verbs port answered plain HTTP (HTTP $code)"
log "mutual TLS: with the scheduler's certificate 200; without one, or over plain HTTP, refused"
log "done in $(( $(date +%s) - t_start )) s"
