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
#   operator-hang  the leading operator replica's API requests hang (its packets to the API server are
#              dropped in its network namespace): it must stop leading within the renew deadline, the
#              standby take over, and never two lead at once;
#   device-plugin-cutoff  the same for the device plugin of a node running a training pod: its GpuNode
#              turns stale, a pod that could only share that node's GPUs stays unbound with the stale
#              telemetry as the reason, and once the API server answers again the plugin writes again
#              and the pod is bound;
#   previous-release  helm upgrade from the previous release to this one and helm rollback, with a
#              TrainingTask submitted to the previous release (upgrade.sh);
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

# api_cut <namespace> <pod> <-I|-D>: insert (or delete) rules in the pod's own network namespace that
# drop every TCP packet it sends to the API server (the Service address on 443, and 6443): connections
# are neither refused nor answered, and established ones hang, as behind a broken proxy. The pod's
# other traffic (kubelet sockets, its /metrics) is untouched.
api_cut() {
  local pid port
  pid="$(pod_pids "$1" "$2" | head -n1)"
  [[ -n "$pid" ]] || { log "faults: no process of $1/$2 found"; return 1; }
  for port in 443 6443; do nsenter -t "$pid" -n iptables "$3" OUTPUT -p tcp --dport "$port" -j DROP || return 1; done
}

# secs_since <t0>: seconds (one decimal) from <t0> (date +%s.%N) until now.
secs_since() { python3 -c "import sys, time; print(f'{time.time() - float(sys.argv[1]):.1f}')" "$1"; }

# operator_pods: "<pod> <pod IP>" per running operator replica. operator_leaders [<that list>]: one line
# per replica, "<pod> <carma_operator_leader>" ("?" when its /metrics does not answer), read from its
# metrics port; given the list, it only asks the replicas (the hang's sampling loop resolves them once,
# so a sample costs two HTTP requests and no API round trip).
OPERATOR_METRICS_PORT="${OPERATOR_METRICS_PORT:-8080}"
operator_pods() {
  k -n "$CHART_NS" get pods -l app.kubernetes.io/component=operator --field-selector status.phase=Running \
    -o jsonpath='{range .items[*]}{.metadata.name} {.status.podIP}{"\n"}{end}'
}
operator_leaders() {
  local name ip v
  while read -r name ip; do
    [[ -n "$name" ]] || continue
    v="$(curl -s -m 1 "http://$ip:$OPERATOR_METRICS_PORT/metrics" 2>/dev/null | awk '$1 == "carma_operator_leader" {print $2}')"
    echo "$name ${v:-?}"
  done <<<"${1:-$(operator_pods)}"
}

# fault_operator_hang: the leading operator replica's API requests hang (api_cut) for FAULT_HANG_S
# seconds while the load trains. Both replicas' carma_operator_leader is sampled every half second: the
# hung one must stop leading within the renew deadline (10 s; 11 s allows for the sampling) and the
# other take over, and no sample may show two leaders. Then its API traffic flows again and a new
# TrainingTask runs to success.
fault_operator_hang() {
  local leader="" other="" line t0 el demoted="" took="" two=0 samples=0 state
  for _ in $(seq 30); do
    while read -r line; do
      case "$line" in *" 1") leader="${line% *}" ;; *) other="${line% *}" ;; esac
    done < <(operator_leaders)
    [[ -n "$leader" && -n "$other" ]] && break
    leader=""; other=""; sleep 1
  done
  [[ -n "$leader" && -n "$other" ]] || { log "faults: no leading operator replica beside a standby one"; operator_leaders >&2; return 1; }
  log "faults: operator $leader (leading) cut off from the API server for ${FAULT_HANG_S}s; standby $other"
  faults_state "$WORK/fault-operator-hang-0"
  local replicas; replicas="$(operator_pods)"
  api_cut "$CHART_NS" "$leader" -I || { log "faults: could not cut $leader off"; return 1; }
  t0=$(date +%s.%N)
  while :; do
    el="$(secs_since "$t0")"
    state="$(operator_leaders "$replicas")"
    samples=$((samples + 1))
    [[ "$(grep -c ' 1$' <<<"$state" || true)" -ge 2 ]] && two=$((two + 1))
    [[ -z "$demoted" ]] && grep -qxE "$leader (0|\?)" <<<"$state" && demoted="$el"
    [[ -z "$took" ]] && grep -qx "$other 1" <<<"$state" && took="$el"
    (( ${el%.*} >= FAULT_HANG_S + 15 )) && break
    [[ -n "$demoted" && -n "$took" ]] && (( ${el%.*} >= FAULT_HANG_S )) && break
    sleep 0.5
  done
  api_cut "$CHART_NS" "$leader" -D || log "faults: could not restore $leader's API traffic"
  log "faults: operator $leader stopped leading after ${demoted:-never} s, $other leading after ${took:-never} s, two leaders in $two of $samples samples"
  faults_after operator-hang || log "faults: the TrainingTask after the operator hang did not succeed"
  faults_state "$WORK/fault-operator-hang-1"
  local ok=false
  [[ -n "$demoted" && -n "$took" && $two == 0 ]] && (( ${demoted%.*} < 11 )) && ok=true
  faults_judge operator-hang "$WORK/fault-operator-hang-0" "$WORK/fault-operator-hang-1" "" \
    "{\"hungPod\": \"$leader\", \"demotedS\": ${demoted:-null}, \"takeoverS\": ${took:-null}, \"twoLeaderSamples\": $two, \"leaderSamples\": $samples, \"ok\": $ok}"
}

# gpunode_age <node>: whole seconds since the node's GpuNode status was last written (its updatedAt).
gpunode_age() {
  python3 -c '
import sys
from datetime import datetime, timezone
t = datetime.fromisoformat(sys.argv[1].replace("Z", "+00:00"))
print(int((datetime.now(timezone.utc) - t).total_seconds()))' "$(k get gpunode "$1" -o jsonpath='{.status.updatedAt}')"
}

# cutoff_probe <node> <gpus>: a pod pinned to <node> asking for all its <gpus> GPUs with a small
# reservation; while the node runs any training pod it can only be placed by sharing a GPU. Its expected
# SM activity (0.1) lets the default policy, pack, put it beside a training pod, whose unknown activity
# is booked as a whole GPU's.
cutoff_probe() {
  gpu_pod cutoff-probe "$2" ', carma.io/sm-activity: "0.1"' \
    "  schedulerName: carma-e2e-scheduler
  nodeSelector: {kubernetes.io/hostname: $1}"
}

# probe_node: the node the cut-off probe is bound to, or nothing; probe_events: its scheduling events.
probe_node() { k get pod cutoff-probe -o jsonpath='{.spec.nodeName}' 2>/dev/null; }
probe_events() {
  k get events -n default --field-selector involvedObject.name=cutoff-probe,reason=FailedScheduling \
    -o jsonpath='{range .items[*]}{.message}{"\n"}{end}' 2>/dev/null
}
# probe_last_attempt: when kube-scheduler last tried the probe (its newest FailedScheduling event,
# seconds ago) and what the extender said, so a probe left unbound tells whether it was tried again.
probe_last_attempt() {
  k get events -n default --field-selector involvedObject.name=cutoff-probe,reason=FailedScheduling -o json \
    >"$WORK/probe-events.json" 2>/dev/null || { echo "unknown"; return; }
  python3 - "$WORK/probe-events.json" <<'PY'
import json, sys
from datetime import datetime, timezone
items = json.load(open(sys.argv[1]))["items"]
def when(e):
    t = ((e.get("series") or {}).get("lastObservedTime") or e.get("lastTimestamp") or e.get("eventTime")
         or e["metadata"]["creationTimestamp"])
    return datetime.strptime(t[:19], "%Y-%m-%dT%H:%M:%S").replace(tzinfo=timezone.utc)
if not items:
    print("none")
else:
    e = max(items, key=when)
    age = (datetime.now(timezone.utc) - when(e)).total_seconds()
    n = sum((i.get("series") or {}).get("count") or i.get("count") or 1 for i in items)
    print(f"{age:.0f} s ago ({n} in all): {e['message'][:160]}")
PY
}
probe_delete() {
  k delete pod cutoff-probe --grace-period 0 --wait=true --timeout 60s >/dev/null 2>&1 || true
  k delete events -n default --field-selector involvedObject.name=cutoff-probe >/dev/null 2>&1 || true
}

# fault_device_plugin_cutoff: the device plugin on tt-load-2's node loses the API server (api_cut)
# while its kubelet and the training pods carry on. The probe (cutoff_probe: pinned to that node, asking
# for all its GPUs, so that it can only be placed by sharing the GPUs the load runs on) is first bound
# while the node is fresh, the control, and deleted. Then the cut: the GpuNode must turn stale (not
# written for longer than placement.maxTelemetryAgeSeconds, which chart.sh shortens to
# FAULT_STALE_AFTER_S for this), and the same probe must stay unbound with kube-scheduler's reason
# naming the telemetry's age (the gate closed on the node's busy GPUs). Once the API server answers
# again the plugin must write again, and the probe must be bound within 30 s of that write: the
# extender answers a pod that only telemetry or time can free with a retry request, which puts it in
# kube-scheduler's backoff queue (at most 10 s) instead of among the unschedulable pods, which a
# GpuNode write never wakes (they wait up to five minutes for an event kube-scheduler's plugins
# name). The running pods keep their containers throughout.
FAULT_STALE_AFTER_S="$CHART_STALE_AFTER_S"
fault_device_plugin_cutoff() {
  local node pod gpus t0 control="" stale_s="" reason="" bound_during="" back_s="" bound_after=""
  node="$(load_node tt-load-2)"
  pod="$(k -n "$CHART_NS" get pods -l app.kubernetes.io/component=device-plugin --field-selector "spec.nodeName=$node" -o jsonpath='{.items[0].metadata.name}')"
  gpus="$(k get gpunode "$node" -o jsonpath='{.status.gpuCount}')"
  [[ -n "$node" && -n "$pod" && "${gpus:-0}" -ge 1 ]] || { log "faults: no device plugin pod or GPUs on tt-load-2's node"; return 1; }
  log "faults: device plugin $pod on $node cut off from the API server (control first: a probe sharing all $gpus GPUs while fresh)"
  cutoff_probe "$node" "$gpus" | k apply -f - >/dev/null
  t0=$(date +%s)
  for _ in $(seq 60); do [[ -n "$(probe_node)" ]] && { control=$(( $(date +%s) - t0 )); break; }; sleep 1; done
  [[ -n "$control" ]] || { log "faults: the probe was not bound while $node was fresh: $(probe_events | tail -n 1)"; }
  probe_delete
  faults_state "$WORK/fault-device-plugin-cutoff-0"
  api_cut "$CHART_NS" "$pod" -I || { log "faults: could not cut $pod off"; return 1; }
  t0=$(date +%s)
  while (( $(date +%s) - t0 < 2 * FAULT_STALE_AFTER_S + 30 )); do
    (( $(gpunode_age "$node") > FAULT_STALE_AFTER_S + 1 )) && { stale_s=$(( $(date +%s) - t0 )); break; }
    sleep 2
  done
  cutoff_probe "$node" "$gpus" | k apply -f - >/dev/null
  for _ in $(seq 30); do
    [[ -n "$(probe_node)" ]] && { bound_during=1; break; }
    reason="$(probe_events | grep -oE 'telemetry [0-9]+ s old \(limit [0-9]+ s\)' | tail -n1 || true)"
    [[ -n "$reason" ]] && break
    sleep 1
  done
  [[ -n "$reason" || -n "$bound_during" ]] || log "faults: the probe's events while stale: $(probe_events | tail -n 1)"
  api_cut "$CHART_NS" "$pod" -D || log "faults: could not restore $pod's API traffic"
  t0=$(date +%s)
  # written again: required, within a heartbeat; the probe: bound within 30 s of that write
  while (( $(date +%s) - t0 < FAULT_STALE_AFTER_S )) && [[ -z "$back_s" || $(( $(date +%s) - t0 - back_s )) -lt 30 ]]; do
    [[ -z "$back_s" ]] && (( $(gpunode_age "$node") < 5 )) && back_s=$(( $(date +%s) - t0 ))
    [[ -n "$(probe_node)" ]] && { bound_after=$(( $(date +%s) - t0 )); break; }
    sleep 2
  done
  log "faults: probe bound ${control:+after $control s }while $node was fresh; GpuNode stale after ${stale_s:-never} s of the cut-off; probe $([[ -n $bound_during ]] && echo "BOUND while stale" || echo "unbound while stale (${reason:-no such reason seen})"); written again ${back_s:-never} s after the API server answered again; $([[ -n $bound_after ]] && echo "probe bound $bound_after s after it" || echo "probe not bound within 30 s of the write; its last scheduling attempt: $(probe_last_attempt)")"
  probe_delete
  faults_after device-plugin-cutoff || log "faults: the TrainingTask after the device plugin cut-off did not succeed"
  faults_state "$WORK/fault-device-plugin-cutoff-1"
  local ok=false
  [[ -n "$control" && -n "$stale_s" && -z "$bound_during" && -n "$reason" && -n "$back_s" && -n "$bound_after" ]] && ok=true
  faults_judge device-plugin-cutoff "$WORK/fault-device-plugin-cutoff-0" "$WORK/fault-device-plugin-cutoff-1" "$node" \
    "{\"probeBoundWhileFreshS\": ${control:-null}, \"staleAfterS\": ${stale_s:-null}, \"probeBoundWhileStale\": $([[ -n $bound_during ]] && echo true || echo false), \"staleReason\": $(python3 -c 'import json, sys; print(json.dumps(sys.argv[1] or None))' "$reason"), \"writtenAgainS\": ${back_s:-null}, \"probeBoundAfterS\": ${bound_after:-null}, \"ok\": $ok}"
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
  for f in upgrade previous_release extender_hang operator_hang device_plugin_cutoff kubelet containerd drain; do "fault_$f" || failed+=("$f"); done
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
    if r.get("notRun"):
        print(f"real-node fault {r['fault']}: not run")
        continue
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
         "apiserver": "apiserver restart", "etcd": "etcd restart", "drain": "drain", "upgrade": "upgrade",
         "operator-hang": "operator hang", "device-plugin-cutoff": "device plugin cut off",
         "previous-release": "upgrade from the previous release and rollback"}
not_run = [names[f["fault"]] for f in faults if f.get("notRun")]
faults = [f for f in faults if not f.get("notRun")]
ran = ", ".join(names.get(f["fault"], f["fault"]) for f in faults)
lost = sorted({t for f in faults for t in f["lost"]})
dup = sorted({t for f in faults for t in f["duplicated"]})
failed = [f["fault"] for f in faults if not f["ok"]]
bound = sum(f.get("boundDuringHang", 0) for f in faults)
hang = [f for f in faults if f["fault"] == "operator-hang"]
two = sum(f.get("twoLeaderSamples", 0) for f in hang)
demoted = hang[0].get("demotedS") if hang else None
cut = [f for f in faults if f["fault"] == "device-plugin-cutoff"]
prev = [f for f in faults if f["fault"] == "previous-release"]
print(f"faults: {len(faults)} faults under load ({ran}): {len(lost)} TrainingTasks lost, {len(dup)} duplicated, "
      f"{bound} pods bound while the extender hung, {len(oc['findings'])} over-committed GPUs in {oc['checks']} checks, "
      + (f"{two} moments with two leaders in {hang[0].get('leaderSamples')} samples, leader hang demoted in {demoted} s"
         if hang else "leader hang not run")
      + (f", cut-off GpuNode stale after {cut[0].get('staleAfterS')} s and written again {cut[0].get('writtenAgainS')} s after reconnecting, probe bound {cut[0].get('probeBoundAfterS')} s after reconnecting"
         if cut else ", device plugin cut-off not run")
      + (f", previous release {prev[0]['previous']}" if prev else "")
      + f"; failed: {', '.join(failed) or 'none'}; not run here: {', '.join(not_run) or 'none'}")
sys.exit(1 if failed or lost or dup or two or oc["findings"] else 0)
PY
}
