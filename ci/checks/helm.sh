#!/usr/bin/env bash
# CI check: the Helm chart.
#   1. chart copies (CRDs, dashboards, rules, dcgm counters) match their sources   tools/sync-chart.sh --check
#   2. dashboards match their generator                                              tools/gen-dashboards.py --check
#   3. helm lint (default and non-default values, strict)
#   4. helm template with default values and with ci/checks/values-nondefault.yaml (at 1.30 without the
#      DRA driver, which needs 1.34+, and at 1.35 with it); the values schema rejects bad values;
#      admissionPolicy.gpuClaims=dra renders the extender's DRA-claims webhook, and nothing else does
#   5. deploy/rendered/carma.yaml is the current default render                      tools/render-chart.sh --check
#   6. the values table in charts/carma/README.md is current                         tools/values-table.py --check
#   7. when the carma binary exists (CARMA_BIN, default target/debug/carma): every carma container's
#      arguments in both renders parse with it (`carma <args> --help`)
# Installs Helm into .tools/ (tools/install-helm.sh) when missing. Exits non-zero on any failure.
set -uo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
cd "$ROOT" || exit 1
HELM="$(tools/install-helm.sh | tail -n1)" || { echo "FAIL: could not install helm"; exit 1; }
CHART=charts/carma
NONDEFAULT=ci/checks/values-nondefault.yaml
failures=()
step() { echo; echo "== $*"; }
run() { # run <description> <command...>
  local desc="$1"; shift
  if "$@"; then echo "PASS: $desc"; else echo "FAIL: $desc"; failures+=("$desc"); fi
}

step "helm: $("$HELM" version --short)"

step "chart copies match their sources (crds/, deploy/grafana, deploy/prometheus, deploy/dcgm-exporter)"
run "tools/sync-chart.sh --check" tools/sync-chart.sh --check

step "dashboards are the generator's output"
run "tools/gen-dashboards.py --check" python3 tools/gen-dashboards.py --check

step "helm lint"
run "helm lint --strict (default values)" "$HELM" lint --strict "$CHART"
run "helm lint --strict ($NONDEFAULT)" "$HELM" lint --strict "$CHART" -f "$NONDEFAULT"

step "helm template"
tmp="$(mktemp -d)"; trap 'rm -rf "$tmp"' EXIT
count() { grep -c '^kind:' "$1"; }
if "$HELM" template carma "$CHART" -n carma-system --include-crds --kube-version 1.35.0 > "$tmp/default.yaml"; then
  echo "PASS: helm template (default values): $(count "$tmp/default.yaml") objects"
else failures+=("helm template default"); echo "FAIL: helm template (default values)"; fi
# The DRA driver (resource.k8s.io/v1) needs Kubernetes 1.34+: the 1.30 render leaves it out, the 1.35 one has it.
if "$HELM" template carma "$CHART" -n carma-system --include-crds --kube-version 1.30.0 -f "$NONDEFAULT" \
    --set dra.enabled=false > "$tmp/nondefault.yaml"; then
  echo "PASS: helm template ($NONDEFAULT with dra.enabled=false, kube 1.30): $(count "$tmp/nondefault.yaml") objects"
else failures+=("helm template nondefault"); echo "FAIL: helm template ($NONDEFAULT)"; fi
if "$HELM" template carma "$CHART" -n carma-system --kube-version 1.35.0 -f "$NONDEFAULT" > "$tmp/nondefault-dra.yaml"; then
  echo "PASS: helm template ($NONDEFAULT, kube 1.35): $(count "$tmp/nondefault-dra.yaml") objects"
else failures+=("helm template nondefault 1.35"); echo "FAIL: helm template ($NONDEFAULT, kube 1.35)"; fi

if "$HELM" template carma "$CHART" -n carma-system --kube-version 1.33.1 -f e2e/kind/values-kind.yaml > "$tmp/kind.yaml"; then
  echo "PASS: helm template (e2e/kind/values-kind.yaml): $(count "$tmp/kind.yaml") objects"
else failures+=("helm template kind"); echo "FAIL: helm template (e2e/kind/values-kind.yaml)"; fi

# Every optional branch must appear in the non-default render.
for kind in PodDisruptionBudget ServiceMonitor PrometheusRule ValidatingAdmissionPolicy PriorityClass DaemonSet \
    NetworkPolicy Namespace Certificate Issuer; do
  if grep -q "^kind: $kind\$" "$tmp/nondefault.yaml"; then echo "PASS: non-default render has a $kind"
  else echo "FAIL: non-default render lacks a $kind"; failures+=("nondefault $kind"); fi
done
for needle in "enableHTTPS: true" "--client-ca-file=" "--metrics-listen=0.0.0.0:9889" "certFile: " \
    "pod-security.kubernetes.io/enforce: privileged" "--backend=dcgm" "--mps" "runtimeClassName: nvidia" \
    "kube-scheduler:v1.34.2" "@sha256:"; do
  if grep -qF -- "$needle" "$tmp/nondefault.yaml"; then echo "PASS: non-default render contains '$needle'"
  else echo "FAIL: non-default render lacks '$needle'"; failures+=("nondefault $needle"); fi
done
# The DRA branch (1.35 render): DeviceClass, the driver's DaemonSet with its flags, its least-privilege RBAC
# and the admission policy that keeps each node's driver to its own ResourceSlice.
for needle in "kind: DeviceClass" "- dra-driver" "--plugin-dir=/srv/kubelet/plugins/gpu.carma.io" "--nvidia-cdi" "--mps" \
    "--slots=4" "--dram-activity-cap=0.35" "image: registry.example.com/carma/carma-dra:0.1.0-dra" \
    "expression: 'device.driver == \"gpu.carma.io\"'" "dra-driver-own-node" \
    "message: the carma DRA driver may only write the ResourceSlice of its own node"; do
  if grep -qF -- "$needle" "$tmp/nondefault-dra.yaml"; then echo "PASS: non-default 1.35 render contains '$needle'"
  else echo "FAIL: non-default 1.35 render lacks '$needle'"; failures+=("nondefault-dra $needle"); fi
done

# The operator on DRA claims: its flags and the one extra RBAC rule; without the driver it is refused.
if "$HELM" template carma "$CHART" -n carma-system --kube-version 1.35.0 --set dra.enabled=true --set dra.featureGatesEnabled=true \
    --set operator.gpuClaims=dra --set scheduler.enabled=false > "$tmp/operator-dra.yaml"; then
  for needle in "- --gpu-claims=dra" "- --dra-device-class=carma-gpu" "- --scheduler-name=default-scheduler" \
      'resources: ["resourceclaimtemplates"]'; do
    if grep -qF -- "$needle" "$tmp/operator-dra.yaml"; then echo "PASS: operator.gpuClaims=dra render contains '$needle'"
    else echo "FAIL: operator.gpuClaims=dra render lacks '$needle'"; failures+=("operator-dra $needle"); fi
  done
else failures+=("helm template operator.gpuClaims=dra"); echo "FAIL: helm template operator.gpuClaims=dra"; fi
if grep -qF "resourceclaimtemplates" "$tmp/default.yaml"; then
  echo "FAIL: the default render grants the operator claim templates"; failures+=("default resourceclaimtemplates")
else echo "PASS: the default render grants the operator no claim templates"; fi
if out="$("$HELM" template carma "$CHART" --set operator.gpuClaims=dra 2>&1)"; then
  echo "FAIL: operator.gpuClaims=dra without dra.enabled rendered"; failures+=("operator-dra without driver")
elif grep -qF "operator.gpuClaims=dra needs dra.enabled=true" <<<"$out"; then
  echo "PASS: operator.gpuClaims=dra without dra.enabled is refused with its reason"
else echo "FAIL: operator.gpuClaims=dra without dra.enabled failed without naming why: $out"; failures+=("operator-dra message"); fi

PY="$(tools/install-ci-venv.sh | tail -n1)/bin/python"

# Bare pods on DRA (admissionPolicy.gpuClaims=dra): the extender's mutating webhook, its listener, Service
# port, flags and RBAC rule, with each TLS source's caBundle; none of it in the default render.
step "admissionPolicy.gpuClaims=dra: the extender's DRA-claims webhook"
DRA_WEBHOOK=(--set admissionPolicy.gpuClaims=dra --set dra.enabled=true --set dra.featureGatesEnabled=true --set extender.tls.enabled=true --set operator.gpuClaims=dra)
if "$HELM" template carma "$CHART" -n carma-system --kube-version 1.35.0 "${DRA_WEBHOOK[@]}" > "$tmp/webhook-helm.yaml" 2>"$tmp/err" &&
   "$HELM" template carma "$CHART" -n carma-system --kube-version 1.35.0 "${DRA_WEBHOOK[@]}" --set extender.tls.source=existing \
     --set admissionPolicy.webhook.caBundle=Q0EgUEVN > "$tmp/webhook-existing.yaml" 2>>"$tmp/err" &&
   "$HELM" template carma "$CHART" -n carma-system --kube-version 1.35.0 -f "$NONDEFAULT" --set admissionPolicy.gpuClaims=dra \
     --set operator.gpuClaims=dra > "$tmp/webhook-nondefault.yaml" 2>>"$tmp/err"; then
  run "gpuClaims=dra: webhook (helm CA, existing caBundle, cert-manager injection), Service port, flags, RBAC, NetworkPolicy; default render has none" \
    "$PY" - "$tmp/default.yaml" "$tmp/nondefault.yaml" "$tmp/nondefault-dra.yaml" "$tmp/webhook-helm.yaml" \
      "$tmp/webhook-existing.yaml" "$tmp/webhook-nondefault.yaml" <<'PY'
import sys, yaml
default, nondefault, nondefault_dra, helm_ca, existing, nondefault_webhook = sys.argv[1:]
docs = lambda path: [d for d in yaml.safe_load_all(open(path)) if d]
bad = []
for path in (default, nondefault, nondefault_dra):
    text = open(path).read()
    for needle in ("kind: MutatingWebhookConfiguration", "--admission-listen", "name: admission\n", "targetPort: admission"):
        if needle in text:
            bad.append(f"{path} (gpuClaims=devicePlugin) contains {needle.strip()!r}")

def check(path, *, port, device_class, failure, timeout, ca=None, inject=None):
    d = docs(path)
    one = lambda kind, suffix: [x for x in d if x["kind"] == kind and x["metadata"]["name"].endswith(suffix)]
    whs = one("MutatingWebhookConfiguration", "-dra-claims-for-gpu-pods")
    if len(whs) != 1 or len(whs[0]["webhooks"]) != 1:
        bad.append(f"{path}: want one MutatingWebhookConfiguration *-dra-claims-for-gpu-pods with one webhook")
        return
    mwc = whs[0]
    w = mwc["webhooks"][0]
    (svc,) = one("Service", "-scheduler-extender")
    want = {"name": "dra-claims.carma.io", "admissionReviewVersions": ["v1"], "sideEffects": "NoneOnDryRun",
            "reinvocationPolicy": "Never", "failurePolicy": failure, "timeoutSeconds": timeout,
            "rules": [{"apiGroups": [""], "apiVersions": ["v1"], "operations": ["CREATE"], "resources": ["pods"], "scope": "Namespaced"}],
            "namespaceSelector": {"matchExpressions": [{"key": "kubernetes.io/metadata.name", "operator": "NotIn",
                                                        "values": ["kube-system", "carma-system"]}]}}
    for k, v in want.items():
        if w.get(k) != v:
            bad.append(f"{path}: webhook {k} = {w.get(k)!r}, want {v!r}")
    service = {"namespace": "carma-system", "name": svc["metadata"]["name"], "path": "/mutate-pods", "port": port}
    if w["clientConfig"].get("service") != service:
        bad.append(f"{path}: clientConfig.service {w['clientConfig'].get('service')} != {service}")
    if w["clientConfig"].get("caBundle") != ca:
        bad.append(f"{path}: caBundle {str(w['clientConfig'].get('caBundle'))[:40]!r}, want {str(ca)[:40]!r}")
    got_inject = (mwc["metadata"].get("annotations") or {}).get("cert-manager.io/inject-ca-from")
    if got_inject != inject:
        bad.append(f"{path}: cert-manager.io/inject-ca-from {got_inject!r}, want {inject!r}")
    if inject and not [c for c in d if c["kind"] == "Certificate" and f"carma-system/{c['metadata']['name']}" == inject]:
        bad.append(f"{path}: inject-ca-from names {inject}, which is no Certificate of the render")
    # The same CEL as the scheduler-name policy (one copy, carma.celRequestsCarmaGpu), and only unbound pods.
    vap = one("ValidatingAdmissionPolicy", "-gpu-pods-use-carma-scheduler")[0]
    conds = {c["name"]: c["expression"] for c in w.get("matchConditions", [])}
    if conds.get("requests-carma-gpu") != {c["name"]: c["expression"] for c in vap["spec"]["matchConditions"]}["requests-carma-gpu"]:
        bad.append(f"{path}: matchConditions requests-carma-gpu differs from the ValidatingAdmissionPolicy's")
    if conds.get("not-bound-at-creation") != "!has(object.spec.nodeName) || object.spec.nodeName == ''":
        bad.append(f"{path}: no not-bound-at-creation matchCondition: {conds}")
    if {"name": "admission", "port": port, "targetPort": "admission", "protocol": "TCP"} not in svc["spec"]["ports"]:
        bad.append(f"{path}: Service ports {svc['spec']['ports']} lack admission {port} -> admission")
    (dep,) = one("Deployment", "-scheduler-extender")
    (c,) = dep["spec"]["template"]["spec"]["containers"]
    for arg in (f"--admission-listen=0.0.0.0:{port}", f"--dra-device-class={device_class}", "--tls-cert=/etc/carma/tls/tls.crt"):
        if arg not in c["args"]:
            bad.append(f"{path}: extender args lack {arg}: {c['args']}")
    if {"name": "admission", "containerPort": port, "protocol": "TCP"} not in c["ports"]:
        bad.append(f"{path}: extender container ports {c['ports']} lack admission {port}")
    (role,) = one("ClusterRole", "-scheduler-extender")
    rule = {"apiGroups": ["resource.k8s.io"], "resources": ["resourceclaimtemplates"], "verbs": ["get", "create"]}
    if rule not in role["rules"]:
        bad.append(f"{path}: the extender's ClusterRole lacks {rule}")
    (np,) = one("NetworkPolicy", "-scheduler-extender")
    if {"ports": [{"protocol": "TCP", "port": port}]} not in np["spec"]["ingress"]:
        bad.append(f"{path}: the NetworkPolicy does not open port {port} to the API server: {np['spec']['ingress']}")
    print(f"  ok    {path.rsplit('/', 1)[-1]}: {mwc['metadata']['name']} -> {service['name']}:{port}{service['path']}, "
          f"failurePolicy {failure}, caBundle {'from ' + inject if inject else str(ca)[:16] + '...'}")

ca = next(x for x in docs(helm_ca) if x["kind"] == "Secret" and x["metadata"]["name"] == "carma-extender-ca")["data"]["tls.crt"]
check(helm_ca, port=8890, device_class="carma-gpu", failure="Fail", timeout=5, ca=ca)
check(existing, port=8890, device_class="carma-gpu", failure="Fail", timeout=5, ca="Q0EgUEVN")
check(nondefault_webhook, port=9890, device_class="gpu.carma.io", failure="Ignore", timeout=10,
      inject="carma-system/carma-extender-serving")
print("\n".join(bad) if bad else "the webhook, its listener and RBAC appear with gpuClaims=dra only")
sys.exit(1 if bad else 0)
PY
  mkdir -p "$tmp/no-crds"
  if "$PY" ci/checks/lib/validate_manifests.py --kube-version 1.35.0 --crd-schemas "$tmp/no-crds" "$tmp/webhook-helm.yaml" \
      "$tmp/webhook-existing.yaml" "$tmp/webhook-nondefault.yaml" > "$tmp/validate.log" 2>&1; then
    echo "PASS: gpuClaims=dra renders validate against the Kubernetes 1.35 schemas (strict): $(tail -n1 "$tmp/validate.log")"
  else grep -E "FAIL|validated" "$tmp/validate.log"; echo "FAIL: gpuClaims=dra renders do not validate"; failures+=("gpuClaims=dra schemas"); fi
else failures+=("helm template gpuClaims=dra"); echo "FAIL: helm template admissionPolicy.gpuClaims=dra: $(head -c 300 "$tmp/err")"; fi

# No wildcard verbs, resources or API groups in any RBAC rule; every container sets resources.
run "no RBAC wildcards, resources on every container, non-root where required (default + non-default)" \
  "$PY" - "$tmp/default.yaml" "$tmp/nondefault.yaml" "$tmp/nondefault-dra.yaml" "$tmp/webhook-nondefault.yaml" <<'PY'
import sys, yaml
bad = []
for path in sys.argv[1:]:
    for doc in yaml.safe_load_all(open(path)):
        if not doc:
            continue
        kind, name = doc.get("kind"), doc["metadata"]["name"]
        if kind in ("ClusterRole", "Role"):
            for r in doc.get("rules", []):
                for key in ("verbs", "resources", "apiGroups"):
                    if "*" in r.get(key, []):
                        bad.append(f"{path}: {kind}/{name} has a wildcard in {key}")
        spec = None
        if kind in ("Deployment", "DaemonSet"):
            spec = doc["spec"]["template"]["spec"]
        if spec:
            for c in spec.get("containers", []):
                sc = c.get("securityContext", {})
                if not c.get("resources", {}).get("limits") or not c.get("resources", {}).get("requests"):
                    bad.append(f"{path}: {kind}/{name} container {c['name']} lacks requests/limits")
                if sc.get("readOnlyRootFilesystem") is not True:
                    bad.append(f"{path}: {kind}/{name} container {c['name']} root filesystem is writable")
                if "ALL" not in sc.get("capabilities", {}).get("drop", []):
                    bad.append(f"{path}: {kind}/{name} container {c['name']} does not drop ALL capabilities")
                if sc.get("allowPrivilegeEscalation") is not False and not sc.get("privileged"):
                    bad.append(f"{path}: {kind}/{name} container {c['name']} allows privilege escalation")
            if kind == "Deployment" and spec.get("securityContext", {}).get("runAsNonRoot") is not True:
                bad.append(f"{path}: {kind}/{name} does not run as non-root")
            # /usr/bin: the directory of NVIDIA's CDI hook (enforcement.hookPath), mounted read-only to
            # look for it; /var/run/cdi: where the device plugin writes the hook's spec
            allowed = ("/var/lib/kubelet/device-plugins", "/var/lib/kubelet/pod-resources", "/var/run/cdi", "/usr/bin")
            if name.endswith("-dra-driver"):  # the kubelet's plugin dirs and the CDI dir (dra.* values)
                allowed = ("/var/lib/kubelet/plugins_registry", "/var/lib/kubelet/plugins/gpu.carma.io",
                           "/var/run/cdi", "/srv/kubelet/plugins_registry", "/srv/kubelet/plugins/gpu.carma.io",
                           "/etc/cdi", "/usr/bin")
            hook_mounts = [m for c in spec.get("containers", []) for m in c.get("volumeMounts", [])
                           if m["name"] == "nvidia-cdi-hook"]
            if any(m.get("readOnly") is not True for m in hook_mounts):
                bad.append(f"{path}: {kind}/{name} mounts the CDI hook's host directory writable")
            for v in spec.get("volumes", []):
                if "hostPath" in v and v["hostPath"]["path"] not in allowed:
                    bad.append(f"{path}: {kind}/{name} mounts unexpected hostPath {v['hostPath']['path']}")
        if kind == "ClusterRole" and name.endswith("-dra-driver"):
            # Exactly what dra-driver/src reads and writes (claims.rs, publisher.rs; the Events of
            # withdrawn devices through kube's Recorder: create, patch for a series).
            want = {("resource.k8s.io", "resourceslices"): {"get", "create", "patch"},
                    ("resource.k8s.io", "resourceclaims"): {"get"}, ("", "nodes"): {"get"},
                    ("events.k8s.io", "events"): {"create", "patch"}}
            got = {(g, r): set(rule["verbs"]) for rule in doc["rules"] for g in rule["apiGroups"]
                   for r in rule["resources"]}
            if got != want:
                bad.append(f"{path}: {kind}/{name} rules {sorted((k, sorted(v)) for k, v in got.items())} "
                           f"are not the driver's {sorted((k, sorted(v)) for k, v in want.items())}")
print("\n".join(bad) if bad else "checked RBAC rules, container resources and security contexts")
sys.exit(1 if bad else 0)
PY

step "kube-scheduler's extender verbs follow scheduler.extenderConfig.mode"
# choose (default): one call per pod (filterVerb: choose) and no prioritizeVerb; rank: filter + prioritize.
if "$HELM" template carma "$CHART" -n carma-system --kube-version 1.35.0 --set scheduler.extenderConfig.mode=rank > "$tmp/rank.yaml"; then
  run "extender verbs: default choose without prioritize, mode=rank filter + prioritize" \
    "$PY" - "$tmp/default.yaml" "$tmp/nondefault.yaml" "$tmp/rank.yaml" <<'PY'
import sys, yaml
def extenders(path):
    for doc in yaml.safe_load_all(open(path)):
        for text in ((doc or {}).get("data") or {}).values():
            if isinstance(text, str) and "kind: KubeSchedulerConfiguration" in text:
                return yaml.safe_load(text)["extenders"]
    raise SystemExit(f"{path}: no KubeSchedulerConfiguration")
bad = []
for path, want in ((sys.argv[1], ("choose", None)), (sys.argv[2], ("choose", None)), (sys.argv[3], ("filter", "prioritize"))):
    (e,) = extenders(path)
    got = (e.get("filterVerb"), e.get("prioritizeVerb"))
    if got != want or e.get("bindVerb") != "bind" or e.get("nodeCacheCapable") is not True:
        bad.append(f"{path}: filterVerb, prioritizeVerb {got}, bindVerb {e.get('bindVerb')}, nodeCacheCapable {e.get('nodeCacheCapable')}; want {want}, bind, true")
print("\n".join(bad) if bad else "choose: filterVerb choose, no prioritizeVerb; rank: filter + prioritize; bind and nodeCacheCapable in both")
sys.exit(1 if bad else 0)
PY
else failures+=("helm template mode=rank"); echo "FAIL: helm template --set scheduler.extenderConfig.mode=rank"; fi

step "with dra.enabled the device plugin stays off the DRA nodes (one GPU path per node)"
if "$HELM" template carma "$CHART" -n carma-system --kube-version 1.36.0 --set dra.enabled=true > "$tmp/dra-default.yaml"; then
  run "device plugin affinity: devicePlugin.affinity's terms, each with one dra.nodeSelector label NotIn its value" \
    "$PY" - "$tmp/dra-default.yaml" "$tmp/nondefault-dra.yaml" "$tmp/default.yaml" "$NONDEFAULT" <<'PY'
import sys, yaml
dra_default, nondefault_dra, default, values = sys.argv[1:]
def plugin(path):
    docs = [d for d in yaml.safe_load_all(open(path)) if d]
    ds = [d for d in docs if d["kind"] == "DaemonSet" and d["metadata"]["name"].endswith("-device-plugin")]
    return ds[0]["spec"]["template"]["spec"]
def terms(spec):
    return spec["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
bad = []
off = {"key": "carma.io/gpu-path", "operator": "NotIn", "values": ["dra"]}
if terms(plugin(dra_default)) != [{"matchExpressions": [off]}]:
    bad.append(f"dra.enabled alone: {terms(plugin(dra_default))}")
v = yaml.safe_load(open(values))
user = v["devicePlugin"]["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
want = [{"matchExpressions": t["matchExpressions"] + [{"key": k, "operator": "NotIn", "values": [str(val)]}]}
        for t in user for k, val in sorted(v["dra"]["nodeSelector"].items())]  # helm ranges over keys in order
if terms(plugin(nondefault_dra)) != want:
    bad.append(f"non-default: {terms(plugin(nondefault_dra))} != {want}")
if "affinity" in plugin(default):
    bad.append(f"default render has a device plugin affinity: {plugin(default)['affinity']}")
print("\n".join(bad) if bad else "device plugin kept off DRA nodes; user terms kept; default unchanged")
sys.exit(1 if bad else 0)
PY
else failures+=("helm template dra.enabled"); echo "FAIL: helm template --set dra.enabled=true"; fi

step "the carma binary accepts every argument the chart passes (default + non-default values)"
CARMA_BIN="${CARMA_BIN:-target/debug/carma}"
if [[ -x "$CARMA_BIN" ]]; then
  run "chart arguments parse with $CARMA_BIN" "$PY" ci/checks/lib/check_chart_args.py "$CARMA_BIN" \
    "$tmp/default.yaml" "$tmp/nondefault.yaml" "$tmp/nondefault-dra.yaml" "$tmp/kind.yaml"
  # The webhook's flags (admissionPolicy.gpuClaims=dra): a binary older than them is named, not failed, outside CI.
  if "$CARMA_BIN" scheduler-extender --help 2>/dev/null | grep -q -- "--admission-listen"; then
    run "gpuClaims=dra arguments parse with $CARMA_BIN" "$PY" ci/checks/lib/check_chart_args.py "$CARMA_BIN" \
      "$tmp/webhook-helm.yaml" "$tmp/webhook-nondefault.yaml"
  elif [[ "${CI:-}" == true ]]; then
    echo "FAIL: $CARMA_BIN scheduler-extender has no --admission-listen (admissionPolicy.gpuClaims=dra)"; failures+=("chart arguments: --admission-listen")
  else
    echo "SKIP: $CARMA_BIN predates --admission-listen (rebuild: cargo build -p carma); the gpuClaims=dra arguments were not parsed"
  fi
elif [[ "${CI:-}" == true ]]; then
  echo "FAIL: $CARMA_BIN not built, so the chart's arguments were not checked (CI=true refuses the skip)"; failures+=("chart arguments: no carma binary")
else
  echo "SKIP: $CARMA_BIN not built (cargo build -p carma); under CI=true this fails"
fi

step "tools/build-image.sh tags the image the chart uses by default"
built="$(tools/build-image.sh --print)"
rendered="$(grep -m1 -o 'image: "\{0,1\}[^" ]*carma[^" ]*' "$tmp/default.yaml" | sed 's/^image: "\{0,1\}//')"
if [[ -n "$built" && "$built" == "$rendered" ]]; then echo "PASS: tools/build-image.sh --print = chart default image ($built)"
else echo "FAIL: tools/build-image.sh --print gives '$built', the chart renders '$rendered'"; failures+=("image tag"); fi
custom="$(tools/build-image.sh --repository registry.example.com/ml/carma --print)"
rendered="$("$HELM" template carma "$CHART" -n carma-system --kube-version 1.35.0 --set image.repository=registry.example.com/ml/carma \
  | grep -m1 -o 'image: "\{0,1\}registry.example.com[^" ]*' | sed 's/^image: "\{0,1\}//')"
if [[ "$custom" == "$rendered" ]]; then echo "PASS: --repository matches --set image.repository ($custom)"
else echo "FAIL: --repository gives '$custom', the chart renders '$rendered'"; failures+=("image repository"); fi
mkdir -p "$tmp/no-engine"; ln -s "$(command -v bash)" "$tmp/no-engine/bash"
for t in sed awk head dirname; do ln -s "$(command -v "$t")" "$tmp/no-engine/$t"; done
if out="$(PATH="$tmp/no-engine" tools/build-image.sh 2>&1)"; then
  echo "FAIL: tools/build-image.sh succeeded without docker or podman"; failures+=("build-image without engine")
elif grep -q "neither docker nor podman is installed" <<<"$out"; then
  echo "PASS: without docker or podman it fails with: $(head -c 100 <<<"$out")..."
else echo "FAIL: tools/build-image.sh without an engine said: $out"; failures+=("build-image message"); fi

step "values.schema.json rejects bad values"
# expect_reject <description> <text the error must contain> <helm args...>: the render fails, and
# for the reason named (a schema path, a template's message), not for another one.
expect_reject() {
  local desc="$1" why="$2"; shift 2
  if "$HELM" template carma "$CHART" --kube-version 1.35.0 "$@" >/dev/null 2>"$tmp/err"; then
    echo "FAIL: the chart accepted $desc"; failures+=("chart accepts $desc")
  elif grep -qF -- "$why" "$tmp/err"; then
    echo "PASS: the chart rejects $desc ($(grep -m1 -F -- "$why" "$tmp/err" | head -c 140))"
  else echo "FAIL: the chart rejects $desc, but not for '$why': $(head -c 200 "$tmp/err")"; failures+=("rejects $desc otherwise"); fi
}
expect_reject "an unknown policy" "at '/placement/policy'" --set placement.policy=worst-fit
expect_reject "a cap above 1" "at '/placement/smActivityCap'" --set-json placement.smActivityCap=1.5
expect_reject "an unknown backend" "at '/devicePlugin/backend'" --set devicePlugin.backend=rocm
expect_reject "a misspelt key" "replicasPerGPU" --set devicePlugin.replicasPerGPU=8
expect_reject "zero replicas per GPU" "at '/devicePlugin/replicasPerGpu'" --set devicePlugin.replicasPerGpu=0
expect_reject "a GpuNode risk deadband of 0" "at '/devicePlugin/publish/riskDelta'" --set-json devicePlugin.publish.riskDelta=0
expect_reject "a heartbeat the staleness limit does not outlast" "must exceed devicePlugin.publish.heartbeatSeconds" --set devicePlugin.publish.heartbeatSeconds=600
expect_reject "dra.enabled as a string" "at '/dra/enabled'" --set-string dra.enabled=yes
expect_reject "a relative DRA plugin directory" "at '/dra/pluginDir'" --set dra.enabled=true --set dra.pluginDir=plugins/gpu.carma.io
expect_reject "a DRA gate margin of 0.5" "at '/dra/gateReopenMargin'" --set dra.enabled=true --set-json dra.gateReopenMargin=0.5
expect_reject "dra.enabled below Kubernetes 1.34" "1.34" --set dra.enabled=true --kube-version 1.33.0
expect_reject "dra.enabled on Kubernetes 1.35 without its feature gates" "needs the feature gates DRAConsumableCapacity and DRADeviceTaints" --set dra.enabled=true
if "$HELM" template carma "$CHART" --kube-version 1.36.0 --set dra.enabled=true >/dev/null 2>"$tmp/err" &&
   "$HELM" template carma "$CHART" --kube-version 1.35.0 --set dra.enabled=true --set dra.featureGatesEnabled=true >/dev/null 2>>"$tmp/err"; then
  echo "PASS: dra.enabled renders on 1.36 as is, and on 1.35 once dra.featureGatesEnabled says the gates are on"
else echo "FAIL: dra.enabled did not render on 1.36, or on 1.35 with dra.featureGatesEnabled: $(head -c 300 "$tmp/err")"; failures+=("dra on 1.36 / with gates"); fi

expect_reject "an unknown admissionPolicy.otherScheduler" "at '/admissionPolicy/otherScheduler'" --set admissionPolicy.otherScheduler=ignore
expect_reject "an unknown admissionPolicy.gpuClaims" "at '/admissionPolicy/gpuClaims'" --set admissionPolicy.gpuClaims=claims
expect_reject "an unknown webhook failurePolicy" "at '/admissionPolicy/webhook/failurePolicy'" --set admissionPolicy.webhook.failurePolicy=Retry
expect_reject "a webhook timeout above 30 s" "at '/admissionPolicy/webhook/timeoutSeconds'" --set admissionPolicy.webhook.timeoutSeconds=31
expect_reject "a caBundle that is not base64" "at '/admissionPolicy/webhook/caBundle'" --set "admissionPolicy.webhook.caBundle=-----BEGIN CERTIFICATE-----"
# What gpuClaims=dra needs, each refused with the fix.
DRA_ON=(--set dra.enabled=true --set dra.featureGatesEnabled=true)
expect_reject "gpuClaims=dra without dra.enabled" "admissionPolicy.gpuClaims=dra needs dra.enabled=true" \
  --set admissionPolicy.gpuClaims=dra --set extender.tls.enabled=true
expect_reject "gpuClaims=dra without the extender" "admissionPolicy.gpuClaims=dra needs extender.enabled=true" \
  --set admissionPolicy.gpuClaims=dra "${DRA_ON[@]}" --set extender.enabled=false --set scheduler.enabled=false --set extender.tls.enabled=true
expect_reject "gpuClaims=dra without extender TLS" "the API server calls admission webhooks over HTTPS only: set extender.tls.enabled=true" \
  --set admissionPolicy.gpuClaims=dra "${DRA_ON[@]}"
expect_reject "gpuClaims=dra with existing certificates and no caBundle" "needs admissionPolicy.webhook.caBundle" \
  --set admissionPolicy.gpuClaims=dra "${DRA_ON[@]}" --set extender.tls.enabled=true --set extender.tls.source=existing
expect_reject "gpuClaims=dra without the admission policies" "admissionPolicy.gpuClaims=dra needs admissionPolicy.enabled=true" \
  --set admissionPolicy.gpuClaims=dra "${DRA_ON[@]}" --set extender.tls.enabled=true --set admissionPolicy.enabled=false
expect_reject "the webhook port equal to the metrics port" "admissionPolicy.webhook.port must differ" \
  --set admissionPolicy.gpuClaims=dra "${DRA_ON[@]}" --set extender.tls.enabled=true --set operator.gpuClaims=dra --set admissionPolicy.webhook.port=8889
expect_reject "gpuClaims=dra while the operator's attempts ask for carma.io/gpu" "admissionPolicy.gpuClaims=dra needs operator.gpuClaims=dra" \
  --set admissionPolicy.gpuClaims=dra "${DRA_ON[@]}" --set extender.tls.enabled=true
# With gpuClaims=dra the webhook takes carma.io/gpu out of a pod, so nothing is steered to carma's
# scheduler on 1.36 (a DRA cluster may run none), while the refusal of what is left stays.
if out="$("$HELM" template carma "$CHART" --kube-version 1.36.0 --set admissionPolicy.gpuClaims=dra "${DRA_ON[@]}" \
    --set extender.tls.enabled=true --set operator.gpuClaims=dra 2>&1)"; then
  if grep -q "^kind: MutatingAdmissionPolicy$" <<<"$out"; then
    echo "FAIL: gpuClaims=dra on 1.36 still renders the steering MutatingAdmissionPolicy"; failures+=("gpuClaims=dra steering")
  elif grep -q "^kind: ValidatingAdmissionPolicy$" <<<"$out" && grep -q "^kind: MutatingWebhookConfiguration$" <<<"$out"; then
    echo "PASS: gpuClaims=dra on 1.36: the webhook and the refusal, no steering"
  else echo "FAIL: gpuClaims=dra on 1.36 lacks the webhook or the refusal"; failures+=("gpuClaims=dra 1.36 render"); fi
else echo "FAIL: helm template gpuClaims=dra --kube-version 1.36.0: $(head -c 300 <<<"$out")"; failures+=("gpuClaims=dra 1.36"); fi

step "GPU pods of other schedulers: steered on 1.36 (MutatingAdmissionPolicy v1), refused before it or when asked"
# has_map <args...>: whether the render holds the steering policy and its binding, and the policy sets
# carma's scheduler name.
has_map() {
  "$HELM" template carma "$CHART" -n carma-system "$@" > "$tmp/map.yaml" 2>"$tmp/err" || return 2
  grep -q '^kind: MutatingAdmissionPolicy$' "$tmp/map.yaml" && grep -q '^kind: MutatingAdmissionPolicyBinding$' "$tmp/map.yaml" &&
    grep -qF 'spec: Object.spec{schedulerName: "carma-scheduler"}' "$tmp/map.yaml"
}
if has_map --kube-version 1.36.0; then echo "PASS: the 1.36 render steers (MutatingAdmissionPolicy and binding)"
else echo "FAIL: the 1.36 render has no steering policy: $(head -c 200 "$tmp/err")"; failures+=("steering on 1.36"); fi
if has_map --kube-version 1.35.0; then echo "FAIL: the 1.35 render steers, but 1.35 serves no MutatingAdmissionPolicy v1"; failures+=("steering on 1.35")
else echo "PASS: the 1.35 render leaves steering out (the validation refuses instead)"; fi
if has_map --kube-version 1.36.0 --set admissionPolicy.otherScheduler=refuse; then echo "FAIL: otherScheduler=refuse still steers"; failures+=("refuse steers")
else echo "PASS: otherScheduler=refuse leaves steering out"; fi
if has_map --kube-version 1.35.0 --api-versions admissionregistration.k8s.io/v1/MutatingAdmissionPolicy; then
  echo "PASS: a cluster that serves MutatingAdmissionPolicy v1 (capability) steers whatever its version"
else echo "FAIL: the MutatingAdmissionPolicy v1 capability does not turn steering on"; failures+=("steering by capability"); fi

step "deploy/rendered/carma.yaml is current"
run "tools/render-chart.sh --check" tools/render-chart.sh --check

step "charts/carma/README.md values table is current"
run "tools/values-table.py --check" "$PY" tools/values-table.py --check

echo
if ((${#failures[@]})); then
  echo "helm.sh: ${#failures[@]} check(s) failed:"; printf '  - %s\n' "${failures[@]}"; exit 1
fi
echo "helm.sh: all checks passed"
