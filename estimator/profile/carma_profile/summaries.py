"""What `carma estimate --summary` reserves for the held-out jobs, from the text a user would have.

Where only a model's description exists, carma estimates from a `torchsummary` table or, for token
Transformers, from a module printout annotated with parameter counts (GPUMemNet's format). This
module writes both for every job of `heldout.HELD_OUT`, exactly as those tools print them, runs
`carma estimate --summary` on each, and compares the reservation with the peak measured on an H100
(`estimator/tests/data/h100-heldout-peaks.csv`):

    cd estimator/profile && PYTHONPATH=$PWD python -m carma_profile.summaries \\
        --carma ../../target/debug/carma --out /tmp/carma-summaries

Both are written by `describe.py`, as for CARMA's models (`estimator/tests/data/describe_models.py`):
tables from one forward pass in training mode on the `meta` device, printouts with a shared
parameter counted where it first appears. Vision Transformers get a table (the parser accepts a
`transformer` table with attention or LayerNorm rows), token models a printout read at the job's
sequence length. No constant is fitted here: this only measures.
"""

from __future__ import annotations

import argparse
import csv
import json
import subprocess
import sys
from pathlib import Path

from .describe import printout, torchsummary
from .heldout import HELD_OUT

ROOT = Path(__file__).resolve().parents[3]
PEAKS = ROOT / "estimator" / "tests" / "data" / "h100-heldout-peaks.csv"


def measured() -> dict:
    with open(PEAKS) as f:
        return {r["job"]: int(r["measured_mib"]) for r in csv.DictReader(f) if r["measured_mib"]}


def main() -> int:
    import torch

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--carma", default=str(ROOT / "target" / "debug" / "carma"))
    ap.add_argument("--out", default="/tmp/carma-summaries", type=Path)
    a = ap.parse_args()
    a.out.mkdir(parents=True, exist_ok=True)
    peaks = measured()
    print("| job | family | from | batch | measured MiB | carma MiB | reservation − measured |")
    print("|---|---|---|---|---|---|---|")
    gaps = {}
    for label, family, factory, inp, _head, batch, mixed in HELD_OUT:
        if label not in peaks:
            print(f"| {label} | {family} | not measured | {batch} | | | |")
            continue
        with torch.device("meta"):
            model = factory()
        slug = "".join(c if c.isalnum() else "_" for c in label)
        args = [a.carma, "--log", "warn", "estimate", "--family", family, "--batch-size", str(batch)]
        if isinstance(inp, tuple):
            text, kind = torchsummary(model, inp[1]), "torchsummary table"
        else:
            text, kind = printout(model), "annotated printout"
            args += ["--seq-len", str(inp)]
        if mixed:
            args.append("--mixed-precision")
        path = a.out / f"{slug}.txt"
        path.write_text(text)
        res = subprocess.run([*args, "--summary", str(path)], capture_output=True, text=True)
        if res.returncode != 0:
            print(f"| {label} | {family} | {kind} | {batch} | {peaks[label]:,} | error: "
                  f"{res.stderr.strip().splitlines()[-1][:80] if res.stderr.strip() else res.returncode} | |")
            continue
        answer = json.loads(res.stdout)
        mib = answer["estimate_mib"]
        gap = mib - peaks[label]
        gaps.setdefault((family, kind), []).append(gap)
        print(f"| {label} | {family} | {kind} ({answer['source']}) | {batch} | {peaks[label]:,} | {mib:,} "
              f"| {gap:+,} |", flush=True)
    print()
    for (family, kind), g in sorted(gaps.items()):
        under = [x for x in g if x < 0]
        print(f"{family}, {kind}: {len(g)} jobs, {len(under)} underestimated, mean reservation − measured "
              f"{sum(g) / len(g):+,.0f} MiB, largest over {max(g):+,} MiB")
    return 0


if __name__ == "__main__":
    sys.exit(main())
