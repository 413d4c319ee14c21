#!/usr/bin/env python3
"""Mutual TLS between kube-scheduler and the extender, as the chart wires it, with the real binary.

    extender_tls.py CARMA_BIN RENDER.yaml OTHER_RENDER.yaml SNAPSHOT.yaml

RENDER.yaml is `helm template` with extender.tls.enabled=true and source=helm (the chart generates the
CA, the extender's serving certificate and kube-scheduler's client certificate); OTHER_RENDER.yaml is a
second such render, so its certificates come from another CA. From RENDER.yaml this script:

  1. lays out the files each pod would see: the Secrets' keys projected into the extender's and the
     scheduler's TLS volumes (items key -> path, as the projected volumes say);
  2. starts `CARMA_BIN <the extender container's args>` (listen addresses moved to free loopback
     ports, /etc/carma/tls/ mapped to the extender's files, the container's literal env, the
     snapshot instead of an API server);
  3. plays kube-scheduler with the KubeSchedulerConfiguration's extender tlsConfig (caFile, certFile,
     keyFile, serverName mapped to the scheduler's files): POST /filter must be served; the same call
     without a client certificate, or with OTHER_RENDER.yaml's client certificate, must be refused;
  4. checks the probes' and the ServiceMonitor's view: the container's probe paths answer over plain
     HTTP on the metrics port, which serves no verb.
Exit status 1 on any failure.
"""
from __future__ import annotations

import base64
import json
import os
import socket
import ssl
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

EXT_MOUNT = "/etc/carma/tls/"


def docs(path: str) -> list[dict]:
    return [d for d in yaml.safe_load_all(open(path)) if d]


def find(objs, kind, suffix):
    for d in objs:
        if d["kind"] == kind and d["metadata"]["name"].endswith(suffix):
            return d
    sys.exit(f"extender_tls: no {kind} *{suffix} in the render")


def project(objs, volume: dict, into: Path) -> None:
    """Write what a projected Secret volume shows into `into`."""
    secrets = {d["metadata"]["name"]: d for d in objs if d["kind"] == "Secret"}
    into.mkdir(parents=True, exist_ok=True)
    for src in volume["projected"]["sources"]:
        s = secrets.get(src["secret"]["name"])
        if s is None:
            sys.exit(f"extender_tls: the volume projects Secret {src['secret']['name']}, which the render lacks")
        for item in src["secret"]["items"]:
            (into / item["path"]).write_bytes(base64.b64decode(s["data"][item["key"]]))


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def https_post(port: int, server_name: str, ca: Path, cert: Path | None, key: Path | None, path: str, body: dict):
    """One HTTP/1.1 request over TLS; returns (status, body) or raises on any refusal."""
    ctx = ssl.create_default_context(cafile=str(ca))
    if cert:
        ctx.load_cert_chain(str(cert), str(key))
    data = json.dumps(body).encode()
    with socket.create_connection(("127.0.0.1", port), timeout=10) as raw:
        with ctx.wrap_socket(raw, server_hostname=server_name) as s:
            s.sendall(
                f"POST {path} HTTP/1.1\r\nHost: {server_name}\r\nContent-Type: application/json\r\n"
                f"Content-Length: {len(data)}\r\nConnection: close\r\n\r\n".encode() + data)
            resp = b""
            while chunk := s.recv(65536):
                resp += chunk
    if not resp:
        raise ConnectionError("connection closed without an answer")
    head, _, payload = resp.partition(b"\r\n\r\n")
    return int(head.split()[1]), payload


def http_get(port: int, path: str) -> int:
    with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
        s.sendall(f"GET {path} HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n".encode())
        resp = b""
        while chunk := s.recv(65536):
            resp += chunk
    return int(resp.split()[1])


def main() -> int:
    binary, render, other, snapshot = sys.argv[1:5]
    objs, other_objs = docs(render), docs(other)
    failures: list[str] = []

    def check(ok: bool, what: str) -> None:
        print(f"{'PASS' if ok else 'FAIL'}: {what}")
        if not ok:
            failures.append(what)

    dep = find(objs, "Deployment", "-scheduler-extender")
    pod = dep["spec"]["template"]["spec"]
    ctr = next(c for c in pod["containers"] if c["name"] == "scheduler-extender")
    sched = find(objs, "Deployment", "-scheduler")
    spod = sched["spec"]["template"]["spec"]
    sctr = next(c for c in spod["containers"] if c["name"] == "kube-scheduler")
    cfg_map = next(d for d in objs if d["kind"] == "ConfigMap" and "config.yaml" in (d.get("data") or {})
                   and "KubeSchedulerConfiguration" in d["data"]["config.yaml"])
    extender_cfg = yaml.safe_load(cfg_map["data"]["config.yaml"])["extenders"][0]
    tls_cfg = extender_cfg["tlsConfig"]

    with tempfile.TemporaryDirectory() as t:
        tmp = Path(t)
        # The files each pod sees.
        ext_vol = next(v for v in pod["volumes"] if v["name"] == "tls")
        ext_mount = next(m for m in ctr["volumeMounts"] if m["name"] == "tls")["mountPath"].rstrip("/") + "/"
        project(objs, ext_vol, tmp / "extender")
        s_mount = next(m for m in sctr["volumeMounts"] if m["name"] == "extender-tls")
        s_vol = next(v for v in spod["volumes"] if v["name"] == s_mount["name"])
        project(objs, s_vol, tmp / "scheduler")
        s_prefix = s_mount["mountPath"].rstrip("/") + "/"

        def sched_file(key: str) -> Path:
            p = tls_cfg[key]
            check(p.startswith(s_prefix), f"tlsConfig.{key} {p} is in the scheduler's TLS volume")
            return tmp / "scheduler" / p[len(s_prefix):]

        ca, cert, key = sched_file("caFile"), sched_file("certFile"), sched_file("keyFile")
        server_name = tls_cfg["serverName"]
        for f in (ca, cert, key):
            check(f.exists(), f"the scheduler's {f.name} is projected")

        # A client certificate from another CA: the other render's scheduler client Secret.
        o_dep = find(other_objs, "Deployment", "-scheduler")
        o_spod = o_dep["spec"]["template"]["spec"]
        project(other_objs, next(v for v in o_spod["volumes"] if v["name"] == "extender-tls"), tmp / "other")

        # Start the extender with the container's arguments.
        port, mport = free_port(), free_port()
        args = []
        for a in ctr["args"]:
            if a.startswith("--listen="):
                a = f"--listen=127.0.0.1:{port}"
            elif a.startswith("--metrics-listen="):
                a = f"--metrics-listen=127.0.0.1:{mport}"
            a = a.replace(ext_mount, str(tmp / "extender") + "/")
            args.append(a)
        check(any(a.startswith("--client-ca-file=") for a in args), "the extender requires client certificates")
        check(any(a.startswith("--metrics-listen=") for a in args), "the extender has a plain metrics listener")
        env = {k: v for k, v in os.environ.items() if k in ("PATH", "HOME")}
        env.update({e["name"]: str(e["value"]) for e in ctr.get("env", []) if "value" in e})
        env["KUBECONFIG"] = str(tmp / "no-kubeconfig")
        log = open(tmp / "extender.log", "w")
        proc = subprocess.Popen([binary, *args, f"--cluster-snapshot={snapshot}"], env=env,
                                stdout=log, stderr=subprocess.STDOUT)
        try:
            for _ in range(60):
                try:
                    if http_get(mport, "/readyz") == 200:
                        break
                except OSError:
                    pass
                if proc.poll() is not None:
                    break
                time.sleep(0.5)
            check(proc.poll() is None, f"carma {' '.join(args[:1])} started with the chart's TLS arguments")

            snap = yaml.safe_load(open(snapshot))
            items = snap.get("items", [])
            nodes = [i["metadata"]["name"] for i in items if i.get("kind") == "Node"]
            pending = next(i for i in items if i.get("kind") == "Pod" and not i["spec"].get("nodeName"))
            body = {"Pod": pending, "NodeNames": nodes}

            try:
                status, out = https_post(port, server_name, ca, cert, key, "/filter", body)
                check(status == 200 and "NodeNames" in json.loads(out),
                      f"kube-scheduler's client certificate: POST /filter answered {status}")
            except (OSError, ssl.SSLError) as e:
                check(False, f"kube-scheduler's client certificate: POST /filter failed: {e}")

            for what, c, k in (("no client certificate", None, None),
                               ("a client certificate from another CA",
                                tmp / "other" / "client.crt", tmp / "other" / "client.key")):
                try:
                    status, _ = https_post(port, server_name, ca, c, k, "/filter", body)
                    check(False, f"{what}: refused (got HTTP {status})")
                except (OSError, ssl.SSLError) as e:
                    check(True, f"{what}: refused ({type(e).__name__}: {str(e)[:80]})")

            for probe in ("livenessProbe", "readinessProbe"):
                g = ctr[probe]["httpGet"]
                check(g["port"] == "metrics" and g.get("scheme", "HTTP") == "HTTP",
                      f"{probe} uses the plain metrics port")
                check(http_get(mport, g["path"]) == 200, f"{probe} {g['path']} answers 200 there")
            check(http_get(mport, "/metrics") == 200, "/metrics answers on the metrics port")
            check(http_get(mport, "/filter") == 404, "the metrics port serves no verb (/filter: 404)")
        finally:
            proc.terminate()
            try:
                proc.wait(15)
            except subprocess.TimeoutExpired:
                proc.kill()
            if failures:
                print("---- extender log ----")
                print((tmp / "extender.log").read_text()[-3000:])
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
