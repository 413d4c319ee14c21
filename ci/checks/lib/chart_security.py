#!/usr/bin/env python3
"""Assertions on the chart's security wiring, for ci/checks/chart-security.sh.

    chart_security.py DIR

DIR holds `helm template` renders named after the values they were made with (see chart-security.sh):
default.yaml, tls-helm.yaml, tls-noclient.yaml, tls-cert-manager.yaml, tls-cert-manager-issuer.yaml,
tls-existing.yaml, namespace.yaml, np-extra.yaml, np-closed.yaml. Checks, per render, what the objects
say to each other: the NetworkPolicy selects the extender's pods and admits the scheduler's pods (by the
labels of the scheduler Deployment's pod template) to the verbs port and the metrics peers to the
metrics port; every Secret a TLS volume projects is rendered (or, with source=existing, left to the
user); cert-manager Certificates carry the right usages, DNS names and issuers; the namespace carries
the privileged Pod Security label. Prints one line per assertion; exit status 1 on any failure.
"""
from __future__ import annotations

import hashlib
import sys
from pathlib import Path

import yaml

failures: list[str] = []


def check(ok: bool, what: str) -> None:
    print(f"  {'ok  ' if ok else 'FAIL'}  {what}")
    if not ok:
        failures.append(what)


def load(path: Path) -> list[dict]:
    return [d for d in yaml.safe_load_all(path.read_text()) if d]


def one(objs, kind, suffix=""):
    found = [d for d in objs if d["kind"] == kind and d["metadata"]["name"].endswith(suffix)]
    return found[0] if len(found) == 1 else None


def all_of(objs, kind):
    return [d for d in objs if d["kind"] == kind]


def extender(objs):
    dep = one(objs, "Deployment", "-scheduler-extender")
    ctr = dep["spec"]["template"]["spec"]["containers"][0]
    return dep, ctr


def scheduler_config(objs):
    for d in all_of(objs, "ConfigMap"):
        text = (d.get("data") or {}).get("config.yaml", "")
        if "KubeSchedulerConfiguration" in text:
            return yaml.safe_load(text)
    return None


def port_of(ctr, flag):
    for a in ctr["args"]:
        if a.startswith(flag + "="):
            return int(a.rsplit(":", 1)[1])
    return None


def policy(name: str, objs, tls: bool, scheduler: bool = True, extra: int = 0, metrics_peers: int = 1):
    np = one(objs, "NetworkPolicy", "-scheduler-extender")
    check(np is not None, f"{name}: one NetworkPolicy for the extender")
    if np is None:
        return
    dep, ctr = extender(objs)
    spec = np["spec"]
    pod_labels = dep["spec"]["template"]["metadata"]["labels"]
    sel = spec["podSelector"]["matchLabels"]
    check(all(pod_labels.get(k) == v for k, v in sel.items()) and sel,
          f"{name}: the policy selects the extender's pods ({sel})")
    check(spec.get("policyTypes") == ["Ingress"], f"{name}: policyTypes [Ingress]")
    rules = spec.get("ingress") or []
    verbs_port = port_of(ctr, "--listen")
    metrics_port = port_of(ctr, "--metrics-listen") if tls else verbs_port
    for r in rules:
        check(bool(r.get("from")), f"{name}: no rule without `from` (it would admit every source)")
    callers = [r for r in rules if any(p["port"] == verbs_port for p in r["ports"]) and
               any("podSelector" in f and "namespaceSelector" not in f for f in r["from"])]
    if scheduler:
        sched = one(objs, "Deployment", "-scheduler")
        slabels = sched["spec"]["template"]["metadata"]["labels"]
        ok = any(all(slabels.get(k) == v for k, v in f["podSelector"]["matchLabels"].items())
                 for r in callers for f in r["from"] if "podSelector" in f)
        check(ok, f"{name}: the scheduler pods may reach the verbs port {verbs_port}")
        # The scheduler's pods are the only pods of the release this rule admits.
        others = [d for d in all_of(objs, "Deployment") + all_of(objs, "DaemonSet")
                  if d is not sched]
        leaked = [d["metadata"]["name"] for d in others for r in callers for f in r["from"]
                  if "podSelector" in f and "namespaceSelector" not in f and
                  all(d["spec"]["template"]["metadata"]["labels"].get(k) == v
                      for k, v in f["podSelector"]["matchLabels"].items())]
        check(not leaked, f"{name}: no other carma pod may call the verbs ({leaked})")
    # Without TLS the metrics share the verbs' port, so its peers count there too.
    on_verbs = sum(len(r["from"]) for r in rules if any(p["port"] == verbs_port for p in r["ports"]))
    want = (1 if scheduler else 0) + extra + (0 if tls else metrics_peers)
    check(on_verbs == want, f"{name}: {want} peer(s) may reach port {verbs_port}, found {on_verbs}")
    if tls:
        on_metrics = sum(len(r["from"]) for r in rules if any(p["port"] == metrics_port for p in r["ports"]))
        check(on_metrics == metrics_peers,
              f"{name}: {metrics_peers} peer(s) may reach the metrics port {metrics_port}, found {on_metrics}")
    prometheus = any(f.get("podSelector", {}).get("matchLabels", {}).get("app.kubernetes.io/name") == "prometheus"
                     for r in rules for f in r["from"] if any(p["port"] == metrics_port for p in r["ports"]))
    check(prometheus == bool(metrics_peers),
          f"{name}: Prometheus pods {'may' if metrics_peers else 'may not'} scrape port {metrics_port}")
    if not scheduler and not extra and not metrics_peers:
        check(rules == [], f"{name}: no peers at all -> ingress [] (deny every source)")


def volume_secrets(pod_spec, volume_name):
    for v in pod_spec.get("volumes", []):
        if v["name"] == volume_name:
            return {s["secret"]["name"]: [i["key"] for i in s["secret"]["items"]]
                    for s in v["projected"]["sources"]}
    return {}


def tls(name: str, objs, source: str, client_auth: bool = True, issuer: str | None = None):
    dep, ctr = extender(objs)
    sched = one(objs, "Deployment", "-scheduler")
    ext_secrets = volume_secrets(dep["spec"]["template"]["spec"], "tls")
    sch_secrets = volume_secrets(sched["spec"]["template"]["spec"], "extender-tls")
    check(bool(ext_secrets) and bool(sch_secrets), f"{name}: both pods mount a TLS volume")
    # The extender never sees the scheduler's key, the scheduler never the extender's.
    ext_keys = {(s, k) for s, ks in ext_secrets.items() for k in ks}
    sch_keys = {(s, k) for s, ks in sch_secrets.items() for k in ks}
    check(not ({k for k in ext_keys if k[1] == "tls.key"} & {k for k in sch_keys if k[1] == "tls.key"}),
          f"{name}: no private key is mounted in both pods")
    cfg = scheduler_config(objs)["extenders"][0]
    check(cfg["enableHTTPS"] is True and cfg["urlPrefix"].startswith("https://"),
          f"{name}: kube-scheduler calls https://")
    has_client = "certFile" in cfg["tlsConfig"] and "keyFile" in cfg["tlsConfig"]
    check(has_client == client_auth, f"{name}: tlsConfig certFile/keyFile {'set' if client_auth else 'absent'}")
    check(any(a.startswith("--client-ca-file=") for a in ctr["args"]) == client_auth,
          f"{name}: --client-ca-file {'passed' if client_auth else 'absent'}")
    svc = one(objs, "Service", "-scheduler-extender")
    host = cfg["tlsConfig"]["serverName"]
    check(host == f"{svc['metadata']['name']}.{svc['metadata']['namespace']}.svc",
          f"{name}: serverName {host} is the Service's DNS name")
    check(any(p["name"] == "metrics" for p in svc["spec"]["ports"]), f"{name}: the Service has a metrics port")
    wanted = set(ext_secrets) | set(sch_secrets)
    secrets = {d["metadata"]["name"]: d for d in all_of(objs, "Secret")}
    certs = {d["spec"]["secretName"]: d for d in all_of(objs, "Certificate")}
    if source == "helm":
        ca = next((d for d in all_of(objs, "Secret") if d["metadata"]["name"].endswith("-extender-ca")), None)
        ann = sched["spec"]["template"]["metadata"].get("annotations", {})
        check(ca is not None and ann.get("checksum/extender-ca") ==
              hashlib.sha256(ca["data"]["tls.crt"].encode()).hexdigest(),
              f"{name}: the scheduler pods carry the checksum of the CA they trust (they read it once)")
        for s in wanted:
            ok = s in secrets and all(k in secrets[s]["data"] for k in set(ext_secrets.get(s, [])) | set(sch_secrets.get(s, [])))
            check(ok, f"{name}: Secret {s} is rendered with every projected key")
        check(not certs, f"{name}: no cert-manager objects")
    elif source == "certManager":
        for s in wanted:
            check(s in certs, f"{name}: a Certificate writes Secret {s}")
        check(not secrets, f"{name}: no Secrets rendered (cert-manager writes them)")
        server = certs.get(next(iter(s for s in ext_secrets if "tls.crt" in ext_secrets[s])))
        if server:
            check("server auth" in server["spec"]["usages"] and host in server["spec"]["dnsNames"],
                  f"{name}: the serving Certificate is for server auth and names {host}")
        for s, keys in sch_secrets.items():
            if "tls.crt" in keys:
                check("client auth" in certs[s]["spec"]["usages"], f"{name}: the client Certificate is for client auth")
        issuers = {d["metadata"]["name"]: d for d in all_of(objs, "Issuer")}
        for c in certs.values():
            ref = c["spec"]["issuerRef"]
            if issuer:
                check(ref["name"] == issuer or c["spec"].get("isCA"),
                      f"{name}: Certificate {c['metadata']['name']} is issued by {ref['kind']}/{ref['name']}")
            else:
                check(ref["kind"] == "Issuer" and ref["name"] in issuers,
                      f"{name}: Certificate {c['metadata']['name']} is issued by a rendered Issuer ({ref['name']})")
        if not issuer:
            ca_issuers = [i for i in issuers.values() if "ca" in i["spec"]]
            check(len(ca_issuers) == 1 and any(c["spec"].get("isCA") and c["spec"]["secretName"] == ca_issuers[0]["spec"]["ca"]["secretName"]
                                               for c in certs.values()),
                  f"{name}: the CA Issuer signs with the chart's own CA Certificate")
        else:
            check(not issuers, f"{name}: no Issuer rendered when issuerRef is given")
    else:
        check(not secrets and not certs, f"{name}: nothing rendered for existing Secrets")
        check(wanted == {"my-extender-tls", "my-scheduler-client-tls"} if client_auth else wanted == {"my-extender-tls"},
              f"{name}: the volumes project the named Secrets ({sorted(wanted)})")


def main() -> int:
    d = Path(sys.argv[1])
    r = {p.stem: load(p) for p in d.glob("*.yaml")}

    print("default values:")
    policy("default", r["default"], tls=False)
    check(not all_of(r["default"], "Namespace"), "default: no Namespace (namespace.create=false)")
    check(not all_of(r["default"], "Secret") and not all_of(r["default"], "Certificate"), "default: no TLS objects")

    print("TLS, certificates generated by Helm:")
    tls("tls-helm", r["tls-helm"], "helm")
    policy("tls-helm", r["tls-helm"], tls=True)
    print("TLS without client certificates:")
    tls("tls-noclient", r["tls-noclient"], "helm", client_auth=False)
    print("TLS from cert-manager, the chart's own CA:")
    tls("tls-cert-manager", r["tls-cert-manager"], "certManager")
    print("TLS from cert-manager, a ClusterIssuer of the user's:")
    tls("tls-cert-manager-issuer", r["tls-cert-manager-issuer"], "certManager", issuer="corp-ca")
    print("TLS from existing Secrets:")
    tls("tls-existing", r["tls-existing"], "existing")

    print("namespace.create=true:")
    ns = all_of(r["namespace"], "Namespace")
    check(len(ns) == 1 and ns[0]["metadata"]["name"] == "carma-system", "namespace: the release namespace is rendered")
    if ns:
        check(ns[0]["metadata"]["labels"].get("pod-security.kubernetes.io/enforce") == "privileged",
              "namespace: labelled pod-security.kubernetes.io/enforce=privileged")

    print("networkPolicy.extenderFrom (2 peers), TLS:")
    policy("np-extra", r["np-extra"], tls=True, extra=2)
    print("no scheduler, no extra peers, no metrics peers:")
    policy("np-closed", r["np-closed"], tls=False, scheduler=False, metrics_peers=0)

    print(f"chart_security: {len(failures)} failure(s)")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
