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
# printing the environment Allocate gave it.

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
  log "chart: images $CARMA_IMAGE (${CARMA_RN_IMAGE:+from the Buildah storage}${CARMA_RN_IMAGE:-assembled from $CARMA}) and $KS_IMAGE"
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

chart_install() {
  local helm args ip t0
  helm="$(dirname "$KUBECTL")/helm"
  args=(-n "$CHART_NS" -f "$ROOT/e2e/control-plane/values.yaml"
    --set image.repository="${CARMA_IMAGE%:*}" --set image.tag="${CARMA_IMAGE##*:}" --set image.pullPolicy=Never
    --set scheduler.image.repository="${KS_IMAGE%:*}" --set scheduler.image.tag="${KS_IMAGE##*:}"
    --set scheduler.image.pullPolicy=Never)
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
    command: [sh, -c, 'env | grep -E "^(CARMA|CUDA|NVIDIA)" | sort; exit 0']
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
env = [l for l in open(log).read().splitlines() if l]
print(f"real-node chart: helm install + upgrade, {len(ready)} of {len(chart)} chart pods Ready after {ready_s} s; "
      f"device plugin registered carma.io/gpu with the kubelets (allocatable {alloc}); {len(gpunodes)} GpuNodes; "
      f"gpu-share bound to {g['spec']['nodeName']} by {g['spec']['schedulerName']}, {t['reason']} exit {t['exitCode']}, "
      f"annotations {ann}, Allocate env {env}")
ok = (len(ready) == len(chart) and all(v not in ("0", None) for v in alloc.values()) and len(gpunodes) == int(n)
      and t["exitCode"] == 0)
sys.exit(0 if ok else 1)
PY
}

chart_images
chart_install
chart_gpu_pod || die "a chart check failed (the line above)"
