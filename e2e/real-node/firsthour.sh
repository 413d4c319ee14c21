# shellcheck shell=bash
# A user's first hour on the real nodes: the commands README.md and charts/carma/README.md mark
# (`<!-- first-hour: run -->` before a fenced block; firsthour.py says how they are read), run verbatim in
# their order, each file one pass from install to uninstall. Sourced by run.sh after chart.sh (whose
# release is gone by then) with CARMA_RN_CHART=1; uses run.sh's k, log, die, WORK, ROOT, HERE, KUBECTL,
# NODES, node_name, SNAPSHOTTER, API_IP and chart.sh's CARMA_IMAGE and KS_IMAGE.
#
# What the cluster supplies, as a user's cluster would, without changing a command:
#   - the images the commands name, imported into each node's containerd under those names (the one
#     substitution, printed): the carma image the run built as ghcr.io/carma-io/carma:<appVersion> and
#     registry.example.com/ml/carma:<appVersion>, its kube-scheduler as registry.k8s.io/kube-scheduler:<v>;
#   - cluster DNS for Service names (dns.py on $API_IP:53, the kubelets' clusterDNS), since the chart's
#     kube-scheduler calls the extender by its Service's DNS name;
#   - GPU nodes labelled nvidia.com/gpu.present=true (as NVIDIA's GPU feature discovery would).
# It prints, every figure read from the cluster:
#   first-hour: <n> documented commands run verbatim, <f> failed, <d> outputs differing; namespace
#   <pod-security level>; a Pending TrainingTask explained in <s> s (<reason>); uninstall left <k> carma objects
# CARMA_RN_PLANT=firsthour: one README command gets a wrong value key (placement.memoryMarginMB); the run
# must fail.

firsthour_images() {
  local app ks i nd c
  app="$(awk '/^appVersion:/ {gsub(/"/, "", $2); print $2}' "$ROOT/charts/carma/Chart.yaml")"
  ks="registry.k8s.io/kube-scheduler:${KS_IMAGE##*:}"
  FH_SUBST="ghcr.io/carma-io/carma:$app and registry.example.com/ml/carma:$app are $CARMA_IMAGE; $ks is $KS_IMAGE"
  for i in $(seq "$NODES"); do
    nd="$WORK/nodes/$(node_name "$i")"
    c=(ctr --address "$nd/containerd/containerd.sock" -n k8s.io)
    "${c[@]}" images tag --force "$CARMA_IMAGE" "ghcr.io/carma-io/carma:$app" >/dev/null &&
      "${c[@]}" images tag --force "$CARMA_IMAGE" "registry.example.com/ml/carma:$app" >/dev/null &&
      "${c[@]}" images tag --force "$KS_IMAGE" "$ks" >/dev/null || return 1
  done
  log "first-hour: image substitution on the nodes (never pulled): $FH_SUBST"
}

firsthour_dns() {
  python3 "$HERE/dns.py" "$API_IP" "$KUBECTL" >"$WORK/logs/dns.log" 2>&1 &
  echo $! >"$WORK/pids/dns"
  for _ in $(seq 50); do grep -q answering "$WORK/logs/dns.log" && return 0; sleep 0.1; done
  return 1
}

firsthour_run() {
  local i
  firsthour_images || die "first-hour: the images could not be tagged on the nodes"
  firsthour_dns || die "first-hour: dns.py did not start: $(tail -n 3 "$WORK/logs/dns.log")"
  for i in $(seq "$NODES"); do k label node "$(node_name "$i")" nvidia.com/gpu.present=true --overwrite >/dev/null; done
  # A cluster carma has not been installed on: chart.sh's uninstall leaves its release namespace.
  if k get namespace carma-system >/dev/null 2>&1; then
    log "first-hour: deleting chart.sh's namespace carma-system first"
    k delete namespace carma-system --timeout 120s >/dev/null || die "first-hour: namespace carma-system not deleted"
  fi
  log "first-hour: the commands README.md and charts/carma/README.md mark, verbatim, in order"
  ROOT="$ROOT" KUBECTL="$KUBECTL" python3 "$HERE/firsthour.py" run "$WORK" "$ROOT/README.md" "$ROOT/charts/carma/README.md" ||
    die "first-hour: firsthour.py run failed"
  python3 - "$WORK/firsthour.json" "$FH_SUBST" <<'PY'
import json, sys
d = json.load(open(sys.argv[1])); subst = sys.argv[2]
res = d["results"]
ran = [r for r in res if r["rc"] is not None]
failed = [r for r in ran if r["rc"] != 0]
differ = [r for r in ran if r.get("differs")]
skipped = [r for r in res if r["rc"] is None]
h = d["hooks"]
ns = h.get("namespace") or "not run"
p = h.get("pending")
pend = ("not run" if p is None else f"not explained: {p['error']}" if "error" in p
        else f"in {p['seconds']} s ({p['reason']}: {p['message'][:200]})")
lefts = h.get("left") or []
left = "not run" if not lefts else str(sum(len(l["left"]) for l in lefts))
for r in skipped:
    print(f"first-hour: not run here: {r['file']}:{r['line']} {r['cmd'].splitlines()[0]} ({r['reason']})")
print(f"first-hour: image substitution: {subst}; passes: "
      + ", ".join(f"{l['file']} (uninstall left {len(l['left'])})" for l in lefts)
      + (f"; PLANTED wrong value key" if d["planted"] else ""))
print(f"first-hour: {len(ran)} documented commands run verbatim, {len(failed)} failed, {len(differ)} outputs differing; "
      f"namespace {ns}; a Pending TrainingTask explained {pend}; uninstall left {left} carma objects")
# the reason must be the scheduler's, and carma's extender must have answered (not an error calling it)
ok = (ran and not failed and not differ and not d["unmarked"] and ns == "privileged" and p and "error" not in p
      and p["reason"] == "Unschedulable" and "extender at URL" not in p["message"] and lefts and left == "0")
if d["unmarked"]:
    print(f"first-hour: unmarked command blocks: {d['unmarked']}")
sys.exit(0 if ok else 1)
PY
}
