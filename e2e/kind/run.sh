#!/usr/bin/env bash
# carma end-to-end test on a real kind cluster (Docker required; NOT run in this project's CI).
#
#   e2e/kind/run.sh            # create the cluster (if missing), build and load the image, install the
#                              # chart, run the assertions; the cluster is kept for inspection
#   e2e/kind/run.sh --delete   # ... and delete the cluster at the end
#   KEEP_IMAGE=1 e2e/kind/run.sh   # skip the image build (reuse the image already built by
#                                  # tools/build-image.sh, e.g. by the GitHub workflow)
#
# Needs: docker, kind (>= 0.20), jq. helm and kubectl come from tools/install-helm.sh when absent.
# What it asserts:
#   1. the device plugin registers with the real kubelet: each worker advertises carma.io/gpu
#      (2 simulated GPUs x 4 replicas) and publishes a GpuNode;
#   2. a pod that requests carma.io/gpu without schedulerName carma-scheduler is rejected at admission;
#   3. a plain pod scheduled by carma-scheduler is bound by the extender with carma.io/assigned-gpus,
#      carma.io/estimate and carma.io/assigned-at, allocated by the plugin (carma.io/allocated), and
#      receives exactly its GPUs in NVIDIA_VISIBLE_DEVICES;
#   4. a TrainingTask is placed and Succeeds on its first attempt;
#   5. a TrainingTask whose first attempt crashes with a CUDA OOM message is requeued with a larger
#      reservation and the carma-recovery priority class, and Succeeds.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
HERE="$ROOT/e2e/kind"
CLUSTER="${KIND_CLUSTER:-carma-e2e}"
# The chart's default image reference: the test installs the image users get from tools/build-image.sh
# (root Dockerfile), under the very name the chart uses.
IMAGE="$("$ROOT/tools/build-image.sh" --print)"
NS=carma-system
TEST_NS=carma-e2e
TIMEOUT="${E2E_TIMEOUT:-300}"
DELETE=0
[[ "${1:-}" == "--delete" ]] && DELETE=1

log() { printf '\n\033[1m== %s\033[0m\n' "$*"; }
pass() { printf 'PASS: %s\n' "$*"; }
die() { printf 'FAIL: %s\n' "$*" >&2; diagnostics; exit 1; }

for tool in docker kind jq; do
  command -v "$tool" >/dev/null || { echo "e2e/kind: $tool is required" >&2; exit 1; }
done
if ! command -v helm >/dev/null || ! command -v kubectl >/dev/null; then
  HELM_BIN="$("$ROOT/tools/install-helm.sh" | tail -n1)"
  PATH="$(dirname "$HELM_BIN"):$PATH"
  export PATH
fi
KCTX="kind-$CLUSTER"
k() { kubectl --context "$KCTX" "$@"; }

diagnostics() {
  echo "---- diagnostics ----" >&2
  k get nodes -o wide >&2 || true
  k get tt,gpunodes -A -o wide >&2 || true
  k get pods -A -o wide >&2 || true
  k -n "$TEST_NS" get events --sort-by=.lastTimestamp >&2 || true
  for c in device-plugin scheduler-extender scheduler operator; do
    echo "---- logs: $c ----" >&2
    k -n "$NS" logs -l "app.kubernetes.io/component=$c" --all-containers --tail=80 --prefix >&2 || true
  done
}

# wait_for <seconds> <description> <command...>: retry the command until it succeeds.
wait_for() {
  local secs="$1" desc="$2"; shift 2
  local end=$((SECONDS + secs))
  until "$@" >/dev/null 2>&1; do
    ((SECONDS < end)) || die "timed out after ${secs}s waiting for: $desc"
    sleep 3
  done
  pass "$desc"
}

cleanup() { if ((DELETE)); then kind delete cluster --name "$CLUSTER" || true; fi; }
trap cleanup EXIT

log "cluster $CLUSTER"
if kind get clusters 2>/dev/null | grep -qx "$CLUSTER"; then
  echo "reusing existing kind cluster $CLUSTER"
else
  kind create cluster --name "$CLUSTER" --config "$HERE/kind-config.yaml" --wait 180s
fi
k version -o json | jq -r '"server " + .serverVersion.gitVersion'

log "image $IMAGE"
if [[ "${KEEP_IMAGE:-0}" != 1 ]]; then
  CONTAINER_ENGINE=docker "$ROOT/tools/build-image.sh"
fi
kind load docker-image "$IMAGE" --name "$CLUSTER"

log "helm install"
helm --kube-context "$KCTX" upgrade --install carma "$ROOT/charts/carma" \
  --namespace "$NS" --create-namespace -f "$HERE/values-kind.yaml" --wait --timeout 5m
k -n "$NS" get deploy,ds,svc -o wide

log "1. device plugin registered with kubelet on every worker"
workers=$(k get nodes -l carma.io/gpu-node=true -o jsonpath='{.items[*].metadata.name}')
[[ -n "$workers" ]] || die "no worker carries carma.io/gpu-node=true"
for n in $workers; do
  wait_for 120 "node $n advertises 8 carma.io/gpu" \
    bash -c "[[ \"\$(kubectl --context $KCTX get node $n -o jsonpath='{.status.allocatable.carma\.io/gpu}')\" == 8 ]]"
  wait_for 120 "GpuNode $n published with 2 GPUs" \
    bash -c "[[ \"\$(kubectl --context $KCTX get gpunode $n -o json | jq '.status.gpus | length')\" == 2 ]]"
done
k get gpunodes -o wide

log "2. admission rejects GPU pods that bypass carma-scheduler"
k create namespace "$TEST_NS" --dry-run=client -o yaml | k apply -f -
if out=$(k apply -f "$HERE/manifests/pod-wrong-scheduler.yaml" 2>&1); then
  die "pod without schedulerName carma-scheduler was admitted: $out"
fi
grep -q "carma-scheduler" <<<"$out" || die "rejection does not explain the fix: $out"
pass "rejected: $(tr '\n' ' ' <<<"$out" | cut -c1-200)"

log "3. plain pod placed by the extender and allocated by the plugin"
k apply -f "$HERE/manifests/pods.yaml"
wait_for "$TIMEOUT" "pod e2e-plain Running" \
  bash -c "[[ \"\$(kubectl --context $KCTX -n $TEST_NS get pod e2e-plain -o jsonpath='{.status.phase}')\" == Running ]]"
pod_json=$(k -n "$TEST_NS" get pod e2e-plain -o json)
node=$(jq -r '.spec.nodeName' <<<"$pod_json")
gpus=$(jq -r '.metadata.annotations["carma.io/assigned-gpus"] // empty' <<<"$pod_json")
est=$(jq -r '.metadata.annotations["carma.io/estimate"] // empty' <<<"$pod_json")
at=$(jq -r '.metadata.annotations["carma.io/assigned-at"] // empty' <<<"$pod_json")
alloc=$(jq -r '.metadata.annotations["carma.io/allocated"] // empty' <<<"$pod_json")
[[ " $workers " == *" $node "* ]] || die "e2e-plain runs on $node, not on a GPU worker"
[[ -n "$gpus" ]] || die "e2e-plain lacks carma.io/assigned-gpus"
[[ -n "$at" ]] || die "e2e-plain lacks carma.io/assigned-at"
jq -e '.mib >= 2048 and (.source | length > 0)' <<<"$est" >/dev/null \
  || die "carma.io/estimate is not {mib >= 2048 (the 2Gi override), source}: $est"
[[ "$alloc" == true ]] || die "e2e-plain lacks carma.io/allocated=true"
[[ "$(jq -r '.status.gpus[].uuid' <<<"$(k get gpunode "$node" -o json)" | grep -cxF "$gpus")" == 1 ]] \
  || die "assigned GPU $gpus is not a GPU of node $node"
wait_for 60 "e2e-plain sees exactly its GPU" \
  bash -c "kubectl --context $KCTX -n $TEST_NS logs e2e-plain | grep -qx 'GPUs $gpus'"
pass "e2e-plain on $node, GPU $gpus, estimate $est, allocated"

log "4./5. TrainingTasks"
k apply -f "$HERE/manifests/trainingtasks.yaml"
tt_phase() { k -n "$TEST_NS" get tt "$1" -o jsonpath='{.status.phase}'; }
for tt in e2e-fits e2e-oom; do
  end=$((SECONDS + TIMEOUT))
  while :; do
    phase=$(tt_phase "$tt" || true)
    [[ "$phase" == Succeeded ]] && break
    [[ "$phase" == Failed ]] && die "TrainingTask $tt Failed: $(k -n "$TEST_NS" get tt "$tt" -o json | jq -c .status)"
    ((SECONDS < end)) || die "TrainingTask $tt not Succeeded after ${TIMEOUT}s (phase '$phase')"
    sleep 3
  done
  pass "TrainingTask $tt Succeeded"
done

fits=$(k -n "$TEST_NS" get tt e2e-fits -o json)
[[ "$(jq '.status.attempts | length' <<<"$fits")" == 1 ]] \
  || die "e2e-fits needed more than one attempt: $(jq -c .status.attempts <<<"$fits")"
fits_pod=$(jq -r '.status.attempts[0].pod' <<<"$fits")
pass "e2e-fits: one attempt (pod $fits_pod)"

oom=$(k -n "$TEST_NS" get tt e2e-oom -o json)
n_att=$(jq '.status.attempts | length' <<<"$oom")
((n_att >= 2)) || die "e2e-oom: expected a recovery attempt, got $n_att attempt(s)"
jq -e '.status.attempts[0].outcome == "GpuOutOfMemory"' <<<"$oom" >/dev/null \
  || die "e2e-oom: first attempt not recorded as an OOM: $(jq -c '.status.attempts[0]' <<<"$oom")"
first_mib=$(jq '.status.attempts[0].reservedMiB' <<<"$oom")
last_mib=$(jq '.status.attempts[-1].reservedMiB' <<<"$oom")
((last_mib > first_mib)) || die "e2e-oom: reservation did not grow ($first_mib -> $last_mib MiB)"
last_pod=$(jq -r '.status.attempts[-1].pod' <<<"$oom")
pc=$(k -n "$TEST_NS" get pod "$last_pod" -o jsonpath='{.spec.priorityClassName}' 2>/dev/null || true)
[[ "$pc" == carma-recovery ]] || die "e2e-oom: recovery pod $last_pod has priority class '$pc', not carma-recovery"
pass "e2e-oom: OOM detected, requeued $first_mib -> $last_mib MiB with carma-recovery, succeeded after $n_att attempts"

log "summary"
k get tt,gpunodes -A -o wide
echo
echo "e2e/kind: all assertions passed"
