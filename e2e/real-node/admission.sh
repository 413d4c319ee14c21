# shellcheck shell=bash
# Pods that would slip past carma, at admission on the real nodes (CARMA_RN_CHART=1); sourced by
# chart.sh after the chart is installed, never run alone. Uses run.sh's k, log, WORK, BUSYBOX_IMAGE and
# chart.sh's CHART_NS.
#
# The chart's admission policies (admissionPolicy.otherScheduler=steer, the default, with
# MutatingAdmissionPolicy v1 on this 1.36 API server) must:
#   steer    a pod asking for carma.io/gpu with no schedulerName (the default scheduler's), and one
#            naming default-scheduler, to carma's profile: created with spec.schedulerName the chart's
#            profile and the annotation carma.io/steered-from-scheduler, bound by that profile (its
#            Scheduled event) and run to completion;
#   refuse   a pod asking for carma.io/gpu with spec.nodeName set (it would bypass every scheduler, so it
#            is not steered either): the create fails with the validating policy's message.
# One `admission:` line, every figure read from the API server (also $WORK/admission.json, which the
# last-metre line reads); exit 1 when a pod was not steered, not refused, or placed by another scheduler.

ADM_SCHEDULER=carma-e2e-scheduler

# gpu_pod <name> <gpus> <extra annotations> <spec lines>: a busybox pod asking for <gpus> carma.io/gpu
# with a 500Mi reservation each, printing its name and exiting 0 (faults.sh's cut-off probe uses it too).
gpu_pod() {
  cat <<EOF
apiVersion: v1
kind: Pod
metadata: {name: $1, namespace: default, annotations: {carma.io/gpu-memory: 500Mi$3}}
spec:
$4
  restartPolicy: Never
  terminationGracePeriodSeconds: 1
  containers:
  - name: main
    image: $BUSYBOX_IMAGE
    imagePullPolicy: Never
    command: [sh, -c, 'echo $1; exit 0']
    resources: {limits: {carma.io/gpu: $2, memory: 16Mi}, requests: {cpu: 10m, memory: 16Mi}}
EOF
}

adm_check() {
  local n
  log "admission: two GPU pods naming no carma scheduler (none, default-scheduler) and one with spec.nodeName"
  gpu_pod adm-no-scheduler 1 "" "" | k apply -f - >/dev/null 2>"$WORK/logs/adm-no-scheduler.log" || true
  gpu_pod adm-default-scheduler 1 "" "  schedulerName: default-scheduler" | k apply -f - >/dev/null 2>"$WORK/logs/adm-default-scheduler.log" || true
  gpu_pod adm-node-name 1 "" "  nodeName: $(node_name 1)" | k apply -f - >/dev/null 2>"$WORK/logs/adm-node-name.log" || true
  for n in adm-no-scheduler adm-default-scheduler; do
    k wait -n default --for jsonpath='{.status.phase}'=Succeeded --timeout 90s "pod/$n" >/dev/null 2>&1 || true
  done
  k get pods -n default -o json >"$WORK/adm-pods.json"
  k get events -n default --field-selector reason=Scheduled -o json >"$WORK/adm-events.json"
  python3 - "$WORK" "$ADM_SCHEDULER" <<'PY'
import json, sys
work, carma = sys.argv[1:]
pods = {p["metadata"]["name"]: p for p in json.load(open(f"{work}/adm-pods.json"))["items"]}
events = json.load(open(f"{work}/adm-events.json"))["items"]
def scheduled_by(name):
    return sorted({e.get("reportingComponent") or e.get("source", {}).get("component") or "?"
                   for e in events if e["involvedObject"].get("name") == name})
steered, problems = [], []
for name, asked in (("adm-no-scheduler", "default-scheduler"), ("adm-default-scheduler", "default-scheduler")):
    p = pods.get(name)
    if p is None:
        problems.append(f"{name} was not created: {open(f'{work}/logs/{name}.log').read().strip()[:200]}")
        continue
    got = p["spec"].get("schedulerName")
    note = p["metadata"].get("annotations", {}).get("carma.io/steered-from-scheduler")
    by = scheduled_by(name)
    if got == carma and note == asked and by == [carma] and p["status"].get("phase") == "Succeeded":
        steered.append(name)
    else:
        problems.append(f"{name}: schedulerName {got}, steered-from {note}, scheduled by {by}, phase {p['status'].get('phase')}")
refusal = open(f"{work}/logs/adm-node-name.log").read().strip()
refused = "adm-node-name" not in pods and "denied request: pods that request carma.io/gpu must" in refusal
if not refused:
    problems.append("adm-node-name: " + ("created" if "adm-node-name" in pods else f"refused otherwise: {refusal[:200]}"))
# every pod asking for carma.io/gpu that some scheduler bound: by carma's profile only
def asks(p):
    return any("carma.io/gpu" in (c.get("resources", {}).get("limits") or {}) for c in p["spec"]["containers"])
others = sorted(n for n, p in pods.items() if asks(p) and p["spec"].get("nodeName")
                and any(c != carma for c in scheduled_by(n)))
print(f"admission: {len(steered)} of 2 pods steered to {carma} (annotation carma.io/steered-from-scheduler) and run, "
      f"{1 if refused else 0} of 1 refused at admission ({refusal.split('denied request: ')[-1][:120] if refused else 'not refused'}), "
      f"{len(others)} GPU pods placed by another scheduler")
json.dump({"steered": len(steered), "refused": 1 if refused else 0, "otherScheduler": len(others)},
          open(f"{work}/admission.json", "w"))
for p in problems + [f"placed by another scheduler: {n}" for n in others]:
    print(f"  admission: {p}")
sys.exit(0 if len(steered) == 2 and refused and not others else 1)
PY
  local rc=$?
  k delete pod -n default adm-no-scheduler adm-default-scheduler --ignore-not-found --timeout 60s >/dev/null 2>&1 || true
  return $rc
}
