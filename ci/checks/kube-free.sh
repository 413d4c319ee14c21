#!/usr/bin/env bash
# CI check: `carma local` builds without kube-rs and k8s-openapi. carma-api and carma-gpu keep what
# needs them behind their default `kube` feature, and carma-local takes carma-gpu without it; a
# workspace build turns the feature on for every crate (the device plugin needs it), so only a build
# of carma-local alone shows that the kube-free code still compiles.
#   1. `cargo tree -p carma-local -e normal` lists neither crate. The same listing of
#      carma-device-plugin must list both, or the pattern itself is broken (the check's planted fault).
#   2. `cargo check -p carma-local` compiles carma-local, carma-gpu and carma-api without the feature.
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.." || exit 1
crates() { cargo tree -q -p "$1" -e normal --prefix none 2>/dev/null | awk '{print $1}' | grep -xE 'kube|kube-client|kube-core|kube-runtime|k8s-openapi' | sort -u | tr '\n' ' '; }
planted="$(crates carma-device-plugin)"
if [[ "$planted" != *kube* || "$planted" != *k8s-openapi* ]]; then
  echo "FAIL: kube-free: the listing of carma-device-plugin shows '${planted}', not kube and k8s-openapi: the check cannot see them"; exit 1
fi
found="$(crates carma-local)"
if [[ -n "$found" ]]; then
  echo "FAIL: kube-free: carma-local depends on ${found}(cargo tree -p carma-local -e normal -i <crate> shows through what)"; exit 1
fi
if ! cargo check -q -p carma-local; then
  echo "FAIL: kube-free: carma-local does not compile without the kube feature"; exit 1
fi
echo "PASS: kube-free: carma-local builds without kube-rs and k8s-openapi (carma-device-plugin lists ${planted% })"
