"""What `carma estimate --summary` reserves for the held-out jobs, from the text a user would have.

Where only a model's description exists, carma estimates from a `torchsummary` table or, for token
Transformers, from a module printout annotated with parameter counts (GPUMemNet's format). This
module writes both for every job of `heldout.HELD_OUT`, exactly as those tools print them, runs
`carma estimate --summary` on each, and compares the reservation with the peak measured on an H100
(`estimator/tests/data/h100-heldout-peaks.csv`):

    cd estimator/profile && PYTHONPATH=$PWD python -m carma_profile.summaries \\
        --carma ../../target/debug/carma --out /tmp/carma-summaries

Tables: the model runs one forward pass on the CPU at batch 2 with hooks on every module but
`Sequential`, `ModuleList` and the model itself (torchsummary's rule); a row is the module's class
and number, its output shape with the batch as -1, and its own `weight` and `bias` sizes. Vision
Transformers get a table too (the parser accepts a `transformer` table with attention or LayerNorm
rows). Printouts: `print(model)` with `, <n> params` after every module, token models only, with the
job's sequence length. No constant is fitted here: this only measures.
"""

from __future__ import annotations

import argparse
import csv
import json
import subprocess
import sys
from pathlib import Path

from .heldout import HELD_OUT

ROOT = Path(__file__).resolve().parents[3]
PEAKS = ROOT / "estimator" / "tests" / "data" / "h100-heldout-peaks.csv"


def torchsummary_table(model, sample) -> str:
    """The table torchsummary prints for `model` on input `sample` (batch 2)."""
    import torch
    from torch import nn

    rows, hooks = [], []

    def shape(out):
        if isinstance(out, (list, tuple)):
            return [shape(o) for o in out if isinstance(o, torch.Tensor)]
        return [-1, *out.shape[1:]] if isinstance(out, torch.Tensor) else None

    def hook(module, _inp, out):
        name = f"{module.__class__.__name__}-{len(rows) + 1}"
        params = 0
        for attr in ("weight", "bias"):
            t = getattr(module, attr, None)
            if isinstance(t, torch.Tensor):
                params += t.numel()
        s = shape(out)
        if isinstance(out, (list, tuple)) and len(s) == 1:
            s = s[0]
        if s is None or s == []:
            return
        rows.append((name, s, params))

    for m in model.modules():
        if not isinstance(m, (nn.Sequential, nn.ModuleList)) and m is not model:
            hooks.append(m.register_forward_hook(hook))
    model.eval()
    with torch.no_grad():
        model(sample)
    for h in hooks:
        h.remove()
    lines = ["-" * 64, f"{'Layer (type)':>20}  {'Output Shape':>25} {'Param #':>15}", "=" * 64]
    for name, s, p in rows:
        lines.append(f"{name:>20}  {str(s):>25} {p:>15,}")
    lines += ["=" * 64, f"Total params: {sum(p for _, _, p in rows):,}"]
    return "\n".join(lines) + "\n"


def annotated_printout(model) -> str:
    """`print(model)` with `, <n> params` after every module, as in GPUMemNet's Transformer data.
    Every class on the way that prints itself (`nn.Module`, `nn.ModuleList`, Hugging Face's
    `Conv1D`, ...) gets the count appended for the length of the call."""
    from torch import nn

    classes = {c for m in model.modules() for c in type(m).__mro__ if issubclass(c, nn.Module)}
    plain = {c: c.__dict__["__repr__"] for c in classes if "__repr__" in c.__dict__}

    def annotated(f):
        return lambda m: f(m) + f", {sum(p.numel() for p in m.parameters()):,} params"

    for c, f in plain.items():
        c.__repr__ = annotated(f)
    try:
        return repr(model) + "\n"
    finally:
        for c, f in plain.items():
            c.__repr__ = f


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
        torch.manual_seed(0)
        model = factory()
        slug = "".join(c if c.isalnum() else "_" for c in label)
        args = [a.carma, "--log", "warn", "estimate", "--family", family, "--batch-size", str(batch)]
        if isinstance(inp, tuple):
            text, kind = torchsummary_table(model, torch.zeros(2, *inp)), "torchsummary table"
        else:
            text, kind = annotated_printout(model), "annotated printout"
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
