# shellcheck shell=bash
# Bare pods on carma's DRA path (admissionPolicy.gpuClaims=dra), step 2b of dra.sh, which sources this
# file and installs the chart with the extender, its TLS and the DRA-claims webhook. Every figure is read
# from the API server, kubectl's own output or the records lastmetre's pods print; barepods.py checks them.
#
#   1. A pod created with `carma.io/gpu: 1` and `carma.io/gpu-memory: DRA_BARE_MEMORY`, no claim, pinned
#      to the last node: the API server calls the extender's webhook (through the Service, kube-proxy's
#      rules), which takes carma.io/gpu out of the pod and gives it a claim from a ResourceClaimTemplate
#      of that size, made by the webhook. kubectl prints the webhook's warning; the default
#      kube-scheduler's DRA allocator places the claim on carma's slices and the pod runs.
#   2. The same pod with another size, created with `--dry-run=server`: the answer shows the claim, and
#      no template of that size exists afterwards (the webhook makes none on dry runs).
#   3. A pod with a malformed carma.io/gpu-memory is refused at creation, with the annotation named.
# The checker also reads a doctored copy (the claim consuming 1 GiB more than the template books) and
# must reject it. The bare pod is deleted before the next step, its claim with it.

DRA_BARE_MEMORY=6Gi
DRA_BARE_DRY_MEMORY=5Gi

# dra_bare_pod <name> <gpu-memory> <node>: a pod asking for carma.io/gpu as on the device-plugin path.
dra_bare_pod() {
  cat <<POD
apiVersion: v1
kind: Pod
metadata:
  name: $1
  namespace: default
  labels: {carma.io/e2e-dra: "true"}
  annotations: {carma.io/gpu-memory: "$2"}
spec:
  restartPolicy: Never
  terminationGracePeriodSeconds: 1
  nodeSelector: {kubernetes.io/hostname: $3}
  containers:
  - name: main
    image: $BUSYBOX_IMAGE
    imagePullPolicy: Never
    command: [sh, -c, "env | grep -E '^(CARMA|NVIDIA)' | sort; sleep 3600"]
    resources:
      requests: {cpu: 10m, memory: 16Mi}
      limits: {carma.io/gpu: 1, memory: 32Mi}
POD
}

dra_bare() {
  local node; node="$(node_name "$NODES")"
  DRA_BARE_RAN=0
  if [[ "$DRA_BARE_WEBHOOK" != 1 ]]; then return 0; fi
  DRA_BARE_RAN=1
  log "dra: a bare pod asking for carma.io/gpu ($DRA_BARE_MEMORY) on $node, given a claim by the extender's webhook"
  dra_bare_pod dra-bare "$DRA_BARE_MEMORY" "$node" | k create -f - >"$WORK/dra-bare-create.log" 2>&1 || {
    cat "$WORK/dra-bare-create.log" >&2; k -n "$DRA_NS" logs deployment/carma-scheduler-extender --tail 30 >&2 || true
    die "the bare pod was not created"; }
  k wait --for jsonpath='{.status.phase}'=Running --timeout 120s pod/dra-bare >/dev/null || {
    k describe pod dra-bare >&2; k get resourceclaims -o wide >&2; die "dra-bare is not Running"; }
  dra_bare_pod dra-bare-dry "$DRA_BARE_DRY_MEMORY" "$node" |
    k create --dry-run=server -o json -f - >"$WORK/dra-bare-dry.json" 2>"$WORK/dra-bare-dry.log" || true
  if dra_bare_pod dra-bare-bad "lots" "$node" | k create -f - >"$WORK/dra-bare-bad.log" 2>&1; then
    k delete pod dra-bare-bad --wait=false >/dev/null
  fi
  k get pods,resourceclaims -n default -o json >"$WORK/dra-bare.json"
  k get resourceclaimtemplates -n default -o json >"$WORK/dra-bare-templates.json"
  k get resourceslices -o json >"$WORK/dra-bare-slices.json"
  k delete pod dra-bare --wait=true --timeout 60s >/dev/null
  for _ in $(seq 60); do
    k get resourceclaims -n default -o name | grep -q '^resourceclaim.resource.k8s.io/dra-bare-' || break
    sleep 1
  done
}

# dra_bare_summary: the `dra-admission:` line; fails the run when a check fails.
dra_bare_summary() {
  if [[ "${DRA_BARE_RAN:-0}" != 1 ]]; then
    echo "dra-admission: not run (admissionPolicy.enabled=false for CARMA_RN_PLANT=${CARMA_RN_PLANT:-})"
    return 0
  fi
  python3 "$HERE/barepods.py" "$WORK" "$DRA_DRIVER" "$DRA_BARE_MEMORY" "$DRA_BARE_DRY_MEMORY"
}
