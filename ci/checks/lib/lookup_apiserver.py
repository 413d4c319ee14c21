#!/usr/bin/env python3
"""A read-only stand-in for the Kubernetes API, enough for Helm's `lookup` of Secrets and Namespaces.

    lookup_apiserver.py PORT OBJECTS.yaml [RELEASE NAMESPACE]

Serves, on 127.0.0.1:PORT over plain HTTP, the discovery documents Helm needs (/version, /api,
/api/v1, /apis) and GET of the Secrets and Namespaces in OBJECTS.yaml (a multi-document YAML, e.g. a
previous `helm template` output): the cluster state `helm template --dry-run=server` then sees, with
the ownership annotations Helm gives the objects of release RELEASE in NAMESPACE (default carma,
carma-system). Every other path is 404. Used by ci/checks/chart-security.sh to check that an upgrade reuses the extender's
Helm-generated certificates instead of making new ones. Stops on SIGTERM.
"""
from __future__ import annotations

import json
import sys
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import yaml


def main() -> int:
    port, path = int(sys.argv[1]), sys.argv[2]
    release, release_ns = (sys.argv[3], sys.argv[4]) if len(sys.argv) > 4 else ("carma", "carma-system")
    owned = {"meta.helm.sh/release-name": release, "meta.helm.sh/release-namespace": release_ns}
    objects: dict[str, dict] = {}
    # Discovery: every apiVersion/kind of OBJECTS.yaml (Helm maps each rendered object through it).
    kinds: dict[str, dict[str, bool]] = {}
    for d in yaml.safe_load_all(open(path)):
        if not d:
            continue
        kinds.setdefault(d["apiVersion"], {})[d["kind"]] = "namespace" in d["metadata"]
        d["metadata"].setdefault("annotations", {}).update(owned)
        if d["kind"] == "Secret":
            ns, name = d["metadata"]["namespace"], d["metadata"]["name"]
            objects[f"/api/v1/namespaces/{ns}/secrets/{name}"] = d
        elif d["kind"] == "Namespace":
            objects[f"/api/v1/namespaces/{d['metadata']['name']}"] = d
    kinds.setdefault("v1", {}).update({"Secret": True, "Namespace": False})

    def plural(kind: str) -> str:
        k = kind.lower()
        return k[:-1] + "ies" if k.endswith("y") else k + "es" if k.endswith("s") else k + "s"

    def resource_list(gv: str) -> dict:
        return {"kind": "APIResourceList", "groupVersion": gv, "resources": [
            {"name": plural(k), "singularName": k.lower(), "namespaced": ns, "kind": k,
             "verbs": ["get", "list"]} for k, ns in sorted(kinds[gv].items())]}

    fixed = {
        "/version": {"major": "1", "minor": "35", "gitVersion": "v1.35.0", "platform": "linux/amd64"},
        "/api": {"kind": "APIVersions", "versions": ["v1"],
                 "serverAddressByClientCIDRs": [{"clientCIDR": "0.0.0.0/0", "serverAddress": f"127.0.0.1:{port}"}]},
        "/apis": {"kind": "APIGroupList", "apiVersion": "v1", "groups": [
            {"name": gv.split("/")[0], "versions": [{"groupVersion": gv, "version": gv.split("/")[1]}],
             "preferredVersion": {"groupVersion": gv, "version": gv.split("/")[1]}}
            for gv in sorted(kinds) if "/" in gv]},
    }
    for gv in kinds:
        fixed["/api/v1" if gv == "v1" else f"/apis/{gv}"] = resource_list(gv)

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self):  # noqa: N802 (http.server's name)
            p = self.path.split("?", 1)[0]
            body = fixed.get(p) or objects.get(p)
            if body is None:
                body = {"kind": "Status", "apiVersion": "v1", "status": "Failure", "reason": "NotFound",
                        "code": 404, "message": f"{p} not found"}
                code = 404
            else:
                code = 200
            data = json.dumps(body).encode()
            self.send_response(code)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, *args):
            pass

    ThreadingHTTPServer(("127.0.0.1", port), Handler).serve_forever()
    return 0


if __name__ == "__main__":
    sys.exit(main())
