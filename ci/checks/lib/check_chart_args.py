#!/usr/bin/env python3
"""Check that every carma container in rendered manifests passes arguments the carma binary accepts.

    check_chart_args.py CARMA_BIN RENDERED.yaml...

For each Deployment/DaemonSet container running the carma image (args start with a subcommand), runs
`CARMA_BIN <args...> --help`: clap parses (and validates) every argument before it reaches `--help`, so
an unknown flag or a bad value fails here instead of in a cluster. $(VAR) references are replaced by a
placeholder. Exit status 1 when any container's arguments are rejected.
"""
from __future__ import annotations

import re
import subprocess
import sys

import yaml


def main() -> int:
    binary, files = sys.argv[1], sys.argv[2:]
    bad = 0
    seen = 0
    for path in files:
        for doc in yaml.safe_load_all(open(path)):
            if not doc or doc.get("kind") not in ("Deployment", "DaemonSet"):
                continue
            for c in doc["spec"]["template"]["spec"]["containers"]:
                args = c.get("args") or []
                if c.get("command") or not args or args[0].startswith("-"):
                    continue  # not the carma image (e.g. kube-scheduler sets command)
                argv = [re.sub(r"\$\((\w+)\)", "placeholder", a) for a in args]
                p = subprocess.run([binary, *argv, "--help"], capture_output=True, text=True, timeout=30)
                seen += 1
                where = f"{path}: {doc['kind']}/{doc['metadata']['name']} container {c['name']}"
                if p.returncode != 0:
                    bad += 1
                    err = " ".join((p.stderr or p.stdout).split())[:300]
                    print(f"  FAIL  {where}: `carma {' '.join(args)}` rejected: {err}")
                else:
                    print(f"  ok    {where}: carma {' '.join(args)}")
    print(f"checked the arguments of {seen} carma containers: {bad} rejected")
    return 1 if bad or not seen else 0


if __name__ == "__main__":
    sys.exit(main())
