#!/usr/bin/env bash
# Ensure the Prometheus server and promtool are available (Debian package `prometheus`). Idempotent.
# Prints the directory holding `prometheus` and `promtool` on the last line.
set -euo pipefail
if command -v promtool >/dev/null && command -v prometheus >/dev/null; then
  echo "prometheus already installed: $(prometheus --version 2>&1 | head -n1)" >&2
  dirname "$(command -v prometheus)"
  exit 0
fi
SUDO=""
if [[ "$(id -u)" != 0 ]]; then SUDO="sudo"; fi
export DEBIAN_FRONTEND=noninteractive
echo "install-prometheus: apt-get install prometheus" >&2
$SUDO apt-get -o DPkg::Lock::Timeout=600 update -qq >&2
# --no-install-recommends keeps node-exporter etc. out; policy-rc.d stops the service from starting.
if [[ ! -e /usr/sbin/policy-rc.d ]]; then
  printf '#!/bin/sh\nexit 101\n' | $SUDO tee /usr/sbin/policy-rc.d >/dev/null
  $SUDO chmod +x /usr/sbin/policy-rc.d
  trap '$SUDO rm -f /usr/sbin/policy-rc.d' EXIT
fi
$SUDO apt-get -o DPkg::Lock::Timeout=600 install -y -qq --no-install-recommends prometheus >&2
echo "install-prometheus: $(prometheus --version 2>&1 | head -n1)" >&2
dirname "$(command -v prometheus)"
