# shellcheck shell=bash
# The control-plane setup that run.sh (the scenarios) and scale.sh (the benchmark) share; sourced, never
# run. Each function is one step of run.sh's setup, in run.sh's order:
#   cp_prereqs; cp_tools; cp_workdir <prefix>; cp_free_ports <n>; cp_certs [node...]; cp_start_etcd;
#   cp_start_apiserver; cp_apply_chart [helm args...]; token_dir ...; podrun ...
# The caller sets HERE (this directory), ROOT (the repository), NS and RELEASE, and may set LOG_TAG
# (the prefix of log lines; default control-plane) before sourcing.

log() { printf '[%s %s] %s\n' "${LOG_TAG:-control-plane}" "$(date +%H:%M:%S)" "$*" >&2; }
die() { log "FAIL: $*"; exit 1; }

nth() { local a; read -r -a a <<<"$1"; echo "${a[$2]}"; } # nth "<list>" <index from 0>

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

start_extender() {
  podrun "$WORK/logs/extender.log" "Deployment/$RELEASE-scheduler-extender" scheduler-extender \
    "$RELEASE-scheduler-extender-0" "$WORK/sa/scheduler-extender" --addr "0.0.0.0:8888=127.0.0.1:$EXT_PORT" \
    --addr "0.0.0.0:8889=127.0.0.1:$EXT_METRICS_PORT"
}

kill_pod() { # kill_pod <pid-file name> [signal]
  local f="$WORK/pids/$1"
  [[ -f "$f" ]] || return 0
  kill "-${2:-TERM}" "$(cat "$f")" 2>/dev/null || true
  for _ in $(seq 50); do kill -0 "$(cat "$f")" 2>/dev/null || break; sleep 0.1; done
  rm -f "$f"
}

cp_prereqs() {
  [[ "$(id -u)" == 0 ]] || die "needs root: each process runs in a mount namespace of its own (unshare -m)"
  for t in go openssl python3 unshare curl; do command -v "$t" >/dev/null || die "$t is required"; done
  python3 -c 'import yaml' 2>/dev/null || die "python3 needs PyYAML"
}

# cp_tools: BIN (etcd, kube-apiserver, kube-scheduler and the harness programs), HELM, KUBECTL, CARMA.
cp_tools() {
  BIN="$(bash "$HERE/build.sh" | tail -n1)"
  HELM="$("$ROOT/tools/install-helm.sh" | tail -n1)"
  KUBECTL="$(dirname "$HELM")/kubectl"
  CARMA="${CARMA_BIN:-$ROOT/target/debug/carma}"
  if [[ -z "${CARMA_BIN:-}" ]]; then (cd "$ROOT" && cargo build -q -p carma); fi
  [[ -x "$CARMA" ]] || die "carma binary $CARMA is missing"
}

# cp_workdir <mktemp prefix>: WORK with pids/ logs/ sa/ pki/ nodes/, removed on exit (unless
# CARMA_E2E_KEEP is set) after every process in pids/ is stopped, newest first.
cp_workdir() {
  WORK="$(mktemp -d "/tmp/$1.XXXXXX")"
  export CARMA_E2E_WORK="$WORK"
  mkdir -p "$WORK"/{pids,logs,sa,pki,nodes}
  trap cp_cleanup EXIT
}

cp_cleanup() {
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

# cp_free_ports <n>: PORTS, n free loopback ports.
cp_free_ports() {
  read -r -a PORTS < <(python3 - "$1" <<'PY'
import socket, sys
socks = [socket.socket() for _ in range(int(sys.argv[1]))]
for s in socks:
    s.bind(("127.0.0.1", 0))
print(*[s.getsockname()[1] for s in socks])
PY
)
}

openssl_q() { openssl "$@" 2>/dev/null; }
client_cert() { # client_cert <file stem> <subject>
  openssl_q req -newkey rsa:2048 -nodes -keyout "$pki/$1.key" -out "$pki/$1.csr" -subj "$2"
  openssl_q x509 -req -in "$pki/$1.csr" -CA "$pki/ca.crt" -CAkey "$pki/ca.key" -CAcreateserial -days 2 \
    -out "$pki/$1.crt" -extfile <(printf 'extendedKeyUsage=clientAuth')
}

# cp_certs [node...]: the CA, the API server's serving certificate, the admin's client certificate,
# one client certificate per node named (system:node:<name>), the ServiceAccount signing key; the
# admin kubeconfig $WORK/kubeconfig (exported as KUBECONFIG) and $WORK/kubeconfig-<node> per node.
cp_certs() {
  log "certificates"
  pki="$WORK/pki"
  openssl_q req -x509 -newkey rsa:2048 -nodes -keyout "$pki/ca.key" -out "$pki/ca.crt" -days 2 -subj "/CN=carma-e2e-ca"
  openssl_q req -newkey rsa:2048 -nodes -keyout "$pki/apiserver.key" -out "$pki/apiserver.csr" -subj "/CN=kube-apiserver"
  openssl_q x509 -req -in "$pki/apiserver.csr" -CA "$pki/ca.crt" -CAkey "$pki/ca.key" -CAcreateserial -days 2 \
    -out "$pki/apiserver.crt" -extfile <(printf 'subjectAltName=IP:127.0.0.1,DNS:localhost,DNS:kubernetes,DNS:kubernetes.default,DNS:kubernetes.default.svc,IP:10.96.0.1\nextendedKeyUsage=serverAuth')
  client_cert admin "/O=system:masters/CN=carma-e2e-admin"
  local n
  for n in "$@"; do client_cert "node-$n" "/O=system:nodes/CN=system:node:$n"; done
  openssl_q genrsa -out "$pki/sa.key" 2048
  openssl_q rsa -in "$pki/sa.key" -pubout -out "$pki/sa.pub"
  kubeconfig "$WORK/kubeconfig" admin
  for n in "$@"; do kubeconfig "$WORK/kubeconfig-$n" "node-$n"; done
  export KUBECONFIG="$WORK/kubeconfig"
}

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

k() { "$KUBECTL" "$@"; }

cp_start_etcd() { # ETCD_PORT, ETCD_PEER
  log "etcd $("$BIN/etcd" --version | head -n1)"
  "$BIN/etcd" --data-dir "$WORK/etcd" --name e2e --unsafe-no-fsync \
    --listen-client-urls "http://127.0.0.1:$ETCD_PORT" --advertise-client-urls "http://127.0.0.1:$ETCD_PORT" \
    --listen-peer-urls "http://127.0.0.1:$ETCD_PEER" --initial-advertise-peer-urls "http://127.0.0.1:$ETCD_PEER" \
    --initial-cluster "e2e=http://127.0.0.1:$ETCD_PEER" --log-level warn >"$WORK/logs/etcd.log" 2>&1 &
  echo $! >"$WORK/pids/etcd"
  sleep 0.01 # distinct modification times order the shutdown
  for _ in $(seq 60); do curl -fsS "http://127.0.0.1:$ETCD_PORT/health" >/dev/null 2>&1 && break; sleep 0.5; done
}

# cp_start_apiserver [more kube-apiserver flags...]: API_PORT, ETCD_PORT; API_BIND and API_ADVERTISE
# (both 127.0.0.1 unless set); t_start for the log line.
cp_start_apiserver() {
  log "kube-apiserver $("$BIN/kube-apiserver" --version)"
  "$BIN/kube-apiserver" --etcd-servers "http://127.0.0.1:$ETCD_PORT" \
    --bind-address "${API_BIND:-127.0.0.1}" --advertise-address "${API_ADVERTISE:-127.0.0.1}" \
    --secure-port "$API_PORT" --cert-dir "$WORK/apiserver" \
    --tls-cert-file "$pki/apiserver.crt" --tls-private-key-file "$pki/apiserver.key" --client-ca-file "$pki/ca.crt" \
    --service-account-issuer https://kubernetes.default.svc.cluster.local \
    --service-account-key-file "$pki/sa.pub" --service-account-signing-key-file "$pki/sa.key" \
    --requestheader-client-ca-file "$pki/ca.crt" --requestheader-allowed-names front-proxy-client \
    --requestheader-username-headers X-Remote-User --requestheader-group-headers X-Remote-Group \
    --requestheader-extra-headers-prefix X-Remote-Extra- \
    --authorization-mode Node,RBAC --enable-admission-plugins NodeRestriction \
    --service-cluster-ip-range 10.96.0.0/16 --allow-privileged=true --profiling=false "$@" \
    >"$WORK/logs/apiserver.log" 2>&1 &
  echo $! >"$WORK/pids/apiserver"
  for _ in $(seq 120); do k get --raw /readyz >/dev/null 2>&1 && break; sleep 0.5; done
  k get --raw /readyz >/dev/null || die "kube-apiserver did not become ready"
  log "API server ready after $(( $(date +%s) - t_start )) s (including the build)"
}

# cp_apply_chart [helm template args...]: render the chart (values.yaml, the extender's loopback URL
# EXT_PORT, then the caller's args) for the release go.mod pins to $WORK/rendered.yaml and apply every
# object with kubectl.
cp_apply_chart() {
  log "chart: helm template + kubectl apply (the API server validates every object)"
  local kube_version # the release build.sh built kube-apiserver from
  kube_version="$(awk '$1 == "k8s.io/kubernetes" && $2 ~ /^v/ {print substr($2, 2); exit}' "$ROOT/e2e/control-plane/go.mod")"
  "$HELM" template "$RELEASE" "$ROOT/charts/carma" -n "$NS" --include-crds --kube-version "$kube_version" \
    -f "$HERE/values.yaml" --set "scheduler.extenderConfig.urlPrefix=https://127.0.0.1:$EXT_PORT" "$@" \
    >"$WORK/rendered.yaml"
  k create namespace "$NS" >/dev/null
  # Without kube-controller-manager nobody creates the namespaces' default ServiceAccounts.
  local ns
  for ns in default "$NS"; do k -n "$ns" create serviceaccount default >/dev/null; done
  k apply -f "$WORK/rendered.yaml" >"$WORK/logs/apply.log" || die "kubectl apply of the rendered chart: $(tail -n 5 "$WORK/logs/apply.log")"
  log "applied $(grep -c . "$WORK/logs/apply.log") objects"
  k wait --for condition=Established --timeout 60s crd/trainingtasks.carma.io crd/gpunodes.carma.io >/dev/null
}

token_dir() { # token_dir <dir> <serviceaccount> [kubectl create token options...]
  local d="$WORK/sa/$1" sa="$2"; shift 2
  mkdir -p "$d"
  k -n "$NS" create token "$sa" --duration 3h "$@" >"$d/token"
  cp "$pki/ca.crt" "$d/ca.crt"
  echo -n "$NS" >"$d/namespace"
}
