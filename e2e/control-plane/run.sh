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
#        run.sh ctl <verb> ...               # used by the scenarios to kill and restart processes
# Needs: root (mount namespaces), go, openssl, python3 with PyYAML, cargo (unless CARMA_BIN is set).
set -euo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
ROOT="$(cd "$HERE/../.." && pwd)"
NS=carma-system
RELEASE=carma
NODES="${CARMA_E2E_NODES:-4}"

log() { printf '[control-plane %s] %s\n' "$(date +%H:%M:%S)" "$*" >&2; }
die() { log "FAIL: $*"; exit 1; }

# ---- process control (also reachable as `run.sh ctl ...` from the scenarios) -----------------------

# podrun <log> <workload> <container> <pod-name> <token-dir> [podrun options...]: start one chart
# container as a local process in its own mount namespace; its PID goes to $WORK/pids/<pod-name>.
podrun() {
  local logf="$1" wl="$2" c="$3" pod="$4" tok="$5"; shift 5
  KUBERNETES_SERVICE_HOST=127.0.0.1 KUBERNETES_SERVICE_PORT="$API_PORT" \
    python3 "$HERE/podrun.py" "$WORK/rendered.yaml" "$wl" --container "$c" --pod-name "$pod" \
    --token-dir "$tok" --workdir "$WORK" --bin "carma=$CARMA" --bin "kube-scheduler=$BIN/kube-scheduler" \
    "$@" >>"$logf" 2>&1 &
  echo $! >"$WORK/pids/$pod"
}

nth() { local a; read -r -a a <<<"$1"; echo "${a[$2]}"; } # nth "<list>" <index from 0>

start_extender() {
  podrun "$WORK/logs/extender.log" "Deployment/$RELEASE-scheduler-extender" scheduler-extender \
    "$RELEASE-scheduler-extender-0" "$WORK/sa/scheduler-extender" --addr "0.0.0.0:8888=127.0.0.1:$EXT_PORT" \
    --addr "0.0.0.0:8889=127.0.0.1:$EXT_METRICS_PORT"
}

start_operator() { # start_operator <i>
  podrun "$WORK/logs/operator-$1.log" "Deployment/$RELEASE-operator" operator "$RELEASE-operator-$1" \
    "$WORK/sa/operator" --addr "0.0.0.0:8080=127.0.0.1:$(nth "$OP_PORTS" "$1")"
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

kill_pod() { # kill_pod <pid-file name> [signal]
  local f="$WORK/pids/$1"
  [[ -f "$f" ]] || return 0
  kill "-${2:-TERM}" "$(cat "$f")" 2>/dev/null || true
  for _ in $(seq 50); do kill -0 "$(cat "$f")" 2>/dev/null || break; sleep 0.1; done
  rm -f "$f"
}

ctl() {
  # shellcheck disable=SC1091
  source "$CARMA_E2E_WORK/env.sh"
  case "$1" in
    kill-extender) kill_pod "$RELEASE-scheduler-extender-0" KILL ;;
    start-extender) start_extender ;;
    kill-operator) kill_pod "$2" KILL ;;           # <pod name, e.g. carma-operator-0>
    start-operator) start_operator "${2##*-}" ;;
    restart-device-plugin) kill_pod "$RELEASE-device-plugin-$2" TERM; start_device_plugin "${2##*-}" ;;
    restart-node) kill_pod "node-$2" TERM; start_node "${2##*-}" ;;
    *) echo "run.sh ctl: unknown verb $1" >&2; exit 2 ;;
  esac
}

if [[ "${1:-}" == ctl ]]; then shift; ctl "$@"; exit; fi

# ---- setup ------------------------------------------------------------------------------------------

[[ "$(id -u)" == 0 ]] || die "needs root: each process runs in a mount namespace of its own (unshare -m)"
for t in go openssl python3 unshare curl; do command -v "$t" >/dev/null || die "$t is required"; done
python3 -c 'import yaml' 2>/dev/null || die "python3 needs PyYAML"

t_start=$(date +%s)
BIN="$(bash "$HERE/build.sh" | tail -n1)"
HELM="$("$ROOT/tools/install-helm.sh" | tail -n1)"
KUBECTL="$(dirname "$HELM")/kubectl"
CARMA="${CARMA_BIN:-$ROOT/target/debug/carma}"
if [[ -z "${CARMA_BIN:-}" ]]; then (cd "$ROOT" && cargo build -q -p carma); fi
[[ -x "$CARMA" ]] || die "carma binary $CARMA is missing"

WORK="$(mktemp -d /tmp/carma-cp.XXXXXX)"
export CARMA_E2E_WORK="$WORK"
mkdir -p "$WORK"/{pids,logs,sa,pki,nodes}
cleanup() {
  local rc=$?
  set +e # a process that already exited must not abort the cleanup
  # Newest first, so the API server and etcd outlive their clients.
  local f
  for f in $(ls -t "$WORK"/pids/ 2>/dev/null); do
    kill "$(cat "$WORK/pids/$f")" 2>/dev/null
    if [[ $f == apiserver ]]; then sleep 1; fi
  done
  sleep 1
  for f in "$WORK"/pids/*; do [[ -f "$f" ]] && kill -9 "$(cat "$f")" 2>/dev/null; done
  if [[ $rc != 0 ]]; then
    for l in "$WORK"/logs/*.log; do echo "---- last lines of $l" >&2; tail -n 25 "$l" >&2; done
  fi
  if [[ -n "${CARMA_E2E_KEEP:-}" ]]; then log "work directory kept: $WORK"; else rm -rf "$WORK"; fi
  exit $rc
}
trap cleanup EXIT

# Free loopback ports: etcd (2), API server, extender (verbs, metrics), 2 operators, one device plugin per node.
read -r -a PORTS < <(python3 - "$((7 + NODES))" <<'PY'
import socket, sys
socks = [socket.socket() for _ in range(int(sys.argv[1]))]
for s in socks:
    s.bind(("127.0.0.1", 0))
print(*[s.getsockname()[1] for s in socks])
PY
)
ETCD_PORT=${PORTS[0]}; ETCD_PEER=${PORTS[1]}; API_PORT=${PORTS[2]}; EXT_PORT=${PORTS[3]}
OP_PORTS="${PORTS[4]} ${PORTS[5]}"; EXT_METRICS_PORT=${PORTS[6]}; DP_PORTS="${PORTS[*]:7}"
cat >"$WORK/env.sh" <<EOF
WORK=$WORK; BIN=$BIN; CARMA=$CARMA; API_PORT=$API_PORT; EXT_PORT=$EXT_PORT; EXT_METRICS_PORT=$EXT_METRICS_PORT
OP_PORTS="$OP_PORTS"
DP_PORTS="$DP_PORTS"; HELM=$HELM; KUBECTL=$KUBECTL
EOF

log "certificates"
pki="$WORK/pki"
openssl_q() { openssl "$@" 2>/dev/null; }
openssl_q req -x509 -newkey rsa:2048 -nodes -keyout "$pki/ca.key" -out "$pki/ca.crt" -days 2 -subj "/CN=carma-e2e-ca"
client_cert() { # client_cert <file stem> <subject>
  openssl_q req -newkey rsa:2048 -nodes -keyout "$pki/$1.key" -out "$pki/$1.csr" -subj "$2"
  openssl_q x509 -req -in "$pki/$1.csr" -CA "$pki/ca.crt" -CAkey "$pki/ca.key" -CAcreateserial -days 2 \
    -out "$pki/$1.crt" -extfile <(printf 'extendedKeyUsage=clientAuth')
}
openssl_q req -newkey rsa:2048 -nodes -keyout "$pki/apiserver.key" -out "$pki/apiserver.csr" -subj "/CN=kube-apiserver"
openssl_q x509 -req -in "$pki/apiserver.csr" -CA "$pki/ca.crt" -CAkey "$pki/ca.key" -CAcreateserial -days 2 \
  -out "$pki/apiserver.crt" -extfile <(printf 'subjectAltName=IP:127.0.0.1,DNS:localhost,DNS:kubernetes,DNS:kubernetes.default,DNS:kubernetes.default.svc,IP:10.96.0.1\nextendedKeyUsage=serverAuth')
client_cert admin "/O=system:masters/CN=carma-e2e-admin"
for i in $(seq "$NODES"); do client_cert "node-gpu-node-$i" "/O=system:nodes/CN=system:node:gpu-node-$i"; done
openssl_q genrsa -out "$pki/sa.key" 2048
openssl_q rsa -in "$pki/sa.key" -pubout -out "$pki/sa.pub"

kubeconfig() { # kubeconfig <file> <cert stem>
  cat >"$1" <<EOF
apiVersion: v1
kind: Config
clusters: [{name: e2e, cluster: {server: "https://127.0.0.1:$API_PORT", certificate-authority: "$pki/ca.crt"}}]
users: [{name: u, user: {client-certificate: "$pki/$2.crt", client-key: "$pki/$2.key"}}]
contexts: [{name: e2e, context: {cluster: e2e, user: u}}]
current-context: e2e
EOF
}
kubeconfig "$WORK/kubeconfig" admin
for i in $(seq "$NODES"); do kubeconfig "$WORK/kubeconfig-gpu-node-$i" "node-gpu-node-$i"; done
export KUBECONFIG="$WORK/kubeconfig"
k() { "$KUBECTL" "$@"; }

log "etcd $("$BIN/etcd" --version | head -n1)"
"$BIN/etcd" --data-dir "$WORK/etcd" --name e2e --unsafe-no-fsync \
  --listen-client-urls "http://127.0.0.1:$ETCD_PORT" --advertise-client-urls "http://127.0.0.1:$ETCD_PORT" \
  --listen-peer-urls "http://127.0.0.1:$ETCD_PEER" --initial-advertise-peer-urls "http://127.0.0.1:$ETCD_PEER" \
  --initial-cluster "e2e=http://127.0.0.1:$ETCD_PEER" --log-level warn >"$WORK/logs/etcd.log" 2>&1 &
echo $! >"$WORK/pids/etcd"
sleep 0.01 # distinct modification times order the shutdown
for _ in $(seq 60); do curl -fsS "http://127.0.0.1:$ETCD_PORT/health" >/dev/null 2>&1 && break; sleep 0.5; done

log "kube-apiserver $("$BIN/kube-apiserver" --version)"
"$BIN/kube-apiserver" --etcd-servers "http://127.0.0.1:$ETCD_PORT" \
  --bind-address 127.0.0.1 --advertise-address 127.0.0.1 --secure-port "$API_PORT" --cert-dir "$WORK/apiserver" \
  --tls-cert-file "$pki/apiserver.crt" --tls-private-key-file "$pki/apiserver.key" --client-ca-file "$pki/ca.crt" \
  --service-account-issuer https://kubernetes.default.svc.cluster.local \
  --service-account-key-file "$pki/sa.pub" --service-account-signing-key-file "$pki/sa.key" \
  --requestheader-client-ca-file "$pki/ca.crt" --requestheader-allowed-names front-proxy-client \
  --requestheader-username-headers X-Remote-User --requestheader-group-headers X-Remote-Group \
  --requestheader-extra-headers-prefix X-Remote-Extra- \
  --authorization-mode Node,RBAC --enable-admission-plugins NodeRestriction \
  --service-cluster-ip-range 10.96.0.0/16 --allow-privileged=true --profiling=false \
  >"$WORK/logs/apiserver.log" 2>&1 &
echo $! >"$WORK/pids/apiserver"
for _ in $(seq 120); do k get --raw /readyz >/dev/null 2>&1 && break; sleep 0.5; done
k get --raw /readyz >/dev/null || die "kube-apiserver did not become ready"
log "API server ready after $(( $(date +%s) - t_start )) s (including the build)"

log "chart: helm template + kubectl apply (the API server validates every object)"
"$HELM" template "$RELEASE" "$ROOT/charts/carma" -n "$NS" --include-crds --kube-version 1.35.4 \
  -f "$HERE/values.yaml" --set "scheduler.extenderConfig.urlPrefix=https://127.0.0.1:$EXT_PORT" \
  >"$WORK/rendered.yaml"
k create namespace "$NS" >/dev/null
# Without kube-controller-manager nobody creates the namespaces' default ServiceAccounts.
for ns in default "$NS"; do k -n "$ns" create serviceaccount default >/dev/null; done
k apply -f "$WORK/rendered.yaml" >"$WORK/logs/apply.log" || die "kubectl apply of the rendered chart: $(tail -n 5 "$WORK/logs/apply.log")"
log "applied $(grep -c . "$WORK/logs/apply.log") objects"
k wait --for condition=Established --timeout 60s crd/trainingtasks.carma.io crd/gpunodes.carma.io >/dev/null

token_dir() { # token_dir <dir> <serviceaccount> [kubectl create token options...]
  local d="$WORK/sa/$1" sa="$2"; shift 2
  mkdir -p "$d"
  k -n "$NS" create token "$sa" --duration 3h "$@" >"$d/token"
  cp "$pki/ca.crt" "$d/ca.crt"
  echo -n "$NS" >"$d/namespace"
}
token_dir scheduler "$RELEASE-scheduler"
token_dir scheduler-extender "$RELEASE-scheduler-extender"
token_dir operator "$RELEASE-operator"

log "kube-scheduler (the chart's KubeSchedulerConfiguration), the extender, two operators"
podrun "$WORK/logs/scheduler.log" "Deployment/$RELEASE-scheduler" kube-scheduler "$RELEASE-scheduler-0" "$WORK/sa/scheduler"
start_extender
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
