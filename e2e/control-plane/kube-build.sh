# shellcheck shell=bash
# Sourced by e2e/control-plane/build.sh and e2e/real-node/build.sh: how Kubernetes components are built
# from a Go module of this repository, so that both builds stamp the same version and share one cache.
#
# kube_build_vars: run in the module's directory; sets
#   release  the k8s.io/kubernetes version go.mod pins
#   ldflags  -s -w and the version stamps a release build carries (kube-scheduler and kubectl read them)
#   bin      $CARMA_E2E_CACHE/<release>/<key>/bin (created), where <key> hashes go.mod, go.sum, the Go
#            version and the ldflags: binaries there are reused while none of them changes
kube_build_vars() {
  local minor key
  release="$(awk '$1 == "k8s.io/kubernetes" && $2 ~ /^v/ {print $2; exit}' go.mod)"
  minor="${release#v1.}"; minor="${minor%%.*}"
  ldflags="-s -w -X k8s.io/component-base/version.gitVersion=$release -X k8s.io/component-base/version.gitMajor=1"
  ldflags+=" -X k8s.io/component-base/version.gitMinor=$minor -X k8s.io/component-base/version.gitTreeState=clean"
  ldflags+=" -X k8s.io/client-go/pkg/version.gitVersion=$release -X k8s.io/client-go/pkg/version.gitMajor=1"
  ldflags+=" -X k8s.io/client-go/pkg/version.gitMinor=$minor"
  key="$( (cat go.mod go.sum; go version; echo "$ldflags") | sha256sum | cut -c1-12)"
  bin="${CARMA_E2E_CACHE:-$HOME/.cache/carma-e2e}/$release/$key/bin"
  mkdir -p "$bin"
}
