#!/usr/bin/env python3
"""Run one container of a rendered chart workload as a local process, the way its pod would run it.

The container's command and args, its environment (fieldRef values resolved for the given pod and node),
its ConfigMap, Secret and projected (ConfigMap and Secret sources) volumes, read from the manifest, written
out and bind-mounted at their mountPath, the ServiceAccount token
directory at /var/run/secrets/kubernetes.io/serviceaccount and any extra host directories are set up in a
private mount namespace (`unshare -m`), and then the process is exec'd in place of this script, so the
caller's PID is the container's. Only the listen addresses are changed (`--addr HOST:PORT=HOST:PORT`),
because every "pod" here shares the host's network.

    podrun.py MANIFEST Deployment/carma-operator --container operator --pod-name carma-operator-0 \
        --token-dir DIR --bin carma=/path/to/carma --addr 0.0.0.0:8080=127.0.0.1:31001 [--node NAME] \
        [--mount HOSTDIR:PATH] [--workdir DIR]
"""
import argparse
import base64
import os
import re
import shlex
import sys

import yaml

SA_PATH = "/var/run/secrets/kubernetes.io/serviceaccount"


def find(manifest, ref):
    kind, _, name = ref.partition("/")
    with open(manifest) as f:
        for doc in yaml.safe_load_all(f):
            if doc and doc.get("kind") == kind and doc["metadata"]["name"] == name:
                return doc
    sys.exit(f"podrun: {ref} is not in {manifest}")


def configmaps(manifest):
    out = {}
    with open(manifest) as f:
        for doc in yaml.safe_load_all(f):
            if doc and doc.get("kind") == "ConfigMap":
                out[doc["metadata"]["name"]] = doc.get("data") or {}
    return out


def secrets(manifest):
    """Secrets of the manifest (the chart's Helm-generated certificates), data decoded to bytes."""
    out = {}
    with open(manifest) as f:
        for doc in yaml.safe_load_all(f):
            if doc and doc.get("kind") == "Secret":
                data = {k: base64.b64decode(v) for k, v in (doc.get("data") or {}).items()}
                data.update({k: v.encode() for k, v in (doc.get("stringData") or {}).items()})
                out[doc["metadata"]["name"]] = data
    return out


def source_files(kind, name, items, store):
    """The files one ConfigMap or Secret source projects: every key, or the listed items."""
    data = store.get(name)
    if data is None:
        sys.exit(f"podrun: {kind} {name} is not in the manifest")
    if not items:
        return {k: v for k, v in data.items()}
    out = {}
    for it in items:
        if it["key"] not in data:
            sys.exit(f"podrun: {kind} {name} has no key {it['key']}")
        out[it["path"]] = data[it["key"]]
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("manifest")
    ap.add_argument("workload")
    ap.add_argument("--container", required=True)
    ap.add_argument("--pod-name", required=True)
    ap.add_argument("--node", default="control-plane")
    ap.add_argument("--token-dir", required=True)
    ap.add_argument("--bin", action="append", default=[], help="IMAGE-OR-COMMAND=PATH")
    ap.add_argument("--addr", action="append", default=[], help="FROM=TO listen address rewrite")
    ap.add_argument("--mount", action="append", default=[], help="HOSTDIR:PATH")
    ap.add_argument("--workdir", required=True)
    a = ap.parse_args()

    wl = find(a.manifest, a.workload)
    spec = wl["spec"]["template"]["spec"]
    ns = wl["metadata"]["namespace"]
    c = next((c for c in spec["containers"] if c["name"] == a.container), None)
    if c is None:
        sys.exit(f"podrun: {a.workload} has no container {a.container}")
    field = {
        "metadata.name": a.pod_name,
        "metadata.namespace": ns,
        "spec.nodeName": a.node,
        "status.hostIP": "127.0.0.1",
        "status.podIP": "127.0.0.1",
        "spec.serviceAccountName": spec.get("serviceAccountName", "default"),
    }
    env = {k: v for k, v in os.environ.items() if k in ("PATH", "HOME", "KUBERNETES_SERVICE_HOST", "KUBERNETES_SERVICE_PORT", "RUST_BACKTRACE")}
    for e in c.get("env", []):
        if "value" in e:
            env[e["name"]] = str(e["value"])
        elif "fieldRef" in e.get("valueFrom", {}):
            env[e["name"]] = field[e["valueFrom"]["fieldRef"]["fieldPath"]]
        else:
            sys.exit(f"podrun: env {e['name']}: only value and fieldRef are supported")

    def expand(s):  # $(VAR) as kubelet expands it
        return re.sub(r"\$\(([A-Za-z_][A-Za-z0-9_]*)\)", lambda m: env.get(m.group(1), m.group(0)), s)

    argv = [expand(x) for x in (c.get("command") or []) + (c.get("args") or [])]
    for rule in a.addr:
        frm, to = rule.split("=", 1)
        argv = [x.replace(frm, to) for x in argv]
    bins = dict(b.split("=", 1) for b in a.bin)
    image = c["image"].split("@")[0].rsplit(":", 1)[0].rsplit("/", 1)[-1]
    if c.get("command"):
        exe = bins.get(argv[0]) or sys.exit(f"podrun: no --bin for command {argv[0]}")
        argv = [exe] + argv[1:]
    else:
        exe = bins.get(image) or sys.exit(f"podrun: no --bin for image {image}")
        argv = [exe] + argv

    mounts = [(a.token_dir, SA_PATH)]
    cms = {n: {k: v.encode() for k, v in d.items()} for n, d in configmaps(a.manifest).items()}
    secs = secrets(a.manifest)
    vols = {v["name"]: v for v in spec.get("volumes", [])}
    for vm in c.get("volumeMounts", []):
        v = vols[vm["name"]]
        files = {}
        if "configMap" in v:
            files = source_files("ConfigMap", v["configMap"]["name"], v["configMap"].get("items"), cms)
        elif "secret" in v:
            files = source_files("Secret", v["secret"]["secretName"], v["secret"].get("items"), secs)
        elif "projected" in v:
            for src in v["projected"].get("sources", []):
                if "configMap" in src:
                    files.update(source_files("ConfigMap", src["configMap"]["name"], src["configMap"].get("items"), cms))
                elif "secret" in src:
                    files.update(source_files("Secret", src["secret"]["name"], src["secret"].get("items"), secs))
        else:
            continue  # emptyDir and the like: the host's directory serves
        d = os.path.join(a.workdir, "volumes", a.pod_name, vm["name"])
        os.makedirs(d, exist_ok=True)
        for k, data in files.items():
            path = os.path.join(d, k)
            with open(path, "wb") as f:
                f.write(data)
            os.chmod(path, 0o440 if "configMap" not in v else 0o644)
        mounts.append((d, vm["mountPath"]))
    for m in a.mount:
        src, dst = m.split(":", 1)
        mounts.append((src, dst))

    script = []
    for src, dst in mounts:
        os.makedirs(dst, exist_ok=True)  # the mount point on the host; empty and harmless
        script.append(f"mount --bind {shlex.quote(src)} {shlex.quote(dst)}")
    script.append('exec "$@"')
    os.execve("/usr/bin/unshare", ["unshare", "-m", "--propagation", "private", "--", "sh", "-c",
                                   " && ".join(script), "sh"] + argv, env)


if __name__ == "__main__":
    main()
