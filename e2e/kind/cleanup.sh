#!/usr/bin/env bash
# Delete the kind cluster created by e2e/kind/run.sh.
set -euo pipefail
kind delete cluster --name "${KIND_CLUSTER:-carma-e2e}"
