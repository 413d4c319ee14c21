#!/usr/bin/env bash
# Builds containerd 2.x (containerd, containerd-shim-runc-v2, ctr) from the Go module that
# e2e/real-node/containerd/go.mod pins, for the real-node run's nodes (run.sh; CARMA_RN_CONTAINERD=debian
# uses Debian's containerd 1.6 instead). Statically linked (CGO_ENABLED=0) without the btrfs, devmapper
# and zfs snapshotters, which need C headers and are not used here (the run picks overlayfs or native);
# version stamped the way containerd's Makefile stamps a release. Cached in
# $CARMA_E2E_CACHE/containerd/<version>/<key>/bin, where <key> hashes that go.mod, go.sum, the Go
# version, the tags and the ldflags: binaries there are reused. Prints the bin directory on its last line.
set -euo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
cd "$HERE/containerd"
command -v go >/dev/null || { echo "real-node/build-containerd.sh: go is required" >&2; exit 1; }
export GOFLAGS="${GOFLAGS:--buildvcs=false}"
mod=github.com/containerd/containerd/v2
version="$(awk -v m="$mod" '$1 == m && $2 ~ /^v/ {print $2; exit}' go.mod)"
[[ -n "$version" ]] || { echo "real-node/build-containerd.sh: $mod is not in go.mod" >&2; exit 1; }
tags="no_btrfs no_devmapper no_zfs"
ldflags="-s -w -X $mod/version.Version=$version -X $mod/version.Package=$mod"
key="$( (cat go.mod go.sum; go version; echo "$tags $ldflags") | sha256sum | cut -c1-12)"
bin="${CARMA_E2E_CACHE:-$HOME/.cache/carma-e2e}/containerd/$version/$key/bin"
mkdir -p "$bin"
cmds=(containerd containerd-shim-runc-v2 ctr)
want=(); for b in "${cmds[@]}"; do [[ -x "$bin/$b" ]] || want+=("$b"); done
if [[ ${#want[@]} == 0 ]]; then
  echo "build: ${cmds[*]} $version reused from $bin" >&2
  echo "$bin"; exit 0
fi
echo "build: ${want[*]} $version into $bin (a cold build takes minutes on 2 cores)" >&2
t0=$(date +%s)
tmp="$(mktemp -d "$bin/.tmp-containerd.XXXXXX")"
trap 'rm -rf "$tmp"' EXIT
pkgs=(); for b in "${want[@]}"; do pkgs+=("$mod/cmd/$b"); done
CGO_ENABLED=0 go build -trimpath -tags "$tags" -ldflags "$ldflags" -o "$tmp/" "${pkgs[@]}"
for b in "${want[@]}"; do mv "$tmp/$b" "$bin/$b"; done
echo "build: ${want[*]} built in $(( $(date +%s) - t0 )) s" >&2
echo "$bin"
