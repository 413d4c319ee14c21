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
#      on the plain metrics port.
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

echo
if ((${#failures[@]})); then
  echo "chart-security.sh: ${#failures[@]} check(s) failed:"; printf '  - %s\n' "${failures[@]}"; exit 1
fi
echo "chart-security.sh: all checks passed"
