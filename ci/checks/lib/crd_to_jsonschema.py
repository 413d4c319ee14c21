#!/usr/bin/env python3
"""Turn a CustomResourceDefinition's openAPIV3Schema into a JSON Schema that check-jsonschema can use.

    crd_to_jsonschema.py CRD.yaml OUT_DIR   -> OUT_DIR/<group>_<kind>_<version>.json for every served version

Conversions (OpenAPI v3 / Kubernetes structural-schema extensions -> JSON Schema draft 2020-12):
  nullable: true                         -> the type also admits null
  x-kubernetes-int-or-string: true       -> anyOf integer | string
  x-kubernetes-preserve-unknown-fields   -> unknown fields allowed there
  objects with properties and neither additionalProperties nor preserve-unknown-fields
                                         -> additionalProperties: false ("strict": the API server's
                                            strict field validation rejects unknown fields too)
apiVersion and kind are pinned to the CRD's group/version and kind; metadata requires a name.
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

import yaml


def convert(node):
    if isinstance(node, list):
        return [convert(n) for n in node]
    if not isinstance(node, dict):
        return node
    out = {}
    for k, v in node.items():
        if k in ("properties", "patternProperties", "definitions", "$defs"):
            out[k] = {name: convert(s) for name, s in v.items()}
        elif k in ("items", "additionalProperties", "not"):
            out[k] = convert(v) if isinstance(v, (dict, list)) else v
        elif k in ("allOf", "anyOf", "oneOf"):
            out[k] = [convert(s) for s in v]
        elif k.startswith("x-kubernetes-") or k == "nullable":
            continue
        else:
            out[k] = v
    if node.get("x-kubernetes-int-or-string"):
        out.pop("type", None)
        out["anyOf"] = out.get("anyOf", []) + [{"type": "integer"}, {"type": "string"}]
    if node.get("nullable") and "type" in out:
        t = out["type"]
        out["type"] = (t if isinstance(t, list) else [t]) + ["null"]
    if ("properties" in node and "additionalProperties" not in node
            and not node.get("x-kubernetes-preserve-unknown-fields")):
        out["additionalProperties"] = False
    return out


def main() -> int:
    crd_path, out_dir = Path(sys.argv[1]), Path(sys.argv[2])
    out_dir.mkdir(parents=True, exist_ok=True)
    crd = yaml.safe_load(crd_path.read_text())
    if crd.get("kind") != "CustomResourceDefinition":
        print(f"{crd_path}: not a CustomResourceDefinition", file=sys.stderr)
        return 1
    group, kind = crd["spec"]["group"], crd["spec"]["names"]["kind"]
    for ver in crd["spec"]["versions"]:
        if not ver.get("served", True):
            continue
        schema = convert(ver["schema"]["openAPIV3Schema"])
        schema["$schema"] = "https://json-schema.org/draft/2020-12/schema"
        schema.setdefault("properties", {})
        schema["properties"]["apiVersion"] = {"const": f"{group}/{ver['name']}"}
        schema["properties"]["kind"] = {"const": kind}
        meta = schema["properties"].get("metadata", {"type": "object"})
        meta = dict(meta)
        meta.pop("additionalProperties", None)
        meta["required"] = sorted(set(meta.get("required", [])) | {"name"})
        meta.setdefault("properties", {})["name"] = {"type": "string", "minLength": 1}
        schema["properties"]["metadata"] = meta
        schema["required"] = sorted(set(schema.get("required", [])) | {"apiVersion", "kind", "metadata"})
        name = f"{group}_{kind}_{ver['name']}.json"
        (out_dir / name).write_text(json.dumps(schema, indent=1))
        print(out_dir / name)
    return 0


if __name__ == "__main__":
    sys.exit(main())
