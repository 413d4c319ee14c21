# shellcheck shell=bash
# `helm install charts/carma` on the real nodes of run.sh (CARMA_RN_CHART=1); sourced by run.sh inside the
# run's namespaces after its own checks, never run alone. Uses run.sh's k, log, die, WORK, BIN, ROOT,
# NODES, node_name, img, SNAPSHOTTER and CARMA (the carma binary, from the outer part).
#
# What it does, and what it has to supply because nothing here reaches a registry or runs cluster DNS:
#   - images: the carma image CARMA_RN_IMAGE names in this machine's Buildah storage (what ci/image.sh
#     built from the root Dockerfile), else localhost/carma-e2e/carma:dev (the carma binary as built,
#     its shared libraries from this machine, CA certificates); and localhost/carma-e2e/kube-scheduler:
#     <release> (the kube-scheduler build.sh built, libc); the chart is pointed at them with pullPolicy
#     Never;
#   - nodes are labelled nvidia.com/gpu.present=true (the device plugin DaemonSet's default nodeSelector);
#   - no cluster DNS: kube-scheduler's extender URL, by default the extender Service's DNS name, is set
#     to the Service's cluster IP by a `helm upgrade` once the install has allocated it (TLS still
#     verifies the DNS name: the chart sets tlsConfig.serverName).
# Then it checks, every figure from the API server: every chart pod Ready; each node's kubelet lists
# the resource carma.io/gpu that the device plugin registered through the hostPath socket; a GpuNode per
# node; and one busybox pod asking for carma.io/gpu: 1 with schedulerName carma-e2e-scheduler is bound
# through the extender, admitted by the kubelet's device manager (Allocate) and runs to completion,
# printing the environment Allocate gave it. Then `helm upgrade` with placement.memoryMarginMiB changed and
# `helm rollback` to the revision before (the pods that roll, their environment, the revisions), three
# TrainingTasks on the rolled-back release (tasks.sh), and `helm uninstall` (what is left: no workload,
# pod or release history; the CRDs and the TrainingTasks). CARMA_RN_HOLD skips the uninstall.
# The last metre (lastmetre.sh): a stand-in of NVIDIA's CDI spec on each node once the GpuNodes are
# there, gpu-share and the TrainingTasks printing from inside what they got, an unresolvable CDI name
# refused, and the comparison with the API's assignments after the TrainingTasks.

CHART_NS=carma-system
CARMA_IMAGE="${CARMA_RN_IMAGE:-localhost/carma-e2e/carma:dev}"
KS_IMAGE="localhost/carma-e2e/kube-scheduler:$("$BIN/kube-scheduler" --version | awk '{print $2}')"

# rootfs_with_libs <dir> <binary> <path in image>: the binary plus the shared libraries ldd names.
rootfs_with_libs() {
  local dir="$1" binary="$2" dest="$3" lib
  mkdir -p "$dir$(dirname "$dest")"
  cp "$binary" "$dir$dest"
  for lib in $(ldd "$binary" | awk '$2 == "=>" && $3 ~ /^\// {print $3} $1 ~ /^\// {print $1}'); do
    mkdir -p "$dir$(dirname "$lib")"; cp -L "$lib" "$dir$lib"
  done
}

chart_images() {
  log "chart: images $CARMA_IMAGE ($([[ -n "${CARMA_RN_IMAGE:-}" ]] && echo "from the Buildah storage" || echo "assembled from $CARMA")) and $KS_IMAGE"
  local t0; t0=$(date +%s)
  if [[ -n "${CARMA_RN_IMAGE:-}" ]]; then # built from the Dockerfile: exported from Buildah's storage
    buildah push -q "$CARMA_IMAGE" "docker-archive:$img/carma.tar:$CARMA_IMAGE" ||
      die "$CARMA_IMAGE (CARMA_RN_IMAGE) is not in Buildah's storage: build it with ci/image.sh"
  else
    rootfs_with_libs "$img/carma" "$CARMA" /usr/bin/carma
    mkdir -p "$img/carma/etc/ssl/certs" "$img/carma/tmp"
    cp /etc/ssl/certs/ca-certificates.crt "$img/carma/etc/ssl/certs/"
  fi
  rootfs_with_libs "$img/kube-scheduler" "$BIN/kube-scheduler" /usr/local/bin/kube-scheduler
  B=(buildah --root "$img/storage" --runroot "$img/run" --storage-driver vfs)
  [[ -n "${CARMA_RN_IMAGE:-}" ]] ||
    build_image "$CARMA_IMAGE" "$img/carma" --entrypoint '["/usr/bin/carma"]' --user 65532:65532
  build_image "$KS_IMAGE" "$img/kube-scheduler" --entrypoint '["/usr/local/bin/kube-scheduler"]' \
    --env PATH=/usr/local/bin:/usr/bin:/bin
  rm -rf "$img/storage" "$img/run" "$img/carma" "$img/kube-scheduler"
  local i t nd
  for i in $(seq "$NODES"); do
    nd="$WORK/nodes/$(node_name "$i")"
    for t in carma kube-scheduler; do
      ctr --address "$nd/containerd/containerd.sock" -n k8s.io images import --snapshotter "$SNAPSHOTTER" \
        "$img/$t.tar" >>"$WORK/logs/import-$(node_name "$i").log" 2>&1 || die "ctr images import $t"
    done
  done
  rm -f "$img/carma.tar" "$img/kube-scheduler.tar"
  log "chart: images built and imported into $NODES containerds in $(( $(date +%s) - t0 )) s"
}

CHART_STALE_AFTER_S=60
chart_install() {
  local helm args ip t0
  helm="$(dirname "$KUBECTL")/helm"; HELM="$helm"
  args=(-n "$CHART_NS" -f "$ROOT/e2e/control-plane/values.yaml" --set enforcement.hookPath="$LM_HOOK"
    --set image.repository="${CARMA_IMAGE%:*}" --set image.tag="${CARMA_IMAGE##*:}" --set image.pullPolicy=Never
    --set scheduler.image.repository="${KS_IMAGE%:*}" --set scheduler.image.tag="${KS_IMAGE##*:}"
    --set scheduler.image.pullPolicy=Never
    # faults.sh cuts a device plugin off from the API server and waits for its GpuNode to turn stale:
    # a minute instead of the default ten (the heartbeat must stay shorter than the maximum age)
    --set placement.maxTelemetryAgeSeconds="$CHART_STALE_AFTER_S" --set devicePlugin.publish.heartbeatSeconds=20)
  for i in $(seq "$NODES"); do k label node "$(node_name "$i")" nvidia.com/gpu.present=true >/dev/null; done
  t0=$(date +%s)
  log "chart: helm install carma charts/carma"
  "$helm" install carma "$ROOT/charts/carma" --create-namespace "${args[@]}" >"$WORK/logs/helm-install.log" 2>&1 ||
    die "helm install: $(tail -n 5 "$WORK/logs/helm-install.log")"
  ip="$(k -n "$CHART_NS" get service carma-scheduler-extender -o jsonpath='{.spec.clusterIP}')"
  log "chart: helm upgrade: kube-scheduler calls the extender at https://$ip:8888 (no cluster DNS here)"
  "$helm" upgrade carma "$ROOT/charts/carma" "${args[@]}" \
    --set scheduler.extenderConfig.urlPrefix="https://$ip:8888" >"$WORK/logs/helm-upgrade.log" 2>&1 ||
    die "helm upgrade: $(tail -n 5 "$WORK/logs/helm-upgrade.log")"
  CHART_ARGS=("${args[@]}" --set scheduler.extenderConfig.urlPrefix="https://$ip:8888")
  k -n "$CHART_NS" rollout status deployment/carma-scheduler --timeout 180s >/dev/null &&
    k -n "$CHART_NS" rollout status deployment/carma-scheduler-extender --timeout 180s >/dev/null &&
    k -n "$CHART_NS" rollout status deployment/carma-operator --timeout 180s >/dev/null &&
    k -n "$CHART_NS" rollout status daemonset/carma-device-plugin --timeout 180s >/dev/null || {
    k -n "$CHART_NS" get pods -o wide >&2
    for p in $(k -n "$CHART_NS" get pods -o name); do echo "---- $p" >&2; k -n "$CHART_NS" logs "$p" --tail 10 >&2; done
    die "chart pods not Ready"; }
  CHART_READY_S=$(( $(date +%s) - t0 ))
  k -n "$CHART_NS" get pods -o wide >&2
  for _ in $(seq 60); do
    [[ "$(k get gpunodes -o name 2>/dev/null | wc -l)" -ge "$NODES" ]] && break; sleep 1
  done
  k get gpunodes >&2 || true
  # The kubelet publishes a registered device plugin's resource with its next node status update
  # (every 10 s by default), so a plugin pod can be Ready before its node lists carma.io/gpu.
  local registered
  for _ in $(seq 60); do
    registered="$(k get nodes -o jsonpath='{range .items[*]}{.status.allocatable.carma\.io/gpu}{"\n"}{end}' |
      grep -c '^[1-9]' || true)"
    [[ "$registered" -ge "$NODES" ]] && break; sleep 1
  done
}

chart_gpu_pod() {
  log "chart: a pod asking for carma.io/gpu: 1 (schedulerName carma-e2e-scheduler)"
  k apply -f - >/dev/null <<EOF
apiVersion: v1
kind: Pod
metadata:
  name: gpu-share
  namespace: default
  annotations: {carma.io/gpu-memory: 4000Mi}
spec:
  schedulerName: carma-e2e-scheduler
  restartPolicy: Never
  terminationGracePeriodSeconds: 1
  containers:
  - name: main
    image: $BUSYBOX_IMAGE
    imagePullPolicy: Never
    command: [sh, -c, $(python3 -c 'import json, sys; print(json.dumps(sys.argv[1]))' 'env | grep -E "^(CARMA|CUDA|NVIDIA)" | sort; '"$LM_PRINT"'; exit 0')]
    resources: {limits: {carma.io/gpu: 1, memory: 64Mi}, requests: {cpu: 10m, memory: 64Mi}}
EOF
  k wait --for jsonpath='{.status.phase}'=Succeeded --timeout 120s pod/gpu-share >/dev/null || {
    k describe pod gpu-share >&2; k -n "$CHART_NS" logs deployment/carma-scheduler --tail 20 >&2
    k -n "$CHART_NS" logs deployment/carma-scheduler-extender --tail 20 >&2; die "gpu-share did not succeed"; }
  k logs gpu-share >"$WORK/gpu-share.log"
  k get nodes,gpunodes,pods -A -o json >"$WORK/chart-state.json"
  python3 - "$WORK/chart-state.json" "$WORK/gpu-share.log" "$NODES" "$CHART_NS" "$CHART_READY_S" <<'PY'
import json, sys
state, log, n, ns, ready_s = sys.argv[1:]
items = json.load(open(state))["items"]
nodes = [i for i in items if i["kind"] == "Node"]
gpunodes = [i for i in items if i["kind"] == "GpuNode"]
pods = [i for i in items if i["kind"] == "Pod"]
chart = [p for p in pods if p["metadata"]["namespace"] == ns]
ready = [p for p in chart if any(c["type"] == "Ready" and c["status"] == "True" for c in p["status"].get("conditions", []))]
alloc = {x["metadata"]["name"]: x["status"].get("allocatable", {}).get("carma.io/gpu", "0") for x in nodes}
g = [p for p in pods if p["metadata"]["name"] == "gpu-share"][0]
t = g["status"]["containerStatuses"][0]["state"]["terminated"]
ann = {k: v for k, v in g["metadata"].get("annotations", {}).items() if k.startswith("carma.io/")}
env = [l for l in open(log).read().splitlines() if l and not l.startswith("carma-last-metre ")]
print(f"real-node chart: helm install + upgrade, {len(ready)} of {len(chart)} chart pods Ready after {ready_s} s; "
      f"device plugin registered carma.io/gpu with the kubelets (allocatable {alloc}); {len(gpunodes)} GpuNodes; "
      f"gpu-share bound to {g['spec']['nodeName']} by {g['spec']['schedulerName']}, {t['reason']} exit {t['exitCode']}, "
      f"annotations {ann}, Allocate env {env}")
ok = (len(ready) == len(chart) and all(v not in ("0", None) for v in alloc.values()) and len(gpunodes) == int(n)
      and t["exitCode"] == 0)
sys.exit(0 if ok else 1)
PY
}

# chart_snapshot <name>: the release's history and the chart's objects, as the API server has them.
chart_snapshot() {
  "$HELM" history carma -n "$CHART_NS" -o json >"$WORK/helm-$1-history.json" 2>/dev/null || echo '[]' >"$WORK/helm-$1-history.json"
  k -n "$CHART_NS" get deployments,daemonsets,replicasets,pods,services,secrets,configmaps,serviceaccounts -o json \
    >"$WORK/helm-$1-ns.json"
  k get crds,trainingtasks,gpunodes -A -o json >"$WORK/helm-$1-cluster.json"
  k get priorityclasses,clusterroles,clusterrolebindings -o json >"$WORK/helm-$1-cluster-rbac.json"
}

# chart_rolled: wait until every chart workload has rolled out and no old pod is left.
chart_rolled() {
  local d
  for d in deployment/carma-scheduler deployment/carma-scheduler-extender deployment/carma-operator daemonset/carma-device-plugin; do
    k -n "$CHART_NS" rollout status "$d" --timeout 180s >/dev/null || { k -n "$CHART_NS" get pods -o wide >&2; return 1; }
  done
  for _ in $(seq 120); do # terminating pods of the old revision gone
    [[ -z "$(k -n "$CHART_NS" get pods -o jsonpath='{range .items[?(@.metadata.deletionTimestamp)]}{.metadata.name}{"\n"}{end}')" ]] && return 0
    sleep 1
  done
  return 1
}

# helm upgrade with a changed value (placement.memoryMarginMiB: the extender's and the device plugin's
# environment), then helm rollback to the revision before it; the TrainingTasks (tasks.sh) then run on
# the rolled-back release. chart_uninstall checks all three and the uninstall: every figure from the API
# server (pods' UIDs and environment, the Deployments' revisions, what is left) and helm's history.
chart_upgrade_rollback() {
  local t0
  CHART_MARGIN=3072
  chart_snapshot installed
  CHART_REV="$(python3 -c 'import json,sys; print(max(h["revision"] for h in json.load(open(sys.argv[1]))))' "$WORK/helm-installed-history.json")"
  log "chart: helm upgrade carma --set placement.memoryMarginMiB=$CHART_MARGIN (from revision $CHART_REV)"
  t0=$(date +%s)
  "$HELM" upgrade carma "$ROOT/charts/carma" "${CHART_ARGS[@]}" --set placement.memoryMarginMiB="$CHART_MARGIN" \
    >"$WORK/logs/helm-upgrade-margin.log" 2>&1 || die "helm upgrade: $(tail -n 5 "$WORK/logs/helm-upgrade-margin.log")"
  chart_rolled || die "the chart did not roll after helm upgrade"
  CHART_UP_S=$(( $(date +%s) - t0 ))
  chart_snapshot upgraded
  log "chart: helm rollback carma $CHART_REV"
  t0=$(date +%s)
  "$HELM" rollback carma "$CHART_REV" -n "$CHART_NS" >"$WORK/logs/helm-rollback.log" 2>&1 ||
    die "helm rollback: $(tail -n 5 "$WORK/logs/helm-rollback.log")"
  chart_rolled || die "the chart did not roll after helm rollback"
  CHART_RB_S=$(( $(date +%s) - t0 ))
  chart_snapshot rolledback
}

chart_uninstall() {
  local t0 t_un=-1
  if [[ -n "${CARMA_RN_HOLD:-}" ]]; then
    log "chart: helm uninstall skipped (CARMA_RN_HOLD keeps the release up)"
  else
    log "chart: helm uninstall carma"
    t0=$(date +%s)
    "$HELM" uninstall carma -n "$CHART_NS" >"$WORK/logs/helm-uninstall.log" 2>&1 ||
      die "helm uninstall: $(tail -n 5 "$WORK/logs/helm-uninstall.log")"
    for _ in $(seq 120); do # the garbage collector deletes the ReplicaSets and pods the workloads owned
      [[ -z "$(k -n "$CHART_NS" get deployments,daemonsets,replicasets,pods -o name)" ]] && break
      sleep 1
    done
    t_un=$(( $(date +%s) - t0 ))
  fi
  chart_snapshot uninstalled
  python3 - "$WORK" "$CHART_REV" "$CHART_MARGIN" "$CHART_UP_S" "$CHART_RB_S" "$t_un" <<'PY'
import json, sys
work, before, margin, t_up, t_rb, t_un = sys.argv[1:]
before, margin, held = int(before), str(margin), t_un == "-1"
def snap(name):
    hist = json.load(open(f"{work}/helm-{name}-history.json")) or []
    ns = json.load(open(f"{work}/helm-{name}-ns.json"))["items"]
    cl = json.load(open(f"{work}/helm-{name}-cluster.json"))["items"]
    rbac = json.load(open(f"{work}/helm-{name}-cluster-rbac.json"))["items"]
    return hist, ns, cl, rbac
def kind(items, k):
    return [i for i in items if i["kind"] == k]
def live_pods(ns):
    return [p for p in kind(ns, "Pod") if not p["metadata"].get("deletionTimestamp")]
def owner_of(p):
    """The workload a chart pod belongs to: carma-operator, carma-device-plugin, ..."""
    refs = p["metadata"].get("ownerReferences", [])
    name = refs[0]["name"] if refs else p["metadata"]["name"]
    return name.rsplit("-", 1)[0] if refs and refs[0]["kind"] == "ReplicaSet" else name
def uids(ns):
    out = {}
    for p in live_pods(ns):
        out.setdefault(owner_of(p), set()).add(p["metadata"]["uid"])
    return out
def margins(ns):
    out = {}
    for p in live_pods(ns):
        for c in p["spec"]["containers"]:
            for e in c.get("env", []):
                if e["name"] == "CARMA_MEMORY_MARGIN_MIB":
                    out.setdefault(owner_of(p), set()).add(e.get("value"))
    return {k: sorted(v) for k, v in out.items()}
def revs(ns):
    return {d["metadata"]["name"]: d["metadata"].get("annotations", {}).get("deployment.kubernetes.io/revision")
            for d in kind(ns, "Deployment")}
def ds_gen(ns):
    return {d["metadata"]["name"]: d["metadata"].get("generation") for d in kind(ns, "DaemonSet")}
def ready(ns):
    return sum(1 for p in live_pods(ns) if any(c["type"] == "Ready" and c["status"] == "True" for c in p["status"].get("conditions", [])))
def last(hist):
    h = max(hist, key=lambda h: h["revision"]) if hist else {}
    return h.get("revision"), h.get("status"), h.get("description", "")

# every TrainingTask there was before the uninstall (the final snapshot of chart.sh) must be kept
expected_tts = sorted(i["metadata"]["name"] for i in json.load(open(f"{work}/final-tasks.json"))["items"]
                      if i["kind"] == "TrainingTask")
h0, n0, c0, _ = snap("installed")
h1, n1, c1, _ = snap("upgraded")
h2, n2, c2, _ = snap("rolledback")
h3, n3, c3, r3 = snap("uninstalled")
u0, u1, u2 = uids(n0), uids(n1), uids(n2)
rolled_up = sorted(w for w in u1 if not (u1[w] & u0.get(w, set())))
kept_up = sorted(w for w in u1 if u1[w] == u0.get(w))
rolled_rb = sorted(w for w in u2 if not (u2[w] & u1.get(w, set())))
m0, m1, m2 = margins(n0), margins(n1), margins(n2)
r1, r2 = last(h1), last(h2)
crds = sorted(c["metadata"]["name"] for c in kind(c3, "CustomResourceDefinition") if c["spec"]["group"] == "carma.io")
tts = sorted(t["metadata"]["name"] for t in kind(c3, "TrainingTask"))
left = {k: len([i for i in kind(n3, k) if i["metadata"]["name"] != "kube-root-ca.crt"])
        for k in ("Deployment", "DaemonSet", "ReplicaSet", "Pod", "Service", "Secret", "ConfigMap")}
left_sa = [s["metadata"]["name"] for s in kind(n3, "ServiceAccount") if s["metadata"]["name"] != "default"]
left_rbac = [r["metadata"]["name"] for r in r3 if r["metadata"]["name"].startswith("carma")]
uninst = ("uninstall skipped (CARMA_RN_HOLD)" if held else
          f"uninstall in {t_un} s: release history {len(h3)} entries, left in carma-system {left}, "
          f"service accounts {left_sa}, cluster RBAC/PriorityClasses {left_rbac}; CRDs kept {crds}; TrainingTasks kept {tts}; "
          f"GpuNodes left {len(kind(c3, 'GpuNode'))}")
print(f"real-node helm: install/upgrade/rollback{'' if held else '/uninstall'} ok ("
      f"installed revision {before}, {ready(n0)} of {len(live_pods(n0))} pods Ready, margin env {m0}; "
      f"upgrade -> revision {r1[0]} {r1[1]} in {t_up} s: new pods for {rolled_up}, unchanged {kept_up}, margin env {m1}, "
      f"Deployment revisions {revs(n0)} -> {revs(n1)}, DaemonSet generation {ds_gen(n0)} -> {ds_gen(n1)}; "
      f"rollback -> revision {r2[0]} {r2[1]} ({r2[2]!r}) in {t_rb} s: new pods for {rolled_rb}, margin env {m2}, "
      f"{ready(n2)} of {len(live_pods(n2))} pods Ready, Deployment revisions {revs(n2)}; "
      f"{uninst})")
ok = (r1[0] == before + 1 and r1[1] == "deployed" and r2[0] == before + 2 and r2[1] == "deployed"
      and "carma-scheduler-extender" in rolled_up and "carma-device-plugin" in rolled_up
      and all(v == [margin] for k, v in m1.items()) and m2 == m0 and all(margin not in v for v in m2.values())
      and "carma-scheduler-extender" in rolled_rb and "carma-device-plugin" in rolled_rb
      and ready(n2) == len(live_pods(n2))
      and (held or not h3 and all(left[k] == 0 for k in ("Deployment", "DaemonSet", "ReplicaSet", "Pod"))
      and not left_rbac and "trainingtasks.carma.io" in crds and tts == expected_tts))
sys.exit(0 if ok else 1)
PY
}

# The README's "removing carma for good", its commands as written: the TrainingTasks (their attempt pods
# follow through the garbage collector), the GpuNodes, then the CRDs. Counts are read before and after.
chart_remove() {
  [[ -z "${CARMA_RN_HOLD:-}" ]] || return 0
  local tts gns pods crds left_pods left
  tts=$(k get trainingtasks -A -o name | wc -l); gns=$(k get gpunodes -o name | wc -l)
  pods=$(k get pods -A -l carma.io/task -o name | wc -l)
  crds=$(k get crd -o name | grep -c '\.carma\.io$' || true)
  log "chart: removing carma for good (the README's commands)"
  k delete trainingtasks --all -A >/dev/null && k delete gpunodes --all >/dev/null &&
    k delete crd trainingtasks.carma.io gpunodes.carma.io memoryhistories.carma.io >/dev/null || return 1
  for _ in $(seq 60); do
    left_pods=$(k get pods -A -l carma.io/task -o name | wc -l)
    [[ $left_pods == 0 ]] && break
    sleep 1
  done
  left=$(k get crd -o name | grep -c '\.carma\.io$' || true)
  echo "real-node remove: $crds CRDs, $tts TrainingTasks and $gns GpuNodes deleted, $pods attempt pods garbage-collected ($left_pods left), $left carma.io CRDs left"
  [[ $left == 0 && $left_pods == 0 && $crds == 3 && $tts -gt 0 && $gns -gt 0 ]]
}

# The over-commit checker of the control-plane harness, every 2 s from the install to the uninstall:
# every bound, live carma pod against its GpuNode's GPUs (memory and replicas per GPU).
watch_start() {
  "$BIN/overcommit-watch" -kubeconfig "$WORK/kubeconfig" -scheduler carma-e2e-scheduler -interval 2s \
    -out "$WORK/overcommit.json" >"$WORK/logs/overcommit-watch.log" 2>&1 &
  echo $! >"$WORK/pids/overcommit-watch"
}
watch_stop() {
  local pid; pid="$(cat "$WORK/pids/overcommit-watch")"
  kill -TERM "$pid"
  for _ in $(seq 100); do kill -0 "$pid" 2>/dev/null || break; sleep 0.2; done
  rm -f "$WORK/pids/overcommit-watch"
  [[ -s "$WORK/overcommit.json" ]] || die "the over-commit watcher wrote no report: $(tail -n 3 "$WORK/logs/overcommit-watch.log")"
}

# The issue-level summary: every figure from the snapshots the steps above took from the API server.
chart_summary() {
  python3 - "$WORK" "$CARMA_IMAGE" "$CHART_NS" "${CARMA_RN_HOLD:-}" <<'PY'
import json, sys
work, image, ns, held = sys.argv[1:]
pods = [p for p in json.load(open(f"{work}/helm-installed-ns.json"))["items"] if p["kind"] == "Pod"]
def as_container(p):  # Running, every container started by containerd from the image the chart names
    cs = p["status"].get("containerStatuses", [])
    return (p["status"].get("phase") == "Running" and cs and all(
        c.get("containerID", "").startswith("containerd://") and "running" in c.get("state", {}) for c in cs))
chart = [p for p in pods if as_container(p)]
carma = [p for p in chart if any(c["image"] == image for c in p["spec"]["containers"])]
state = json.load(open(f"{work}/final-tasks.json"))["items"]
tts = [i for i in state if i["kind"] == "TrainingTask"]
attempts = [a for t in tts for a in t.get("status", {}).get("attempts", [])]
ran = [a for a in attempts if a.get("outcome")]
# attempt pods as last seen: the drain deletes the finished pods of its node, so the snapshot taken
# after the first TrainingTasks (tasks.sh) fills in those the final one lacks
kpods = {i["metadata"]["name"]: i for f in ("tasks-state.json", "final-tasks.json")
         for i in json.load(open(f"{work}/{f}"))["items"] if i["kind"] == "Pod"}
def reason(a):
    p = kpods.get(a["pod"], {})
    cs = p.get("status", {}).get("containerStatuses") or [{}]
    return (cs[0].get("state", {}).get("terminated") or {}).get("reason")
oom_rec = [t for t in tts if t.get("status", {}).get("phase") == "Succeeded"
           and any(a.get("outcome") == "GpuOutOfMemory" for a in t["status"].get("attempts", []))]
kernel = [a for a in ran if a["outcome"] == "HostOOMKilled" and reason(a) == "OOMKilled"]
faults = [f for f in map(json.loads, open(f"{work}/faults.jsonl")) if not f.get("notRun")]
survived = [f for f in faults if f["ok"]]
oc = json.load(open(f"{work}/overcommit.json"))
print(f"real-node: {len(carma)} chart pods running as containers from {image}, {len(ran)} training pods run "
      f"({len(oom_rec)} GPU-OOM recovered, {len(kernel)} kernel OOMKilled), "
      f"helm install/upgrade/rollback{' ok (uninstall skipped: CARMA_RN_HOLD)' if held else '/uninstall ok'}, "
      f"{len(survived)} restarts survived, {len(oc['findings'])} over-committed GPUs in {oc['checks']} checks")
if oc["findings"]:
    for f in oc["findings"]:
        print(f"  over-commit: {f['id']}: {f['detail']} (first seen {f['first']})")
ok = (len(carma) >= 4 and len(ran) >= 3 and oom_rec and kernel and len(survived) == len(faults) >= 4
      and not oc["findings"] and oc["checks"] > 0)
sys.exit(0 if ok else 1)
PY
}

# shellcheck source=lastmetre.sh
source "$HERE/lastmetre.sh" || die "e2e/real-node/lastmetre.sh could not be read"
chart_images
chart_install
lm_standins
watch_start
chart_gpu_pod || die "a chart check failed (the line above)"
lm_refusal
# shellcheck source=admission.sh
source "$HERE/admission.sh" || die "e2e/real-node/admission.sh could not be read"
adm_check || die "a GPU pod slipped past carma's admission policies (the lines above)"
chart_upgrade_rollback
# shellcheck source=tasks.sh
source "$HERE/tasks.sh" || die "e2e/real-node/tasks.sh could not be read"
# shellcheck source=faults.sh
source "$HERE/faults.sh" || die "e2e/real-node/faults.sh could not be read"
# shellcheck source=upgrade.sh
source "$HERE/upgrade.sh" || die "e2e/real-node/upgrade.sh could not be read"
# Called here, not from tasks.sh or faults.sh: a file that bash cannot parse would otherwise skip its
# checks and let the run pass without their lines.
tasks_run || die "a TrainingTask check failed (the line above)"
lm_check || die "a last-metre check failed (the lines above)"
faults_run || die "a restart or fault was not survived (the lines above)"
k get trainingtasks,pods -n default -o json >"$WORK/final-tasks.json"
watch_stop
faults_summary "$WORK/overcommit.json" || die "a fault under load lost or over-committed something (the line above)"
chart_uninstall || die "a helm check failed (the line above)"
chart_remove || die "carma was not removed for good (the line above)"
chart_summary || die "the real-node summary's goals are not met (the line above)"
