# shellcheck shell=bash
# TrainingTasks through the chart's operator on the real nodes (CARMA_RN_CHART=1); sourced by chart.sh
# after its checks, never run alone. Uses run.sh's k, log, die, WORK and BUSYBOX_IMAGE.
#
# Three TrainingTasks run the busybox image (the template's image is the task's own; the operator
# only adds carma.io/gpu, the scheduler name, restartPolicy Never and terminationMessagePolicy
# FallbackToLogsOnError to it):
#   tt-ok    exits 0;
#   tt-gpuoom  attempt 1 writes a termination message of its own ("training failed, see the log"),
#            prints PyTorch's CUDA out-of-memory error and exits 1, a later attempt exits 0 (the attempt
#            number comes from the pod's carma.io/attempt label through the downward API); the message
#            names no OOM, so the operator has to read the log through the kubelet, find the GPU OOM
#            there, grow the reservation and run it again;
#   tt-hostoom is killed by the kernel under its 32Mi memory limit (OOMKilled, exit 137): the operator
#            has to call it HostOOMKilled, not a GPU OOM, and leave the GPU reservation as it was.
# Every figure of the summary line is read from the API server: the TrainingTasks' status and their
# attempt pods' container statuses. Each attempt first prints lastmetre.sh's line (its GPUs and env as
# seen from inside), which lm_check compares with the assignment.

# training_task <name> <memory limit> <script> [more recovery fields]: a TrainingTask running <script>
# with busybox sh, the attempt number in $ATTEMPT, on one GPU with a 2000Mi reservation (TT_GPU_MEMORY
# to change it, TT_GPU_MEMORY=none for no gpuMemory: the estimate decides); TT_PROFILE, a flow-style
# YAML map, becomes spec.modelProfile; with TT_SIGNAL_DIR set, that host directory is mounted
# read-only at /signal.
training_task() {
  local script
  # first, the container's own view of its GPUs (lastmetre.sh's LM_PRINT; a no-op when not sourced)
  script="$(python3 -c 'import json, sys; print(json.dumps(sys.argv[1]))' "${LM_PRINT:-:}"$'\n'"$3")"
  cat <<EOF
apiVersion: carma.io/v1alpha1
kind: TrainingTask
metadata: {name: $1, namespace: default}
spec:
  gpus: 1
$( [[ "${TT_GPU_MEMORY:-}" == none ]] || echo "  gpuMemory: ${TT_GPU_MEMORY:-2000Mi}")
${TT_PROFILE:+  modelProfile: $TT_PROFILE}
  recovery: {maxAttempts: 3, backoffSeconds: 1, retriesOnFailure: 0${4:+, $4}}
  template:
    spec:
      restartPolicy: Never
      terminationGracePeriodSeconds: 1
      volumes: [${TT_SIGNAL_DIR:+{name: signal, hostPath: {path: $TT_SIGNAL_DIR, type: Directory\}\}}]
      containers:
      - name: train
        image: $BUSYBOX_IMAGE
        imagePullPolicy: Never
        env:
        - name: ATTEMPT
          valueFrom: {fieldRef: {fieldPath: "metadata.labels['carma.io/attempt']"}}
        command: [sh, -c, $script]
        volumeMounts: [${TT_SIGNAL_DIR:+{name: signal, mountPath: /signal, readOnly: true\}}]
        resources: {limits: {memory: $2}, requests: {cpu: 10m, memory: $2}}
---
EOF
}

tasks_run() {
  local t0 names=(tt-ok tt-gpuoom tt-hostoom) n phases done_n
  log "tasks: TrainingTasks ${names[*]} (busybox; exit 0, a CUDA OOM on attempt 1, a kernel OOM kill)"
  t0=$(date +%s)
  {
    training_task tt-ok 64Mi 'echo "step 0 loss 2.30 reserved $CARMA_RESERVED_MIB MiB"; exit 0'
    training_task tt-gpuoom 64Mi 'echo "attempt $ATTEMPT reserved $CARMA_RESERVED_MIB MiB"
if [ "$ATTEMPT" = 1 ]; then
  echo "training failed, see the log" >/dev/termination-log
  echo "Traceback (most recent call last):"
  echo "  File \"train.py\", line 12, in <module>"
  echo "RuntimeError: CUDA out of memory. Tried to allocate 2.00 GiB (GPU 0; 79.11 GiB total capacity)"
  exit 1
fi
echo "step 0 loss 2.30"; exit 0' 'exclusiveAfterOoms: 2'
    # doubles a shell string until the 32Mi memory cgroup limit kills it
    training_task tt-hostoom 32Mi 'echo "allocating, reserved $CARMA_RESERVED_MIB MiB"; x=0123456789abcdef; while :; do x=$x$x; done'
  } | k apply -f - >/dev/null
  for _ in $(seq 180); do
    phases="$(k get trainingtasks -n default -o jsonpath='{range .items[*]}{.status.phase}{"\n"}{end}')"
    done_n="$(grep -cE '^(Succeeded|Failed)$' <<<"$phases" || true)"
    [[ "$done_n" -ge "${#names[@]}" ]] && break
    sleep 1
  done
  TASKS_S=$(( $(date +%s) - t0 ))
  k get trainingtasks -n default >&2 || true
  k get trainingtasks,pods -n default -o json >"$WORK/tasks-state.json"
  [[ "${done_n:-0}" -ge "${#names[@]}" ]] || {
    for n in "${names[@]}"; do k describe trainingtask "$n" >&2; done
    k -n "$CHART_NS" logs deployment/carma-operator --tail 30 >&2
    die "TrainingTasks did not all end within 180 s"; }
  mkdir -p "$WORK/tasks-logs" # each attempt's log, through the API server (the kubelet)
  for n in $(k get pods -n default -l carma.io/attempt -o name); do
    k logs -n default "$n" >"$WORK/tasks-logs/${n#pod/}.log" 2>&1 || true
  done
  PYTHONPATH="$HERE" python3 - "$WORK/tasks-state.json" "$TASKS_S" "$WORK/tasks-logs" <<'PY'
import json, os, re, sys
from recovery import describe, restart_latencies
state, secs, logdir = sys.argv[1:]
items = json.load(open(state))["items"]
tts = {i["metadata"]["name"]: i for i in items if i["kind"] == "TrainingTask"}
pods = {i["metadata"]["name"]: i for i in items if i["kind"] == "Pod"}

def term(pod_name):
    """The training container's terminated state, from the attempt pod's container status."""
    p = pods.get(pod_name)
    if not p:
        return {}
    for c in p["status"].get("containerStatuses", []):
        if c["name"] == p["spec"]["containers"][0]["name"]:
            return c.get("state", {}).get("terminated", {}) or {}
    return {}

succeeded, recovered, host_oom, bad = [], [], [], []
detail = []
for name, tt in sorted(tts.items()):
    st = tt.get("status", {})
    att = st.get("attempts", [])
    outs = [a.get("outcome") for a in att]
    terms = [term(a["pod"]) for a in att]
    res = [a.get("reservedMiB") for a in att]
    logs = [open(os.path.join(logdir, a["pod"] + ".log")).read() if os.path.exists(os.path.join(logdir, a["pod"] + ".log")) else ""
            for a in att]
    # the reservation the device plugin's Allocate gave the container (CARMA_RESERVED_MIB), as it printed it
    env_res = [int(m.group(1)) if (m := re.search(r"reserved (\d+) MiB", l)) else None for l in logs]
    prio = [pods.get(a["pod"], {}).get("spec", {}).get("priorityClassName") for a in att]
    detail.append(f"{name}: {st.get('phase')} attempts {st.get('attemptCount')} outcomes {outs} "
                  f"exits {[t.get('exitCode') for t in terms]} reasons {[t.get('reason') for t in terms]} reservedMiB {res} "
                  f"(Allocate env CARMA_RESERVED_MIB {env_res}), priorityClass {prio}, first reason {att[0].get('reason', '')[:90]!r}")
    if st.get("phase") == "Succeeded" and outs and outs[-1] == "Succeeded" and terms[-1].get("exitCode") == 0:
        succeeded.append(name)
    if (st.get("phase") == "Succeeded" and len(att) >= 2 and outs[0] == "GpuOutOfMemory"
            and terms[0].get("exitCode") == 1 and terms[0].get("message", "").startswith("training failed")
            and "CUDA out of memory" in att[0].get("reason", "")
            and (res[1] or 0) > (res[0] or 0) and env_res[:2] == res[:2]):
        recovered.append(name)
    if (outs and outs[0] == "HostOOMKilled" and terms[0].get("reason") == "OOMKilled" and terms[0].get("exitCode") == 137
            and "GpuOutOfMemory" not in outs and len(set(res)) == 1):
        host_oom.append(name)
# Recovery latency of tt-gpuoom: attempt 1's container finishedAt to attempt 2's container startedAt.
oom_att = tts.get("tt-gpuoom", {}).get("status", {}).get("attempts", [])
latency = describe(restart_latencies(oom_att[:2], pods))
detail.append(f"tt-gpuoom crash to the next attempt's container start {latency}")
print(f"real-node tasks: {len(tts)} TrainingTasks run ({len(succeeded)} succeeded, {len(recovered)} GPU-OOM recovered, "
      f"{len(host_oom)} kernel OOMKilled not read as GPU OOM) in {secs} s; " + "; ".join(detail))
ok = (len(tts) == 3 and set(succeeded) == {"tt-ok", "tt-gpuoom"} and recovered == ["tt-gpuoom"]
      and host_oom == ["tt-hostoom"] and tts["tt-hostoom"]["status"].get("phase") == "Failed")
sys.exit(0 if ok else 1)
PY
}

