#!/usr/bin/env python3
"""Generate the values table of charts/carma/README.md from the "# --" comments in values.yaml.

    python3 tools/values-table.py          # rewrite the table between the README's markers
    python3 tools/values-table.py --check  # exit 1 when the README's table is out of date

A comment that starts with "# --" (continued by following "#" lines) documents the key below it.
"""
from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parent.parent
VALUES = ROOT / "charts" / "carma" / "values.yaml"
README = ROOT / "charts" / "carma" / "README.md"
START, END = "<!-- values-table:start -->", "<!-- values-table:end -->"
KEY = re.compile(r"^(\s*)([A-Za-z0-9_.-]+):(.*)$")


def documented(text: str) -> list[tuple[str, str]]:
    stack: list[tuple[int, str]] = []
    pending: list[str] | None = None
    out: list[tuple[str, str]] = []
    for line in text.splitlines():
        s = line.strip()
        if s.startswith("# --"):
            pending = [s[4:].strip()]
            continue
        if s.startswith("#"):
            if pending is not None:
                pending.append(s[1:].strip())
            continue
        m = KEY.match(line)
        if not m or s.startswith("- "):
            if s:
                pending = None
            continue
        indent, key = len(m.group(1)), m.group(2)
        while stack and stack[-1][0] >= indent:
            stack.pop()
        stack.append((indent, key))
        if pending is not None:
            out.append((".".join(k for _, k in stack), " ".join(pending)))
        pending = None
    return out


def lookup(values: dict, path: str):
    cur = values
    for part in path.split("."):
        cur = cur[part]
    return cur


def table() -> str:
    text = VALUES.read_text()
    values = yaml.safe_load(text)
    docs = documented(text)
    parents = {p.rsplit(".", 1)[0] for p, _ in docs if "." in p}
    rows = ["| Key | Default | Description |", "|---|---|---|"]
    for path, desc in docs:
        if path in parents:
            default = "(see below)"
        else:
            v = lookup(values, path)
            default = "`" + json.dumps(v, separators=(", ", ": ")).replace("|", "\\|") + "`"
        cell = desc.replace("|", "\\|")
        rows.append(f"| `{path}` | {default} | {cell} |")
    return "\n".join(rows)


def main() -> int:
    readme = README.read_text()
    if START not in readme or END not in readme:
        print(f"values-table: {README.relative_to(ROOT)} lacks the {START} / {END} markers", file=sys.stderr)
        return 1
    head, rest = readme.split(START, 1)
    _, tail = rest.split(END, 1)
    new = f"{head}{START}\n{table()}\n{END}{tail}"
    if "--check" in sys.argv[1:]:
        if new != readme:
            print("DRIFT: charts/carma/README.md values table is out of date (run tools/values-table.py)",
                  file=sys.stderr)
            return 1
        print("ok: charts/carma/README.md values table matches values.yaml")
        return 0
    README.write_text(new)
    print("values-table: updated charts/carma/README.md")
    return 0


if __name__ == "__main__":
    sys.exit(main())
