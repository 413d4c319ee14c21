#!/usr/bin/env bash
# CI check: the chart's security wiring.
#   1. renders with the security-relevant values (extender TLS from Helm-generated certificates, from
#      cert-manager with the chart's own CA or a ClusterIssuer, from existing Secrets, without client
#      certificates; namespace.create; NetworkPolicy peers) validate against the Kubernetes schemas
#      (strict) and ci/checks/schemas/ (cert-manager Certificate / Issuer, KubeSchedulerConfiguration);
#   2. what the objects say to each other (ci/checks/lib/chart_security.py): the NetworkPolicy admits
#      only the scheduler's pods to the verbs port and Prometheus to the metrics port, or nobody; TLS
#      volumes project Secrets that exist and no private key is in both pods; Certificates carry the
#      right usages, names and issuers; the namespace label pod-security.kubernetes.io/enforce=privileged;
#   3. mutual TLS with the real binary (ci/checks/lib/extender_tls.py): the Helm-generated certificates,
#      laid out as the pods' projected volumes show them, let "kube-scheduler" (its tlsConfig files) call
#      /filter, while no client certificate or one from another CA is refused; probes and /metrics answer
#      on the plain metrics port;
#   4. upgrades keep those certificates: `helm template --dry-run=server` against a read-only stand-in
#      of the API server (ci/checks/lib/lookup_apiserver.py) serving the installed Secrets reuses them,
#      signs a deleted client certificate again with the stored CA, and starts over without the CA.
# Env: CARMA_BIN (default target/debug/carma; build with `cargo build -p carma`). Exits non-zero on any
# failure.
set -uo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
cd "$ROOT" || exit 1
HELM="$(tools/install-helm.sh | tail -n1)" || { echo "FAIL: could not install helm"; exit 1; }
VENV="$(tools/install-ci-venv.sh | tail -n1)" || { echo "FAIL: could not create the CI venv"; exit 1; }
export PATH="$VENV/bin:$PATH"
PY="$VENV/bin/python"
CARMA_BIN="${CARMA_BIN:-target/debug/carma}"
tmp="$(mktemp -d)"; trap 'rm -rf "$tmp"' EXIT
mkdir -p "$tmp/renders" "$tmp/crd-schemas"
failures=()
step() { echo; echo "== $*"; }

render() { # render <name> <helm args...>
  local name="$1"; shift
  if "$HELM" template carma charts/carma -n carma-system --kube-version 1.35.0 "$@" > "$tmp/renders/$name.yaml" 2>"$tmp/err"; then
    echo "PASS: helm template ($name): $(grep -c '^kind:' "$tmp/renders/$name.yaml") objects"
  else
    echo "FAIL: helm template ($name): $(head -c 400 "$tmp/err")"; failures+=("render $name")
  fi
}

step "renders"
TLS=(--set extender.tls.enabled=true)
render default
render tls-helm "${TLS[@]}"
render tls-helm-other-ca "${TLS[@]}"
render tls-noclient "${TLS[@]}" --set extender.tls.clientAuth=false
render tls-cert-manager "${TLS[@]}" --set extender.tls.source=certManager
render tls-cert-manager-issuer "${TLS[@]}" --set extender.tls.source=certManager \
  --set extender.tls.certManager.issuerRef.name=corp-ca --set extender.tls.certManager.issuerRef.kind=ClusterIssuer
render tls-existing "${TLS[@]}" --set extender.tls.source=existing \
  --set extender.tls.secretName=my-extender-tls --set extender.tls.clientSecretName=my-scheduler-client-tls
render namespace --set namespace.create=true
render np-extra "${TLS[@]}" --set-json 'networkPolicy.extenderFrom=[{"namespaceSelector":{"matchLabels":{"kubernetes.io/metadata.name":"kube-system"}},"podSelector":{"matchLabels":{"component":"kube-scheduler"}}},{"ipBlock":{"cidr":"10.0.0.0/8"}}]'
render np-closed --set scheduler.enabled=false --set-json 'networkPolicy.metricsFrom=[]'

step "schemas (Kubernetes 1.35 strict; cert-manager and KubeSchedulerConfiguration schemas from ci/checks/schemas)"
if "$PY" ci/checks/lib/validate_manifests.py --kube-version 1.35.0 --crd-schemas "$tmp/crd-schemas" \
    "$tmp"/renders/*.yaml > "$tmp/validate.log" 2>&1; then
  echo "PASS: $(tail -n1 "$tmp/validate.log")"
else
  grep -E "FAIL|validated" "$tmp/validate.log"; failures+=("schemas")
fi
for kind in NetworkPolicy Namespace Certificate Issuer; do
  if grep -qx "kind: $kind" "$tmp"/renders/*.yaml && grep -q "\[.*$kind\|$kind/" "$tmp/validate.log"; then
    echo "PASS: a $kind was rendered and validated"
  else echo "FAIL: no $kind validated"; failures+=("no $kind"); fi
done

step "the bad values are refused"
expect_reject() { # expect_reject <description> <helm args...>
  local desc="$1"; shift
  if "$HELM" template carma charts/carma "$@" >/dev/null 2>"$tmp/err"; then
    echo "FAIL: accepted $desc"; failures+=("accepts $desc")
  else echo "PASS: rejects $desc ($(grep -m1 -o "at '[^']*'.*\|execution error.*" "$tmp/err" | head -c 160))"; fi
}
expect_reject "an unknown TLS source" --set extender.tls.source=vault
expect_reject "a NetworkPolicy peer that is not a peer" --set-json 'networkPolicy.metricsFrom=[{"pods":"all"}]'
expect_reject "the metrics port equal to the verbs port with TLS" "${TLS[@]}" --set extender.metricsPort=8888

step "what the objects say to each other"
if "$PY" ci/checks/lib/chart_security.py "$tmp/renders"; then echo "PASS: chart_security.py"
else failures+=("chart_security.py"); fi

step "mutual TLS with the real binary ($CARMA_BIN) and the Helm-generated certificates"
if [[ -x "$CARMA_BIN" ]]; then
  if "$PY" ci/checks/lib/extender_tls.py "$CARMA_BIN" "$tmp/renders/tls-helm.yaml" \
      "$tmp/renders/tls-helm-other-ca.yaml" deploy/examples/snapshot.yaml; then
    echo "PASS: extender_tls.py"
  else failures+=("extender_tls.py"); fi
else
  echo "FAIL: $CARMA_BIN not found (cargo build -p carma, or set CARMA_BIN)"; failures+=("no carma binary")
fi

step "upgrades keep the Helm-generated certificates (helm template --dry-run=server: lookup against ci/checks/lib/lookup_apiserver.py)"
# The cluster state of a release installed from tls-helm.yaml, served read-only; an "upgrade" render
# must reuse what is there. Three states: all Secrets present; the client Secret deleted; the CA deleted.
PORT="$("$PY" -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')"
cat > "$tmp/kubeconfig" <<KUBECONFIG
apiVersion: v1
kind: Config
clusters: [{name: lookup, cluster: {server: "http://127.0.0.1:$PORT"}}]
users: [{name: none, user: {}}]
contexts: [{name: lookup, context: {cluster: lookup, user: none}}]
current-context: lookup
KUBECONFIG
without() { # without <secret name or ""> <in> <out>: the render minus one Secret
  "$PY" - "$@" <<'PY'
import sys, yaml
drop, src, dst = sys.argv[1:4]
docs = [d for d in yaml.safe_load_all(open(src)) if d and not (d["kind"] == "Secret" and d["metadata"]["name"] == drop)]
yaml.safe_dump_all(docs, open(dst, "w"))
PY
}
upgrade() { # upgrade <state file> <out>: render against that state
  "$PY" ci/checks/lib/lookup_apiserver.py "$PORT" "$1" & local server=$!
  local ok=1
  for _ in $(seq 50); do curl -fsS -o /dev/null "http://127.0.0.1:$PORT/version" 2>/dev/null && break; sleep 0.1; done
  KUBECONFIG="$tmp/kubeconfig" "$HELM" template carma charts/carma -n carma-system --dry-run=server \
    --disable-openapi-validation "${TLS[@]}" > "$2" 2>"$tmp/err" || { ok=0; head -c 400 "$tmp/err"; }
  kill "$server"; wait "$server" 2>/dev/null
  ((ok))
}
compare() { # compare <before> <after> <secret=same|new>...
  "$PY" - "$@" <<'PY'
import sys, yaml
def secrets(f):
    docs = [d for d in yaml.safe_load_all(open(f)) if d]
    out = {d["metadata"]["name"]: d["data"] for d in docs if d["kind"] == "Secret"}
    # kube-scheduler reads its CA once: its pods must roll exactly when the CA changes.
    out["scheduler-pods"] = next(d["spec"]["template"]["metadata"]["annotations"]["checksum/extender-ca"]
                                 for d in docs if d["kind"] == "Deployment" and d["metadata"]["name"] == "carma-scheduler")
    return out
a, b = secrets(sys.argv[1]), secrets(sys.argv[2])
bad = 0
for spec in sys.argv[3:]:
    name, want = spec.split("=")
    same = a.get(name) == b.get(name)
    ok = same if want == "same" else (not same and name in b)
    print(f"  {'ok  ' if ok else 'FAIL'}  {name}: {'kept' if same else 'new'} (expected {'kept' if want == 'same' else 'new'})")
    bad += not ok
sys.exit(1 if bad else 0)
PY
}
CA=carma-extender-ca; SRV=carma-extender-tls; CLI=carma-scheduler-client-tls
cp "$tmp/renders/tls-helm.yaml" "$tmp/state-all.yaml"
without "$CLI" "$tmp/renders/tls-helm.yaml" "$tmp/state-no-client.yaml"
without "$CA" "$tmp/renders/tls-helm.yaml" "$tmp/state-no-ca.yaml"
if upgrade "$tmp/state-all.yaml" "$tmp/up-all.yaml" && compare "$tmp/renders/tls-helm.yaml" "$tmp/up-all.yaml" "$CA=same" "$SRV=same" "$CLI=same" scheduler-pods=same; then
  echo "PASS: an upgrade keeps the CA and both certificates"
else failures+=("upgrade keeps certificates"); echo "FAIL: an upgrade does not keep the certificates"; fi
if upgrade "$tmp/state-no-client.yaml" "$tmp/up-no-client.yaml" && compare "$tmp/renders/tls-helm.yaml" "$tmp/up-no-client.yaml" "$CA=same" "$SRV=same" "$CLI=new" scheduler-pods=same; then
  echo "PASS: a deleted client Secret is signed again, the rest kept"
  if [[ -x "$CARMA_BIN" ]] && "$PY" ci/checks/lib/extender_tls.py "$CARMA_BIN" "$tmp/up-no-client.yaml" \
      "$tmp/renders/tls-helm-other-ca.yaml" deploy/examples/snapshot.yaml > "$tmp/tls2.log" 2>&1; then
    echo "PASS: the re-signed client certificate is accepted by the extender (same CA)"
  else tail -n 20 "$tmp/tls2.log"; failures+=("re-signed client certificate"); fi
else failures+=("upgrade without client Secret"); echo "FAIL: a deleted client Secret"; fi
if upgrade "$tmp/state-no-ca.yaml" "$tmp/up-no-ca.yaml" && compare "$tmp/renders/tls-helm.yaml" "$tmp/up-no-ca.yaml" "$CA=new" "$SRV=new" "$CLI=new" scheduler-pods=new; then
  echo "PASS: without the CA, everything is made anew"
else failures+=("upgrade without CA"); echo "FAIL: a deleted CA Secret"; fi

echo
if ((${#failures[@]})); then
  echo "chart-security.sh: ${#failures[@]} check(s) failed:"; printf '  - %s\n' "${failures[@]}"; exit 1
fi
echo "chart-security.sh: all checks passed"
