#!/usr/bin/env python3
"""Copy the figures of the last `cargo bench -p carma-estimator` run into
`estimator/models/latency.json` and re-render MODEL_CARD.md (no retraining).

    cargo bench -p carma-estimator
    .venv/bin/python estimator/training/record_latency.py [--criterion-dir target/criterion]
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import card  # noqa: E402

REPO = Path(__file__).resolve().parents[2]
# (criterion group/bench id, label in the card, elements per iteration)
BENCHES = [
    ("estimate/mlp_single", "one MLP estimate (`Estimator::estimate`)", 1),
    ("estimate/mlp_batch_64", "MLP estimate in a batch of 64 (`estimate_batch`), per estimate", 64),
    ("estimate/mlp_batch_1024", "MLP estimate in a batch of 1024, per estimate", 1024),
    ("estimate/cnn_analytic_single", "one CNN estimate (analytic bound, no model)", 1),
    ("parse/profile_json", "parse a `carma.io/model-profile` annotation", 1),
    ("parse/torchsummary_81_rows", "parse an 81-row torchsummary table", 1),
    ("load/mlp_model", "load + optimise the embedded model (once per process)", 1),
]


def fmt(ns: float) -> str:
    if ns < 1e3:
        return f"{ns:.0f} ns"
    if ns < 1e6:
        return f"{ns / 1e3:.2f} µs"
    return f"{ns / 1e6:.2f} ms"


def cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown CPU"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--criterion-dir", type=Path, default=REPO / "target" / "criterion")
    ap.add_argument("--models", type=Path, default=REPO / "estimator" / "models")
    ap.add_argument("--note", default="")
    args = ap.parse_args(argv)
    rows = []
    for bench_id, label, n in BENCHES:
        est = args.criterion_dir / bench_id / "new" / "estimates.json"
        if not est.is_file():
            print(f"error: {est} not found: run `cargo bench -p carma-estimator` first", file=sys.stderr)
            return 2
        figures = json.loads(est.read_text())
        # criterion prints the slope estimate when it has one (linear sampling), else the mean
        mean = figures.get("slope") or figures["mean"]
        per = mean["point_estimate"] / n
        lo, hi = mean["confidence_interval"]["lower_bound"] / n, mean["confidence_interval"]["upper_bound"] / n
        rows.append({"id": bench_id, "name": label, "mean_ns": per, "ci95_ns": [lo, hi],
                     "display": f"{fmt(per)} (95 % CI {fmt(lo)} – {fmt(hi)})"})
    latency = {
        "command": "cargo bench -p carma-estimator (release, criterion)",
        "machine": f"{cpu_name()}, {os.cpu_count()} logical CPUs shared with other builds, {platform.system()}",
        "date": datetime.date.today().isoformat(),
        "benchmarks": rows,
        "note": args.note,
    }
    (args.models / "latency.json").write_text(json.dumps(latency, indent=1) + "\n")
    sidecar = json.loads((args.models / "gpumemnet-mlp.json").read_text())
    (args.models / "MODEL_CARD.md").write_text(card.render(sidecar, latency))
    for r in rows:
        print(f"{r['name']}: {r['display']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
