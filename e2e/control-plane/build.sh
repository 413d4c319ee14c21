#!/usr/bin/env bash
# Builds the real control plane and our harness programs from their Go modules (go.mod pins the
# Kubernetes release; go.sum is committed):
#   etcd, kube-apiserver, kube-scheduler   -> cached in $CARMA_E2E_CACHE/<release>/<key>/bin, reused
#                                             while go.mod, go.sum and the Go version are unchanged
#   node-harness, scenarios                -> rebuilt each run (seconds with a warm Go build cache);
#                                             scenarios with Go's race detector (its checks run
#                                             from many goroutines), so CI runs it under -race
# Prints the bin directory on its last line.
set -euo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
cd "$HERE"
command -v go >/dev/null || { echo "build.sh: go is required (Go 1.26 or newer: go.mod's go line)" >&2; exit 1; }
# shellcheck source=kube-build.sh
source "$HERE/kube-build.sh"
kube_build_vars # release, ldflags, bin
export GOFLAGS="${GOFLAGS:--buildvcs=false}"
t0=$(date +%s)
if [[ -x "$bin/etcd" && -x "$bin/kube-apiserver" && -x "$bin/kube-scheduler" ]]; then
  echo "build: etcd, kube-apiserver, kube-scheduler $release reused from $bin" >&2
else
  echo "build: etcd, kube-apiserver, kube-scheduler $release (cold builds take minutes on 2 cores)" >&2
  go build -trimpath -ldflags "$ldflags" -o "$bin/.tmp/" go.etcd.io/etcd/server/v3 k8s.io/kubernetes/cmd/kube-apiserver k8s.io/kubernetes/cmd/kube-scheduler
  mv "$bin/.tmp/server" "$bin/etcd"
  mv "$bin/.tmp/kube-apiserver" "$bin/.tmp/kube-scheduler" "$bin/"
  rmdir "$bin/.tmp"
fi
t1=$(date +%s)
go build -trimpath -ldflags "$ldflags" -o "$bin/" ./cmd/node-harness
CGO_ENABLED=1 go build -race -trimpath -ldflags "$ldflags" -o "$bin/" ./cmd/scenarios
t2=$(date +%s)
echo "build: control plane $((t1 - t0)) s, harness programs $((t2 - t1)) s" >&2
echo "$bin"
