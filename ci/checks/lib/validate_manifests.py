#!/usr/bin/env python3
"""Validate Kubernetes manifests offline; used by ci/checks/schemas.sh.

    validate_manifests.py --kube-version 1.35.0 --crd-schemas DIR [--examples] FILE...

Every document (items of a `kind: List` included) is validated according to its kind:
  * built-in Kubernetes kinds: kubernetes-validate (the Kubernetes JSON schemas), strict (unknown fields
    are errors);
  * carma.io kinds: the generated CRD's openAPIV3Schema (converted by crd_to_jsonschema.py) through the
    check-jsonschema CLI; a TrainingTask's spec.template is also validated as a core/v1 PodTemplate;
  * ServiceMonitor / PrometheusRule: hand-written schemas in ci/checks/schemas/, and a PrometheusRule's
    rules with `promtool check rules`;
  * cert-manager Certificate / Issuer (extender TLS with source=certManager): hand-written schemas in
    ci/checks/schemas/;
  * the KubeSchedulerConfiguration inside the scheduler ConfigMap: its v1 schema in ci/checks/schemas/
    plus the semantic rules kube-scheduler enforces for extenders;
  * Grafana dashboard ConfigMaps: their JSON must parse and carry panels.
Prints one line per object; exits 1 when any object fails or has no schema.
"""
from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import jsonschema
import kubernetes_validate
import yaml

HERE = Path(__file__).resolve().parent
SCHEMAS = HERE.parent / "schemas"


class Result:
    def __init__(self) -> None:
        self.ok = 0
        self.failed: list[str] = []

    def good(self, what: str, how: str) -> None:
        self.ok += 1
        print(f"  ok    {what}  [{how}]")

    def bad(self, what: str, why: str) -> None:
        self.failed.append(f"{what}: {why}")
        print(f"  FAIL  {what}: {why}")


def docs_of(path: Path):
    for doc in yaml.safe_load_all(path.read_text()):
        if not doc:
            continue
        if doc.get("kind") == "List" and doc.get("apiVersion") == "v1":
            for item in doc.get("items", []):
                yield item
        else:
            yield doc


def ident(path: Path, doc: dict) -> str:
    meta = doc.get("metadata") or {}
    ns = f"{meta['namespace']}/" if meta.get("namespace") else ""
    return f"{path.name}: {doc.get('kind')}/{ns}{meta.get('name')}"


def k8s_validate(doc: dict, version: str) -> str | None:
    try:
        kubernetes_validate.validate(doc, version, strict=True)
    except kubernetes_validate.ValidationError as e:
        return f"{e.message} at {'/'.join(str(p) for p in e.path) or '(root)'}"
    except kubernetes_validate.SchemaNotFoundError as e:
        return f"no Kubernetes schema: {e}"
    return None


def jsonschema_file(doc, schema_file: Path) -> str | None:
    schema = json.loads(schema_file.read_text())
    errors = sorted(jsonschema.Draft202012Validator(schema).iter_errors(doc), key=lambda e: list(e.path))
    if errors:
        e = errors[0]
        return f"{e.message} at {'/'.join(str(p) for p in e.path) or '(root)'}" + (
            f" (+{len(errors) - 1} more)" if len(errors) > 1 else "")
    return None


def check_jsonschema_cli(doc: dict, schema_file: Path, tmp: Path) -> str | None:
    inst = tmp / "instance.json"
    inst.write_text(json.dumps(doc))
    exe = shutil.which("check-jsonschema") or str(Path(sys.executable).parent / "check-jsonschema")
    p = subprocess.run([exe, "--schemafile", str(schema_file), str(inst)], capture_output=True, text=True)
    if p.returncode != 0:
        return " ".join((p.stdout + p.stderr).split())[-600:]
    return None


def scheduler_config_semantics(cfg: dict) -> str | None:
    """Rules kube-scheduler's ValidateKubeSchedulerConfiguration applies to extenders and profiles."""
    names = [p.get("schedulerName") for p in cfg.get("profiles", [])]
    if len(names) != len(set(names)):
        return "duplicate profile schedulerName"
    binders = [e for e in cfg.get("extenders", []) if e.get("bindVerb")]
    if len(binders) > 1:
        return "only one extender may implement bind"
    for e in cfg.get("extenders", []):
        if e.get("prioritizeVerb") and int(e.get("weight", 0)) <= 0:
            return "an extender with prioritizeVerb needs a positive weight"
        seen = set()
        for r in e.get("managedResources", []):
            n = r["name"]
            if n in seen:
                return f"duplicate managed resource {n}"
            seen.add(n)
            if n.split("/")[0].endswith("kubernetes.io"):
                return f"managed resource {n} is not an extended resource"
        if e.get("enableHTTPS") and not e.get("urlPrefix", "").startswith("https://"):
            return "enableHTTPS with an http:// urlPrefix"
        if not e.get("enableHTTPS") and e.get("urlPrefix", "").startswith("https://"):
            return "https:// urlPrefix without enableHTTPS"
    return None


def validate(path: Path, doc: dict, args, res: Result, tmp: Path) -> None:
    what = ident(path, doc)
    api, kind = doc.get("apiVersion", ""), doc.get("kind", "")
    group = api.split("/")[0] if "/" in api else ""

    if group == "carma.io":
        version = api.split("/")[1]
        schema = Path(args.crd_schemas) / f"carma.io_{kind}_{version}.json"
        if not schema.exists():
            res.bad(what, f"no CRD schema for {api} {kind} (is crds/ generated?)")
            return
        err = check_jsonschema_cli(doc, schema, tmp)
        if err:
            res.bad(what, err)
            return
        template = (doc.get("spec") or {}).get("template")
        if kind == "TrainingTask" and isinstance(template, dict):
            err = k8s_validate({"apiVersion": "v1", "kind": "PodTemplate",
                                "metadata": {"name": "template"}, "template": template}, args.kube_version)
            if err:
                res.bad(what, f"spec.template is not a valid PodTemplateSpec: {err}")
                return
            res.good(what, f"check-jsonschema vs CRD {schema.name}; spec.template vs core/v1 PodTemplateSpec")
            return
        res.good(what, f"check-jsonschema vs CRD {schema.name}")
        return

    if group == "cert-manager.io":
        schema = SCHEMAS / f"{kind.lower()}-{api.split('/')[1]}.schema.json"
        if not schema.exists():
            res.bad(what, f"no schema for {api} {kind}")
            return
        err = jsonschema_file(doc, schema)
        if err:
            res.bad(what, err)
            return
        res.good(what, schema.name)
        return

    if group == "monitoring.coreos.com":
        schema = SCHEMAS / f"{kind.lower()}-{api.split('/')[1]}.schema.json"
        if not schema.exists():
            res.bad(what, f"no schema for {api} {kind}")
            return
        err = jsonschema_file(doc, schema)
        if err:
            res.bad(what, err)
            return
        if kind == "PrometheusRule":
            rules = tmp / "rules.yaml"
            rules.write_text(yaml.safe_dump(doc["spec"]))
            promtool = shutil.which("promtool")
            if not promtool:
                res.bad(what, "promtool not found")
                return
            p = subprocess.run([promtool, "check", "rules", str(rules)], capture_output=True, text=True)
            if p.returncode != 0:
                res.bad(what, "promtool: " + " ".join((p.stdout + p.stderr).split())[-400:])
                return
            res.good(what, f"{schema.name}; promtool check rules")
            return
        res.good(what, schema.name)
        return

    err = k8s_validate(doc, args.kube_version)
    if err:
        res.bad(what, err)
        return
    how = f"kubernetes-validate {args.kube_version} strict"

    if kind == "ConfigMap":
        for key, value in (doc.get("data") or {}).items():
            if key == "config.yaml" and "KubeSchedulerConfiguration" in value:
                cfg = yaml.safe_load(value)
                err = jsonschema_file(cfg, SCHEMAS / "kubeschedulerconfiguration-v1.schema.json") \
                    or scheduler_config_semantics(cfg)
                if err:
                    res.bad(f"{what} {key}", err)
                    return
                how += "; KubeSchedulerConfiguration v1 schema + extender rules"
            elif key.endswith(".json"):
                try:
                    dash = json.loads(value)
                except json.JSONDecodeError as e:
                    res.bad(f"{what} {key}", f"invalid JSON: {e}")
                    return
                if not dash.get("panels") or not dash.get("uid"):
                    res.bad(f"{what} {key}", "not a Grafana dashboard (no uid/panels)")
                    return
                how += f"; {key} is a dashboard with {len(dash['panels'])} panels"
    res.good(what, how)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--kube-version", required=True)
    ap.add_argument("--crd-schemas", required=True)
    ap.add_argument("files", nargs="+")
    args = ap.parse_args()
    res = Result()
    with tempfile.TemporaryDirectory() as t:
        for f in args.files:
            path = Path(f)
            print(f"{path} (Kubernetes {args.kube_version}):")
            try:
                docs = list(docs_of(path))
            except yaml.YAMLError as e:
                res.bad(str(path), f"YAML error: {e}")
                continue
            if not docs:
                res.bad(str(path), "no documents")
            for doc in docs:
                validate(path, doc, args, res, Path(t))
    print(f"validated {res.ok + len(res.failed)} objects: {res.ok} ok, {len(res.failed)} failed")
    return 1 if res.failed else 0


if __name__ == "__main__":
    sys.exit(main())
