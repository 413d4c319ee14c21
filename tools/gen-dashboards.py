#!/usr/bin/env python3
"""Generate carma's Grafana dashboards (deploy/grafana/*.json).

The dashboards are plain Grafana JSON (schemaVersion 39, Grafana 10/11). They are generated so every
panel follows the same conventions (datasource variable, node/gpu filters, units, legends) and so
ci/checks/prometheus.sh can evaluate every query against a real Prometheus. Edit this file, then run

    python3 tools/gen-dashboards.py          # write deploy/grafana/*.json
    python3 tools/gen-dashboards.py --check  # exit 1 when the committed JSON differs
    tools/sync-chart.sh                      # copy them into the chart

Template variables used in queries: $job, $node, $gpu, $namespace, $pod (regex, "All" = .*), the
chart-set constants below ($telemetry_reserve_mib, ...), $__rate_interval, $__range.

Grafana's schema: ci/checks/dashboards.sh decodes every dashboard strictly into the Grafana Foundation
SDK's types (e2e/dashboards), so a field Grafana does not know or one of the wrong type fails CI; the
options that schema requires (a stat's wideLayout, a legend's calcs, ...) are written out here, with
Grafana's own defaults.

Constants the chart sets: a value of the chart (placement.telemetryReserveMiB, ...) that a query needs is
a `constant` variable whose default is the chart's default (read from charts/carma/values.yaml) and
whose description names the value; charts/carma/templates/dashboards.yaml replaces the default with the
release's value when it renders the ConfigMaps, and ci/checks/prometheus.sh checks that it does.
"""
from __future__ import annotations

import json
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "deploy" / "grafana"
DS = {"type": "prometheus", "uid": "${datasource}"}

JOB_SEL = 'job=~"$job"'
GPU_SEL = 'job=~"$job", node=~"$node", gpu=~"$gpu"'
NODE_SEL = 'job=~"$job", node=~"$node"'
# Per-pod series: the workload pod's namespace and name (the device plugin is scraped with honor_labels).
POD_SEL = 'job=~"$job", node=~"$node", namespace=~"$namespace", pod=~"$pod"'
POD_GPU_SEL = GPU_SEL + ', namespace=~"$namespace", pod=~"$pod"'  # carma_pod_gpu_info has the GPU index

# (variable, label, chart value under placement.) of the constants the chart sets; see the docstring.
CHART_CONSTANTS = [
    ("telemetry_reserve_mib", "Telemetry reserve (MiB)", "telemetryReserveMiB"),
    ("memory_margin_mib", "Memory margin (MiB)", "memoryMarginMiB"),
    ("sm_occupancy_cap", "SM occupancy cap", "smOccupancyCap"),
    ("dram_activity_cap", "DRAM activity cap", "dramActivityCap"),
]


def chart_default(key: str) -> str:
    """The chart's default of placement.<key>, read from charts/carma/values.yaml (no YAML parser needed:
    the placement block is flat)."""
    text = (ROOT / "charts" / "carma" / "values.yaml").read_text()
    block = re.search(r"^placement:\n((?:[ #].*\n|\n)*)", text, re.M)
    m = block and re.search(rf"^  {key}: *([0-9.]+) *$", block.group(1), re.M)
    if not m:
        raise SystemExit(f"gen-dashboards: placement.{key} not found in charts/carma/values.yaml")
    return format(float(m.group(1)), "g")  # as Helm prints the value (Go's %v): 0.40 -> 0.4


class Layout:
    """Places panels left to right on Grafana's 24-column grid."""

    def __init__(self) -> None:
        self.x = 0
        self.y = 0
        self.row_h = 0
        self.next_id = 1
        self.panels: list[dict] = []

    def row(self, title: str) -> None:
        self.newline()
        self.panels.append({
            "type": "row", "title": title, "id": self._id(), "collapsed": False, "panels": [],
            "gridPos": {"h": 1, "w": 24, "x": 0, "y": self.y},
        })
        self.y += 1

    def newline(self) -> None:
        if self.x:
            self.y += self.row_h
            self.x = 0
            self.row_h = 0

    def add(self, panel: dict, w: int, h: int) -> None:
        if self.x + w > 24:
            self.newline()
        panel["id"] = self._id()
        panel["gridPos"] = {"h": h, "w": w, "x": self.x, "y": self.y}
        self.panels.append(panel)
        self.x += w
        self.row_h = max(self.row_h, h)

    def _id(self) -> int:
        i = self.next_id
        self.next_id += 1
        return i


def target(expr: str, legend: str = "", ref: str = "A", instant: bool = False, fmt: str = "time_series") -> dict:
    t = {
        "datasource": DS, "refId": ref, "expr": expr, "legendFormat": legend or "__auto",
        "range": not instant, "instant": instant, "format": fmt,
    }
    return t


def refs(targets: list[dict]) -> list[dict]:
    for i, t in enumerate(targets):
        t["refId"] = chr(ord("A") + i)
    return targets


def timeseries(title: str, desc: str, targets: list[dict], unit: str = "short", *, min_=None, max_=None,
               thresholds: list[tuple[float, str]] | None = None, overrides: list[dict] | None = None,
               stack: bool = False, draw: str = "line") -> dict:
    custom = {
        "drawStyle": draw, "lineWidth": 1, "fillOpacity": 10 if not stack else 40, "showPoints": "never",
        "spanNulls": False, "stacking": {"mode": "normal" if stack else "none", "group": "A"},
        "axisPlacement": "auto", "axisSoftMin": 0,
    }
    defaults: dict = {"unit": unit, "custom": custom}
    if min_ is not None:
        defaults["min"] = min_
    if max_ is not None:
        defaults["max"] = max_
    if thresholds:
        custom["thresholdsStyle"] = {"mode": "dashed"}
        defaults["thresholds"] = {"mode": "absolute", "steps": [{"color": "transparent", "value": None}] + [
            {"color": c, "value": v} for v, c in thresholds]}
    return {
        "type": "timeseries", "title": title, "description": desc, "datasource": DS,
        "targets": refs(targets),
        "fieldConfig": {"defaults": defaults, "overrides": overrides or []},
        "options": {"legend": {"displayMode": "table", "placement": "bottom", "showLegend": True,
                               "calcs": ["lastNotNull", "max"]},
                    "tooltip": {"mode": "multi", "sort": "desc"}},
    }


def stat(title: str, desc: str, expr: str, unit: str = "short", *, thresholds: list[tuple[float, str]] | None = None,
         decimals: int | None = None, nan_text: str | None = None, base: str = "green") -> dict:
    steps = [{"color": base, "value": None}] + [{"color": c, "value": v} for v, c in (thresholds or [])]
    defaults: dict = {"unit": unit, "thresholds": {"mode": "absolute", "steps": steps}}
    if decimals is not None:
        defaults["decimals"] = decimals
    if nan_text:
        defaults["mappings"] = nan_mapping(nan_text)
    return {
        "type": "stat", "title": title, "description": desc, "datasource": DS,
        "targets": refs([target(expr, instant=True)]),
        "fieldConfig": {"defaults": defaults, "overrides": []},
        "options": {"reduceOptions": {"calcs": ["lastNotNull"], "fields": "", "values": False},
                    "colorMode": "value", "graphMode": "none", "textMode": "auto", "justifyMode": "auto",
                    "orientation": "auto", "wideLayout": True, "showPercentChange": False,
                    "percentChangeColorMode": "standard"},
    }


def table(title: str, desc: str, targets: list[dict], *, exclude: list[str], rename: dict[str, str],
          units: dict[str, str] | None = None, merge: bool = False, overrides: list[dict] | None = None,
          sort_by: tuple[str, bool] | None = None) -> dict:
    transformations: list[dict] = []
    if merge:
        transformations.append({"id": "merge", "options": {}})
    transformations.append({"id": "organize", "options": {
        "excludeByName": {k: True for k in exclude}, "renameByName": rename, "indexByName": {}}})
    unit_overrides = [{"matcher": {"id": "byName", "options": name},
                       "properties": [{"id": "unit", "value": unit}]} for name, unit in (units or {}).items()]
    options: dict = {"showHeader": True, "cellHeight": "sm", "frameIndex": 0,
                     "footer": {"show": False, "reducer": []}}
    if sort_by:
        options["sortBy"] = [{"displayName": sort_by[0], "desc": sort_by[1]}]
    return {
        "type": "table", "title": title, "description": desc, "datasource": DS,
        "targets": refs(targets),
        "transformations": transformations,
        "fieldConfig": {"defaults": {"custom": {"align": "auto", "filterable": True, "inspect": False}},
                        "overrides": unit_overrides + (overrides or [])},
        "options": options,
    }


def bargauge(title: str, desc: str, targets: list[dict], unit: str = "short", *, min_=None, max_=None,
             thresholds: list[tuple[float, str]] | None = None, nan_text: str | None = None) -> dict:
    """Horizontal bar gauge of instant values (one bar per series); nan_text names what NaN means."""
    steps = [{"color": "green", "value": None}] + [{"color": c, "value": v} for v, c in (thresholds or [])]
    defaults: dict = {"unit": unit, "thresholds": {"mode": "absolute", "steps": steps}}
    if min_ is not None:
        defaults["min"] = min_
    if max_ is not None:
        defaults["max"] = max_
    if nan_text:
        defaults["mappings"] = nan_mapping(nan_text)
    return {
        "type": "bargauge", "title": title, "description": desc, "datasource": DS,
        "targets": refs(targets),
        "fieldConfig": {"defaults": defaults, "overrides": []},
        "options": {"reduceOptions": {"calcs": ["lastNotNull"], "fields": "", "values": False},
                    "orientation": "horizontal", "displayMode": "gradient", "valueMode": "color",
                    "showUnfilled": True, "namePlacement": "auto", "sizing": "auto", "minVizWidth": 8,
                    "minVizHeight": 16, "maxVizHeight": 300,
                    "legend": {"showLegend": False, "displayMode": "list", "placement": "bottom", "calcs": []}},
    }


def state_timeline(title: str, desc: str, targets: list[dict], mappings: list[dict]) -> dict:
    """One row per series, coloured by its value through `mappings` (e.g. 1 = open, 0 = closed)."""
    return {
        "type": "state-timeline", "title": title, "description": desc, "datasource": DS,
        "targets": refs(targets),
        "fieldConfig": {"defaults": {"mappings": mappings, "custom": {"fillOpacity": 80, "lineWidth": 0},
                                     "color": {"mode": "thresholds"},
                                     "thresholds": {"mode": "absolute", "steps": [{"color": "text", "value": None}]}},
                        "overrides": []},
        "options": {"mergeValues": True, "showValue": "never", "alignValue": "left", "rowHeight": 0.9,
                    "legend": {"showLegend": False, "displayMode": "list", "placement": "bottom", "calcs": []},
                    "tooltip": {"mode": "single", "sort": "none"}},
    }


def value_map(*entries: tuple[str, str, str]) -> list[dict]:
    """Value mapping of exact values: (value, text, colour)."""
    return [{"type": "value", "options": {v: {"text": t, "color": c, "index": i} for i, (v, t, c) in enumerate(entries)}}]


def nan_mapping(text: str) -> list[dict]:
    """Value mapping that shows NaN (e.g. a ratio or quantile with nothing counted) as text."""
    return [{"type": "special", "options": {"match": "nan", "result": {"text": text, "color": "text", "index": 0}}}]


def by_name(name: str, props: dict) -> dict:
    return {"matcher": {"id": "byName", "options": name},
            "properties": [{"id": k, "value": v} for k, v in props.items()]}


def dashed_line(name: str, color: str) -> dict:
    """Override drawing the series `name` (a cap, a margin) as a dashed line of its own colour."""
    return by_name(name, {"color": {"mode": "fixed", "fixedColor": color},
                          "custom.lineStyle": {"fill": "dash", "dash": [10, 10]},
                          "custom.fillOpacity": 0, "custom.lineWidth": 2})


def by_regex(rx: str, props: dict) -> dict:
    return {"matcher": {"id": "byRegexp", "options": rx},
            "properties": [{"id": k, "value": v} for k, v in props.items()]}


def variables(with_gpu: bool) -> list[dict]:
    out = [{
        "name": "datasource", "label": "Prometheus", "type": "datasource", "query": "prometheus",
        "hide": 0, "refresh": 1, "regex": "", "includeAll": False, "multi": False,
    }]
    # Scrape jobs of carma's processes: with the chart's ServiceMonitors, one per component Service
    # (<release>-device-plugin, ...), so the job picks a carma installation or a component.
    out.append(query_var("job", "Job", 'label_values({__name__=~"carma_.+"}, job)'))
    if with_gpu:
        out.append(query_var("node", "Node", 'label_values(carma_gpu_memory_total_bytes{job=~"$job"}, node)'))
        out.append(query_var("gpu", "GPU", 'label_values(carma_gpu_memory_total_bytes{job=~"$job", node=~"$node"}, gpu)'))
        out.append(query_var("namespace", "Namespace",
                             'label_values(carma_pod_gpu_info{job=~"$job", node=~"$node"}, namespace)'))
        out.append(query_var("pod", "Pod",
                             'label_values(carma_pod_gpu_info{job=~"$job", node=~"$node", namespace=~"$namespace"}, pod)'))
        for name, label, key in CHART_CONSTANTS:
            out.append(constant_var(name, label, key))
    return out


def constant_var(name: str, label: str, key: str) -> dict:
    """A value the chart sets from placement.<key> (charts/carma/templates/dashboards.yaml matches the
    "name" and replaces "query"; keep the two adjacent, with no braces between them)."""
    return {
        "name": name, "label": label, "type": "constant", "query": chart_default(key), "hide": 2,
        "description": f"Set by the chart from placement.{key} when it renders this dashboard; "
                       "change it here when the dashboard is imported by hand for a release with another value.",
        "skipUrlSync": False,
    }


def query_var(name: str, label: str, query: str) -> dict:
    return {
        "name": name, "label": label, "type": "query", "datasource": DS,
        "query": {"query": query, "refId": f"{name}-var"}, "definition": query,
        "current": {"selected": True, "text": ["All"], "value": ["$__all"]},
        "includeAll": True, "allValue": ".*", "multi": True, "refresh": 2, "sort": 3, "hide": 0,
        "regex": "", "options": [],
    }


def annotation(name: str, expr: str, color: str, title: str, tags: str = "") -> dict:
    """An annotation from a Prometheus query: a mark at each step where `expr` returns a series.
    `expr` is `<query> > 0`; ci/checks/prometheus.sh evaluates it and requires data from `<query>`."""
    assert expr.endswith(" > 0"), expr
    return {
        "name": name, "datasource": DS, "enable": True, "hide": False, "iconColor": color,
        "expr": expr, "step": "1m", "titleFormat": title, "tagKeys": tags, "textFormat": "",
        "useValueForTime": False,
    }


# Operator events: window 2m at a 1m step, so no increase falls between two steps.
OOM_CRASHES = annotation(
    "GPU OOM crashes",
    f'sum(increase(carma_operator_attempts_total{{{JOB_SEL}, outcome="GpuOutOfMemory"}}[2m])) > 0',
    "red", "Attempt crashed out of GPU memory")
OOM_REQUEUES = annotation(
    "Requeued after OOM",
    f"sum(increase(carma_operator_oom_recoveries_total{{{JOB_SEL}}}[2m])) > 0",
    "orange", "Attempt requeued with a larger reservation")
LEADER_CHANGES = annotation(
    "Operator leader changes",
    f"sum(changes(carma_operator_leader{{{JOB_SEL}}}[2m])) > 0",
    "purple", "An operator replica gained or lost the leader lease")


def dashboard(uid: str, title: str, desc: str, panels: list[dict], with_gpu: bool, links: list[dict],
              annotations: list[dict]) -> dict:
    return {
        "uid": uid, "title": title, "description": desc, "tags": ["carma", "gpu", "kubernetes"],
        "editable": True, "graphTooltip": 1, "schemaVersion": 39, "version": 1, "refresh": "30s",
        "time": {"from": "now-3h", "to": "now"}, "timepicker": {}, "timezone": "browser",
        "fiscalYearStartMonth": 0, "liveNow": False, "weekStart": "",
        "annotations": {"list": [{
            "builtIn": 1, "datasource": {"type": "grafana", "uid": "-- Grafana --"}, "enable": True,
            "hide": True, "iconColor": "rgba(0, 211, 255, 1)", "name": "Annotations & Alerts", "type": "dashboard"}]
            + annotations},
        "links": links,
        "templating": {"list": variables(with_gpu)},
        "panels": panels,
    }


def link(title: str, uid: str) -> dict:
    return {"title": title, "type": "link", "url": f"/d/{uid}", "icon": "dashboard", "keepTime": True,
            "includeVars": True, "asDropdown": False, "tags": [], "targetBlank": False, "tooltip": ""}


# --------------------------------------------------------------------------------------------------
def collocation() -> dict:
    L = Layout()
    L.row("Overview")
    L.add(stat("GPUs", "Physical GPUs advertised by carma device plugins on the selected nodes.",
               f"count(carma_gpu_memory_total_bytes{{{GPU_SEL}}})"), 4, 4)
    L.add(stat("Pods on GPUs", "Pods placed by carma on the selected GPUs (a pod on 2 GPUs counts twice).",
               f"sum(carma_gpu_pods{{{GPU_SEL}}})"), 4, 4)
    L.add(stat("Shared GPUs", "GPUs running more than one pod right now.",
               f"sum(carma_gpu_pods{{{GPU_SEL}}} > bool 1)"), 4, 4)
    L.add(stat("Memory reserved", "Reserved GPU memory (estimates or overrides of placed pods) over total.",
               f"sum(carma_gpu_memory_reserved_bytes{{{GPU_SEL}}}) / sum(carma_gpu_memory_total_bytes{{{GPU_SEL}}})",
               "percentunit", thresholds=[(0.8, "orange"), (0.95, "red")]), 4, 4)
    L.add(stat("Unhealthy GPUs", "GPUs the device plugin reports unhealthy (withdrawn from kubelet).",
               f"sum(1 - carma_gpu_healthy{{{GPU_SEL}}})", thresholds=[(1, "red")]), 4, 4)
    L.add(stat("OOM recoveries", "TrainingTask attempts that crashed out of GPU memory and were requeued "
               "with a larger reservation, in the selected time range (all nodes).",
               "sum(increase(carma_operator_oom_recoveries_total{job=~\"$job\"}[$__range]))", decimals=0,
               thresholds=[(1, "orange"), (5, "red")]), 4, 4)

    L.row("Which pods share each GPU")
    L.add(timeseries("Pods sharing each GPU", "Number of pods running on each GPU (carma_gpu_pods). "
                     "Above 1 the GPU is collocated.",
                     [target(f"carma_gpu_pods{{{GPU_SEL}}}", "{{node}} GPU {{gpu}}")], "short", min_=0,
                     draw="line"), 10, 9)
    L.add(table("Pods per GPU", "Every pod carma placed, the GPU it runs on, and its reserved and observed "
                "GPU memory (device-plugin per-pod metrics). Reserved − used is the estimator's margin.",
                [target(f"max by (node, gpu, uuid, namespace, pod) (carma_pod_gpu_info{{{POD_GPU_SEL}}})", instant=True, fmt="table"),
                 target(f"max by (node, uuid, namespace, pod) (carma_pod_gpu_memory_reserved_bytes{{{POD_SEL}}})", instant=True, fmt="table"),
                 target(f"max by (node, uuid, namespace, pod) (carma_pod_gpu_memory_used_bytes{{{POD_SEL}}})", instant=True, fmt="table")],
                exclude=["Time", "Value #A"],
                rename={"node": "Node", "gpu": "GPU", "uuid": "UUID", "namespace": "Namespace", "pod": "Pod",
                        "Value #B": "Reserved", "Value #C": "Used"},
                units={"Reserved": "bytes", "Used": "bytes"}, merge=True), 14, 9)

    L.row("Sharing decision per GPU")
    open_closed = value_map(("1", "open", "green"), ("0", "closed", "red"))
    L.add(stat("GPUs open to sharing", "GPUs whose utilization gate lets them take another shared pod now "
               "(carma_gpu_sharing_allowed), of the selected GPUs.",
               f"sum(carma_gpu_sharing_allowed{{{GPU_SEL}}})", decimals=0), 4, 9)
    L.add(state_timeline("Sharing decision per GPU",
                         "The device plugin's utilization gate per GPU over time (carma_gpu_sharing_allowed): open "
                         "= the GPU may take another shared pod, closed = exclusive pods only. The label rule is the "
                         "gate its telemetry source allows (smact-smocc-drama, smact-drama, ..., none). Memory, "
                         "replicas and warm-up are placement's tests, not the gate's.",
                         [target(f"max by (node, gpu, rule) (carma_gpu_sharing_allowed{{{GPU_SEL}}})",
                                 "{{node}}/{{gpu}} ({{rule}})")], open_closed), 10, 9)
    # The reason is derived from the same series the gate reads (the device plugin exports the decision and
    # its rule, not the reason): unhealthy, no activity telemetry, window filling, or over the caps.
    allowed = f"carma_gpu_sharing_allowed{{{GPU_SEL}}}"
    reasons = [
        (f"{allowed} == 1", "open: below the caps"),
        (f"({allowed} == 0) and on (node, uuid) (carma_gpu_healthy{{{GPU_SEL}}} == 0)", "closed: GPU unhealthy"),
        (f'carma_gpu_sharing_allowed{{{GPU_SEL}, rule="none"}} == 0',
         "closed: no SM-activity telemetry (exclusive pods only)"),
        (f"({allowed} == 0) unless on (node, uuid) carma_gpu_sm_activity_risk_score{{{GPU_SEL}}}",
         "closed: risk window still filling"),
        (f"{allowed} == 0", "closed: SM-activity risk at or above the cap, and SM occupancy (cap $sm_occupancy_cap) "
                            "or DRAM activity (cap $dram_activity_cap) at or above its cap"),
    ]
    reason_expr = " or ignoring (reason) ".join(
        f'label_replace({e}, "reason", "{text}", "", "")' for e, text in reasons)
    L.add(table("Sharing decision and reason per GPU",
                "Per GPU now: the gate's decision, the rule its telemetry allows, and why. The reason is worked "
                "out from carma_gpu_healthy, the rule and the risk scores in the order the device plugin "
                "tests them (health, telemetry, window, caps); the SM-activity cap is the device plugin's "
                "(carma_gpu_sm_activity_cap_ratio), the others are the chart's placement values.",
                [target(f"max by (node, gpu, rule, reason) ({reason_expr})", instant=True, fmt="table")],
                exclude=["Time"],
                rename={"node": "Node", "gpu": "GPU", "rule": "Rule", "reason": "Reason", "Value": "Sharing"},
                overrides=[by_name("Sharing", {"mappings": open_closed, "custom.cellOptions": {"type": "color-text"}})],
                sort_by=("Sharing", False)), 10, 9)

    L.row("Memory")
    L.add(timeseries("Reserved vs used memory per GPU",
                     "Total, reserved (sum of placed pods' reservations) and used (telemetry) memory per GPU. "
                     "Used above reserved means a pod uses more than carma reserved for it.",
                     [target(f"carma_gpu_memory_total_bytes{{{GPU_SEL}}}", "total {{node}}/{{gpu}}"),
                      target(f"carma_gpu_memory_reserved_bytes{{{GPU_SEL}}}", "reserved {{node}}/{{gpu}}"),
                      target(f"carma_gpu_memory_used_bytes{{{GPU_SEL}}}", "used {{node}}/{{gpu}}")],
                     "bytes", min_=0,
                     overrides=[by_regex("^total .*", {"custom.lineStyle": {"fill": "dash", "dash": [10, 10]},
                                                       "custom.fillOpacity": 0})]), 12, 9)
    L.add(timeseries("Estimator error per pod (reserved − observed)",
                     "Per pod: reserved GPU memory minus the memory it is observed to use. Negative means the "
                     "estimate was too low (out-of-memory risk for the pod and its neighbours); large positive "
                     "values waste shareable memory.",
                     [target(f"carma_pod_gpu_memory_reserved_bytes{{{POD_SEL}}} - on (node, namespace, pod, uuid) "
                             f"carma_pod_gpu_memory_used_bytes{{{POD_SEL}}}", "{{namespace}}/{{pod}}")],
                     "bytes", thresholds=[(0, "red")]), 12, 9)
    L.add(timeseries("Memory headroom per GPU (reserve $telemetry_reserve_mib MiB)",
                     "Free memory carma may still place into: total − used − the telemetry reserve "
                     "(placement.telemetryReserveMiB, $telemetry_reserve_mib MiB). A GPU needs the pod's reservation "
                     "+ the margin (placement.memoryMarginMiB, dashed line) free to take another pod.",
                     [target(f"carma_gpu_memory_total_bytes{{{GPU_SEL}}} - carma_gpu_memory_used_bytes{{{GPU_SEL}}} "
                             "- $telemetry_reserve_mib * 1024 * 1024", "{{node}}/{{gpu}}"),
                      target("vector($memory_margin_mib * 1024 * 1024)", "margin")], "bytes",
                     overrides=[dashed_line("margin", "orange")]), 12, 8)
    L.add(stat("Underestimated pods", "Pods whose observed GPU memory exceeds their reservation right now.",
               f"sum((carma_pod_gpu_memory_reserved_bytes{{{POD_SEL}}} - on (node, namespace, pod, uuid) "
               f"carma_pod_gpu_memory_used_bytes{{{POD_SEL}}}) < bool 0)", thresholds=[(1, "red")]), 6, 8)
    L.add(stat("Mean estimator margin", "Average reserved − observed memory over the pods on the selected nodes.",
               f"avg(carma_pod_gpu_memory_reserved_bytes{{{POD_SEL}}} - on (node, namespace, pod, uuid) "
               f"carma_pod_gpu_memory_used_bytes{{{POD_SEL}}})", "bytes"), 6, 8)
    L.add(stat("GPUs without enforced memory limits",
               "GPUs whose containers nothing holds to their NVIDIA_GPU_MEMORY_LIMIT "
               "(carma_gpu_memory_enforcement mode none): a pod there can use more than its reservation "
               "and push a neighbour out of memory (docs/enforcement.md).",
               f'count(carma_gpu_memory_enforcement{{{GPU_SEL}, mode="none"}}) or vector(0)', decimals=0,
               thresholds=[(1, "orange")]), 6, 7)
    L.add(table("Memory limit enforcement per GPU",
                "What holds each GPU's containers to their memory limit, as its node agent decided at start "
                "(carma_gpu_memory_enforcement): driver = NVIDIA's CDI hook apply-cuda-memory-limits (NVML, "
                "CUDA 13.4 drivers), mps = MPS pinned device memory, none = advisory. Chart value "
                "enforcement.memoryLimits.",
                [target(f"max by (node, gpu, mode) (carma_gpu_memory_enforcement{{{GPU_SEL}}})",
                        instant=True, fmt="table")],
                exclude=["Time", "Value"],
                rename={"node": "Node", "gpu": "GPU", "mode": "Enforcement"}), 18, 7)

    L.row("Estimator vs observed peaks")
    # Over the dashboard's time range: attempts end rarely, so per-interval rates would be mostly empty.
    L.add(stat("Underestimated attempts", "TrainingTask attempts, in the selected time range (all nodes), that "
               "ran out of GPU memory or peaked above their reservation (operator, by the device plugin's "
               "running per-pod peak). Alert CarmaEstimatorUnderestimates.",
               "sum(increase(carma_operator_underestimates_total{job=~\"$job\"}[$__range]))", decimals=0,
               thresholds=[(1, "red")]), 8, 4)
    L.add(stat("Reservations learned from history", "Share of the extender's reservations in the selected time "
               "range that came from a MemoryHistory record (largest observed peak of the same model profile "
               "+ headroom, used when lower than the estimate or when the estimate proved too small).",
               "(sum(increase(carma_extender_reservations_total{job=~\"$job\", source=\"history\"}[$__range])) or on () vector(0)) / "
               "sum(increase(carma_extender_reservations_total{job=~\"$job\"}[$__range]))", "percentunit", decimals=1,
               nan_text="no reservations"), 8, 4)
    L.add(stat("MemoryHistory write errors", "Observed peaks the operator failed to record in a MemoryHistory in "
               "the selected time range (recording is advisory: the pod keeps its estimate; check the "
               "operator's logs and RBAC). Alert CarmaMemoryHistoryWriteErrors.",
               'sum(increase(carma_operator_history_writes_total{job=~"$job", result="error"}[$__range]))', decimals=0,
               thresholds=[(1, "orange")]), 8, 4)
    L.add(table("Reservation vs observed peak per pod",
                "Per pod over the selected time range: its largest reservation per GPU, the largest GPU memory "
                "it was observed to use on one GPU (carma_pod_gpu_memory_peak_bytes: the device plugin's running "
                "peak at its sample interval, so a spike shorter than a sample can be missed), and peak ÷ reservation (the largest over its GPUs). Above 100 % "
                "the estimate was too low; far below, the reservation wasted shareable memory.",
                [target(f"max by (node, namespace, pod) (max_over_time(carma_pod_gpu_memory_reserved_bytes{{{POD_SEL}}}[$__range]))",
                        instant=True, fmt="table"),
                 target(f"max by (node, namespace, pod) (max_over_time(carma_pod_gpu_memory_peak_bytes{{{POD_SEL}}}[$__range]))",
                        instant=True, fmt="table"),
                 target(f"max by (node, namespace, pod) (max_over_time(carma_pod_gpu_memory_peak_bytes{{{POD_SEL}}}[$__range]) "
                        f"/ on (node, namespace, pod, uuid) max_over_time(carma_pod_gpu_memory_reserved_bytes{{{POD_SEL}}}[$__range]))",
                        instant=True, fmt="table")],
                exclude=["Time"],
                rename={"node": "Node", "namespace": "Namespace", "pod": "Pod", "Value #A": "Reservation",
                        "Value #B": "Observed peak", "Value #C": "Peak ÷ reservation"},
                units={"Reservation": "bytes", "Observed peak": "bytes", "Peak ÷ reservation": "percentunit"},
                merge=True, sort_by=("Peak ÷ reservation", True),
                overrides=[by_name("Peak ÷ reservation", {
                    "custom.cellOptions": {"type": "color-text"},
                    "thresholds": {"mode": "absolute", "steps": [
                        {"color": "green", "value": None}, {"color": "orange", "value": 0.9},
                        {"color": "red", "value": 1}]}})]), 14, 9)
    L.add(bargauge("Peak ÷ reservation by source (p50, p95)",
                   "Observed GPU memory peak ÷ reservation per GPU of the attempts that succeeded or ran out of "
                   "GPU memory in the selected time range, by where the reservation came from (GPUMemNet, "
                   "analytic bound, history, override, whole GPU), from the operator's histogram. Above 100 % "
                   "the source underestimated; the top bucket is 125 %, so anything above shows as 125 %.",
                   [target("histogram_quantile(0.5, sum by (source, le) (increase(carma_operator_attempt_peak_ratio_bucket{job=~\"$job\"}[$__range])))",
                           "p50 {{source}}", instant=True),
                    target("histogram_quantile(0.95, sum by (source, le) (increase(carma_operator_attempt_peak_ratio_bucket{job=~\"$job\"}[$__range])))",
                           "p95 {{source}}", instant=True)],
                   "percentunit", min_=0, max_=1.25, thresholds=[(0.9, "orange"), (1, "red")],
                   nan_text="no attempts"), 10, 9)

    L.add(timeseries("Predicted vs actual peak memory per pod",
                     "Per pod (largest over its GPUs): the reservation carma made for it per GPU (dashed: the "
                     "prediction it was placed by, from carma.io/estimate: GPUMemNet, analytic bound, history, "
                     "override or whole GPU), the running peak the device plugin observed "
                     "(carma_pod_gpu_memory_peak_bytes) and the current use. A peak above the dashed line is an "
                     "underestimate; a peak far below it is memory the GPU could have shared. Filter by namespace "
                     "and pod to compare a few.",
                     [target(f"max by (namespace, pod) (carma_pod_gpu_memory_reserved_bytes{{{POD_SEL}}})",
                             "reservation {{namespace}}/{{pod}}"),
                      target(f"max by (namespace, pod) (carma_pod_gpu_memory_peak_bytes{{{POD_SEL}}})",
                             "peak {{namespace}}/{{pod}}"),
                      target(f"max by (namespace, pod) (carma_pod_gpu_memory_used_bytes{{{POD_SEL}}})",
                             "used {{namespace}}/{{pod}}")],
                     "bytes", min_=0,
                     overrides=[by_regex("^reservation .*", {"custom.lineStyle": {"fill": "dash", "dash": [10, 10]},
                                                             "custom.fillOpacity": 0, "custom.lineWidth": 2}),
                                by_regex("^used .*", {"custom.fillOpacity": 0, "custom.lineStyle": {"fill": "dot", "dash": [0, 10]}})]),
          24, 10)

    L.row("SM activity against the cap")
    L.add(timeseries("SM activity risk score vs cap",
                     "CARMA risk score of SM activity (0.2·mean + 0.3·median + 0.3·p95 + 0.2·EMA over 30 "
                     "samples) per GPU, and the cap: a GPU at or above the cap takes no new pod when its SM "
                     "occupancy or DRAM activity is also high.",
                     [target(f"carma_gpu_sm_activity_risk_score{{{GPU_SEL}}}", "{{node}}/{{gpu}}"),
                      target(f"max(carma_gpu_sm_activity_cap_ratio{{{GPU_SEL}}})", "cap")],
                     "percentunit", min_=0, max_=1,
                     overrides=[dashed_line("cap", "red")]), 12, 9)
    L.add(timeseries("SM activity (last sample)",
                     "Last SM-activity sample per GPU, with its source (dcgm, gpm, nvml-util fallback, "
                     "simulated). nvml-util is kernel time, not SM activity: treat it as an upper bound.",
                     [target(f"carma_gpu_sm_activity_ratio{{{GPU_SEL}}}", "{{node}}/{{gpu}} ({{source}})")],
                     "percentunit", min_=0, max_=1), 12, 9)
    L.add(timeseries("SM occupancy risk score", "Second gate input: SM occupancy risk score against its cap "
                     "(placement.smOccupancyCap, dashed line).",
                     [target(f"carma_gpu_sm_occupancy_risk_score{{{GPU_SEL}}}", "{{node}}/{{gpu}}"),
                      target("vector($sm_occupancy_cap)", "cap")],
                     "percentunit", min_=0, max_=1, overrides=[dashed_line("cap", "orange")]), 12, 8)
    L.add(timeseries("DRAM activity risk score", "Third gate input: DRAM activity risk score against its cap "
                     "(placement.dramActivityCap, dashed line).",
                     [target(f"carma_gpu_dram_activity_risk_score{{{GPU_SEL}}}", "{{node}}/{{gpu}}"),
                      target("vector($dram_activity_cap)", "cap")],
                     "percentunit", min_=0, max_=1, overrides=[dashed_line("cap", "orange")]), 12, 8)
    L.add(timeseries("SM occupancy and DRAM activity (last sample)", "Last samples of the two gate inputs.",
                     [target(f"carma_gpu_sm_occupancy_ratio{{{GPU_SEL}}}", "occupancy {{node}}/{{gpu}}"),
                      target(f"carma_gpu_dram_activity_ratio{{{GPU_SEL}}}", "dram {{node}}/{{gpu}}")],
                     "percentunit", min_=0, max_=1), 24, 8)

    L.row("Power and energy")
    L.add(timeseries("Power per GPU", "Power draw per GPU.",
                     [target(f"carma_gpu_power_watts{{{GPU_SEL}}}", "{{node}}/{{gpu}}")], "watt", min_=0), 12, 8)
    L.add(timeseries("Energy per GPU", "Energy used per GPU in each interval (from the energy counter).",
                     [target(f"increase(carma_gpu_energy_joules_total{{{GPU_SEL}}}[$__rate_interval])",
                             "{{node}}/{{gpu}}")], "joule", min_=0, draw="bars", stack=True), 6, 8)
    L.add(stat("Energy in range", "GPU energy on the selected GPUs over the selected time range.",
               f"sum(increase(carma_gpu_energy_joules_total{{{GPU_SEL}}}[$__range])) / 3.6e6", "kwatth"), 6, 8)

    L.row("Telemetry and recovery")
    L.add(timeseries("Telemetry age per node", "Seconds since each device plugin's last GPU sample. Above "
                     "60 s placement runs on stale figures (alert CarmaTelemetryStale).",
                     [target(f"time() - carma_telemetry_last_sample_timestamp_seconds{{{NODE_SEL}}}", "{{node}}")],
                     "s", min_=0, thresholds=[(60, "red")]), 8, 8)
    L.add(timeseries("GPU health", "1 = healthy, 0 = unhealthy (replicas withdrawn).",
                     [target(f"carma_gpu_healthy{{{GPU_SEL}}}", "{{node}}/{{gpu}}")], "short", min_=0, max_=1),
          8, 8)
    L.add(timeseries("OOM recoveries", "Out-of-memory crashes requeued by the operator per interval.",
                     [target("sum(increase(carma_operator_oom_recoveries_total{job=~\"$job\"}[$__rate_interval]))", "OOM recoveries")],
                     "short", min_=0, draw="bars"), 8, 8)
    L.add(timeseries("Allocate calls by result", "kubelet Allocate calls per device plugin and result. Anything but ok "
                     "(no_pod, lookup_off, lookup_error, bad_request, bad_assignment) means a container did not "
                     "get its GPUs.",
                     [target("sum by (instance, result) (increase(carma_device_plugin_allocations_total{job=~\"$job\"}[$__rate_interval]))",
                             "{{instance}} {{result}}")],
                     "short", min_=0, draw="bars", stack=True), 12, 8)
    L.add(timeseries("GpuNode publishes by result", "Writes of each node's GpuNode status (at the next sample after a "
                     "change that can move a placement, beyond the deadbands, else once per 5 min heartbeat). Errors "
                     "leave the extender with stale figures.",
                     [target("sum by (instance, result) (increase(carma_gpunode_publish_total{job=~\"$job\"}[$__rate_interval]))",
                             "{{instance}} {{result}}")], "short", min_=0, draw="bars", stack=True), 12, 8)
    L.add(timeseries("GpuNode status writes per second by reason", "What the device plugins cost the API server: "
                     "status writes a second, all nodes together, by why they were made (first, change, heartbeat). "
                     "At rest only heartbeats: nodes / 285 a second at the default 5 min heartbeat (5,000 nodes: "
                     "about 18).",
                     [target("sum by (reason) (rate(carma_gpunode_status_writes_total{job=~\"$job\"}[$__rate_interval]))",
                             "{{reason}}")], "ops", min_=0, stack=True), 12, 8)
    return dashboard("carma-gpu-collocation", "carma / GPU collocation",
                     "Per-GPU collocation: which pods share each GPU, the sharing decision and its reason per GPU, "
                     "reserved vs used memory, predicted (reserved) vs actual peak memory per pod, SM activity "
                     "against the cap, power and energy, estimator error (reservation vs observed peak per pod and by "
                     "reservation source, underestimates, reservations learned from history) and OOM recoveries.",
                     L.panels, True, [link("carma / scheduling and recovery", "carma-control-plane")],
                     [OOM_CRASHES, OOM_REQUEUES])


def control_plane() -> dict:
    L = Layout()
    L.row("Scheduler extender")
    L.add(timeseries("Extender requests by verb and outcome", "kube-scheduler calls to the carma extender.",
                     [target("sum by (verb, outcome) (rate(carma_extender_requests_total{job=~\"$job\"}[$__rate_interval]))",
                             "{{verb}} {{outcome}}")], "reqps", min_=0), 12, 8)
    L.add(timeseries("Extender latency (p50, p99)", "Latency of filter, prioritize and bind as the extender "
                     "measures it. kube-scheduler's httpTimeout (5 s by default) bounds it; p99 above 1 s alerts.",
                     [target("histogram_quantile(0.99, sum by (le, verb) (rate(carma_extender_request_duration_seconds_bucket{job=~\"$job\"}[$__rate_interval])))",
                             "p99 {{verb}}"),
                      target("histogram_quantile(0.5, sum by (le, verb) (rate(carma_extender_request_duration_seconds_bucket{job=~\"$job\"}[$__rate_interval])))",
                             "p50 {{verb}}")], "s", min_=0, thresholds=[(1, "red")]), 12, 8)
    L.add(timeseries("Mean extender latency", "Mean latency per verb.",
                     [target("sum by (verb) (rate(carma_extender_request_duration_seconds_sum{job=~\"$job\"}[$__rate_interval])) / "
                             "sum by (verb) (rate(carma_extender_request_duration_seconds_count{job=~\"$job\"}[$__rate_interval]))",
                             "{{verb}}")], "s", min_=0), 8, 8)
    L.add(timeseries("Node rejections by reason", "Why filter rejected nodes (memory, utilization gate, "
                     "settling GPU, malformed annotation, ...).",
                     [target("sum by (reason) (increase(carma_extender_rejections_total{job=~\"$job\"}[$__rate_interval]))",
                             "{{reason}}")], "short", min_=0, draw="bars", stack=True), 8, 8)
    L.add(timeseries("Reservations by source", "Where each pod's memory reservation came from (GPUMemNet "
                     "estimate, analytic fallback, learned from earlier runs of the same model profile (history), "
                     "user override, whole GPU).",
                     [target("sum by (source) (increase(carma_extender_reservations_total{job=~\"$job\"}[$__rate_interval]))",
                             "{{source}}")], "short", min_=0, draw="bars", stack=True), 8, 8)
    L.add(timeseries("Placements in flight", "Pods bound by the extender whose memory does not show in "
                     "telemetry yet (their GPUs take no other pod meanwhile).",
                     [target("sum(carma_extender_placements_in_flight{job=~\"$job\"})", "in flight")], "short", min_=0), 12, 8)
    L.add(timeseries("Binds by result", "Bind calls: GPU choice, annotations and Binding creation.",
                     [target("sum by (result) (increase(carma_extender_binds_total{job=~\"$job\"}[$__rate_interval]))",
                             "{{result}}")], "short", min_=0, draw="bars", stack=True), 12, 8)

    L.row("Operator leadership")
    L.add(stat("Operator leaders", "Operator replicas holding the leader lease now (carma_operator_leader). "
               "1 is healthy; 0 means no replica reconciles TrainingTasks (lease lost or API server "
               "unreachable); above 1 two replicas think they lead.",
               f"sum(carma_operator_leader{{{JOB_SEL}}})", decimals=0,
               thresholds=[(1, "green"), (2, "red")], base="red"), 4, 7)
    L.add(state_timeline("Leader lease per operator replica",
                         "Per operator replica (scrape instance): leader (holds the lease and reconciles) or "
                         "standby. A hand-over shows as one replica turning standby and another turning leader; "
                         "the annotation marks each change.",
                         [target(f"max by (instance) (carma_operator_leader{{{JOB_SEL}}})", "{{instance}}")],
                         value_map(("1", "leader", "green"), ("0", "standby", "text"))), 20, 7)

    L.row("Operator and recovery")
    L.add(timeseries("TrainingTasks by phase", "TrainingTasks per phase (Pending, Running, Recovering, "
                     "Succeeded, Failed).",
                     [target("sum by (phase) (carma_operator_tasks{job=~\"$job\"})", "{{phase}}")], "short", min_=0,
                     stack=True), 12, 8)
    L.add(timeseries("Attempts by outcome", "Finished attempts per outcome.",
                     [target("sum by (outcome) (increase(carma_operator_attempts_total{job=~\"$job\"}[$__rate_interval]))",
                             "{{outcome}}")], "short", min_=0, draw="bars", stack=True), 12, 8)
    L.add(timeseries("OOM recoveries", "Attempts that crashed out of GPU memory and were requeued.",
                     [target("sum(increase(carma_operator_oom_recoveries_total{job=~\"$job\"}[$__rate_interval]))", "OOM recoveries")],
                     "short", min_=0, draw="bars"), 8, 8)
    L.add(timeseries("Recovery duration (p50, p90)", "Time from an OOM crash to the next attempt running.",
                     [target("histogram_quantile(0.9, sum by (le) (rate(carma_operator_recovery_duration_seconds_bucket{job=~\"$job\"}[$__rate_interval])))", "p90"),
                      target("histogram_quantile(0.5, sum by (le) (rate(carma_operator_recovery_duration_seconds_bucket{job=~\"$job\"}[$__rate_interval])))", "p50")],
                     "s", min_=0), 8, 8)
    L.add(timeseries("Declared durations exceeded", "Attempts that ran longer than their TrainingTask's "
                     "expectedDurationSeconds; the task's later attempts lose their queue priority class.",
                     [target("sum(increase(carma_operator_expected_duration_exceeded_total{job=~\"$job\"}[$__rate_interval]))",
                             "exceeded")],
                     "short", min_=0, draw="bars"), 8, 8)
    L.add(timeseries("Reconcile errors", "Operator reconcile errors per second, by kind (conflict, "
                     "not_found, forbidden, transport, ...). The series of a kind appears with its first "
                     "error; 0 means none so far.",
                     [target("sum by (kind) (rate(carma_operator_reconcile_errors_total{job=~\"$job\"}[$__rate_interval])) "
                             "or on () vector(0)", "{{kind}}")], "ops", min_=0), 8, 8)
    return dashboard("carma-control-plane", "carma / scheduling and recovery",
                     "The carma scheduler extender (requests, latency, rejections, reservations, binds) and "
                     "the TrainingTask operator (leadership, phases, attempts, OOM recoveries).",
                     L.panels, False, [link("carma / GPU collocation", "carma-gpu-collocation")],
                     [OOM_CRASHES, OOM_REQUEUES, LEADER_CHANGES])


DASHBOARDS = {"carma-gpu-collocation.json": collocation, "carma-control-plane.json": control_plane}


def main() -> int:
    check = "--check" in sys.argv[1:]
    bad = 0
    OUT.mkdir(parents=True, exist_ok=True)
    for name, fn in DASHBOARDS.items():
        text = json.dumps(fn(), indent=2, sort_keys=False) + "\n"
        path = OUT / name
        if check:
            if not path.exists() or path.read_text() != text:
                print(f"DRIFT: deploy/grafana/{name} is not tools/gen-dashboards.py's output", file=sys.stderr)
                bad = 1
            else:
                print(f"ok: deploy/grafana/{name} matches tools/gen-dashboards.py")
        else:
            path.write_text(text)
            print(f"gen-dashboards: wrote deploy/grafana/{name}")
    return bad


if __name__ == "__main__":
    sys.exit(main())
