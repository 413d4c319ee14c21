#!/usr/bin/env bash
# Builds etcd, kube-apiserver, kube-scheduler, kube-controller-manager, kubelet and kube-proxy from this
# directory's Go module (go.mod: e2e/control-plane/go.mod, same k8s.io/kubernetes release and versions,
# plus the indirect requirements of the three added commands), exactly as e2e/control-plane/build.sh
# builds its three: same -trimpath and version ldflags, cached in $CARMA_E2E_CACHE/<release>/<key>/bin
# where <key> hashes this go.mod, go.sum, the Go version and the ldflags. Binaries already there are
# reused; packages shared with control-plane/build.sh come from Go's build cache, so only the link steps
# and the kubelet's/controller-manager's own packages compile cold.
# Also the harness's over-commit watcher from e2e/control-plane. Prints the bin directory on its last line.
set -euo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
cd "$HERE"
command -v go >/dev/null || { echo "real-node/build.sh: go is required (Go 1.26 or newer: go.mod's go line)" >&2; exit 1; }
# shellcheck source=../control-plane/kube-build.sh
source "$HERE/../control-plane/kube-build.sh"
kube_build_vars # release, ldflags, bin
export GOFLAGS="${GOFLAGS:--buildvcs=false}"
# The over-commit watcher (e2e/control-plane/cmd/overcommit-watch, the checker the control-plane harness
# uses): rebuilt each run, seconds with a warm Go build cache.
(cd "$HERE/../control-plane" && go build -trimpath -o "$bin/" ./cmd/overcommit-watch)
want=()
for b in etcd kube-apiserver kube-scheduler kube-controller-manager kubelet kube-proxy; do [[ -x "$bin/$b" ]] || want+=("$b"); done
if [[ ${#want[@]} == 0 ]]; then
  echo "build: etcd, kube-apiserver, kube-scheduler, kube-controller-manager, kubelet, kube-proxy $release reused from $bin" >&2
  echo "$bin"; exit 0
fi
pkgs=()
for b in "${want[@]}"; do
  case $b in
    etcd) pkgs+=(go.etcd.io/etcd/server/v3) ;;
    *) pkgs+=("k8s.io/kubernetes/cmd/$b") ;;
  esac
done
echo "build: ${want[*]} $release into $bin (cold builds take minutes on 2 cores)" >&2
t0=$(date +%s)
tmp="$(mktemp -d "$bin/.tmp-real-node.XXXXXX")"
trap 'rm -rf "$tmp"' EXIT
go build -trimpath -ldflags "$ldflags" -o "$tmp/" "${pkgs[@]}"
[[ -f "$tmp/server" ]] && mv "$tmp/server" "$tmp/etcd"
for b in "${want[@]}"; do mv "$tmp/$b" "$bin/$b"; done
echo "build: ${want[*]} built in $(( $(date +%s) - t0 )) s" >&2
echo "$bin"
