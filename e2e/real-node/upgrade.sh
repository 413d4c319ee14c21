# shellcheck shell=bash
# Upgrade from the previous release and rollback, with TrainingTasks running (CARMA_RN_CHART=1);
# sourced by chart.sh after faults.sh, never run alone. Uses run.sh's k, log, WORK, img, NODES,
# node_name, SNAPSHOTTER, build_image and chart.sh's CHART_NS, CHART_ARGS, HELM, chart_rolled,
# rootfs_with_libs, and faults.sh's load_task, faults_state, faults_after, faults_judge.
#
# The previous release is what e2e/real-node/previous-release.sh found and built before the run
# entered its namespaces: CARMA_PREV_RELEASE="<commit> <chart version> <worktree> <binary>", or empty
# when the clone's history has none (then the fault is reported as not run). Its binary becomes
# localhost/carma-e2e/carma:previous on every node; its chart and its e2e values come from its
# worktree. With the load training throughout:
#   1. helm upgrade to the previous release (chart, values and image), and a TrainingTask tt-prev
#      submitted to it, running;
#   2. the documented CRD step (kubectl apply --server-side -f charts/carma/crds/), then helm upgrade
#      to this release: the upgrade under test;
#   3. helm rollback to the previous release's revision;
#   4. helm upgrade to this release again, for the rest of the run.
# After each step: every training pod keeps its container, tt-prev included; a chart pod is replaced
# only where its workload's pod template changed (its pod-template-hash or controller-revision-hash);
# the CRDs keep their UIDs (updated in place, never recreated).
#
# CARMA_RN_PLANT=upgrade plants a fault for these checks: right after the upgrade to the previous
# release, the scheduler extender's pods are deleted (their Deployment makes new ones from the same
# template), so the next step must report a chart pod replaced without a spec change and the run fail.

PREV_IMAGE=localhost/carma-e2e/carma:previous

# prev_image: the previous release's binary as an image on every node (as chart_images does).
prev_image() {
  local bin="$1" i B
  rm -rf "$img/carma-prev"
  rootfs_with_libs "$img/carma-prev" "$bin" /usr/bin/carma
  mkdir -p "$img/carma-prev/etc/ssl/certs" "$img/carma-prev/tmp"
  cp /etc/ssl/certs/ca-certificates.crt "$img/carma-prev/etc/ssl/certs/"
  # shellcheck disable=SC2034 # build_image (run.sh) reads B
  B=(buildah --root "$img/storage" --runroot "$img/run" --storage-driver vfs)
  build_image "$PREV_IMAGE" "$img/carma-prev" --entrypoint '["/usr/bin/carma"]' --user 65532:65532
  rm -rf "$img/storage" "$img/run" "$img/carma-prev"
  for i in $(seq "$NODES"); do
    ctr --address "$WORK/nodes/$(node_name "$i")/containerd/containerd.sock" -n k8s.io images import \
      --snapshotter "$SNAPSHOTTER" "$img/carma-prev.tar" >>"$WORK/logs/import-prev.log" 2>&1 || return 1
  done
  rm -f "$img/carma-prev.tar"
}

# prev_args <worktree>: CHART_ARGS for the previous chart: its own e2e values and the previous image.
prev_args() {
  local a skip=""
  PREV_ARGS=()
  for a in "${CHART_ARGS[@]}"; do
    if [[ -n "$skip" ]]; then skip=""; PREV_ARGS+=("$1/e2e/control-plane/values.yaml"); continue; fi
    [[ "$a" == -f ]] && skip=1
    case "$a" in
      image.repository=*) a="image.repository=${PREV_IMAGE%:*}" ;;
      image.tag=*) a="image.tag=${PREV_IMAGE##*:}" ;;
    esac
    PREV_ARGS+=("$a")
  done
}

# upgrade_step <name> <helm args...>: run helm, wait for the roll, snapshot the chart's pods, the
# CRDs and the training pods as $WORK/upgrade-<name>.json.
upgrade_step() {
  local name="$1"; shift
  "$HELM" "$@" >"$WORK/logs/helm-prev-$name.log" 2>&1 || { log "faults: helm $1 ($name): $(tail -n 3 "$WORK/logs/helm-prev-$name.log")"; return 1; }
  chart_rolled || { log "faults: the chart did not roll ($name)"; return 1; }
  k get pods -n "$CHART_NS" -o json >"$WORK/upgrade-$name.chart.json" &&
    k get pods -n default -o json >"$WORK/upgrade-$name.pods.json" &&
    k get crds -o json >"$WORK/upgrade-$name.crds.json"
}

fault_previous_release() {
  local commit version tree bin rev
  read -r commit version tree bin <<<"${CARMA_PREV_RELEASE:-}"
  if [[ -z "$bin" ]]; then
    log "faults: upgrade from the previous release not run: ${CARMA_PREV_RELEASE_WHY:-no previous release}"
    echo '{"fault": "previous-release", "node": null, "notRun": true, "lost": [], "duplicated": {}, "ok": true}' >>"$WORK/faults.jsonl"
    return 0
  fi
  log "faults: helm upgrade to the previous release $version (${commit:0:12}) and back, with the load in flight"
  prev_image "$bin" || { log "faults: the previous release's image could not be imported"; return 1; }
  prev_args "$tree"
  faults_state "$WORK/fault-previous-release-0"
  upgrade_step current0 get all carma -n "$CHART_NS" || return 1
  upgrade_step previous upgrade carma "$tree/charts/carma" "${PREV_ARGS[@]}" || return 1
  if [[ "${CARMA_RN_PLANT:-}" == upgrade ]]; then
    log "faults: PLANTED: the scheduler extender's pods deleted after the upgrade to the previous release; the run must fail"
    k delete pods -n "$CHART_NS" -l app.kubernetes.io/component=scheduler-extender --wait=true >/dev/null
    chart_rolled || log "faults: the chart did not roll after the planted deletion"
  fi
  rev="$("$HELM" history carma -n "$CHART_NS" -o json | python3 -c 'import json, sys; print(max(h["revision"] for h in json.load(sys.stdin)))')"
  load_task tt-prev | k apply -f - >/dev/null || return 1
  FAULT_TASKS+=(tt-prev)
  for _ in $(seq 120); do
    [[ -n "$(k get pods -n default -l carma.io/task=tt-prev --field-selector status.phase=Running -o name)" ]] && break
    sleep 1
  done
  upgrade_step prev-running get all carma -n "$CHART_NS" || return 1
  k apply --server-side -f "$ROOT/charts/carma/crds/" >"$WORK/logs/crds-apply.log" 2>&1 ||
    { log "faults: kubectl apply --server-side -f charts/carma/crds/: $(tail -n 3 "$WORK/logs/crds-apply.log")"; return 1; }
  upgrade_step upgraded upgrade carma "$ROOT/charts/carma" "${CHART_ARGS[@]}" || return 1
  upgrade_step rolledback rollback carma "$rev" -n "$CHART_NS" || return 1
  upgrade_step current upgrade carma "$ROOT/charts/carma" "${CHART_ARGS[@]}" || return 1
  faults_after previous-release || log "faults: the TrainingTask after the upgrade from the previous release did not succeed"
  faults_state "$WORK/fault-previous-release-1"
  local extra
  extra="$(python3 - "$WORK" "$version" "$commit" <<'PY'
import json, sys
work, version, commit = sys.argv[1:]
steps = ["current0", "previous", "prev-running", "upgraded", "rolledback", "current"]
def load(step, what):
    return json.load(open(f"{work}/upgrade-{step}.{what}.json"))["items"]
def template(p):
    l = p["metadata"].get("labels", {})
    return l.get("pod-template-hash") or l.get("controller-revision-hash")
def component(p):
    l = p["metadata"].get("labels", {})
    return (l.get("app.kubernetes.io/component"), p["spec"].get("nodeName") if "controller-revision-hash" in l else None)
def running(items):
    return {p["metadata"]["name"]: (p["metadata"]["uid"], (p["status"].get("containerStatuses") or [{}])[0].get("containerID"))
            for p in items if p["status"].get("phase") == "Running" and not p["metadata"].get("deletionTimestamp")}
needless, disturbed, crds_recreated, replaced = [], [], [], {}
for a, b in zip(steps, steps[1:]):
    ca, cb = load(a, "chart"), load(b, "chart")
    def group(items):
        g = {}
        for p in items:
            if not p["metadata"].get("deletionTimestamp"):
                g.setdefault(component(p), set()).add((template(p), p["metadata"]["uid"]))
        return g
    ga, gb = group(ca), group(cb)
    n = 0
    for key, pods in ga.items():
        after = gb.get(key, set())
        uids_a, uids_b = {u for _, u in pods}, {u for _, u in after}
        n += len(uids_a - uids_b)
        if {t for t, _ in pods} == {t for t, _ in after} and uids_a != uids_b:  # same template, new pods
            needless.append(f"{b}: {key[0]}{' on ' + key[1] if key[1] else ''}")
    replaced[b] = n
    pa, pb = running(load(a, "pods")), running(load(b, "pods"))
    for name, v in pa.items():
        if name.startswith("tt-load-") or name.startswith("tt-prev-"):
            if pb.get(name) != v:
                disturbed.append(f"{b}: {name}")
    ua = {c["metadata"]["name"]: c["metadata"]["uid"] for c in load(a, "crds") if c["spec"]["group"] == "carma.io"}
    ub = {c["metadata"]["name"]: c["metadata"]["uid"] for c in load(b, "crds") if c["spec"]["group"] == "carma.io"}
    crds_recreated += [f"{b}: {n}" for n in ua if ub.get(n) != ua[n]]
prev_running = any(n.startswith("tt-prev-") for n in running(load("prev-running", "pods")))
print(json.dumps({"previous": f"{version} ({commit[:12]})", "chartPodsReplaced": replaced,
                  "replacedWithoutSpecChange": needless, "trainingPodsDisturbed": disturbed,
                  "crdsRecreated": crds_recreated, "prevTaskRanOnPrevious": prev_running,
                  "ok": prev_running and not needless and not disturbed and not crds_recreated}))
PY
)" || return 1
  faults_judge previous-release "$WORK/fault-previous-release-0" "$WORK/fault-previous-release-1" "" "$extra"
}
