# shellcheck shell=bash
# Restarts and faults under load on the real nodes (CARMA_RN_CHART=1); sourced by chart.sh after the
# TrainingTask checks, never run alone. Uses run.sh's k, log, die, WORK, BIN, NODES, node_name,
# start_kubelet, start_containerd, start_apiserver, cp_start_etcd, BUSYBOX_IMAGE and chart.sh's
# CHART_NS, CHART_ARGS, HELM, chart_rolled and training_task (tasks.sh).
#
# The load: four TrainingTasks whose training loop prints a step a second until the harness creates a
# stop file (a read-only hostPath volume), so each is in flight through every fault below and ends
# with exit 0 when told. Then, one after the other:
#   upgrade    `helm upgrade` with a changed value: the extender and the device plugin roll while the
#              training pods keep running;
#   extender-hang  the extender's processes are stopped (SIGSTOP) for 20 s and continued: a task submitted
#              meanwhile stays unbound (no scheduler binds it without carma), then runs;
#   kubelet    the kubelet of tt-load-1's node is stopped (SIGTERM) and started again: the device plugin registers
#              again (its log, read through the kubelet), the node lists carma.io/gpu again, and the
#              running training pods keep their containers and GPUs;
#   containerd the containerd of tt-load-2's node is killed (SIGKILL) and started again: the running containers (their
#              shims outlive it) and the pods keep running;
#   drain      `kubectl drain` of the node a load task runs on: its attempt is evicted, the operator
#              runs the next attempt on the other node; the node is uncordoned afterwards;
#   apiserver  kube-apiserver is killed (SIGKILL) and started again 5 s later;
#   etcd       etcd is killed (SIGKILL) and started again on its data 5 s later.
# After each: every TrainingTask still exists, none has more than one live attempt pod, no attempt
# index ran twice, and a new TrainingTask submitted then runs to success. The over-commit watcher
# (chart.sh) checks every 2 s throughout. Each fault's result is one JSON line in $WORK/faults.jsonl,
# every figure read from the API server.

FAULT_LOAD=(tt-load-1 tt-load-2 tt-load-3 tt-load-4)
FAULT_TASKS=(tt-ok tt-gpuoom tt-hostoom "${FAULT_LOAD[@]}") # every TrainingTask that must still exist

# load_task <name>: a TrainingTask (tasks.sh's template) that trains until $WORK/signal/stop exists.
load_task() {
  TT_GPU_MEMORY=3000Mi TT_SIGNAL_DIR="$WORK/signal" training_task "$1" 32Mi \
    'i=0; while [ ! -e /signal/stop ]; do echo "step $i"; i=$((i+1)); sleep 1; done; echo done; exit 0'
}

# faults_state <file>: TrainingTasks, pods in default, the chart's pods, and nodes, as JSON.
faults_state() { k get trainingtasks,pods -n default -o json >"$1.tasks.json" && k get nodes -o json >"$1.nodes.json"; }

# faults_wait_running: every load task's current attempt pod Running.
faults_wait_running() {
  local n running
  for _ in $(seq 180); do
    running=0
    for n in "${FAULT_LOAD[@]}"; do
      [[ "$(k get pods -n default -l "carma.io/task=$n" -o jsonpath='{range .items[?(@.status.phase=="Running")]}{.metadata.name}{"\n"}{end}' 2>/dev/null | grep -c . || true)" -ge 1 ]] &&
        running=$((running + 1))
    done
    [[ $running -ge ${#FAULT_LOAD[@]} ]] && return 0
    sleep 1
  done
  k get trainingtasks,pods -n default -o wide >&2
  return 1
}

# faults_after <fault>: a new TrainingTask submitted after the fault runs to success.
faults_after() {
  local name="tt-after-$1"
  training_task "$name" 32Mi 'echo "after the fault, reserved $CARMA_RESERVED_MIB MiB"; exit 0' | k apply -f - >/dev/null ||
    return 1
  FAULT_TASKS+=("$name")
  k wait -n default --for jsonpath='{.status.phase}'=Succeeded --timeout 150s "trainingtask/$name" >/dev/null
}

# faults_judge <fault> <before> <after> <node or ''> <extra JSON>: one JSON line for the fault, and exit 1
# when a TrainingTask is lost or duplicated, or the fault's own check fails. Pods that ran before the fault
# and were not meant to be disturbed must keep their container (same ID, no restart).
faults_judge() {
  python3 - "$@" "${FAULT_TASKS[*]}" "${FAULT_LOAD[*]}" >>"$WORK/faults.jsonl" <<'PY'
import json, sys
fault, before, after, node, extra, expected, load = sys.argv[1:]
extra = json.loads(extra)
def load_state(p):
    items = json.load(open(p + ".tasks.json"))["items"]
    return ({i["metadata"]["name"]: i for i in items if i["kind"] == "TrainingTask"},
            {i["metadata"]["name"]: i for i in items if i["kind"] == "Pod"})
t0, p0 = load_state(before)
t1, p1 = load_state(after)
def live(p):
    return not p["metadata"].get("deletionTimestamp") and p["status"].get("phase") in ("Pending", "Running")
def task_of(p):
    return p["metadata"].get("labels", {}).get("carma.io/task")
def container(p):
    cs = p["status"].get("containerStatuses") or [{}]
    return cs[0].get("containerID"), cs[0].get("restartCount")
lost = sorted(set(expected.split()) - set(t1))
dup = {}
for name in t1:
    pods = [p for p in p1.values() if task_of(p) == name]
    n_live = sum(1 for p in pods if live(p))
    idx = [a["index"] for a in t1[name].get("status", {}).get("attempts", [])]
    if n_live > 1 or len(idx) != len(set(idx)):
        dup[name] = {"livePods": n_live, "attemptIndexes": idx}
# pods Running before the fault: which kept their container, which were replaced, on which node
kept, replaced = [], []
for name, p in p0.items():
    if task_of(p) not in load.split() or p["status"].get("phase") != "Running":
        continue
    q = p1.get(name)
    if q and q["metadata"]["uid"] == p["metadata"]["uid"] and container(q) == container(p) and q["status"].get("phase") == "Running":
        kept.append(name)
    else:
        replaced.append(name)
on_node = sorted(n for n in kept if p0[n]["spec"].get("nodeName") == node)
out = {"fault": fault, "node": node or None, "tasks": len(t1), "lost": lost, "duplicated": dup,
       "runningKept": sorted(kept), "runningReplaced": sorted(replaced), "keptOnFaultNode": on_node}
out.update(extra)
after_task = t1.get(f"tt-after-{fault}", {}).get("status", {})
out["afterTask"] = f"{after_task.get('phase')} on {after_task.get('node')}"
ok = not lost and not dup and after_task.get("phase") == "Succeeded"
if fault == "drain":
    moved = {}
    for name in load.split():
        att = t1[name].get("status", {}).get("attempts", [])
        on_node = [a for a in att if a.get("node") == node]
        if on_node:
            moved[name] = [(a.get("node"), a.get("outcome")) for a in att]
    out["recovered"] = moved
    # every load task that ran on the drained node: its attempt there ended Evicted and its current
    # attempt is live on another node
    ok = ok and bool(moved) and all(
        any(o == "Evicted" for n, o in v if n == node) and v[-1][0] != node and v[-1][1] is None for v in moved.values())
else:
    # nothing running may be disturbed; a node-level fault must have had training pods on its node
    ok = ok and not replaced and bool(kept) and (not node or bool(on_node))
ok = ok and extra.get("ok", True)
out["ok"] = ok
print(json.dumps(out))
sys.exit(0 if ok else 1)
PY
}

# stop_child <signal> <pid>: signal one of this shell's background processes and reap it (quietly: bash
# would otherwise report the kill as a job's death).
stop_child() { kill -s "$1" "$2"; wait "$2" 2>/dev/null || true; }

# plugin_registrations <node>: how many times the device plugin on <node> has registered with its
# kubelet (its log, read through the kubelet).
plugin_registrations() {
  local pod
  pod="$(k -n "$CHART_NS" get pods -l app.kubernetes.io/component=device-plugin --field-selector "spec.nodeName=$1" -o name | head -n1)"
  [[ -n "$pod" ]] || { echo 0; return; }
  k -n "$CHART_NS" logs "$pod" 2>/dev/null | grep -c "registered with kubelet" || true
}

# fault_upgrade: `helm upgrade` with a changed value while the load trains: the extender and the device
# plugin DaemonSet roll (new pods), the training pods keep running on their GPUs, and the device plugin's
# new pods register with the kubelets again.
fault_upgrade() {
  local before after rolled
  log "faults: helm upgrade --set placement.memoryMarginMiB=2560 with the load in flight"
  faults_state "$WORK/fault-upgrade-0"
  before="$(k -n "$CHART_NS" get pods -l app.kubernetes.io/component=device-plugin -o jsonpath='{.items[*].metadata.uid}')"
  "$HELM" upgrade carma "$ROOT/charts/carma" "${CHART_ARGS[@]}" --set placement.memoryMarginMiB=2560 \
    >"$WORK/logs/helm-upgrade-load.log" 2>&1 || { log "faults: helm upgrade: $(tail -n 3 "$WORK/logs/helm-upgrade-load.log")"; return 1; }
  chart_rolled || { log "faults: the chart did not roll"; return 1; }
  after="$(k -n "$CHART_NS" get pods -l app.kubernetes.io/component=device-plugin -o jsonpath='{.items[*].metadata.uid}')"
  rolled=0; [[ -n "$after" && "$after" != "$before" ]] && rolled=1
  for _ in $(seq 60); do # the new plugin pods registered: every node lists carma.io/gpu again
    [[ "$(k get nodes -o jsonpath='{range .items[*]}{.status.allocatable.carma\.io/gpu}{"\n"}{end}' | grep -c '^[1-9]' || true)" -ge "$NODES" ]] && break
    sleep 1
  done
  faults_after upgrade || log "faults: the TrainingTask after the upgrade did not succeed"
  faults_state "$WORK/fault-upgrade-1"
  faults_judge upgrade "$WORK/fault-upgrade-0" "$WORK/fault-upgrade-1" "" \
    "{\"devicePluginPodsReplaced\": $([[ $rolled == 1 ]] && echo true || echo false), \"ok\": $([[ $rolled == 1 ]] && echo true || echo false)}"
}

# load_node <task>: the node the task's running attempt pod is on; node_index <name>: its i.
load_node() { k get pods -n default -l "carma.io/task=$1" --field-selector status.phase=Running -o jsonpath='{.items[0].spec.nodeName}'; }
node_index() { local i; for i in $(seq "$NODES"); do [[ "$(node_name "$i")" == "$1" ]] && echo "$i"; done; }

# The kubelet and containerd faults hit the nodes that tt-load-1 and tt-load-2 run on, so that a training
# pod is running where the fault is (the policy decides where they go; both may share a node).
fault_kubelet() {
  local node reg0 reg1 alloc i
  node="$(load_node tt-load-1)"; i="$(node_index "$node")"
  [[ -n "$i" ]] || { log "faults: tt-load-1 is not running on any node"; return 1; }
  log "faults: kubelet restart on $node"
  faults_state "$WORK/fault-kubelet-0"
  reg0="$(plugin_registrations "$node")"
  stop_child TERM "$(cat "$WORK/pids/kubelet-$node")"
  start_kubelet "$i"
  for _ in $(seq 90); do
    reg1="$(plugin_registrations "$node")"
    alloc="$(k get node "$node" -o jsonpath='{.status.allocatable.carma\.io/gpu}')"
    [[ "$reg1" -gt "$reg0" && "$alloc" =~ ^[1-9] ]] &&
      k get node "$node" -o jsonpath='{.status.conditions[?(@.type=="Ready")].status}' | grep -q True && break
    sleep 1
  done
  faults_after kubelet || log "faults: the TrainingTask after the kubelet restart did not succeed"
  faults_state "$WORK/fault-kubelet-1"
  faults_judge kubelet "$WORK/fault-kubelet-0" "$WORK/fault-kubelet-1" "$node" \
    "{\"pluginRegistrations\": [$reg0, $reg1], \"allocatableAfter\": \"$alloc\", \"ok\": $([[ "$reg1" -gt "$reg0" && "$alloc" =~ ^[1-9] ]] && echo true || echo false)}"
}

fault_containerd() {
  local i node
  node="$(load_node tt-load-2)"; i="$(node_index "$node")"
  [[ -n "$i" ]] || { log "faults: tt-load-2 is not running on any node"; return 1; }
  log "faults: containerd killed and started again on $node"
  faults_state "$WORK/fault-containerd-0"
  stop_child KILL "$(cat "$WORK/pids/containerd-$node")"
  sleep 2
  start_containerd "$i"
  sleep 5 # the kubelet's next relist (PLEG) runs against the new containerd
  faults_after containerd || log "faults: the TrainingTask after the containerd restart did not succeed"
  faults_state "$WORK/fault-containerd-1"
  faults_judge containerd "$WORK/fault-containerd-0" "$WORK/fault-containerd-1" "$node" '{}'
}

fault_drain() {
  local node
  node="$(load_node tt-load-1)"
  [[ -n "$node" ]] || { log "faults: no running pod of tt-load-1 to drain the node of"; return 1; }
  log "faults: kubectl drain $node"
  faults_state "$WORK/fault-drain-0"
  k drain "$node" --ignore-daemonsets --delete-emptydir-data --grace-period 5 --timeout 180s \
    >"$WORK/logs/drain.log" 2>&1 || log "faults: kubectl drain: $(tail -n 3 "$WORK/logs/drain.log")"
  faults_wait_running || log "faults: load tasks not all Running again after the drain"
  faults_after drain || log "faults: the TrainingTask after the drain did not succeed"
  faults_state "$WORK/fault-drain-1"
  k uncordon "$node" >/dev/null
  faults_judge drain "$WORK/fault-drain-0" "$WORK/fault-drain-1" "$node" '{}'
}

# pod_pids <namespace> <pod>: host PIDs of the pod's processes, found by the pod UID in their cgroup path
# (cgroupfs: .../pod<uid>/..., systemd: ...-pod<uid with _>.slice), so a concurrent run's processes of
# the same name are never touched.
pod_pids() {
  local uid
  uid="$(k -n "$1" get pod "$2" -o jsonpath='{.metadata.uid}')" || return 1
  [[ -n "$uid" ]] || return 1
  grep -lE "pod(${uid}|${uid//-/_})" /proc/[0-9]*/cgroup 2>/dev/null | cut -d/ -f3 | sort -n
}

# fault_extender_hang: the extender's processes are stopped (SIGSTOP) for FAULT_HANG_S seconds, a hang
# and not a crash: its port still accepts connections, nothing answers. A TrainingTask submitted during
# the hang must have its attempt pod created and that pod must stay unbound (kube-scheduler's calls time out and it binds nothing itself; no other
# scheduler may take the pod), the load keeps training, and after SIGCONT that task and a new one run
# to success.
FAULT_HANG_S="${FAULT_HANG_S:-20}"
fault_extender_hang() {
  local pod pids name=tt-during-extender-hang bound=() t0 node=""
  pod="$(k -n "$CHART_NS" get pods -l app.kubernetes.io/component=scheduler-extender --field-selector status.phase=Running \
    -o jsonpath='{.items[0].metadata.name}')"
  pids="$(pod_pids "$CHART_NS" "$pod" | tr '\n' ' ')"
  [[ -n "$pod" && -n "${pids// /}" ]] || { log "faults: no running extender pod, or none of its processes found"; return 1; }
  log "faults: extender $pod hung (SIGSTOP of PIDs $pids) for ${FAULT_HANG_S}s with the load in flight"
  faults_state "$WORK/fault-extender-hang-0"
  # shellcheck disable=SC2086 # one PID per word
  kill -STOP $pids
  t0=$(date +%s)
  # shellcheck disable=SC2086 # one PID per word
  training_task "$name" 32Mi 'echo "placed after the extender hang"; exit 0' | k apply -f - >/dev/null ||
    { kill -CONT $pids; return 1; }
  FAULT_TASKS+=("$name")
  local seen=0 pods
  while (( $(date +%s) - t0 < FAULT_HANG_S )); do
    # one line per pod of the task: "<name> <node or nothing>"
    pods="$(k get pods -n default -l "carma.io/task=$name" -o jsonpath='{range .items[*]}{.metadata.name} {.spec.nodeName}{"\n"}{end}' || true)"
    [[ -z "$pods" ]] || seen=1
    node="$(awk 'NF > 1 {print $2}' <<<"$pods")"
    [[ -z "$node" ]] || bound+=("$node")
    sleep 1
  done
  # shellcheck disable=SC2086
  kill -CONT $pids
  log "faults: extender resumed after $(( $(date +%s) - t0 )) s; pods of $name bound during the hang: ${#bound[@]}"
  k wait -n default --for jsonpath='{.status.phase}'=Succeeded --timeout 150s "trainingtask/$name" >/dev/null ||
    log "faults: $name did not succeed after the extender resumed"
  faults_after extender-hang || log "faults: the TrainingTask after the extender hang did not succeed"
  faults_state "$WORK/fault-extender-hang-1"
  local during restarts
  during="$(k get trainingtask -n default "$name" -o jsonpath='{.status.phase}')"
  restarts="$(k -n "$CHART_NS" get pod "$pod" -o jsonpath='{.status.containerStatuses[0].restartCount}' 2>/dev/null || echo gone)"
  faults_judge extender-hang "$WORK/fault-extender-hang-0" "$WORK/fault-extender-hang-1" "" \
    "{\"hangS\": $FAULT_HANG_S, \"boundDuringHang\": ${#bound[@]}, \"taskSubmittedDuringHang\": \"$during\", \"attemptPodDuringHang\": $([[ $seen == 1 ]] && echo true || echo false), \"extenderRestarts\": \"$restarts\", \"ok\": $([[ $seen == 1 && ${#bound[@]} == 0 && $during == Succeeded ]] && echo true || echo false)}"
}

# fault_control_plane <apiserver|etcd>: SIGKILL, 5 s down, started again.
fault_control_plane() {
  local what="$1" t0 down
  log "faults: $what killed, started again after 5 s"
  faults_state "$WORK/fault-$what-0"
  t0=$(date +%s)
  stop_child KILL "$(cat "$WORK/pids/$what")"
  sleep 5
  if [[ $what == etcd ]]; then cp_start_etcd; else start_apiserver; fi
  for _ in $(seq 120); do k get --raw /readyz >/dev/null 2>&1 && break; sleep 0.5; done
  down=$(( $(date +%s) - t0 ))
  sleep 5 # controllers' watches re-established
  faults_after "$what" || log "faults: the TrainingTask after the $what restart did not succeed"
  faults_state "$WORK/fault-$what-1"
  faults_judge "$what" "$WORK/fault-$what-0" "$WORK/fault-$what-1" "" "{\"apiUnavailableS\": $down}"
}

# plant_overcommit (CARMA_RN_PLANT=overcommit): a planted fault for the over-commit watcher, which must
# then report it and fail the run. Every GPU of the node running tt-load-2 is made to advertise 100 MiB
# in its GpuNode's status while the load holds 3000 MiB there; the device plugin rewrites the status
# with its next publication, and the watcher checks every 2 s in between.
plant_overcommit() {
  local node n i ops=()
  node="$(load_node tt-load-2)"
  n="$(k get gpunode "$node" -o jsonpath='{range .status.gpus[*]}{.uuid}{"\n"}{end}' | grep -c .)"
  for ((i = 0; i < n; i++)); do ops+=("{\"op\": \"replace\", \"path\": \"/status/gpus/$i/memoryTotalMiB\", \"value\": 100}"); done
  log "faults: PLANTED: GpuNode $node's $n GPUs advertise 100 MiB each; the run must fail"
  k patch gpunode "$node" --subresource status --type json -p "[$(IFS=,; echo "${ops[*]}")]" >/dev/null
  sleep 5
}

faults_run() {
  local f failed=()
  mkdir -p "$WORK/signal"
  : >"$WORK/faults.jsonl"
  log "faults: load ${FAULT_LOAD[*]} (training until told to stop)"
  for f in "${FAULT_LOAD[@]}"; do load_task "$f"; done | k apply -f - >/dev/null
  faults_wait_running || die "the load TrainingTasks did not all start"
  for f in upgrade extender_hang kubelet containerd drain; do "fault_$f" || failed+=("$f"); done
  for f in apiserver etcd; do fault_control_plane "$f" || failed+=("$f"); done
  if [[ "${CARMA_RN_PLANT:-}" == overcommit ]]; then plant_overcommit; fi
  log "faults: stopping the load"
  touch "$WORK/signal/stop"
  for f in "${FAULT_LOAD[@]}"; do
    k wait -n default --for jsonpath='{.status.phase}'=Succeeded --timeout 120s "trainingtask/$f" >/dev/null || failed+=("$f")
  done
  k get trainingtasks -n default >&2 || true
  python3 - "$WORK/faults.jsonl" <<'PY'
import json, sys
for line in open(sys.argv[1]):
    r = json.loads(line)
    print(f"real-node fault {r['fault']}{' on ' + r['node'] if r['node'] else ''}: {'ok' if r['ok'] else 'FAILED'}; "
          + ", ".join(f"{k} {v}" for k, v in r.items() if k not in ("fault", "node", "ok")))
PY
  [[ ${#failed[@]} == 0 ]] || { log "faults: failed: ${failed[*]}"; return 1; }
}

# faults_summary <over-commit report>: one line over every fault of the run, each figure read from the
# faults' JSON lines (themselves read from the API server) and the over-commit watcher's report; the
# faults this run does not make are named as not run. Exit 1 when a fault failed or a task was lost.
faults_summary() {
  python3 - "$WORK/faults.jsonl" "$1" <<'PY'
import json, sys
faults = [json.loads(l) for l in open(sys.argv[1])]
oc = json.load(open(sys.argv[2]))
names = {"extender-hang": "extender hang", "kubelet": "kubelet restart", "containerd": "containerd restart",
         "apiserver": "apiserver restart", "etcd": "etcd restart", "drain": "drain", "upgrade": "upgrade"}
ran = ", ".join(names.get(f["fault"], f["fault"]) for f in faults)
lost = sorted({t for f in faults for t in f["lost"]})
dup = sorted({t for f in faults for t in f["duplicated"]})
failed = [f["fault"] for f in faults if not f["ok"]]
bound = sum(f.get("boundDuringHang", 0) for f in faults)
print(f"faults: {len(faults)} faults under load ({ran}): {len(lost)} TrainingTasks lost, {len(dup)} duplicated, "
      f"{bound} pods bound while the extender hung, {len(oc['findings'])} over-committed GPUs in {oc['checks']} checks; "
      f"failed: {', '.join(failed) or 'none'}; not run here: device plugin cut off, operator hang (control-plane "
      f"scenario hang), upgrade from the previous chart release")
sys.exit(1 if failed or lost or dup or oc["findings"] else 0)
PY
}
