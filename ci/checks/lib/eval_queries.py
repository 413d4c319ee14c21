#!/usr/bin/env python3
"""Evaluate every Grafana panel query, dashboard variable and alert expression against a live
Prometheus; used by ci/checks/prometheus.sh.

    eval_queries.py --prom http://127.0.0.1:PORT --rules deploy/prometheus/carma-rules.yaml \
                    deploy/grafana/*.json

* Dashboard panel targets: Grafana variables are substituted the way Grafana would with "All"
  selected: query variables ($job, $node, $gpu, $namespace, $pod) -> their allValue (.*); constant,
  textbox and custom variables (the chart-set $telemetry_reserve_mib, ...) -> their value; $__rate_interval,
  $__range, $__interval -> --rate-interval, --range, --interval. A query naming a variable the dashboard
  does not define FAILS. Range targets go through /api/v1/query_range over the last --range, instant
  targets through /api/v1/query. A target FAILS when Prometheus returns an error or no series at all; a
  result whose every value is NaN is reported as a warning (Grafana shows "NaN" but the query is live).
* Dashboard variables (label_values(selector, label)) go through /api/v1/label/<label>/values with the
  selector as match[]; no values is a failure. A variable (other than the datasource) that no panel
  query, annotation or other variable uses FAILS: a filter the panels ignore is a broken promise.
* Annotations from Prometheus queries (`<query> > 0`: a mark where the query is positive) must evaluate
  over the range at their step, and `<query>` itself must return data (the events are rare; the series
  they come from must exist).
* Alert and recording rules: every expr must evaluate without error (/api/v1/query); whether it
  returns series does not matter. Prometheus' own rule evaluation (/api/v1/rules) must report every
  rule healthy.
Exit status 1 when anything fails.
"""
from __future__ import annotations

import argparse
import json
import math
import re
import sys
import time
import urllib.parse
import urllib.request
from pathlib import Path

import yaml


def api(prom: str, path: str, params: dict | list) -> dict:
    url = f"{prom}{path}?{urllib.parse.urlencode(params, doseq=True)}"
    try:
        with urllib.request.urlopen(url, timeout=20) as r:
            return json.loads(r.read())
    except urllib.error.HTTPError as e:
        try:
            return json.loads(e.read())
        except Exception:  # noqa: BLE001
            return {"status": "error", "error": f"HTTP {e.code}"}


BUILTIN = ("__rate_interval", "__range", "__interval")


def variable_values(dash: dict) -> dict[str, str]:
    """What each dashboard variable stands for in a query: query variables with "All" selected -> their
    allValue (a regex); constant, textbox and custom variables -> their (current) value."""
    out: dict[str, str] = {}
    for var in dash.get("templating", {}).get("list", []):
        kind, name = var.get("type"), var["name"]
        if kind == "query":
            out[name] = var.get("allValue") or ".*"
        elif kind in ("constant", "textbox", "custom"):
            cur = (var.get("current") or {}).get("value")
            if isinstance(cur, list):
                cur = cur[0] if cur else None
            out[name] = str(cur if cur not in (None, "", "$__all") else var.get("query", "")).split(",")[0].strip()
    return out


def substitute(expr: str, a, values: dict[str, str], undefined: set[str] | None = None) -> str:
    out = expr
    for name, value in (("__rate_interval", a.rate_interval), ("__range", a.range),
                        ("__interval", a.interval)):
        out = out.replace("${" + name + "}", value).replace("$" + name, value)

    def var(m: re.Match) -> str:
        name = m.group(1) or m.group(3)
        if name in values:
            return values[name]
        if undefined is not None:
            undefined.add(name)
        return ".*"
    return re.sub(r"\$\{(\w+)(:\w+)?\}|\$(\w+)", var, out)


def uses(expr: str, name: str) -> bool:
    return re.search(r"\$(\{" + name + r"(:\w+)?\}|" + name + r"\b)", expr) is not None


def values_of(result: list, kind: str) -> list[float]:
    vals: list[float] = []
    for s in result:
        if kind == "matrix":
            vals += [float(v[1]) for v in s.get("values", [])]
        elif kind == "vector":
            vals.append(float(s["value"][1]))
        elif kind == "scalar":
            vals.append(float(result[1]))
            break
    return vals


def iter_panels(panels: list):
    for p in panels:
        if p.get("type") == "row":
            yield from iter_panels(p.get("panels", []))
        else:
            yield p


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--prom", required=True)
    ap.add_argument("--rules", action="append", default=[])
    ap.add_argument("--rate-interval", default="20s")
    ap.add_argument("--range", default="2m")
    ap.add_argument("--interval", default="2s")
    ap.add_argument("dashboards", nargs="*")
    a = ap.parse_args()

    failures: list[str] = []
    warnings: list[str] = []
    checked = 0
    now = time.time()
    range_s = int(re.match(r"(\d+)", a.range).group(1)) * {"s": 1, "m": 60, "h": 3600}[a.range[-1]]

    for dpath in a.dashboards:
        dash = json.loads(Path(dpath).read_text())
        print(f"dashboard {Path(dpath).name} ({dash.get('title')}):")
        values = variable_values(dash)
        undefined: set[str] = set()
        used_in: list[str] = []  # every query text of the dashboard, to find unused variables
        for var in dash.get("templating", {}).get("list", []):
            if var.get("type") != "query":
                continue
            q = var["query"]["query"] if isinstance(var.get("query"), dict) else var.get("query", "")
            used_in.append(q)
            m = re.fullmatch(r"\s*label_values\((.*),\s*(\w+)\)\s*", q)
            if not m:
                failures.append(f"{dpath}: variable {var['name']}: unsupported query {q!r}")
                continue
            match, label = substitute(m.group(1), a, values, undefined), m.group(2)
            res = api(a.prom, f"/api/v1/label/{label}/values", {"match[]": match})
            checked += 1
            if res.get("status") != "success" or not res.get("data"):
                failures.append(f"{Path(dpath).name}: variable ${var['name']} ({q}): no values "
                                f"{res.get('error', '')}")
                print(f"  FAIL  variable ${var['name']}: no values")
            else:
                print(f"  ok    variable ${var['name']} = {res['data'][:6]}")
        for panel in iter_panels(dash.get("panels", [])):
            for t in panel.get("targets", []):
                expr = t.get("expr")
                if not expr:
                    continue
                used_in.append(expr)
                q = substitute(expr, a, values, undefined)
                label = f"{panel.get('title')} [{t.get('refId')}]"
                if t.get("instant") and not t.get("range"):
                    res = api(a.prom, "/api/v1/query", {"query": q, "time": f"{now:.3f}"})
                else:
                    res = api(a.prom, "/api/v1/query_range", {
                        "query": q, "start": f"{now - range_s:.3f}", "end": f"{now:.3f}", "step": a.interval.rstrip("s")})
                checked += 1
                if res.get("status") != "success":
                    failures.append(f"{Path(dpath).name}: {label}: error {res.get('errorType')}: {res.get('error')}\n      {q}")
                    print(f"  FAIL  {label}: {res.get('error')}")
                    continue
                data = res["data"]
                result = data.get("result", [])
                vals = values_of(result, data.get("resultType"))
                if not vals:
                    failures.append(f"{Path(dpath).name}: {label}: no data\n      {q}")
                    print(f"  FAIL  {label}: no data  <- {q}")
                    continue
                nseries = len(result) if data.get("resultType") in ("matrix", "vector") else 1
                if all(math.isnan(v) for v in vals):
                    warnings.append(f"{Path(dpath).name}: {label}: only NaN values")
                    print(f"  warn  {label}: {nseries} series, all NaN")
                else:
                    last = [v for v in vals if not math.isnan(v)][-1]
                    print(f"  ok    {label}: {nseries} series, e.g. {last:.6g}")

        for ann in dash.get("annotations", {}).get("list", []):
            expr = ann.get("expr") or (ann.get("target") or {}).get("expr")
            if not expr:
                continue
            used_in.append(expr)
            label = f"annotation {ann.get('name')!r}"
            step = substitute(ann.get("step") or a.interval, a, values)
            step_s = int(re.match(r"(\d+)", step).group(1)) * {"s": 1, "m": 60, "h": 3600}[step[-1]]
            m = re.fullmatch(r"(?s)(.*\S)\s*>\s*0\s*", expr)
            for q, need_data in ((expr, False), (m.group(1), True) if m else (None, False)):
                if q is None:
                    failures.append(f"{Path(dpath).name}: {label}: not of the form '<query> > 0'")
                    print(f"  FAIL  {label}: not of the form '<query> > 0'")
                    continue
                q = substitute(q, a, values, undefined)
                res = api(a.prom, "/api/v1/query_range", {
                    "query": q, "start": f"{now - max(range_s, step_s):.3f}", "end": f"{now:.3f}", "step": step_s})
                checked += 1
                if res.get("status") != "success":
                    failures.append(f"{Path(dpath).name}: {label}: error {res.get('errorType')}: {res.get('error')}\n      {q}")
                    print(f"  FAIL  {label}: {res.get('error')}")
                elif need_data and not values_of(res["data"].get("result", []), res["data"].get("resultType")):
                    failures.append(f"{Path(dpath).name}: {label}: no data from {q}")
                    print(f"  FAIL  {label}: no data  <- {q}")
                elif need_data:
                    print(f"  ok    {label}: its query returns data ({len(res['data']['result'])} series)")
        for name in sorted(undefined):
            failures.append(f"{Path(dpath).name}: a query uses ${name}, which the dashboard does not define")
            print(f"  FAIL  ${name} is used but not defined")
        for var in dash.get("templating", {}).get("list", []):
            if var.get("type") == "datasource":
                continue
            if not any(uses(q, var["name"]) for q in used_in):
                failures.append(f"{Path(dpath).name}: variable ${var['name']} is used by no query")
                print(f"  FAIL  variable ${var['name']} is used by no panel query, annotation or variable")
            else:
                n = sum(uses(q, var["name"]) for q in used_in)
                print(f"  ok    variable ${var['name']} = {values.get(var['name'])!r} in queries: used by {n}")

    for rpath in a.rules:
        print(f"rules {Path(rpath).name}:")
        for group in yaml.safe_load(Path(rpath).read_text()).get("groups", []):
            for rule in group.get("rules", []):
                name = rule.get("alert") or rule.get("record")
                res = api(a.prom, "/api/v1/query", {"query": str(rule["expr"]), "time": f"{now:.3f}"})
                checked += 1
                if res.get("status") != "success":
                    failures.append(f"rule {name}: {res.get('errorType')}: {res.get('error')}")
                    print(f"  FAIL  {name}: {res.get('error')}")
                else:
                    n = len(res["data"].get("result", []))
                    print(f"  ok    {name}: evaluates ({n} series{', would fire' if n and rule.get('alert') else ''})")
        res = api(a.prom, "/api/v1/rules", {})
        loaded = 0
        for g in res.get("data", {}).get("groups", []):
            for r in g.get("rules", []):
                loaded += 1
                if r.get("health") not in ("ok", "unknown") or r.get("lastError"):
                    failures.append(f"Prometheus evaluates rule {r.get('name')} with health "
                                    f"{r.get('health')}: {r.get('lastError')}")
        print(f"  Prometheus has {loaded} rules loaded from the rule files")
        if loaded == 0:
            failures.append("Prometheus loaded no rules")

    print(f"\nevaluated {checked} queries: {len(failures)} failed, {len(warnings)} warnings")
    for w in warnings:
        print(f"  warn: {w}")
    for f in failures:
        print(f"  FAIL: {f}")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
