#!/usr/bin/env python3
"""Which attention kernel CUDA runs for a model, and what each kernel costs in memory.

    PYTHONPATH=estimator/profile python3 tools/gpu-probe-attention.py --out DIR

Needs a CUDA GPU. The traced estimate models every `scaled_dot_product_attention` call as a
fused kernel that keeps no L x L tensors. On an H100 T5-small (whose learned position bias
reaches attention as a float mask that needs a gradient) allocated 2,094 MiB more than its
trace, and GPT-2 under bf16 autocast 1,210 MiB more (docs/traced-estimate.md). This probe runs
each such model's training step once per SDPA backend (the default choice, then each backend
forced with `torch.nn.attention.sdpa_kernel`), each in a fresh process, and writes to
DIR/attention.csv: the model, the backend, `torch.cuda.max_memory_allocated`, and the
attention kernels the profiler saw in the default run. A backend that refuses the call is
recorded with its error.
"""

from __future__ import annotations

import argparse
import csv
import json
import subprocess
import sys
import time
from pathlib import Path

MIB = 1 << 20
# label -> (heldout/calibrate label, batch, bf16 autocast)
MODELS = {
    "t5-small": ("t5-small (seq2seq)", 16, False),
    "gpt2-bf16": ("gpt2 (causal LM, bf16 autocast)", 16, True),
    "bert-base-bf16": ("bert-base (masked LM, bf16 autocast)", 32, True),
}
BACKENDS = ["default", "EFFICIENT_ATTENTION", "FLASH_ATTENTION", "CUDNN_ATTENTION", "MATH"]


def run_one(model: str, backend: str) -> dict:
    import contextlib

    import torch

    from carma_profile.calibrate import step_inputs
    from carma_profile.heldout import HELD_OUT
    from carma_profile.measure import TrainingLoop

    label, batch, amp = MODELS[model]
    _, _, factory, shape, head, _, _ = next(j for j in HELD_OUT if j[0] == label)
    kw, _ = step_inputs(torch, shape, head)
    loop = TrainingLoop(torch, factory, batch, mixed_precision=amp, **kw)
    if backend == "default":
        choose = contextlib.nullcontext()
    else:
        from torch.nn.attention import SDPBackend, sdpa_kernel

        choose = sdpa_kernel([getattr(SDPBackend, backend)])
    prof = (torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA])
            if backend == "default" else contextlib.nullcontext())
    torch.cuda.reset_peak_memory_stats()
    with prof as p, choose:
        for _ in range(3):
            loop.step()
        torch.cuda.synchronize()
    kernels: set[str] = set()
    if p is not None:
        for e in p.key_averages():
            if any(k in e.key.lower() for k in ("fmha", "flash", "attention", "cudnn", "softmax")):
                kernels.add(e.key[:80])
    return {"model": label, "batch_size": batch, "backend": backend,
            "peak_allocated_mib": -(-torch.cuda.max_memory_allocated() // MIB),
            "peak_reserved_mib": -(-torch.cuda.max_memory_reserved() // MIB),
            "kernels": " | ".join(sorted(kernels)), "torch_version": torch.__version__, "error": ""}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, help="directory for attention.csv")
    ap.add_argument("--models", default=",".join(MODELS), help=f"comma-separated, of {', '.join(MODELS)}")
    ap.add_argument("--deadline-s", type=float, default=300, help="start no run after this long")
    ap.add_argument("--one", nargs=2, metavar=("MODEL", "BACKEND"), help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.one:
        try:
            print(json.dumps(run_one(*args.one)))
        except Exception as e:  # noqa: BLE001 — the backend refused: recorded
            label, batch, _ = MODELS[args.one[0]]
            print(json.dumps({"model": label, "batch_size": batch, "backend": args.one[1],
                              "error": f"{type(e).__name__}: {str(e).splitlines()[0][:200] if str(e) else ''}"}))
        return 0
    if args.out is None:
        ap.error("--out is required")
    unknown = [m for m in args.models.split(",") if m not in MODELS]
    if unknown:
        print(f"gpu-probe-attention: error: unknown model(s) {', '.join(unknown)}", file=sys.stderr)
        return 2
    args.out.mkdir(parents=True, exist_ok=True)
    cols = ["model", "batch_size", "backend", "peak_allocated_mib", "peak_reserved_mib", "kernels",
            "torch_version", "error"]
    t0 = time.time()
    with (args.out / "attention.csv").open("w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=cols, lineterminator="\n", extrasaction="ignore")
        w.writeheader()
        for model in args.models.split(","):
            for backend in BACKENDS:
                if time.time() - t0 > args.deadline_s:
                    print("gpu-probe-attention: deadline reached", file=sys.stderr)
                    return 0
                try:
                    r = subprocess.run([sys.executable, __file__, "--one", model, backend], capture_output=True,
                                       text=True, timeout=max(10.0, args.deadline_s - (time.time() - t0)))
                except subprocess.TimeoutExpired as e:
                    # one slow backend is a row of its own, not the end of the probe
                    w.writerow({"model": model, "backend": backend, "error": f"timed out after {e.timeout:.0f} s"})
                    f.flush()
                    continue
                try:
                    row = json.loads(r.stdout.strip().splitlines()[-1])
                except (ValueError, IndexError):
                    row = {"model": model, "backend": backend,
                           "error": f"exited with {r.returncode}: {' | '.join(r.stderr.strip().splitlines()[-2:])[:300]}"}
                w.writerow(row)
                f.flush()
                print(f"{model} {backend}: {row.get('peak_allocated_mib', '')} MiB {row.get('error', '')}",
                      file=sys.stderr, flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
