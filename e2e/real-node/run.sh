#!/usr/bin/env bash
# Real Kubernetes nodes on this machine (see docs/real-node.md): etcd, kube-apiserver,
# kube-controller-manager, kube-scheduler and kube-proxy, then per node a containerd 2.x (built from its
# Go module by build-containerd.sh; CDI on, spec directories node-private; Debian's runc) and a real
# kubelet, all built from their Go modules (build.sh) and all inside a network namespace of the run's
# own, so every port and address is private to the run. Then pods run through
# them: one that echoes hello and exits 0, one OOM-killed under a 32Mi memory limit, one that reaches
# kube-apiserver through the kubernetes Service (kube-proxy), a 2-replica Deployment and a DaemonSet
# (kube-controller-manager's controllers), and the Deployment's deletion (garbage collector). It prints
# one summary line, every figure read from the API server:
#   real-node: <n> of <n> nodes Ready <s> s after the first containerd started (...); hello Completed
#   exit 0 log 'hello' ...; oom OOMKilled exit 137 ...; api pod ...; Deployment ...; DaemonSet ...
#
# Usage: e2e/real-node/run.sh                 # exit 0 on success
#        CARMA_E2E_KEEP=1 e2e/real-node/run.sh  # keep the work directory (logs, configs) afterwards
#        CARMA_RN_NODES=1 e2e/real-node/run.sh  # one node instead of two
#        CARMA_RN_CHART=1 e2e/real-node/run.sh  # then also `helm install charts/carma` on the nodes, run a
#                                              # carma.io/gpu pod through it, helm upgrade + rollback, three
#                                              # TrainingTasks (tasks.sh), helm uninstall (chart.sh);
#                                              # and the last metre (lastmetre.sh): a stand-in of the
#                                              # CDI spec NVIDIA's toolkit writes on each node, every
#                                              # GPU container printing from inside the devices and env
#                                              # it got, compared with carma's assignment in the API:
#                                              #   last-metre: <c> of <C> containers saw exactly their
#                                              #   GPUs and reservation (CDI via containerd <v>), ...
#        CARMA_RN_PLANT=lastmetre CARMA_RN_CHART=1 ... # plants stand-in specs whose UUIDs name their
#                                              # neighbours' device nodes: the run must FAIL
#                                              # (also: overcommit, faults.sh; dra-overcommit and
#                                              # dra-any-node, dra.sh)
#        CARMA_RN_IMAGE=<ref> ...               # the chart's carma image: <ref> in Buildah's storage
#                                              # (ci/image.sh builds it from the root Dockerfile); else
#                                              # one is assembled from target/debug/carma
#        CARMA_RN_HOLD=600 e2e/real-node/run.sh # after the checks, keep the cluster up 600 s; the
#                                              # kubeconfig and an nsenter line to reach it are printed
#        CARMA_RN_RUNC=<path> e2e/real-node/run.sh # another runc binary (e.g. a --debug wrapper)
#        CARMA_RN_CONTAINERD=debian ...         # Debian's containerd 1.6 (its package) instead of the
#                                              # built 2.x: it ignores CDI, so the chart's last-metre
#                                              # check (lastmetre.sh) says `not run`
#        CARMA_RN_CHART=1 CARMA_RN_DRA=1 ...     # then also carma's DRA path (dra.sh): every component
#                                              # with the release's default feature gates (from 1.36
#                                              # DRAConsumableCapacity and DRADeviceTaints are beta and
#                                              # on), the kubelets' plugin and CDI directories
#                                              # node-private, and the chart with dra.enabled=true;
#                                              # its pods' last metre: `last-metre DRA: ...`
# Needs: root, go, openssl, python3, curl, gcc (static glibc), buildah, iproute2, iptables, runc, the
# CNI plugins and a static busybox (Debian 12: apt-get install -y runc containernetworking-plugins
# busybox-static buildah gcc iptables iproute2; and containerd for CARMA_RN_CONTAINERD=debian).
set -euo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
ROOT="$(cd "$HERE/../.." && pwd)"
LOG_TAG=real-node
# shellcheck source=../control-plane/cluster.sh
source "$ROOT/e2e/control-plane/cluster.sh" # log, die, client_cert, cp_certs, kubeconfig, k, cp_start_etcd
NODES="${CARMA_RN_NODES:-2}"
BUSYBOX_IMAGE=localhost/carma-e2e/busybox:1.35.0
PAUSE_IMAGE=localhost/carma-e2e/pause:3.10.1
CNI_BIN=/usr/lib/cni
# CARMA_RN_DRA (dra.sh): no --feature-gates on any component. The DRA gates carma's driver needs,
# DRAConsumableCapacity and DRADeviceTaints, are beta and on by default from 1.36 (alpha and off at 1.35,
# where this run had to turn them on): the run uses the release's defaults, and dra.sh prints the gates
# kube-apiserver reports (its kubernetes_feature_enabled metric). The kubelets log their DRA plugin
# manager at -v 3 (dra.sh waits for its "Registered DRA plugin").
RN_KUBELET_DRA=(); [[ -z "${CARMA_RN_DRA:-}" ]] || RN_KUBELET_DRA=(--vmodule=dra_plugin_manager=3)

# ======================= outer part: host namespaces =======================================
if [[ -z "${CARMA_RN_INNER:-}" ]]; then
  [[ "$(id -u)" == 0 ]] || die "needs root (namespaces, cgroups, containerd)"
  tools=(go openssl python3 unshare nsenter ip iptables gcc buildah runc curl)
  case "${CARMA_RN_CONTAINERD:-built}" in
    built) ;;
    debian) tools+=(containerd ctr) ;;
    *) die "CARMA_RN_CONTAINERD is built (the default: containerd 2.x from its Go module) or debian" ;;
  esac
  for t in "${tools[@]}"; do
    command -v "$t" >/dev/null || die "$t is required (see the header of $0)"
  done
  [[ -x "$CNI_BIN/bridge" && -x "$CNI_BIN/host-local" && -x "$CNI_BIN/loopback" ]] ||
    die "CNI plugins missing in $CNI_BIN (apt-get install -y containernetworking-plugins)"
  [[ -x /bin/busybox ]] && ! ldd /bin/busybox >/dev/null 2>&1 ||
    die "/bin/busybox must be the static one (apt-get install -y busybox-static)"
  t_start=$(date +%s)
  BIN="$(bash "$HERE/build.sh" | tail -n1)"
  # containerd 2.x (CDI) by default; Debian's 1.6 on request. Its directory goes first on the inner
  # part's PATH, so containerd, ctr and containerd-shim-runc-v2 are the chosen ones everywhere.
  if [[ "${CARMA_RN_CONTAINERD:-built}" == built ]]; then
    CTRD_BIN="$(bash "$HERE/build-containerd.sh" | tail -n1)"
  else
    CTRD_BIN="$(dirname "$(command -v containerd)")"
  fi
  t_built=$(date +%s)
  KUBECTL="$(dirname "$("$ROOT/tools/install-helm.sh" | tail -n1)")/kubectl"
  CARMA=
  if [[ -n "${CARMA_RN_CHART:-}" ]]; then # the chart's pods run the carma binary (chart.sh)
    CARMA="${CARMA_BIN:-$ROOT/target/debug/carma}"
    if [[ -z "${CARMA_BIN:-}${CARMA_RN_IMAGE:-}" ]]; then (cd "$ROOT" && cargo build -q -p carma); fi
    [[ -n "${CARMA_RN_IMAGE:-}" || -x "$CARMA" ]] || die "carma binary $CARMA is missing"
    # the previous release, for the upgrade under load (upgrade.sh); none in a shallow clone
    mkdir -p "$HOME/.cache/carma-e2e"
    if CARMA_PREV_RELEASE="$(bash "$HERE/previous-release.sh" 2>"$HOME/.cache/carma-e2e/previous-release.err")"; then
      CARMA_PREV_RELEASE_WHY=""
    else
      [[ $? == 3 ]] || die "the previous release could not be built: $(tail -n 3 "$HOME/.cache/carma-e2e/previous-release.err")"
      CARMA_PREV_RELEASE_WHY="$(tail -n 1 "$HOME/.cache/carma-e2e/previous-release.err")"
      # CI may not skip it, unless its clone is shallow (then the history holds no previous release)
      [[ "${CI:-}" != true || -f "$(git -C "$ROOT" rev-parse --git-dir)/shallow" ]] ||
        die "CI=true and the upgrade from the previous release would be skipped: $CARMA_PREV_RELEASE_WHY"
    fi
    export CARMA_PREV_RELEASE CARMA_PREV_RELEASE_WHY
  fi
  WORK="$(mktemp -d /tmp/carma-rn.XXXXXX)"
  CGROOT="/$(basename "$WORK")" # the kubelets' cgroup subtree: /sys/fs/cgroup/<controller>/carma-rn.XXXXXX
  log "work directory $WORK; build $((t_built - t_start)) s"
  set +e
  CARMA_RN_INNER=1 BIN="$BIN" CTRD_BIN="$CTRD_BIN" KUBECTL="$KUBECTL" WORK="$WORK" CGROOT="$CGROOT" T_START="$t_start" CARMA="$CARMA" \
    unshare --net --mount --propagation private --fork -- bash "$0" "$@"
  rc=$?
  set -e
  # Every process of the run lived in that network namespace and has exited with it; their mounts went
  # with the mount namespaces. What is left on the host: the cgroups the kubelets made, and WORK.
  for c in /sys/fs/cgroup/*/; do
    [[ -d "$c${CGROOT#/}" ]] && find "$c${CGROOT#/}" -depth -type d -exec rmdir {} + 2>/dev/null
  done
  if [[ -n "${CARMA_E2E_KEEP:-}" ]]; then log "work directory kept: $WORK"; else rm -rf "$WORK"; fi
  exit $rc
fi

# ======================= inner part: the run's own network and mount namespace ===============
# BIN, CTRD_BIN, KUBECTL, WORK, CGROOT, T_START come from the outer part.
mkdir -p "$WORK"/{pids,logs,pki,nodes}
export PATH="$CTRD_BIN:$PATH"
CONTAINERD_VERSION="$(containerd --version | awk '{print $3}')"
CONTAINERD_MAJOR="${CONTAINERD_VERSION#v}"; CONTAINERD_MAJOR="${CONTAINERD_MAJOR%%.*}"
log "containerd $CONTAINERD_VERSION ($(command -v containerd)), $(runc --version | head -n1)"
export CARMA_E2E_WORK="$WORK"

NODE_IP_PREFIX=198.18.0.      # node addresses 198.18.0.11, .12, ...: RFC 2544 test range, on a bridge
POD_NET_PREFIX=198.18.        # pod subnets 198.18.<i>.0/24 (node i), on bridge rn-cni<i>
ETCD_PORT=2379; ETCD_PEER=2380; API_PORT=6443 # free: this network namespace is the run's own
API_IP=198.18.0.1             # the API server's address for pods (the kubernetes Service's endpoint)

node_name() { echo "rn-node-$1"; }
node_ip() { echo "$NODE_IP_PREFIX$((10 + $1))"; }

cleanup() {
  local rc=$?
  set +e
  log "stopping"
  local i nd f
  # Kubelets first (they would restart what we stop), then every container through its containerd (so
  # each shim exits), then containerd, then the control plane, newest first.
  for f in "$WORK"/pids/kubelet-*; do [[ -f "$f" ]] && kill "$(cat "$f")" 2>/dev/null; done
  sleep 1
  for i in $(seq "$NODES"); do
    nd="$WORK/nodes/$(node_name "$i")"
    [[ -S "$nd/containerd/containerd.sock" ]] || continue
    local c=(ctr --address "$nd/containerd/containerd.sock" -n k8s.io)
    for t in $("${c[@]}" tasks ls -q 2>/dev/null); do "${c[@]}" tasks kill -s SIGKILL "$t" >/dev/null 2>&1; done
    sleep 0.5
    for t in $("${c[@]}" tasks ls -q 2>/dev/null); do "${c[@]}" tasks delete -f "$t" >/dev/null 2>&1; done
    for t in $("${c[@]}" containers ls -q 2>/dev/null); do "${c[@]}" containers delete "$t" >/dev/null 2>&1; done
  done
  for f in $(ls -t "$WORK"/pids/ 2>/dev/null); do
    kill "$(cat "$WORK/pids/$f")" 2>/dev/null
    if [[ $f == apiserver ]]; then sleep 1; fi
  done
  sleep 1
  # Anything still alive in this network namespace (it is the run's own, so all of it was started by
  # the run: daemons, shims, the mount-namespace holders) or in the kubelets' cgroups (containers).
  local me; me="$(readlink /proc/self/ns/net)"
  for p in /proc/[0-9]*; do
    p="${p#/proc/}"
    [[ $p == "$$" || $p == "$BASHPID" || $p == "$PPID" ]] && continue # PPID: unshare, waiting for us
    [[ "$(readlink "/proc/$p/ns/net" 2>/dev/null)" == "$me" ]] && kill -9 "$p" 2>/dev/null
  done
  for f in /sys/fs/cgroup/pids"$CGROOT"/; do
    [[ -d "$f" ]] && find "$f" -name cgroup.procs -exec cat {} + 2>/dev/null | while read -r p; do kill -9 "$p" 2>/dev/null; done
  done
  if [[ $rc != 0 ]]; then
    for l in "$WORK"/logs/*.log; do echo "---- last lines of $l" >&2; tail -n 12 "$l" | cut -c1-400 >&2; done
  fi
  exit $rc
}
trap cleanup EXIT

# ---- network: loopback plus one bridge that carries the API server's and the nodes' addresses ----
ip link set lo up
ip link add rn-nodes type bridge
ip addr add "$API_IP/24" dev rn-nodes
for i in $(seq "$NODES"); do ip addr add "$(node_ip "$i")/24" dev rn-nodes; done
ip link set rn-nodes up
# The namespace has no default route, which a real node has: without one, a connection the host itself
# opens to a Service IP (kube-apiserver calling an admission webhook through its Service) fails to
# route before kube-proxy's DNAT in OUTPUT can rewrite it. A route for the Service range stands in.
ip route add 10.96.0.0/16 dev rn-nodes
# Pods reach Service IPs through kube-proxy's iptables rules; a pod calling a Service whose endpoint is
# on the same node bridge needs bridged packets to pass netfilter (per network namespace since Linux 5.3).
echo 1 >/proc/sys/net/bridge/bridge-nf-call-iptables
echo 1 >/proc/sys/net/ipv4/ip_forward # also per network namespace: node bridges <-> rn-nodes

# ---- kernel tunables the kubelet insists on -----------------------------------------------------
# With protectKernelDefaults=false the kubelet writes vm.overcommit_memory=1, vm.panic_on_oom=0,
# kernel.panic=10, kernel.panic_on_oops=1 when they differ, and those sysctls are not namespaced: it
# would change them for the whole machine. Instead, in this mount namespace only, a file holding the
# value it wants is bind-mounted over each /proc/sys entry that differs, so it reads what it expects and
# writes nothing. The real kernel values stay as they are (containers, with their own /proc, see them).
mkdir -p "$WORK/sysctl"
for kv in vm/overcommit_memory=1 vm/panic_on_oom=0 kernel/panic=10 kernel/panic_on_oops=1 \
  kernel/keys/root_maxkeys=1000000 kernel/keys/root_maxbytes=25000000; do
  key="${kv%%=*}"; val="${kv#*=}"
  real="$(cat "/proc/sys/$key")"
  if [[ "$real" != "$val" ]]; then
    f="$WORK/sysctl/${key//\//.}"; echo "$val" >"$f"; mount --bind "$f" "/proc/sys/$key"
    log "the kubelet reads $key=$val here; the kernel keeps $real"
  fi
done

# ---- certificates, kubeconfigs ------------------------------------------------------------------
nodes=(); for i in $(seq "$NODES"); do nodes+=("$(node_name "$i")"); done
cp_certs "${nodes[@]}" # CA, API server serving cert, admin, system:node:<name> per node, SA keys
client_cert controller-manager "/CN=system:kube-controller-manager"
client_cert scheduler "/CN=system:kube-scheduler"
client_cert apiserver-kubelet-client "/O=system:masters/CN=kube-apiserver-kubelet-client"
client_cert kube-proxy "/CN=system:kube-proxy"
kubeconfig "$WORK/kubeconfig-kube-proxy" kube-proxy
kubeconfig "$WORK/kubeconfig-controller-manager" controller-manager
kubeconfig "$WORK/kubeconfig-scheduler" scheduler

# ---- control plane -------------------------------------------------------------------------------
cp_start_etcd
# cluster.sh's kube-apiserver on the run's bridge address, with the client certificate it shows the
# kubelets (logs, exec).
t_start="$T_START"
API_FLAGS=(--kubelet-client-certificate "$pki/apiserver-kubelet-client.crt" --kubelet-client-key "$pki/apiserver-kubelet-client.key"
  --kubelet-preferred-address-types InternalIP)
start_apiserver() { API_BIND=0.0.0.0 API_ADVERTISE="$API_IP" cp_start_apiserver "${API_FLAGS[@]}"; }
start_apiserver
t_api=$(date +%s)

log "kube-controller-manager, kube-scheduler"
"$BIN/kube-controller-manager" --kubeconfig "$WORK/kubeconfig-controller-manager" \
  --authentication-kubeconfig "$WORK/kubeconfig-controller-manager" --authorization-kubeconfig "$WORK/kubeconfig-controller-manager" \
  --bind-address 127.0.0.1 --secure-port 10257 --leader-elect=false \
  --use-service-account-credentials=true --service-account-private-key-file "$pki/sa.key" --root-ca-file "$pki/ca.crt" \
  --cluster-signing-cert-file "$pki/ca.crt" --cluster-signing-key-file "$pki/ca.key" \
  --profiling=false >"$WORK/logs/controller-manager.log" 2>&1 &
echo $! >"$WORK/pids/controller-manager"; sleep 0.01
"$BIN/kube-scheduler" --kubeconfig "$WORK/kubeconfig-scheduler" \
  --authentication-kubeconfig "$WORK/kubeconfig-scheduler" --authorization-kubeconfig "$WORK/kubeconfig-scheduler" \
  --bind-address 127.0.0.1 --secure-port 10259 --leader-elect=false --profiling=false \
  >"$WORK/logs/scheduler.log" 2>&1 &
echo $! >"$WORK/pids/scheduler"; sleep 0.01

# kube-proxy: one for the run's network namespace, which all nodes share (two would fight over the same
# iptables chains). conntrack settings 0: leave the kernel's conntrack table size and timeouts alone
# (nf_conntrack_max and the hash size are machine-wide).
cat >"$WORK/kube-proxy.yaml" <<EOF
apiVersion: kubeproxy.config.k8s.io/v1alpha1
kind: KubeProxyConfiguration
clientConnection: {kubeconfig: $WORK/kubeconfig-kube-proxy}
hostnameOverride: $(node_name 1)
mode: iptables
clusterCIDR: ${POD_NET_PREFIX}0.0/16
healthzBindAddress: 127.0.0.1:10256
metricsBindAddress: 127.0.0.1:10249
conntrack: {maxPerCore: 0, min: 0, tcpEstablishedTimeout: 0s, tcpCloseWaitTimeout: 0s}
EOF
log "kube-proxy $("$BIN/kube-proxy" --version) (iptables mode)"
"$BIN/kube-proxy" --config "$WORK/kube-proxy.yaml" >"$WORK/logs/kube-proxy.log" 2>&1 &
echo $! >"$WORK/pids/kube-proxy"; sleep 0.01

# ---- images: busybox (Debian's busybox-static) and the pause container (k8s's pause.c) --------------
log "images: $BUSYBOX_IMAGE, $PAUSE_IMAGE (buildah, own storage under the work directory)"
t_img0=$(date +%s)
img="$WORK/images"; mkdir -p "$img/busybox/bin" "$img/pause"
cp /bin/busybox "$img/busybox/bin/busybox"
for a in $(/bin/busybox --list); do [[ $a == busybox ]] || ln -s busybox "$img/busybox/bin/$a"; done
pause_src="$(cd "$HERE" && go env GOMODCACHE)/k8s.io/kubernetes@$("$BIN/kubelet" --version | awk '{print $2}')/build/pause/linux/pause.c"
[[ -f "$pause_src" ]] || die "pause.c not found at $pause_src (go mod download k8s.io/kubernetes)"
gcc -Os -Wall -Werror -static -DVERSION=v3.10.1-carma-e2e -o "$img/pause/pause" "$pause_src"
B=(buildah --root "$img/storage" --runroot "$img/run" --storage-driver vfs)
build_image() { # build_image <name> <dir> <buildah config args...>
  local name="$1" dir="$2" c; shift 2
  c="$("${B[@]}" from scratch)"
  "${B[@]}" copy "$c" "$dir" / >/dev/null
  "${B[@]}" config "$@" "$c"
  "${B[@]}" commit -q "$c" "$name" >/dev/null
  "${B[@]}" push -q "$name" "docker-archive:$img/$(basename "$dir").tar:$name"
  "${B[@]}" rm "$c" >/dev/null
}
build_image "$BUSYBOX_IMAGE" "$img/busybox" --cmd '["/bin/sh"]' --env PATH=/bin
build_image "$PAUSE_IMAGE" "$img/pause" --entrypoint '["/pause"]' --user 65535:65535
rm -rf "$img/storage" "$img/run" "$img/busybox" "$img/pause"
log "images built in $(( $(date +%s) - t_img0 )) s: $(du -sh "$img" | cut -f1)"

# ---- snapshotter: overlayfs if this filesystem takes an overlay mount, else native ----------------
SNAPSHOTTER=overlayfs
mkdir -p "$WORK/ovl"/{l,u,w,m}
if mount -t overlay overlay -o "lowerdir=$WORK/ovl/l,upperdir=$WORK/ovl/u,workdir=$WORK/ovl/w" "$WORK/ovl/m" 2>"$WORK/logs/overlay-probe.log"; then
  umount "$WORK/ovl/m"
else
  SNAPSHOTTER=native; log "overlay mount failed ($(cat "$WORK/logs/overlay-probe.log")): snapshotter native"
fi
rm -rf "$WORK/ovl"

# ---- nodes ---------------------------------------------------------------------------------------
# Each node gets a mount namespace of its own, held by a sleeping process; its containerd and kubelet are
# started in it with nsenter, so the kubelet's mounts (projected token tmpfs) are the ones runc sees, and
# the paths the kubelet hard-codes can be node-private bind mounts:
#   /var/lib/kubelet/device-plugins  (device plugins' sockets; DevicePluginPath is a constant)
#   /var/log                          (tmpfs: /var/log/containers symlinks are a constant path)
#   /run/containerd                   (tmpfs: containerd's shim sockets and runc's state)
mkdir -p /var/lib/kubelet/device-plugins /run/containerd
start_node() { # start_node <i>
  local i="$1" name nd ip subnet holder
  name="$(node_name "$i")"; nd="$WORK/nodes/$name"; ip="$(node_ip "$i")"; subnet="$POD_NET_PREFIX$i.0/24"
  mkdir -p "$nd"/{containerd/root,containerd/state,cni/conf,cni/ipam,kubelet,pod-logs,device-plugins,volume-plugins}
  # containerd: own root, state, socket; CRI with runc (cgroupfs), the local pause image, CNI bridge.
  # 2.x: configuration version 3 (containerd 2.0's; 2.4 reads it and moves the server addresses itself);
  # CDI is always on from 2.4 (2.0-2.3: enable_cdi, default true), its spec directories are the node's
  # own: cdi/ (the DRA driver's, bind-mounted at /var/run/cdi with CARMA_RN_DRA) and cdi-nvidia/ (the
  # stand-in of NVIDIA's toolkit spec, lastmetre.sh). NRI is off (its socket is a fixed host path) and
  # every other path containerd would create is under the node's directory.
  # This sandbox lacks CAP_SYS_RESOURCE, so no process may lower its oom_score_adj below its own (0):
  # runc's write of the sandbox's -998 fails ("nsexec: failed to update /proc/self/oom_score_adj:
  # Permission denied", surfacing as "can't get final child's PID from pipe: EOF"). With
  # restrict_oom_score_adj, containerd raises every requested score to at least its own; scores above it
  # (BestEffort's 1000) are kept.
  mkdir -p "$nd"/{cdi,cdi-nvidia,dev,containerd/opt}
  if [[ $CONTAINERD_MAJOR -ge 2 ]]; then
    cat >"$nd/containerd/config.toml" <<EOF
version = 3
root = "$nd/containerd/root"
state = "$nd/containerd/state"
imports = []
[grpc]
  address = "$nd/containerd/containerd.sock"
[ttrpc]
  address = "$nd/containerd/containerd.sock.ttrpc"
[debug]
  address = ""
[metrics]
  address = ""
[plugins.'io.containerd.internal.v1.opt']
  path = "$nd/containerd/opt"
[plugins.'io.containerd.nri.v1.nri']
  disable = true
[plugins.'io.containerd.cri.v1.images']
  snapshotter = "$SNAPSHOTTER"
  [plugins.'io.containerd.cri.v1.images'.pinned_images]
    sandbox = "$PAUSE_IMAGE"
[plugins.'io.containerd.cri.v1.runtime']
  enable_selinux = false
  restrict_oom_score_adj = true
  cdi_spec_dirs = ["$nd/cdi-nvidia", "$nd/cdi"]
  [plugins.'io.containerd.cri.v1.runtime'.containerd]
    default_runtime_name = "runc"
    [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      runtime_path = "$CTRD_BIN/containerd-shim-runc-v2"
      [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc.options]
        BinaryName = "${CARMA_RN_RUNC:-$(command -v runc)}"
        SystemdCgroup = false
  [plugins.'io.containerd.cri.v1.runtime'.cni]
    bin_dirs = ["$CNI_BIN"]
    conf_dir = "$nd/cni/conf"
    max_conf_num = 1
EOF
  else # Debian's 1.6: configuration version 2, no CDI
    cat >"$nd/containerd/config.toml" <<EOF
version = 2
root = "$nd/containerd/root"
state = "$nd/containerd/state"
[grpc]
  address = "$nd/containerd/containerd.sock"
[ttrpc]
  address = "$nd/containerd/containerd.sock.ttrpc"
[debug]
  address = ""
[metrics]
  address = ""
[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "$PAUSE_IMAGE"
  enable_selinux = false
  restrict_oom_score_adj = true
  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "$SNAPSHOTTER"
    default_runtime_name = "runc"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
        BinaryName = "${CARMA_RN_RUNC:-$(command -v runc)}"
        SystemdCgroup = false
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "$CNI_BIN"
    conf_dir = "$nd/cni/conf"
    max_conf_num = 1
EOF
  fi
  # Pods' network: a bridge per node whose host side (198.18.<i>.1) is the pods' gateway into the run's
  # network namespace (kube-apiserver, Service IPs via kube-proxy, the other node's pods); no masquerade,
  # and nothing beyond the namespace exists. hairpinMode lets a pod reach itself through a Service.
  cat >"$nd/cni/conf/10-rn.conflist" <<EOF
{"cniVersion": "1.0.0", "name": "rn-$i", "plugins": [
  {"type": "bridge", "bridge": "rn-cni$i", "isGateway": true, "isDefaultGateway": true, "hairpinMode": true, "ipMasq": false,
   "ipam": {"type": "host-local", "ranges": [[{"subnet": "$subnet"}]], "dataDir": "$nd/cni/ipam"}}]}
EOF
  # kubelet: every setting that is not the default is here, each with its reason (docs/real-node.md).
  mkdir -p "/sys/fs/cgroup/cpuset$CGROOT/$name"
  for c in /sys/fs/cgroup/*/; do mkdir -p "$c${CGROOT#/}/$name"; done
  # a new cpuset cgroup starts with no CPUs and no memory nodes: copy the root's down
  for d in "/sys/fs/cgroup/cpuset$CGROOT" "/sys/fs/cgroup/cpuset$CGROOT/$name"; do
    cat /sys/fs/cgroup/cpuset/cpuset.cpus >"$d/cpuset.cpus"; cat /sys/fs/cgroup/cpuset/cpuset.mems >"$d/cpuset.mems"
  done
  cat >"$nd/kubelet-config.yaml" <<EOF
apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
failCgroupV1: false
cgroupDriver: cgroupfs
cgroupRoot: $CGROOT/$name
containerRuntimeEndpoint: unix://$nd/containerd/containerd.sock
address: $ip
port: 10250
readOnlyPort: 0
healthzBindAddress: 127.0.0.1
healthzPort: $((10270 + i))
podLogsDir: $nd/pod-logs
authentication:
  anonymous: {enabled: false}
  webhook: {enabled: true}
  x509: {clientCAFile: $pki/ca.crt}
authorization: {mode: Webhook}
evictionHard: {memory.available: 100Mi}
imageGCHighThresholdPercent: 100
imageGCLowThresholdPercent: 99
volumePluginDir: $nd/volume-plugins
clusterDNS: [$API_IP]
clusterDomain: cluster.local
EOF
  # the node's mount namespace; with CARMA_RN_DRA also the paths the DRA driver's hostPaths name: the
  # kubelet's plugin registry and plugin directories (under its --root-dir) and a CDI directory
  # /var/run/cdi is the node's cdi/ always: the device plugin writes its memory-limit hook spec there
  [[ -z "${CARMA_RN_DRA:-}" ]] || mkdir -p "$nd"/kubelet/{plugins_registry,plugins} \
    /var/lib/kubelet/plugins_registry /var/lib/kubelet/plugins
  mkdir -p "$nd/cdi" /var/run/cdi
  unshare -m --propagation private -- sh -c 'mount --bind "$0" /var/lib/kubelet/device-plugins &&
      mount --bind "$2" /var/run/cdi && mount -t tmpfs tmpfs /var/log && mount -t tmpfs tmpfs /run/containerd &&
      { [ -z "$1" ] || { mount --bind "$1/kubelet/plugins_registry" /var/lib/kubelet/plugins_registry &&
        mount --bind "$1/kubelet/plugins" /var/lib/kubelet/plugins; }; } &&
      exec sleep infinity' \
    "$nd/device-plugins" "${CARMA_RN_DRA:+$nd}" "$nd/cdi" &
  holder=$!; echo "$holder" >"$WORK/pids/holder-$name"
  for _ in $(seq 50); do [[ "$(tr '\0' ' ' <"/proc/$holder/cmdline")" == sleep* ]] && break; sleep 0.1; done
  [[ "$(tr '\0' ' ' <"/proc/$holder/cmdline")" == sleep* ]] || die "mount namespace of $name not set up"
  start_containerd "$i"
  for t in busybox pause; do
    ctr --address "$nd/containerd/containerd.sock" -n k8s.io images import --snapshotter "$SNAPSHOTTER" "$img/$t.tar" >>"$WORK/logs/import-$name.log" 2>&1 ||
      die "ctr images import $t on $name: $(tail -n 3 "$WORK/logs/import-$name.log")"
  done
  date +%s >"$nd/kubelet.started"
  start_kubelet "$i"
}
# node_mnt <i>: node i's mount namespace, for nsenter (which execs the command: $! is then its pid).
node_mnt() { echo "--mount=/proc/$(cat "$WORK/pids/holder-$(node_name "$1")")/ns/mnt"; }
# start_containerd <i> / start_kubelet <i>: (re)start node i's containerd or kubelet with the same
# configuration; a restart appends to the same log. start_containerd waits until it answers.
start_containerd() {
  local name nd; name="$(node_name "$1")"; nd="$WORK/nodes/$name"
  nsenter "$(node_mnt "$1")" -- containerd --config "$nd/containerd/config.toml" >>"$WORK/logs/containerd-$name.log" 2>&1 &
  echo $! >"$WORK/pids/containerd-$name"; sleep 0.01
  for _ in $(seq 60); do ctr --address "$nd/containerd/containerd.sock" version >/dev/null 2>&1 && break; sleep 0.5; done
  ctr --address "$nd/containerd/containerd.sock" version >/dev/null || die "containerd of $name did not start"
}
start_kubelet() {
  local name nd; name="$(node_name "$1")"; nd="$WORK/nodes/$name"
  nsenter "$(node_mnt "$1")" -- "$BIN/kubelet" --config "$nd/kubelet-config.yaml" --kubeconfig "$WORK/kubeconfig-$name" \
    --hostname-override "$name" --node-ip "$(node_ip "$1")" --root-dir "$nd/kubelet" --cert-dir "$nd/kubelet/pki" \
    --node-labels "carma.io/e2e=real-node" ${RN_KUBELET_DRA[@]+"${RN_KUBELET_DRA[@]}"} \
    >>"$WORK/logs/kubelet-$name.log" 2>&1 &
  echo $! >"$WORK/pids/kubelet-$name"; sleep 0.01
}

t_nodes0=$(date +%s)
for i in $(seq "$NODES"); do start_node "$i"; log "node $(node_name "$i"): containerd $CONTAINERD_VERSION ($SNAPSHOTTER, runc) + kubelet at $(node_ip "$i"):10250"; done
log "waiting for $NODES nodes to be Ready"
for i in $(seq "$NODES"); do
  for _ in $(seq 240); do k get node "$(node_name "$i")" >/dev/null 2>&1 && break; sleep 0.5; done
done
k wait --for condition=Ready --timeout 180s node -l carma.io/e2e=real-node >/dev/null || {
  k get nodes -o wide >&2; k describe nodes >&2; die "nodes not Ready"; }
t_ready=$(date +%s)
k get nodes -o wide >&2

# ---- pods ----------------------------------------------------------------------------------------
for _ in $(seq 60); do k -n default get serviceaccount default >/dev/null 2>&1 && break; sleep 0.5; done
log "pods: hello (exit 0), oom (32Mi limit), Deployment (2 replicas), DaemonSet"
k apply -f - >/dev/null <<EOF
apiVersion: v1
kind: Pod
metadata: {name: hello, namespace: default}
spec:
  restartPolicy: Never
  terminationGracePeriodSeconds: 1
  containers:
  - name: main
    image: $BUSYBOX_IMAGE
    imagePullPolicy: Never
    command: [sh, -c, 'echo hello; exit 0']
---
apiVersion: v1
kind: Pod
metadata: {name: oom, namespace: default}
spec:
  restartPolicy: Never
  terminationGracePeriodSeconds: 1
  containers:
  - name: main
    image: $BUSYBOX_IMAGE
    imagePullPolicy: Never
    # doubles a shell string until the 32Mi memory cgroup limit kills it
    command: [sh, -c, 'echo allocating; x=0123456789abcdef; while :; do x=\$x\$x; done']
    resources: {limits: {memory: 32Mi, cpu: 500m}}
---
apiVersion: v1
kind: Pod
metadata: {name: api, namespace: default}
spec:
  restartPolicy: Never
  terminationGracePeriodSeconds: 1
  containers:
  - name: main
    image: $BUSYBOX_IMAGE
    imagePullPolicy: Never
    # the kubernetes Service's IP: pod network -> node bridge -> kube-proxy's DNAT -> kube-apiserver.
    # Plain HTTP to its TLS port: Go's TLS server answers that with a 400 naming the mistake. (Debian's
    # busybox-static wget segfaults on https here, so a real TLS request is left to the chart's pods.)
    command: [sh, -c, 'printf "GET /version HTTP/1.0\\r\\n\\r\\n" | nc -w 10 10.96.0.1 443 | tail -n 1']
---
apiVersion: apps/v1
kind: Deployment
metadata: {name: sleeper, namespace: default}
spec:
  replicas: 2
  selector: {matchLabels: {app: sleeper}}
  template:
    metadata: {labels: {app: sleeper}}
    spec:
      terminationGracePeriodSeconds: 1
      topologySpreadConstraints:
      - {maxSkew: 1, topologyKey: kubernetes.io/hostname, whenUnsatisfiable: ScheduleAnyway, labelSelector: {matchLabels: {app: sleeper}}}
      containers:
      - name: main
        image: $BUSYBOX_IMAGE
        imagePullPolicy: Never
        command: [sleep, "3600"]
---
apiVersion: apps/v1
kind: DaemonSet
metadata: {name: per-node, namespace: default}
spec:
  selector: {matchLabels: {app: per-node}}
  template:
    metadata: {labels: {app: per-node}}
    spec:
      terminationGracePeriodSeconds: 1
      containers:
      - name: main
        image: $BUSYBOX_IMAGE
        imagePullPolicy: Never
        command: [sleep, "3600"]
EOF
k wait --for jsonpath='{.status.phase}'=Succeeded --timeout 120s pod/hello >/dev/null || { k describe pod hello >&2; die "hello did not succeed"; }
k wait --for jsonpath='{.status.phase}'=Failed --timeout 120s pod/oom >/dev/null || { k describe pod oom >&2; die "oom did not fail"; }
k wait --for jsonpath='{.status.phase}'=Succeeded --timeout 120s pod/api >/dev/null || { k describe pod api >&2; k logs api >&2; die "api did not reach kube-apiserver"; }
k rollout status deployment/sleeper --timeout 120s >/dev/null || { k describe deployment sleeper >&2; k get pods -o wide >&2; die "Deployment not available"; }
k rollout status daemonset/per-node --timeout 120s >/dev/null || { k get pods -o wide >&2; die "DaemonSet not ready"; }
hello_log="$(k logs hello)"
oom_log="$(k logs oom)"
api_answer="$(k logs api)"
k get pods -o wide >&2
k get nodes,pods -o json >"$WORK/state.json" # the figures of the summary, before the Deployment goes

# Garbage collector: deleting the Deployment in the background leaves its ReplicaSet and pods to the GC.
t_del0=$(date +%s.%N)
k delete deployment sleeper --cascade=background --wait=false >/dev/null
for _ in $(seq 120); do
  [[ -z "$(k get rs,pods -l app=sleeper -o name 2>/dev/null)" ]] && break; sleep 0.5
done
[[ -z "$(k get rs,pods -l app=sleeper -o name 2>/dev/null)" ]] || die "the garbage collector left $(k get rs,pods -l app=sleeper -o name)"
gc_s=$(python3 -c "import time; print(f'{time.time() - $t_del0:.1f}')")

summary="$(python3 - "$WORK/state.json" "$NODES" "$((t_ready - t_nodes0))" "$hello_log" "$oom_log" "$gc_s" "$WORK/nodes" "$api_answer" <<'PY'
import json, os, sys
from datetime import datetime
state, n, ready_s, hello_log, oom_log, gc_s, nodes_dir, api_answer = sys.argv[1:]
items = json.load(open(state))["items"]
ts = lambda s: datetime.strptime(s, "%Y-%m-%dT%H:%M:%SZ").timestamp()
nodes = [i for i in items if i["kind"] == "Node"]
ready = [x for x in nodes if any(c["type"] == "Ready" and c["status"] == "True" for c in x["status"]["conditions"])]
def kubelet_to_ready(x):  # the kubelet's start (this machine's clock) to the Ready condition's transition
    t0 = int(open(os.path.join(nodes_dir, x["metadata"]["name"], "kubelet.started")).read())
    c = [c for c in x["status"]["conditions"] if c["type"] == "Ready"][0]
    return int(ts(c["lastTransitionTime"]) - t0)
node_ready = sorted(kubelet_to_ready(x) for x in ready)
pods = {p["metadata"]["name"]: p for p in items if p["kind"] == "Pod"}
def term(name):
    p = pods[name]; cs = p["status"]["containerStatuses"][0]; t = cs["state"]["terminated"]
    return p, t
hp, ht = term("hello"); op, ot = term("oom")
def started(p, t):  # pod creation to container start, as the API server recorded them (1 s resolution)
    return int(ts(t["startedAt"]) - ts(p["metadata"]["creationTimestamp"]))
def ready_after(p):  # pod creation to its Ready condition
    c = [c for c in p["status"].get("conditions", []) if c["type"] == "Ready" and c["status"] == "True"]
    return int(ts(c[0]["lastTransitionTime"]) - ts(p["metadata"]["creationTimestamp"])) if c else None
dep = [p for k, p in pods.items() if k.startswith("sleeper-")]
dep_ready = sorted(x for x in map(ready_after, dep) if x is not None)
dep_nodes = sorted({p["spec"]["nodeName"] for p in dep})
ds = [p for k, p in pods.items() if k.startswith("per-node-")]
ds_nodes = sorted({p["spec"]["nodeName"] for p in ds if p["status"]["phase"] == "Running"})
runtime = nodes[0]["status"]["nodeInfo"]["containerRuntimeVersion"]
kubelet = nodes[0]["status"]["nodeInfo"]["kubeletVersion"]
print(f"real-node: {len(ready)} of {n} nodes Ready {ready_s} s after the first containerd started "
      f"(kubelet start to Ready {node_ready} s; kubelet {kubelet}, {runtime}); "
      f"hello {ht['reason']} exit {ht['exitCode']} log {hello_log!r} on {hp['spec']['nodeName']} started {started(hp, ht)} s after creation; "
      f"oom {ot['reason']} exit {ot['exitCode']} log {oom_log!r} on {op['spec']['nodeName']}; "
      f"api pod on {pods['api']['spec']['nodeName']} reached Service 10.96.0.1:443 (kube-proxy -> kube-apiserver), answer {api_answer!r}; "
      f"Deployment {len(dep_ready)} of 2 replicas Ready on {len(dep_nodes)} nodes (Ready {dep_ready} s after creation), "
      f"ReplicaSet and pods garbage-collected {gc_s} s after the Deployment's delete; "
      f"DaemonSet pods Running on {len(ds_nodes)} of {n} nodes")
ok = (len(ready) == int(n) and ht["reason"] == "Completed" and ht["exitCode"] == 0 and hello_log == "hello"
      and "HTTPS server" in api_answer and ot["reason"] == "OOMKilled" and ot["exitCode"] == 137 and len(ds_nodes) == int(n) and len(dep_ready) == 2)
sys.exit(0 if ok else 1)
PY
)" || { echo "$summary"; die "a check failed (the line above)"; }
echo "$summary"

if [[ -n "${CARMA_RN_CHART:-}" ]]; then
  # shellcheck source=chart.sh
  source "$HERE/chart.sh"
  # shellcheck source=firsthour.sh
  source "$HERE/firsthour.sh" || die "e2e/real-node/firsthour.sh could not be read"
  firsthour_run || die "a documented command failed, its output differs, or the uninstall left objects (the lines above)"
  if [[ -n "${CARMA_RN_DRA:-}" ]]; then
    # shellcheck source=dra.sh
    source "$HERE/dra.sh" || die "e2e/real-node/dra.sh could not be read"
    dra_run || die "a DRA check failed (the lines above)"
  fi
fi

if [[ -n "${CARMA_RN_HOLD:-}" ]]; then
  log "holding the cluster ${CARMA_RN_HOLD} s; from another shell:"
  log "  nsenter --net=/proc/$$/ns/net --mount=/proc/$$/ns/mnt $KUBECTL --kubeconfig $WORK/kubeconfig get nodes"
  sleep "$CARMA_RN_HOLD" || true
fi
log "done in $(( $(date +%s) - T_START )) s (control plane ready $((t_api - T_START)) s after the start, build included)"
