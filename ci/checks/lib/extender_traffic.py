#!/usr/bin/env python3
"""Drive a carma scheduler extender the way kube-scheduler does, for ci/checks/prometheus.sh.

    extender_traffic.py --url http://127.0.0.1:PORT --snapshot deploy/examples/snapshot.yaml --seconds 30

Reads the snapshot (a v1 List of Nodes, GpuNodes and Pods), and for every pending pod that requests
carma.io/gpu sends, with kube-scheduler's wire format (PascalCase keys, nodeCacheCapable = true so
only NodeNames): POST /filter, POST /prioritize on the nodes that passed, POST /bind to the best one.
Also sends a pod with a malformed carma.io/model-profile annotation (a filter rejection with a reason)
and one malformed JSON body (HTTP 400), so every extender metric family gets samples. Repeats until
--seconds have passed. Prints a summary; exits 1 only when the extender cannot be reached at all.
"""
from __future__ import annotations

import argparse
import copy
import json
import sys
import time
import urllib.error
import urllib.request
from collections import Counter

import yaml


def post(url: str, body, raw: bool = False, timeout: float = 5.0):
    data = body if raw else json.dumps(body).encode()
    req = urllib.request.Request(url, data=data, headers={"Content-Type": "application/json"}, method="POST")
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return r.status, json.loads(r.read() or b"null")
    except urllib.error.HTTPError as e:
        return e.code, None


def requests_gpu(pod: dict) -> bool:
    for c in pod.get("spec", {}).get("containers", []):
        res = c.get("resources", {})
        if "carma.io/gpu" in (res.get("limits") or {}) or "carma.io/gpu" in (res.get("requests") or {}):
            return True
    return False


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--url", required=True)
    ap.add_argument("--snapshot", required=True)
    ap.add_argument("--seconds", type=float, default=30)
    ap.add_argument("--interval", type=float, default=0.5)
    args = ap.parse_args()

    snap = yaml.safe_load(open(args.snapshot))
    items = snap.get("items", [])
    nodes = [i["metadata"]["name"] for i in items if i.get("kind") == "Node"]
    pending = [i for i in items if i.get("kind") == "Pod" and not i.get("spec", {}).get("nodeName")
               and requests_gpu(i)]
    if not nodes or not pending:
        print("extender_traffic: the snapshot needs Nodes and pending pods that request carma.io/gpu",
              file=sys.stderr)
        return 1
    bad = copy.deepcopy(pending[0])
    bad["metadata"]["name"] = "malformed-profile"
    bad["metadata"]["uid"] = "00000000-0000-4000-8000-00000000bad0"
    bad["metadata"].setdefault("annotations", {})["carma.io/model-profile"] = '{"family": "mlp", "bogus": 1'

    stats: Counter = Counter()
    deadline = time.monotonic() + args.seconds
    reached = False
    rnd = 0
    while time.monotonic() < deadline:
        rnd += 1
        for pod in pending + [bad]:
            try:
                code, res = post(f"{args.url}/filter", {"Pod": pod, "NodeNames": nodes})
            except (urllib.error.URLError, OSError) as e:
                stats[f"unreachable ({e})"] += 1
                continue
            reached = True
            stats[f"filter {code}"] += 1
            if code != 200 or not isinstance(res, dict):
                continue
            fits = res.get("NodeNames") or res.get("nodeNames") or []
            failed = res.get("FailedNodes") or res.get("failedNodes") or {}
            stats["filter rejections"] += len(failed)
            if res.get("Error") or res.get("error"):
                stats["filter errors"] += 1
            if not fits:
                continue
            code, prio = post(f"{args.url}/prioritize", {"Pod": pod, "NodeNames": fits})
            stats[f"prioritize {code}"] += 1
            best = fits[0]
            if code == 200 and isinstance(prio, list) and prio:
                best = max(prio, key=lambda h: h.get("Score", h.get("score", 0))).get("Host") or best
            meta = pod["metadata"]
            code, b = post(f"{args.url}/bind", {"PodName": meta["name"], "PodNamespace": meta.get("namespace", "default"),
                                               "PodUID": meta.get("uid", ""), "Node": best})
            err = (b or {}).get("Error") or (b or {}).get("error") if isinstance(b, dict) else None
            stats[f"bind {code}{' error' if err else ''}"] += 1
        code, _ = post(f"{args.url}/filter", b"{not json", raw=True)
        stats[f"malformed body -> {code}"] += 1
        time.sleep(args.interval)
    print(f"extender_traffic: {rnd} rounds over {len(pending)} pending pods and {len(nodes)} nodes: "
          + ", ".join(f"{k}: {v}" for k, v in sorted(stats.items())))
    return 0 if reached else 1


if __name__ == "__main__":
    sys.exit(main())
