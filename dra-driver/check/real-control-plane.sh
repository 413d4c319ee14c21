#!/usr/bin/env bash
# carma dra-driver against real Kubernetes code, at the release e2e/control-plane pins: etcd and
# kube-apiserver (slices and claims stored and validated for real) and the kubelet's own plugin
# watcher and DRA plugin manager (e2e/real-node/cmd/dra-plugin-check) calling the driver's sockets.
# No kubelet process, container runtime or scheduler. Needs root, Go, openssl, kubectl.
#
#   dra-driver/check/real-control-plane.sh [kube-apiserver flags...]
#
# e.g. without flags (from 1.36 both DRA gates carma uses are beta and on), or with
# --feature-gates=DRAConsumableCapacity=false to see the driver withdraw its devices when the API
# server drops the sharing fields.
set -euo pipefail
HERE="$(cd "$(dirname "$0")" && pwd)"
ROOT="$(cd "$HERE/../.." && pwd)"
CP="$ROOT/e2e/control-plane"
BIN="${BIN:-$(bash "$CP/build.sh" | tail -n1)}"
W="$(mktemp -d /tmp/carma-dra-check.XXXXXX)"
PIDS=()
cleanup() {
  for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; done
  for _ in $(seq 50); do
    alive=0; for p in "${PIDS[@]}"; do kill -0 "$p" 2>/dev/null && alive=1; done
    ((alive)) || break; sleep 0.2
  done
  for p in "${PIDS[@]}"; do kill -9 "$p" 2>/dev/null || true; done
  rm -rf "$W"
}
trap cleanup EXIT

(cd "$ROOT" && cargo build -q -p carma)
cp "${CARGO_TARGET_DIR:-$ROOT/target}/debug/carma" "$W/carma" # the shared target directory may be rebuilt meanwhile
# The kubelet-side program lives in e2e/real-node's Go module (its go.sum already pins the kubelet).
(cd "$ROOT/e2e/real-node" && GOFLAGS=-mod=readonly go build -o "$W/kubelet-check" ./cmd/dra-plugin-check)

port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
EP=$(port) PP=$(port) AP=$(port)
openssl genrsa -out "$W/sa.key" 2048 2>/dev/null && openssl rsa -in "$W/sa.key" -pubout -out "$W/sa.pub" 2>/dev/null
echo "check-token,admin,admin,system:masters" >"$W/tokens.csv"
"$BIN/etcd" --data-dir "$W/etcd" --name c --unsafe-no-fsync --log-level warn \
  --listen-client-urls "http://127.0.0.1:$EP" --advertise-client-urls "http://127.0.0.1:$EP" \
  --listen-peer-urls "http://127.0.0.1:$PP" --initial-advertise-peer-urls "http://127.0.0.1:$PP" \
  --initial-cluster "c=http://127.0.0.1:$PP" >"$W/etcd.log" 2>&1 &
PIDS+=($!)
"$BIN/kube-apiserver" --etcd-servers "http://127.0.0.1:$EP" --bind-address 127.0.0.1 --secure-port "$AP" \
  --cert-dir "$W/certs" --service-account-issuer https://kubernetes.default.svc \
  --service-account-key-file "$W/sa.pub" --service-account-signing-key-file "$W/sa.key" \
  --token-auth-file "$W/tokens.csv" --authorization-mode AlwaysAllow \
  --service-cluster-ip-range 10.96.0.0/16 "$@" >"$W/apiserver.log" 2>&1 &
PIDS+=($!)
cat >"$W/kubeconfig" <<KC
apiVersion: v1
kind: Config
clusters: [{name: c, cluster: {server: "https://127.0.0.1:$AP", insecure-skip-tls-verify: true}}]
users: [{name: u, user: {token: check-token}}]
contexts: [{name: c, context: {cluster: c, user: u}}]
current-context: c
KC
export KUBECONFIG="$W/kubeconfig"
for _ in $(seq 120); do kubectl get --raw /readyz >/dev/null 2>&1 && break; sleep 0.5; done
echo '{"apiVersion": "v1", "kind": "Node", "metadata": {"name": "n1"}}' | kubectl create -f - >/dev/null

CARMA_LOG="info,h2=debug" "$W/carma" dra-driver --backend simulated --simulated-gpus 2x40GiB --node-name n1 \
  --registry-dir "$W/reg" --plugin-dir "$W/plug" --cdi-dir "$W/cdi" --sample-interval 200ms >"$W/driver.log" 2>&1 &
DRIVER=$!
PIDS+=($DRIVER)
sleep 2
echo "== stored ResourceSlice while the activity windows fill"
kubectl get resourceslice n1-gpu.carma.io -o json || true
PAUSE_FILE="$W/paused" "$W/kubelet-check" -kubeconfig "$W/kubeconfig" -registry "$W/reg" \
  -endpoint "$W/plug/dra.sock" -node n1 >"$W/check.out" 2>&1 &
CHECK=$!
for _ in $(seq 150); do [[ -f "$W/paused" ]] && break; sleep 0.2; done
echo "== CDI specs while the claim is prepared"
{ ls "$W/cdi" && cat "$W"/cdi/*.json && echo; } 2>/dev/null || echo "(none)"
rc=0; wait "$CHECK" || rc=$?
grep -v goroutinemap "$W/check.out" || true
echo "== kubelet check exit code: $rc"
echo "== CDI specs after unprepare: $(ls -A "$W/cdi" 2>/dev/null | wc -l)"
sleep 5
# The kubelet's DRA plugin manager wipes the node's slices when it starts (the check above); the
# driver re-applies within its resync (30 s) or with its next change.
echo "== stored ResourceSlice after the windows filled"
kubectl get resourceslice n1-gpu.carma.io -o json || true
kill "$DRIVER"; wait "$DRIVER" || true
echo "== h2 on the driver's sockets (malformed requests)"
grep -m3 -i malformed "$W/driver.log" | cut -c1-300 || echo "(none)"
echo "== driver log"
grep -v 'h2::' "$W/driver.log" | cut -c1-400
