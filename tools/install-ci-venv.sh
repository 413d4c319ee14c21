#!/usr/bin/env bash
# Create (once) the Python virtual environment used by ci/checks/schemas.sh: <repo>/.tools/venv-ci
# (inside the gitignored .tools folder) with kubernetes-validate, check-jsonschema and PyYAML from PyPI.
# Idempotent: packages are only installed when an import fails. Prints the venv path on the last line.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="${CARMA_CI_VENV:-$ROOT/.tools/venv-ci}"
if [[ ! -x "$VENV/bin/python" ]]; then
  echo "install-ci-venv: creating $VENV" >&2
  python3 -m venv "$VENV"
fi
# Pinned for reproducible CI; kubernetes-validate 1.37 carries the schemas of Kubernetes 1.25-1.37.
PINS=(kubernetes-validate==1.37.0 check-jsonschema==0.39.0 jsonschema==4.26.0 pyyaml==6.0.3)
STAMP="$VENV/.carma-pins"
if [[ "$(cat "$STAMP" 2>/dev/null)" != "${PINS[*]}" ]] \
   || ! "$VENV/bin/python" -c 'import kubernetes_validate, yaml, jsonschema' 2>/dev/null \
   || [[ ! -x "$VENV/bin/check-jsonschema" ]]; then
  echo "install-ci-venv: pip install ${PINS[*]}" >&2
  "$VENV/bin/python" -m pip install -q --disable-pip-version-check "${PINS[@]}" >&2
  echo "${PINS[*]}" > "$STAMP"
fi
echo "$VENV"
