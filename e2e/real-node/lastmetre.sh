# shellcheck shell=bash
# The last metre (CARMA_RN_CHART=1): what carma's device plugin hands a container through CDI, seen from
# inside the container. Sourced by chart.sh, never run alone. Uses run.sh's k, log, die, WORK, NODES,
# node_name, CONTAINERD_VERSION, CONTAINERD_MAJOR, BUSYBOX_IMAGE and chart.sh's CHART_NS.
#
# Allocate answers each container with CDI names `nvidia.com/gpu=<UUID>` (and env: NVIDIA_VISIBLE_DEVICES,
# CARMA_ASSIGNED_GPUS, CARMA_RESERVED_MIB, NVIDIA_GPU_MEMORY_REQUEST/LIMIT in bytes); the kubelet passes
# the names to the runtime, and containerd 2 resolves them against the CDI specs of its cdi_spec_dirs
# (run.sh: the node's cdi-nvidia/ and cdi/). On a GPU node that spec is what NVIDIA's container toolkit
# writes (`nvidia-ctk cdi generate`); here lm_standin writes a stand-in of it per node:
#   - kind nvidia.com/gpu; per GPU a device named by its index and one named by its UUID (the default
#     --device-name-strategy of nvidia-ctk v1.20.2 is both, index and uuid, read from its source,
#     cmd/nvidia-ctk/cdi/generate/generate.go; older releases defaulted to index alone, which carma's
#     UUID names would not resolve against), plus "all"; each device's edits add /dev/nvidia<index>;
#   - common edits: /dev/nvidiactl, /dev/nvidia-uvm, /dev/nvidia-uvm-tools, env NVIDIA_VISIBLE_DEVICES=void
#     and /dev/null bound at /var/run/nvidia-container-devices/void (as the toolkit writes them);
#   - left out: the toolkit's hooks (ldcache, symlinks) and its library mounts, which need a driver (the
#     memory-limit hook comes from carma's own specs, below);
#   - the device nodes' host paths are char devices with /dev/null's numbers (1:3) made with mknod under
#     the node's work directory, so a container gets harmless nodes named like the real ones;
#   - the UUIDs and indexes are those the node's device plugin advertises, read from its GpuNode.
# Every GPU container of the run (gpu-share in chart.sh, the TrainingTasks' attempts in tasks.sh) prints
# LM_PRINT's line from inside; lm_check compares each with the pod's assignment in the API
# (lastmetre.py), runs the comparison over two doctored records (canaries it must reject), and
# lm_refusal shows that a CDI name the node's spec lacks refuses the container.

# The memory-limit hook (docs/enforcement.md): the chart's enforcement.memoryLimits=auto finds NVIDIA's
# nvidia-cdi-hook at enforcement.hookPath, so the device plugin writes its spec carma.io/memory-limits
# into each node's cdi/ (run.sh binds it at /var/run/cdi) and names it in every Allocate, and the DRA
# driver puts the hook into each per-claim spec; containerd runs it as a createContainer hook. These
# nodes have no toolkit, so LM_HOOK is a stand-in shared by the nodes (one filesystem; the chart is
# installed with enforcement.hookPath=$LM_HOOK): it records its arguments, the container's id and the
# NVIDIA_GPU_MEMORY_REQUEST/LIMIT of the container's OCI config (the runtime hands a hook the container's
# state on stdin: its id and bundle directory, whose config.json has process.env) in LM_HOOK_LOG, one
# line a call. lm_check and lm_dra_check count the training containers whose values it recorded.
# CARMA_RN_PLANT=hook: the stand-in records every limit one MiB too high, and the run must fail.
LM_HOOK="$WORK/hook/nvidia-cdi-hook"
LM_HOOK_LOG="$WORK/hook/calls.log"
lm_hook_standin() {
  local plant=""
  [[ "${CARMA_RN_PLANT:-}" != hook ]] || plant='[ -z "$limit" ] || limit=$((limit + 1048576)) # planted: a wrong limit'
  mkdir -p "$(dirname "$LM_HOOK")" && : >"$LM_HOOK_LOG" || return 1
  {
    echo '#!/bin/sh'
    echo '# stand-in of nvidia-cdi-hook (e2e/real-node/lastmetre.sh); a hook runs with an empty environment'
    echo 'PATH=/usr/sbin:/usr/bin:/sbin:/bin'
    echo 'state="$(cat)"'
    echo 'field() { printf "%s" "$state" | grep -o "\"$1\": *\"[^\"]*\"" | head -n 1 | sed "s/.*\"\\([^\"]*\\)\"\$/\\1/"; }'
    echo 'id="$(field id)"; bundle="$(field bundle)"'
    echo 'env_of() { grep -o "\"$1=[0-9]*\"" "$bundle/config.json" | head -n 1 | tr -d "\"" | cut -d= -f2; }'
    echo 'request="$(env_of NVIDIA_GPU_MEMORY_REQUEST)"; limit="$(env_of NVIDIA_GPU_MEMORY_LIMIT)"'
    echo "$plant"
    echo "echo \"carma-hook args=\$* id=\$id request=\$request limit=\$limit\" >>'$LM_HOOK_LOG'"
  } >"$LM_HOOK.tmp" && chmod 755 "$LM_HOOK.tmp" && mv "$LM_HOOK.tmp" "$LM_HOOK"
}
lm_hook_standin || die "last-metre: the stand-in memory-limit hook could not be written"
[[ "${CARMA_RN_PLANT:-}" != hook ]] || log "last-metre: planted: the stand-in hook records every limit 1 MiB too high"

# One line from inside a container: the env carma's Allocate and the CDI spec set, and /dev/nvidia*.
LM_PRINT='echo "carma-last-metre env $(env | grep -E "^(CARMA_|CUDA_|NVIDIA_)" | sort | tr "\n" " ")dev $(for d in /dev/nvidia*; do [ -e "$d" ] && printf "%s " "$d"; done)end"'

# lm_standin <i> [no-uuid|swap]: write node i's stand-in spec from its GpuNode; with no-uuid, without
# the devices named by UUID (lm_refusal); with swap, each UUID's device edits add the next GPU's node
# (CARMA_RN_PLANT=lastmetre: every container then sees another GPU than its assignment, and the run
# must fail).
lm_standin() {
  local i="$1" name nd
  name="$(node_name "$i")"; nd="$WORK/nodes/$name"
  k get gpunode "$name" -o json >"$nd/gpunode.json" || return 1
  python3 - "$nd" "${2:-}" <<'PY' || return 1
import json, os, stat, sys
nd, mode = sys.argv[1:]
gpus = sorted(json.load(open(f"{nd}/gpunode.json"))["status"]["gpus"], key=lambda g: g["index"])
if not gpus:
    sys.exit("the GpuNode lists no GPUs")
dev = f"{nd}/dev"
def node(n):  # a char device with /dev/null's numbers, named like NVIDIA's
    p = f"{dev}/{n}"
    if not os.path.exists(p):
        os.mknod(p, 0o666 | stat.S_IFCHR, os.makedev(1, 3))
    return {"path": f"/dev/{n}", "hostPath": p}
devices = []
for k, g in enumerate(gpus):
    edits = {"deviceNodes": [node(f"nvidia{g['index']}")]}
    devices.append({"name": str(g["index"]), "containerEdits": edits})
    if mode == "swap":  # CARMA_RN_PLANT=lastmetre: each UUID names its neighbour's device node
        edits = {"deviceNodes": [node(f"nvidia{gpus[(k + 1) % len(gpus)]['index']}")]}
    if mode != "no-uuid":
        devices.append({"name": g["uuid"], "containerEdits": edits})
devices.append({"name": "all", "containerEdits": {"deviceNodes": [node(f"nvidia{g['index']}") for g in gpus]}})
spec = {"cdiVersion": "0.5.0", "kind": "nvidia.com/gpu", "devices": devices, "containerEdits": {
    "env": ["NVIDIA_VISIBLE_DEVICES=void"],
    "deviceNodes": [node(n) for n in ("nvidiactl", "nvidia-uvm", "nvidia-uvm-tools")],
    "mounts": [{"hostPath": "/dev/null", "containerPath": "/var/run/nvidia-container-devices/void",
                "options": ["ro", "nosuid", "nodev", "bind"]}]}}
tmp = f"{nd}/cdi-nvidia/.nvidia.json.tmp"
with open(tmp, "w") as f:
    json.dump(spec, f, indent=1)
os.rename(tmp, f"{nd}/cdi-nvidia/nvidia.json")  # containerd re-reads its spec dirs at each creation
PY
}

# lm_standins: every node's stand-in, once the device plugins have published their GpuNodes.
lm_standins() {
  [[ $CONTAINERD_MAJOR -ge 2 ]] || { log "last-metre: containerd $CONTAINERD_VERSION ignores CDI: no stand-in specs"; return 0; }
  local i
  for i in $(seq "$NODES"); do
    lm_standin "$i" "$([[ "${CARMA_RN_PLANT:-}" == lastmetre ]] && echo swap)" ||
      die "last-metre: no stand-in CDI spec for $(node_name "$i")"
  done
  [[ "${CARMA_RN_PLANT:-}" != lastmetre ]] || log "last-metre: planted: every UUID's CDI device is its neighbour's /dev/nvidia<index>"
  log "last-metre: stand-in nvidia.com/gpu CDI specs on $NODES nodes ($(python3 -c 'import json,sys; print(len(json.load(open(sys.argv[1]))["devices"]))' "$WORK/nodes/$(node_name 1)/cdi-nvidia/nvidia.json") devices on $(node_name 1))"
}

# lm_refusal: on the last node, a spec without the UUID-named devices, then a carma.io/gpu pod pinned
# there: its CDI name is unresolvable, so containerd must refuse to create the container
# (CreateContainerError). The pod is deleted and the full spec restored. Writes lm-refused.json.
lm_refusal() {
  local i="$NODES" name pod=lm-refused reason="" msg=""
  name="$(node_name "$i")"
  if [[ $CONTAINERD_MAJOR -lt 2 ]]; then
    echo "{\"refused\": false, \"why\": \"not run: containerd $CONTAINERD_VERSION ignores CDI\"}" >"$WORK/lm-refused.json"
    return 0
  fi
  log "last-metre: a pod on $name whose CDI name its spec lacks"
  lm_standin "$i" no-uuid || die "last-metre: stand-in without UUIDs"
  k apply -f - >/dev/null <<EOF
apiVersion: v1
kind: Pod
metadata:
  name: $pod
  namespace: default
  annotations: {carma.io/gpu-memory: 1000Mi}
spec:
  schedulerName: carma-e2e-scheduler
  nodeSelector: {kubernetes.io/hostname: $name}
  restartPolicy: Never
  terminationGracePeriodSeconds: 1
  containers:
  - name: main
    image: $BUSYBOX_IMAGE
    imagePullPolicy: Never
    command: [sh, -c, 'echo started; exit 0']
    resources: {limits: {carma.io/gpu: 1, memory: 64Mi}, requests: {cpu: 10m, memory: 64Mi}}
EOF
  for _ in $(seq 90); do
    reason="$(k get pod "$pod" -o jsonpath='{.status.containerStatuses[0].state.waiting.reason}' 2>/dev/null)"
    [[ $reason == CreateContainerError ]] && break
    [[ "$(k get pod "$pod" -o jsonpath='{.status.phase}' 2>/dev/null)" =~ ^(Succeeded|Failed)$ ]] && break
    sleep 1
  done
  k get pod "$pod" -o json >"$WORK/lm-refused-pod.json"
  k delete pod "$pod" --wait=true --timeout 60s >/dev/null 2>&1 || true
  lm_standin "$i" "$([[ "${CARMA_RN_PLANT:-}" == lastmetre ]] && echo swap)" || die "last-metre: stand-in spec not restored on $name"
  python3 - "$WORK/lm-refused-pod.json" "$name" >"$WORK/lm-refused.json" <<'PY'
import json, sys
p, node = json.load(open(sys.argv[1])), sys.argv[2]
cs = (p["status"].get("containerStatuses") or [{}])[0]
w = cs.get("state", {}).get("waiting") or {}
gpus = p["metadata"].get("annotations", {}).get("carma.io/assigned-gpus", "")
name = f"nvidia.com/gpu={gpus}"
msg = w.get("message", "")
refused = (w.get("reason") == "CreateContainerError" and "CDI" in msg and bool(gpus) and gpus in msg
           and p["spec"].get("nodeName") == node and not cs.get("state", {}).get("terminated"))
why = "" if refused else f"state {cs.get('state')}, phase {p['status'].get('phase')}, node {p['spec'].get('nodeName')}"
print(json.dumps({"refused": refused, "pod": f"default/{p['metadata']['name']}", "node": node, "name": name,
                  "reason": w.get("reason"), "message": msg, "why": why}))
PY
}

# lm_check: the comparison, after chart.sh's gpu-share and tasks.sh's TrainingTasks (their pods and logs).
lm_check() {
  local f p runtime dra
  if [[ $CONTAINERD_MAJOR -lt 2 ]]; then
    echo "last-metre: not run (containerd $CONTAINERD_VERSION ignores CDI names: CARMA_RN_CONTAINERD=debian); memory limits applied by the hook: not run; DRA containers: not run"
    return 0
  fi
  mkdir -p "$WORK/lm-logs"
  cp "$WORK/gpu-share.log" "$WORK/lm-logs/gpu-share.log"
  for f in "$WORK"/tasks-logs/*.log; do cp "$f" "$WORK/lm-logs/"; done
  python3 - "$WORK/chart-state.json" "$WORK/tasks-state.json" >"$WORK/lm-pods.json" <<'PY'
import json, sys
pods = {}
for f in sys.argv[1:]:
    for i in json.load(open(f))["items"]:
        if i["kind"] == "Pod" and i["metadata"]["namespace"] == "default":
            pods[i["metadata"]["name"]] = i
print(json.dumps(list(pods.values())))
PY
  k get gpunodes -o json >"$WORK/lm-gpunodes.json"
  # the version the running containerd reports through CRI (the kubelet's node status)
  runtime="$(k get node "$(node_name 1)" -o jsonpath='{.status.nodeInfo.containerRuntimeVersion}')"
  dra="$([[ -n "${CARMA_RN_DRA:-}" ]] && echo "the 'last-metre DRA' line (dra.sh, later)" || echo "not run (CARMA_RN_DRA unset)")"
  cp "$LM_HOOK_LOG" "$WORK/lm-hook.log"
  # the over-commit watcher's report so far (chart.sh's watch_start; SIGUSR1: it writes it and goes on)
  rm -f "$WORK/overcommit.json" "$WORK/lm-overcommit.json"
  kill -USR1 "$(cat "$WORK/pids/overcommit-watch")" 2>/dev/null || log "last-metre: the over-commit watcher is not running"
  for _ in $(seq 50); do [[ -s "$WORK/overcommit.json" ]] && break; sleep 0.2; done
  cp "$WORK/overcommit.json" "$WORK/lm-overcommit.json" 2>/dev/null || log "last-metre: the over-commit watcher wrote no report"
  PYTHONPATH="$HERE" python3 "$HERE/lastmetre.py" "$WORK" "${runtime#containerd://}" "$dra"
}

# lm_dra_check: dra.sh's sharers (carma's DRA driver, the chart's default dra.nvidiaCdi=false: its
# per-claim spec gpu.carma.io/claim carries only env) against their claims' allocations.
lm_dra_check() {
  local p runtime
  if [[ $CONTAINERD_MAJOR -lt 2 ]]; then
    echo "last-metre DRA: not run (containerd $CONTAINERD_VERSION ignores CDI names)"
    return 0
  fi
  mkdir -p "$WORK/lm-dra-logs"
  for p in $(k get pods -n default -o name | grep '^pod/dra-share-'); do
    k logs -n default "${p#pod/}" >"$WORK/lm-dra-logs/${p#pod/}.log" 2>&1 || true
  done
  k get resourceclaims,pods -n default -o json >"$WORK/lm-dra.json"
  k get resourceslices -o json >"$WORK/lm-dra-slices.json"
  runtime="$(k get node "$(node_name 1)" -o jsonpath='{.status.nodeInfo.containerRuntimeVersion}')"
  cp "$LM_HOOK_LOG" "$WORK/lm-hook.log"
  PYTHONPATH="$HERE" python3 "$HERE/lastmetre.py" dra "$WORK" "${runtime#containerd://}" "$DRA_DRIVER"
}
