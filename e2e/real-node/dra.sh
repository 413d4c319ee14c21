# shellcheck shell=bash
# carma's DRA path on the real nodes of run.sh (CARMA_RN_CHART=1 CARMA_RN_DRA=1); sourced by run.sh inside
# the run's namespaces after chart.sh (which leaves the chart's images in every containerd and the
# release uninstalled), never run alone. run.sh has started kube-apiserver, kube-controller-manager,
# kube-scheduler and the kubelets of the release go.mod pins with no --feature-gates: the DRA features
# carma uses (DRAConsumableCapacity, DRADeviceTaints) are beta and on by default from 1.36 (docs/dra.md);
# the run reads both from kube-apiserver's /metrics and fails unless both are on. It has made each node's
# /var/lib/kubelet/plugins_registry, /var/lib/kubelet/plugins (the kubelet's, under its --root-dir) and
# /var/run/cdi node-private, because the chart's DaemonSet names them as hostPaths.
#
# Steps, every figure read from the API server (pods, ResourceClaims, ResourceSlices) or the kubelets' logs:
#   1. helm install charts/carma with dra.enabled=true on nodes labelled carma.io/gpu-path=dra, the device
#      plugin kept off them by the chart (0 of its pods scheduled), simulated GPUs (DRA_GPUS per node); wait for
#      each node's ResourceSlice of gpu.carma.io without taints (the activity windows filled) and for the
#      kubelet's "Registered DRA plugin" (its DRA plugin manager, logged at -v 3 for that file).
#   2. DRA_SHARERS pods, each with a claim of DRA_SHARE memory from a ResourceClaimTemplate (the chart
#      README's example, with a CEL selector for the device of index 0), pinned to the first node, so
#      all on one GPU; the kubelet prepares the claims (NodePrepareResources) and the pods run.
#      Each prints from inside what carma's per-claim CDI spec gave it (lastmetre.sh's LM_PRINT), and
#      lm_dra_check compares that with the claim's allocation: the device's UUID in its ResourceSlice
#      and the memory it consumes (a `last-metre DRA:` line; two doctored records must be rejected).
#   2b. Bare pods (bare.sh): a pod asking for carma.io/gpu gets a claim sized by the extender's admission
#      webhook (admissionPolicy.gpuClaims=dra), runs on carma's slices; a dry run makes no template; a
#      malformed annotation is refused at creation (a `dra-admission:` line).
#   3. A pod whose claim asks for more memory than any GPU has stays Pending; counted as refused only when
#      its PodScheduled condition says Unschedulable because of its claim.
#   4. The simulated backend puts scripted load on GPUs with prepared claims, rising with their number
#      (device-plugin/src/backends/simulated.rs): DRA_SHARERS claims drive the shared GPU's SM activity
#      and DRAM activity over the chart's default caps, the driver publishes the utilization-gate taint
#      on it, and a pod with a small claim pinned to that node is counted as skipped while tainted when
#      its claim goes to another GPU although the tainted one had the memory free.
#   5. OOM recovery through a bigger claim: the chart's operator runs with operator.gpuClaims=dra. A
#      TrainingTask with a traced model profile and no gpuMemory: the operator sizes attempt 1's claim
#      from its own estimate, attempt 1 prints PyTorch's CUDA out-of-memory error and exits 1, the
#      operator creates attempt 2 with a claim from a larger template, attempt 2 exits 0. Counted as a
#      recovery when the task Succeeded and the claim allocated to the attempt after an out-of-memory
#      crash booked more memory (its consumedCapacity, as the API server shows it while the attempt
#      runs) than the crashed attempt's claim.
#   5b. A burst: DRA_BURST pods created at once, each with a claim of a random size (seeded, 3-13 GiB),
#      more than the GPUs hold together; one snapshot a second for DRA_BURST_S seconds while
#      kube-scheduler allocates them, every snapshot checked for over-commit as in 6; some must be
#      allocated and at least one left pending for memory (asking more than any GPU has left in the
#      last snapshot), not for slots or taints alone.
#   6. Over-commit: at every snapshot, for each device of each slice, the sum of consumedCapacity of the
#      claims allocated to it against the capacity the slice publishes (memory and slots).
#   7. The admission policy that keeps a node's driver to its own slice (charts/carma/templates/
#      admission-policy.yaml): as the driver's service account with the first node's name in its token
#      (kubectl impersonation), writing a slice of the first node is allowed and one of the second node is
#      denied with the policy's message. CARMA_RN_PLANT=dra-any-node installs without the policy: the
#      second write then goes through and the run must fail.
# Then the pods are deleted: their claims are unprepared (CDI specs gone) and deleted by the
# resourceclaim controller. CARMA_RN_PLANT=dra-overcommit lowers one GPU's published memory in its
# ResourceSlice below what its claims hold (the driver re-applies its slice within 30 s) before the last
# snapshot: the over-commit check must then report it and the run fail.

# shellcheck source=bare.sh
source "$HERE/bare.sh"

DRA_NS=carma-system
DRA_DRIVER=gpu.carma.io
DRA_GPUS=2x40GiB  # per node: 2 GPUs of 40 GiB
DRA_SHARERS=5     # 5 x 7 GiB = 35 GiB on one GPU: load over the gate's caps, 5 GiB still free
DRA_SHARE=7Gi
DRA_BIG=41Gi      # more than any GPU has
DRA_SMALL=2Gi     # fits the tainted GPU's free memory
DRA_BURST=40      # pods created at once, claims of 3-13 GiB: memory runs out before the slots do
DRA_BURST_S=30    # seconds of snapshots after the burst

# dra_snapshot <name>: claims, pods and slices as the API server has them.
dra_snapshot() {
  k get resourceclaims,pods -n default -o json >"$WORK/dra-$1-claims.json"
  k get resourceslices -o json >"$WORK/dra-$1-slices.json"
}

dra_install() {
  local i name t0 n
  for i in $(seq "$NODES"); do k label node "$(node_name "$i")" carma.io/gpu-path=dra >/dev/null; done
  # The extender serves bare pods' claims (bare.sh; its TLS is on in the control plane's values), unless
  # the admission policies are off for a planted fault: the webhook is one of them.
  local webhook=(--set extender.enabled=false)
  DRA_BARE_WEBHOOK=0
  if [[ "${CARMA_RN_PLANT:-}" != dra-any-node ]]; then
    webhook=(--set extender.enabled=true --set admissionPolicy.gpuClaims=dra); DRA_BARE_WEBHOOK=1
  fi
  log "dra: helm install carma charts/carma --set dra.enabled=true (simulated $DRA_GPUS per node) ${webhook[*]}"
  t0=$(date +%s)
  "$HELM" install carma "$ROOT/charts/carma" -n "$DRA_NS" --create-namespace -f "$ROOT/e2e/control-plane/values.yaml" \
    --set image.repository="${CARMA_IMAGE%:*}" --set image.tag="${CARMA_IMAGE##*:}" --set image.pullPolicy=Never \
    --set dra.enabled=true --set devicePlugin.simulatedGpus="$DRA_GPUS" --set enforcement.hookPath="${LM_HOOK:-/usr/bin/nvidia-cdi-hook}" \
    --set admissionPolicy.enabled="$([[ "${CARMA_RN_PLANT:-}" == dra-any-node ]] && echo false || echo true)" \
    --set scheduler.enabled=false --set operator.enabled=true --set operator.gpuClaims=dra "${webhook[@]}" \
    >"$WORK/logs/helm-dra.log" 2>&1 || die "helm install (dra): $(tail -n 5 "$WORK/logs/helm-dra.log")"
  k -n "$DRA_NS" rollout status daemonset/carma-dra-driver --timeout 180s >/dev/null || {
    k -n "$DRA_NS" get pods -o wide >&2; k -n "$DRA_NS" describe daemonset carma-dra-driver >&2
    for p in $(k -n "$DRA_NS" get pods -o name); do echo "---- $p" >&2; k -n "$DRA_NS" logs "$p" --tail 20 >&2; done
    die "the DRA driver pods are not Ready"; }
  if [[ $DRA_BARE_WEBHOOK == 1 ]]; then
    k -n "$DRA_NS" rollout status deployment/carma-scheduler-extender --timeout 180s >/dev/null || {
      k -n "$DRA_NS" get pods -o wide >&2; k -n "$DRA_NS" logs deployment/carma-scheduler-extender --tail 30 >&2 || true
      die "the extender (admissionPolicy.gpuClaims=dra) is not Ready"; }
  fi
  k -n "$DRA_NS" rollout status deployment/carma-operator --timeout 180s >/dev/null || {
    k -n "$DRA_NS" get pods -o wide >&2; die "the operator (operator.gpuClaims=dra) is not Ready"; }
  # One GPU path per node: the chart keeps the device plugin off the DRA nodes by itself, though
  # they carry its nodeSelector's label too.
  DRA_PLUGIN_PODS=$(k -n "$DRA_NS" get daemonset carma-device-plugin -o jsonpath='{.status.desiredNumberScheduled}')
  [[ "$DRA_PLUGIN_PODS" == 0 ]] || die "the device plugin is scheduled on $DRA_PLUGIN_PODS DRA node(s)"
  DRA_READY_S=$(( $(date +%s) - t0 ))
  # Each node's slice, with every device untainted: the driver's activity windows have filled (30
  # samples) and the kubelet's startup wipe, if any, has been re-applied over.
  log "dra: waiting for each node's ResourceSlice of $DRA_DRIVER, devices untainted"
  for _ in $(seq 120); do
    n=$(k get resourceslices -o json | python3 -c '
import json, sys
nodes = set()
for s in json.load(sys.stdin)["items"]:
    d = s["spec"].get("devices", [])
    if s["spec"]["driver"] == sys.argv[1] and d and not any(x.get("taints") for x in d):
        nodes.add(s["spec"].get("nodeName"))
print(len(nodes))' "$DRA_DRIVER")
    [[ $n -ge $NODES ]] && break; sleep 1
  done
  DRA_SLICES_S=$(( $(date +%s) - t0 ))
  k get resourceslices -o wide >&2
  [[ $n -ge $NODES ]] || { k get resourceslices -o yaml >&2; die "only $n of $NODES nodes have an untainted ResourceSlice of $DRA_DRIVER"; }
  DRA_REGISTERED=0
  for i in $(seq "$NODES"); do
    name="$(node_name "$i")"
    grep -q "\"Registered DRA plugin\".* driverName=\"$DRA_DRIVER\"" "$WORK/logs/kubelet-$name.log" && DRA_REGISTERED=$((DRA_REGISTERED + 1))
  done
  dra_snapshot installed
}

# dra_template <name> <memory> [CEL selector]: a ResourceClaimTemplate as in the chart README, with the
# selector when one is given.
dra_template() {
  local selectors=""
  [[ -z "${3:-}" ]] || selectors="selectors: [{cel: {expression: '$3'}}]"
  cat <<EOF
apiVersion: resource.k8s.io/v1
kind: ResourceClaimTemplate
metadata: {name: $1, namespace: default}
spec:
  spec:
    devices:
      requests:
      - name: gpu
        exactly:
          deviceClassName: carma-gpu
          allocationMode: ExactCount
          count: 1
          capacity:
            requests: {memory: $2}
          $selectors
---
EOF
}
# dra_pod <name> <template> [node]: a pod holding one claim from <template>, on <node> if given.
dra_pod() {
  local sel=""; [[ -z "${3:-}" ]] || sel="nodeSelector: {kubernetes.io/hostname: $3}"
  cat <<EOF
apiVersion: v1
kind: Pod
metadata: {name: $1, namespace: default, labels: {carma.io/e2e-dra: "true"}}
spec:
  restartPolicy: Never
  terminationGracePeriodSeconds: 1
  $sel
  resourceClaims:
  - name: gpu
    resourceClaimTemplateName: $2
  containers:
  - name: main
    image: $BUSYBOX_IMAGE
    imagePullPolicy: Never
    command: [sh, -c, $(python3 -c 'import json, sys; print(json.dumps(sys.argv[1]))' 'env | grep -E "^(CARMA|NVIDIA)" | sort; '"${LM_PRINT:-:}"'; sleep 3600')]
    resources:
      claims: [{name: gpu}]
      requests: {cpu: 10m, memory: 16Mi}
      limits: {memory: 32Mi}
---
EOF
}

dra_share() {
  local i node1; node1="$(node_name 1)"
  log "dra: $DRA_SHARERS pods with a $DRA_SHARE claim each on $node1"
  # The sharers name their GPU: once the first claims are prepared their load can close gpu-0's gate
  # (or refill its window) before the last sharer is allocated, and that one then goes to another GPU,
  # as it should, leaving no GPU loaded enough to test the gate with (a CI run split them 4 + 1).
  { dra_template dra-share "$DRA_SHARE" 'device.attributes["gpu.carma.io"].index == 0'; dra_template dra-big "$DRA_BIG"; dra_template dra-small "$DRA_SMALL"
    for i in $(seq "$DRA_SHARERS"); do dra_pod "dra-share-$i" dra-share "$node1"; done; } | k apply -f - >/dev/null
  for i in $(seq "$DRA_SHARERS"); do
    k wait --for jsonpath='{.status.phase}'=Running --timeout 120s "pod/dra-share-$i" >/dev/null || {
      k describe pod "dra-share-$i" >&2; k get resourceclaims -o wide >&2; die "dra-share-$i is not Running"; }
  done
  DRA_ENV="$(k logs dra-share-1 | grep -v '^carma-last-metre ' | tr '\n' ' ')"
  dra_snapshot shared
  lm_dra_check || die "a DRA last-metre check failed (the lines above)"
}

dra_refuse() {
  log "dra: a pod whose claim asks for $DRA_BIG, more than any GPU has"
  dra_pod dra-big dra-big | k apply -f - >/dev/null
  for _ in $(seq 60); do
    [[ "$(k get pod dra-big -o jsonpath='{.status.conditions[?(@.type=="PodScheduled")].reason}')" == Unschedulable ]] && break
    sleep 1
  done
  dra_snapshot refused
}

# dra_recover: step 5. Polls the cluster's pods and claims every second into $WORK/dra-recover.jsonl
# (one JSON document per poll) and snapshots while each attempt runs, until the task has finished.
DRA_TASK=tt-dra-oom
dra_recover() {
  local t0 phase="" i seen=""
  log "dra: TrainingTask $DRA_TASK (traced profile, no gpuMemory): a CUDA OOM on attempt 1, success after"
  # tasks.sh's TrainingTask (chart.sh sources it): no gpuMemory, a traced CNN profile.
  TT_GPU_MEMORY=none TT_PROFILE='{family: cnn, batchSize: 64, parameters: 25557032, activations: 37560000, depth: 107, traced: {forwardMiB: 5500, backwardMiB: 5594, optimizerStepMiB: 600, largestTensorMiB: 196, reservedMiB: 6626}}' \
    training_task "$DRA_TASK" 32Mi 'sleep 6
if [ "$ATTEMPT" = 1 ]; then echo "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB"; exit 1; fi' |
    k apply -f - >/dev/null
  t0=$(date +%s)
  : >"$WORK/dra-recover.jsonl"
  for _ in $(seq 150); do
    k get pods,resourceclaims -n default -o json | python3 -c 'import json, sys; print(json.dumps(json.load(sys.stdin)))' >>"$WORK/dra-recover.jsonl"
    for i in 1 2 3; do
      [[ " $seen " == *" a$i "* ]] && continue
      if [[ "$(k get pod "$DRA_TASK-a$i" -o jsonpath='{.status.phase}' 2>/dev/null)" == Running ]]; then
        dra_snapshot "recover-a$i"; seen+=" a$i"
      fi
    done
    phase="$(k get trainingtask "$DRA_TASK" -o jsonpath='{.status.phase}' 2>/dev/null || true)"
    [[ "$phase" == Succeeded || "$phase" == Failed ]] && break
    sleep 1
  done
  DRA_RECOVER_S=$(( $(date +%s) - t0 ))
  log "dra: $DRA_TASK ${phase:-without a phase} after $DRA_RECOVER_S s"
  [[ "$phase" == Succeeded ]] || { k -n "$DRA_NS" logs deployment/carma-operator --tail 30 >&2 || true; }
  k get trainingtask "$DRA_TASK" -o json >"$WORK/dra-recover-task.json"
  k get pods -n default -l "carma.io/task=$DRA_TASK" -o json >"$WORK/dra-recover-pods.json"
  k delete trainingtask "$DRA_TASK" --wait=false >/dev/null
}

# dra_burst: step 5b. The pods and their templates come from one seeded draw, so every run asks for
# the same sizes.
dra_burst() {
  local i
  log "dra: a burst of $DRA_BURST pods with claims of 3-13 GiB, snapshots every second for $DRA_BURST_S s"
  python3 - "$DRA_BURST" <<'PY' >"$WORK/dra-burst.txt"
import random, sys
rng = random.Random(20261127)
print(" ".join(str(rng.choice([3, 5, 8, 13])) for _ in range(int(sys.argv[1]))))
PY
  { for g in 3 5 8 13; do dra_template "dra-burst-${g}g" "${g}Gi"; done
    i=0; for g in $(cat "$WORK/dra-burst.txt"); do i=$((i + 1)); dra_pod "dra-burst-$i" "dra-burst-${g}g"; done
  } | k apply -f - >/dev/null
  for i in $(seq "$DRA_BURST_S"); do dra_snapshot "burst-$i"; sleep 1; done
}

# The device the sharers' claims hold, and its taints in node 1's slice.
dra_taint() {
  local node1 dev="" t=""; node1="$(node_name 1)"
  dev="$(k get resourceclaims -n default -o json | python3 -c '
import json, sys
devs = {r["device"] for c in json.load(sys.stdin)["items"] if c["metadata"]["name"].startswith("dra-share-")
        for r in ((c.get("status") or {}).get("allocation") or {}).get("devices", {}).get("results", [])}
print(" ".join(sorted(devs)))')"
  log "dra: waiting for the load of $DRA_SHARERS claims on $node1's $dev to close its utilization gate"
  t0=$(date +%s)
  for _ in $(seq 90); do
    t="$(k get resourceslices -o json | python3 -c '
import json, sys
node, dev, driver = sys.argv[1:]
for s in json.load(sys.stdin)["items"]:
    if s["spec"].get("nodeName") == node and s["spec"]["driver"] == driver:
        for d in s["spec"].get("devices", []):
            if d["name"] == dev:
                print(" ".join("%s=%s" % (t["key"], t.get("value", "")) for t in d.get("taints", []) if t.get("value") != "window-filling"))' "$node1" "$dev" "$DRA_DRIVER")"
    [[ -n "$t" ]] && break
    sleep 1
  done
  DRA_TAINT_WAIT=$(( $(date +%s) - t0 ))
  [[ -n "$t" ]] || { log "dra: no taint on $dev after $DRA_TAINT_WAIT s"; dra_snapshot tainted; return 0; }
  log "dra: $dev tainted ($t) after $DRA_TAINT_WAIT s; a pod with a $DRA_SMALL claim on $node1"
  dra_snapshot taint-before
  dra_pod dra-small dra-small "$node1" | k apply -f - >/dev/null
  k wait --for jsonpath='{.status.phase}'=Running --timeout 120s pod/dra-small >/dev/null || {
    k describe pod dra-small >&2; die "dra-small is not Running"; }
  dra_snapshot tainted
}

dra_plant() {
  local node1 slice; node1="$(node_name 1)"
  slice="$(k get resourceslices -o jsonpath="{range .items[?(@.spec.nodeName==\"$node1\")]}{.metadata.name}{end}")"
  log "dra: PLANTED: $slice's gpu-0 publishes 20Gi of memory while its claims hold more; the run must fail"
  k patch resourceslice "$slice" --type json -p '[
    {"op": "replace", "path": "/spec/devices/0/capacity/memory/value", "value": "20Gi"},
    {"op": "replace", "path": "/spec/devices/0/capacity/memory/requestPolicy/default", "value": "20Gi"}]' >/dev/null ||
    die "the planted fault could not be written"
  dra_snapshot planted
}

# dra_own_node: step 7. Sets DRA_OWN_NODE to "<own write> / <other node's write> / <write with a token
# naming no node>", each allowed or denied.
dra_own_node() {
  local own other
  own="$(node_name 1)"; other="$(node_name "$NODES")"
  [[ "$own" != "$other" ]] || { DRA_OWN_NODE="not run (one node)"; return; }
  DRA_OWN_NODE="$(dra_write_slice "$own" "$own") / $(dra_write_slice "$own" "$other") / $(dra_write_slice "" "$own")"
  log "dra: the driver of $own writing a slice of $own / of $other / of $own with no node in its token: $DRA_OWN_NODE"
}

# dra_write_slice <driver's node> <slice's node>: create a slice of the second node as the driver's
# service account with the first node in its token (none when empty); prints allowed, denied (by the
# policy) or error: ...
dra_write_slice() {
  local name="carma-e2e-own-node-$2" out extra=()
  [[ -z "$1" ]] || extra=(--as-user-extra "authentication.kubernetes.io/node-name=$1")
  if out=$(printf '%s\n' "apiVersion: resource.k8s.io/v1" "kind: ResourceSlice" "metadata: {name: $name}" \
      "spec: {driver: $DRA_DRIVER, nodeName: $2, pool: {name: $2-e2e, generation: 1, resourceSliceCount: 1}}" |
      k create --as "system:serviceaccount:$DRA_NS:carma-dra-driver" "${extra[@]}" -f - 2>&1); then
    k delete resourceslice "$name" >/dev/null
    echo allowed
  elif grep -q "may only write the ResourceSlice of its own node\|token names no node" <<<"$out"; then
    echo denied
  else
    echo "error: $(tr '\n' ' ' <<<"$out" | cut -c1-200)"
  fi
}

# dra_versions: the versions and DRA gates the cluster reports (DRA_CLUSTER), for the detail line:
# kube-apiserver's gitVersion and its kubernetes_feature_enabled metric, each kubelet's version.
dra_versions() {
  local server gates kubelets
  server=$(k version -o json | python3 -c 'import json,sys; print(json.load(sys.stdin)["serverVersion"]["gitVersion"])')
  gates=$(k get --raw /metrics | python3 -c '
import re, sys
want = ("DRAConsumableCapacity", "DRADeviceTaints")
on = {m.group(1): m.group(2) for m in re.finditer(r"^kubernetes_feature_enabled\{name=\"(\w+)\"[^}]*\} (\d)", sys.stdin.read(), re.M)}
state = lambda g: "on" if on.get(g) == "1" else "off" if g in on else "not reported"
print(", ".join(g + " " + state(g) for g in want))')
  kubelets=$(k get nodes -o jsonpath='{range .items[*]}{.status.nodeInfo.kubeletVersion}{" "}{end}')
  DRA_CLUSTER="kube-apiserver $server with $gates (its /metrics), kubelets ${kubelets% }"
}

dra_cleanup() {
  log "dra: deleting the pods (their claims are unprepared and deleted)"
  k delete pods -n default -l carma.io/e2e-dra=true --wait=false >/dev/null
  for _ in $(seq 180); do
    [[ -z "$(k get pods,resourceclaims -n default -l carma.io/e2e-dra=true -o name 2>/dev/null)$(k get resourceclaims -n default -o name 2>/dev/null)" ]] && break
    sleep 1
  done
  DRA_CDI_LEFT=$(find "$WORK"/nodes/*/cdi -name "$DRA_DRIVER-claim_*.json" 2>/dev/null | wc -l)
  DRA_CLAIMS_LEFT=$(k get resourceclaims -n default -o name | wc -l)
}

dra_summary() {
  PYTHONPATH="$HERE" python3 - "$WORK" "$DRA_DRIVER" "$DRA_SMALL" "$DRA_SHARERS" "$NODES" "$DRA_REGISTERED" "$DRA_READY_S" \
    "$DRA_SLICES_S" "${DRA_TAINT_WAIT:-}" "$DRA_CDI_LEFT" "$DRA_CLAIMS_LEFT" "$DRA_CDI_PREPARED" "$DRA_ENV" \
    "$DRA_OWN_NODE" "$DRA_CLUSTER" "$DRA_TASK" "${DRA_RECOVER_S:-}" "${DRA_PLUGIN_PODS:-}" <<'PY'
import json, os, re, sys
(work, driver, small_size, sharers, nodes, registered, ready_s, slices_s, taint_wait, cdi_left, claims_left,
 cdi_prepared, share_env, own_node, cluster, task_name, recover_s, plugin_pods) = sys.argv[1:]
snaps = [s for s in ("installed", "shared", "refused", "taint-before", "tainted", "recover-a1", "recover-a2",
                     "recover-a3") + tuple(f"burst-{i}" for i in range(1, 1000)) + ("planted",)
         if os.path.exists(f"{work}/dra-{s}-claims.json")]
def load(s):
    return (json.load(open(f"{work}/dra-{s}-claims.json"))["items"],
            json.load(open(f"{work}/dra-{s}-slices.json"))["items"])
UNITS = {"": 1, "Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "k": 10**3, "M": 10**6, "G": 10**9}
def qty(q):
    m = re.fullmatch(r"([0-9.]+)([A-Za-z]*)", str(q))
    return int(float(m.group(1)) * UNITS[m.group(2)])
def results(c):  # the claim's allocated devices of carma's driver
    a = (c.get("status") or {}).get("allocation") or {}
    return [r for r in a.get("devices", {}).get("results", []) if r["driver"] == driver]
def devices(slices):  # (pool, device) -> (device, taints) of carma's slices
    out = {}
    for s in slices:
        if s["spec"]["driver"] == driver:
            for d in s["spec"].get("devices", []):
                out[(s["spec"]["pool"]["name"], d["name"])] = d
    return out
def booked(claims):  # (pool, device) -> [(claim, {capacity: bytes or count})]
    out = {}
    for c in claims:
        if c["kind"] != "ResourceClaim":
            continue
        for r in results(c):
            out.setdefault((r["pool"], r["device"]), []).append(
                (c["metadata"]["name"], {k: qty(v) for k, v in (r.get("consumedCapacity") or {}).items()}))
    return out

# 6. over-commit: every snapshot, every device of carma's slices
checks, over = 0, []
for s in snaps:
    claims, slices = load(s)
    b = booked(claims)
    for key, d in devices(slices).items():
        checks += 1
        for cap, spec in (d.get("capacity") or {}).items():
            used = sum(cc.get(cap, 0) for _, cc in b.get(key, []))
            if used > qty(spec["value"]):
                shown = f"{used // 2**20}Mi" if cap == "memory" else str(used)
                over.append(f"{s}: {key[0]}/{key[1]} {cap} {shown} booked > {spec['value']} published "
                            f"({[n for n, _ in b.get(key, [])]})")
over_gpus = sorted({o.split(": ", 1)[1].split(" ", 1)[0] for o in over})

last = "tainted" if "tainted" in snaps else "refused"
claims, slices = load(last)
cl = [c for c in claims if c["kind"] == "ResourceClaim"]
pods = {p["metadata"]["name"]: p for p in claims if p["kind"] == "Pod"}
allocated = [c for c in cl if results(c)]
b = booked(claims)
shared = sorted(f"{k[0]}/{k[1]}" for k, v in b.items() if len(v) >= 2)
share_pods = [p for n, p in pods.items() if n.startswith("dra-share-")]
running = [p for p in share_pods if p["status"].get("phase") == "Running" and all(
    "running" in cs.get("state", {}) for cs in p["status"].get("containerStatuses", []))]

# 3. refused: PodScheduled False, reason Unschedulable, because of its claim
cr, _ = load("refused")
big = [p for p in cr if p["kind"] == "Pod" and p["metadata"]["name"] == "dra-big"]
cond = [c for c in (big[0]["status"].get("conditions", []) if big else []) if c["type"] == "PodScheduled"]
big_claim = [c for c in cr if c["kind"] == "ResourceClaim" and c["metadata"]["name"].startswith("dra-big-")]
refused = int(bool(cond and cond[0]["status"] == "False" and cond[0].get("reason") == "Unschedulable"
                   and "claim" in cond[0].get("message", "") and big_claim and not results(big_claim[0])
                   and not big[0]["spec"].get("nodeName")))
why = f"{cond[0].get('reason')}: {cond[0].get('message', '')!r}" if cond else "no PodScheduled condition"

# 4. skipped while tainted: the small claim avoided a device that was tainted before and after its
# allocation and had the memory free
skipped, taint_note = "not run", "no taint appeared"
if "tainted" in snaps and "taint-before" in snaps:
    cb, sb = load("taint-before")
    ca, sa = load("tainted")
    db, da = devices(sb), devices(sa)
    bb = booked(cb)
    small = [c for c in ca if c["kind"] == "ResourceClaim" and c["metadata"]["name"].startswith("dra-small-")]
    got = {(r["pool"], r["device"]) for c in small for r in results(c)}
    req = qty(small_size)
    skipped = 0
    tainted = []
    for key, d in db.items():
        t0 = [t["key"] for t in d.get("taints", []) if t.get("value") != "window-filling"]
        t1 = [t["key"] for t in da.get(key, {}).get("taints", []) if t.get("value") != "window-filling"]
        free = qty(d["capacity"]["memory"]["value"]) - sum(cc.get("memory", 0) for _, cc in bb.get(key, []))
        if t0 and t1:
            tainted.append(f"{key[0]}/{key[1]} {t0} ({free // 2**20} Mi free)")
            if got and key not in got and key[0] in {g[0] for g in got} and free >= req:
                skipped += 1
    taint_note = f"tainted {tainted} after {taint_wait} s of load, dra-small's claim on {sorted(f'{g[0]}/{g[1]}' for g in got)}"

# 5. OOM recovery through a bigger claim: the largest booking seen in the polls for each attempt pod
# (the claims it owns, allocated on carma's slices), against the task's own record of its attempts.
booked_by_pod = {}
jsonl = f"{work}/dra-recover.jsonl"
for line in (open(jsonl) if os.path.exists(jsonl) else []):
    for c in json.loads(line)["items"]:
        if c["kind"] != "ResourceClaim":
            continue
        owners = [o["name"] for o in c["metadata"].get("ownerReferences", []) if o["kind"] == "Pod"]
        for r in results(c):
            mem = qty((r.get("consumedCapacity") or {}).get("memory", "0"))
            for o in owners:
                if mem >= booked_by_pod.get(o, (0, ""))[0]:
                    booked_by_pod[o] = (mem, f"{r['pool']}/{r['device']}")
recoveries, recover_note = "not run", "no TrainingTask"
if os.path.exists(f"{work}/dra-recover-task.json"):
    st = json.load(open(f"{work}/dra-recover-task.json")).get("status") or {}
    atts = st.get("attempts", [])
    mib = lambda a: booked_by_pod.get(a.get("pod", ""), (0, ""))[0]
    recoveries = sum(1 for prev, nxt in zip(atts, atts[1:])
                     if prev.get("outcome") == "GpuOutOfMemory" and st.get("phase") == "Succeeded"
                     and mib(nxt) > mib(prev) > 0)
    # Recovery latency: the crashed container's finishedAt to the next attempt's container startedAt.
    from recovery import describe, restart_latencies
    pods = {p["metadata"]["name"]: p for p in json.load(open(f"{work}/dra-recover-pods.json"))["items"]}
    lat = restart_latencies(atts, pods)
    recover_note = (f"{task_name} {st.get('phase')} after {recover_s} s, crash to the next attempt's container "
                    f"start {describe(lat)}; " + "; ".join(
        f"a{a.get('index')} booked {mib(a) // 2**20} Mi on {booked_by_pod.get(a.get('pod', ''), (0, 'no device'))[1]}"
        f" (status reservedMiB {a.get('reservedMiB')}), {a.get('outcome', 'no outcome')}" for a in atts))

# 5b. The burst: how many of its claims were allocated by the last snapshot, and the fullest GPU then.
burst_note, burst_ok = "not run", False
bsnaps = [x for x in snaps if x.startswith("burst-")]
if bsnaps:
    cz, sz = load(bsnaps[-1])
    asked = [int(g) for g in open(f"{work}/dra-burst.txt").read().split()]
    bc = [c for c in cz if c["kind"] == "ResourceClaim" and c["metadata"]["name"].startswith("dra-burst-")]
    got = [c for c in bc if results(c)]
    bz = booked(cz)
    caps = {k: qty(d["capacity"]["memory"]["value"]) for k, d in devices(sz).items()}
    fullest = max([(sum(cc.get("memory", 0) for _, cc in v) / caps[k], k) for k, v in bz.items() if k in caps]
                  or [(0.0, ("none", "none"))])
    first_full = next((x for x in bsnaps if len([c for c in load(x)[0] if c["kind"] == "ResourceClaim"
                       and c["metadata"]["name"].startswith("dra-burst-") and results(c)]) == len(got)), bsnaps[-1])
    burst_note = (f"{len(asked)} pods asking {sum(asked)} GiB at once onto {sum(caps.values()) // 2**30} GiB of GPUs: "
                  f"{len(got)} claims allocated ({sum(qty(r['consumedCapacity']['memory']) for c in got for r in results(c) if 'memory' in (r.get('consumedCapacity') or {})) // 2**30} GiB), "
                  f"that count first reached at snapshot {first_full} of {len(bsnaps)}, fullest GPU {fullest[1][0]}/{fullest[1][1]} "
                  f"at {fullest[0]:.0%} of its memory")
    # Refused for memory: a pending claim asking more than any GPU, tainted or not, had left. Slots
    # (8 a GPU) and the load's taints also keep claims out; these claims memory alone refuses.
    room = max([caps[k] - sum(cc.get("memory", 0) for _, cc in bz.get(k, [])) for k in caps] or [0])
    want = lambda c: qty(c["spec"]["devices"]["requests"][0]["exactly"]["capacity"]["requests"]["memory"])
    pending = [c for c in bc if not results(c)]
    memory_refused = [c for c in pending if want(c) > room]
    burst_note += (f"; {len(pending)} pending, {len(memory_refused)} of them asking more than the "
                   f"{room // 2**20} Mi the roomiest GPU had left")
    burst_ok = len(got) > 0 and len(memory_refused) > 0

_, si = load("installed")
devs_installed = devices(si)
print(f"dra detail: {cluster}; driver pods Ready {ready_s} s after helm install, "
      f"device plugin pods on the DRA nodes {plugin_pods if plugin_pods else 'not run'}, "
      f"untainted slices after {slices_s} s: {len(devs_installed)} devices in {len({k[0] for k in devs_installed})} pools; "
      f"{registered} of {nodes} kubelets logged 'Registered DRA plugin' for {driver}; "
      f"{len(running)} of {sharers} sharer pods Running; bookings {{{', '.join(f'{k[1]}@{k[0]}: ' + str(len(v)) for k, v in sorted(b.items()))}}}; "
      f"refusal {why}; {taint_note}; recovery: {recover_note}; burst: {burst_note}; CDI specs while prepared {cdi_prepared}, after the pods' deletion {cdi_left}, "
      f"claims left {claims_left}; dra-share-1's CARMA/NVIDIA environment {share_env.strip()!r}; "
      f"the driver's service account writing its own node's slice / another node's / with no node in its token: {own_node}; "
      f"snapshots {[x for x in snaps if not x.startswith('burst-')]} and {len(bsnaps)} of the burst")
for o in over:
    print(f"  over-commit: {o}")
print(f"dra: {len(allocated)} claims allocated on carma's slices, {len(shared)} GPUs shared by memory, "
      f"{refused} refused when full, {skipped} skipped while tainted, {recoveries} OOM recoveries, "
      f"{len(over_gpus)} over-committed GPUs in {checks} checks")
ok = (len(allocated) >= int(sharers) and shared and len(running) == int(sharers) and refused == 1
      and skipped == 1 and recoveries == 1 and burst_ok and not over and checks > 0
      and "DRAConsumableCapacity on, DRADeviceTaints on" in cluster and int(registered) == int(nodes)
      and int(cdi_prepared) > 0 and cdi_left == "0" and claims_left == "0"
      and (own_node == "allowed / denied / denied" or (int(nodes) == 1 and own_node.startswith("not run"))))
sys.exit(0 if ok else 1)
PY
}

dra_run() {
  local t0; t0=$(date +%s)
  dra_install
  dra_bare
  dra_share
  dra_refuse
  dra_taint
  dra_recover
  dra_burst
  DRA_CDI_PREPARED=$(find "$WORK"/nodes/*/cdi -name "$DRA_DRIVER-claim_*.json" 2>/dev/null | wc -l)
  if [[ "${CARMA_RN_PLANT:-}" == dra-overcommit ]]; then dra_plant; fi
  dra_own_node
  dra_versions
  dra_cleanup
  log "dra: done in $(( $(date +%s) - t0 )) s"
  local bare=0
  dra_bare_summary || bare=$?
  dra_summary && return "$bare"
}
