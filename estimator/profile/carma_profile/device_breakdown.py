"""What a training step keeps on a real GPU, by module and operator, beside what the trace keeps.

    python -m carma_profile.device_breakdown "t5-small (seq2seq)" --out /tmp/t5.json   # needs CUDA

The traced estimate runs on fake CPU tensors and takes CUDA's operator paths where it knows them
(`gpu_paths`, and the fused attention `trace` substitutes). Where a measured peak is above the
traced one, this runs the same step on the GPU with the same bookkeeping (every storage an
operator creates, by the innermost module running and the ATen operator) and reports:

* at the end of forward and loss, each `(module, operator)` group's bytes on the GPU and in the
  trace, largest difference first: what the trace does not see, or sees too much of;
* each phase's peak three ways: the storages the step's operators create (what the trace
  models), `torch.cuda.max_memory_allocated` (which also sees what kernels allocate inside
  themselves: cuBLAS and cuDNN workspaces), and `torch.cuda.max_memory_reserved` (the caching
  allocator's segments);
* how often each attention kernel ran (`_scaled_dot_product_*` operators, or the math path's
  `bmm` and `_softmax` when none did), which the trace cannot know without a GPU.

Nothing is estimated here: without CUDA it refuses. `device_step(..., device="cpu")` runs the
same bookkeeping on real CPU tensors (the tests use it).
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import Counter
from pathlib import Path

from .core import ProfileError

MIB = 1 << 20

#: Operators that say which attention implementation ran.
ATTENTION_OPS = ("_scaled_dot_product_flash_attention", "_scaled_dot_product_efficient_attention",
                 "_scaled_dot_product_cudnn_attention", "_scaled_dot_product_attention_math",
                 "_flash_attention_forward", "_efficient_attention_forward", "bmm", "_softmax")


def device_step(factory, batch: int, *, device: str = "cuda", steps: int = 2, input_size=None,
                make_input=None, labels=None, mixed_precision: bool = False) -> dict:
    """Two training steps (as `trace.trace_step`: zero_grad, forward, loss, backward, Adam) on
    `device` with real tensors; the bookkeeping of the last step."""
    import torch

    from .trace import PHASES, _LiveBytes, _loss_of, _mode_class, _module_labels, _optimizer

    cuda = device == "cuda"
    if make_input is None:
        shape = tuple(input_size)
        make_input = lambda b: torch.zeros((b, *shape))  # noqa: E731
    live = _LiveBytes(torch)
    live.labels = {}
    with torch.device(device):
        model = factory()
    model.to(device).train()
    for t in [*model.parameters(), *model.buffers()]:
        live.add_tensor(t)
    opt = _optimizer(torch, "adam", [p for p in model.parameters() if p.requires_grad])
    ops: Counter = Counter()

    class Counting(_mode_class(torch)):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            ops[func.overloadpacket.__name__] += 1
            return super().__torch_dispatch__(func, types, args, kwargs)

    def reset() -> None:
        live.start_phase()
        if cuda:
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()

    def peak() -> dict:
        out = {"storagesMiB": live.peak / MIB}
        if cuda:
            torch.cuda.synchronize()
            out["allocatedMiB"] = torch.cuda.max_memory_allocated() / MIB
            out["reservedMiB"] = torch.cuda.max_memory_reserved() / MIB
        return out

    hooks = _module_labels(torch, live)
    phases: dict = {}
    kept: dict = {}
    at_forward_end: dict = {}
    try:
        with Counting(live):
            out = loss = None
            for step in range(steps):
                last = step == steps - 1
                if last:
                    ops.clear()
                opt.zero_grad(set_to_none=True)
                reset()
                live.label = ("input", "")
                with torch.device(device):
                    x = make_input(batch)
                    kw = {} if labels is None else {"labels": labels(batch)}
                    with torch.autocast(device, dtype=torch.bfloat16, enabled=mixed_precision):
                        new_out = model(**x, **kw) if isinstance(x, dict) else model(x, **kw)
                        out = loss = None
                        out = new_out
                        del new_out
                        live.label = ("loss", "")
                        loss = _loss_of(torch, out)
                phases[PHASES[0]] = peak()
                if last:
                    kept = live.breakdown()
                    at_forward_end = {"storagesMiB": live.live / MIB}
                    if cuda:
                        at_forward_end["allocatedMiB"] = torch.cuda.memory_allocated() / MIB
                live.label = ("backward", "")
                reset()
                loss.backward()
                phases[PHASES[1]] = peak()
                live.label = ("optimizer state", "")
                reset()
                opt.step()
                phases[PHASES[2]] = peak()
    finally:
        for h in hooks:
            h.remove()
    return {"phases": phases, "atForwardEnd": at_forward_end, "kept": kept,
            "attentionOps": {k: v for k, v in ops.items() if k in ATTENTION_OPS}}


def differences(device: dict, traced: dict) -> list[tuple[str, str, int, int]]:
    """`(module, operator, device bytes, traced bytes)` for every group of either, the largest
    absolute difference first."""
    keys = set(device) | set(traced)
    rows = [(m, op, device.get((m, op), 0), traced.get((m, op), 0)) for m, op in keys]
    return sorted(rows, key=lambda r: (-abs(r[2] - r[3]), r[0], r[1]))


def environment(torch, device: str) -> dict:
    """The GPU, driver, CUDA and torch versions every figure is recorded with."""
    from .measure import driver_version

    cuda = device == "cuda"
    return {"torch": torch.__version__, "cuda": torch.version.cuda, "driver": driver_version() if cuda else "",
            "gpu": torch.cuda.get_device_name(0) if cuda else "none (CPU run)"}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m carma_profile.device_breakdown",
                                 description=__doc__.split("\n\n")[1])
    ap.add_argument("job", help="a label of carma_profile.heldout or of CARMA's architectures (calibrate.MODELS)")
    ap.add_argument("--batch", type=int, help="per-GPU batch (default: the held-out job's own)")
    ap.add_argument("--out", type=Path, help="write the figures as JSON here as well")
    ap.add_argument("--min-mib", type=float, default=8.0, help="hide groups that differ by less than this")
    ap.add_argument("--device", choices=["cuda", "cpu"], default="cuda",
                    help="cpu: the same step on real CPU tensors, storages only (checks the tool, "
                         "not the GPU)")
    args = ap.parse_args(argv)
    import torch

    from .breakdown import breakdown, jobs
    from .calibrate import step_inputs

    if args.device == "cuda" and not torch.cuda.is_available():
        print("device_breakdown: error: needs a CUDA GPU (torch.cuda.is_available() is false); "
              "`python -m carma_profile.breakdown` shows the traced side alone", file=sys.stderr)
        return 2
    known = jobs()
    if args.job not in known:
        print(f"device_breakdown: error: no job {args.job!r}; known: {', '.join(sorted(known))}", file=sys.stderr)
        return 2
    factory, shape, head, default_batch, amp = known[args.job]
    batch = args.batch or default_batch
    try:
        if batch is None:
            raise ProfileError(f"{args.job} has no batch of its own: give --batch")
        traced, traced_kept = breakdown(args.job, batch)
        kw, _ = step_inputs(torch, shape, head)
        measured = device_step(factory, batch, device=args.device, mixed_precision=bool(amp), **kw)
    except ProfileError as e:
        print(f"device_breakdown: error: {e}", file=sys.stderr)
        return 2
    rows = differences(measured["kept"], traced_kept)
    report = {"job": args.job, "batch": batch, "mixedPrecision": bool(amp), **environment(torch, args.device),
              "traced": traced, **{k: v for k, v in measured.items() if k != "kept"},
              "keptAtForwardEnd": [{"module": m, "operator": op, "deviceMiB": d / MIB, "tracedMiB": t / MIB}
                                   for m, op, d, t in rows]}
    print(f"{args.job} at batch {batch} on {report['gpu']} (driver {report['driver'] or 'unknown'}, "
          f"CUDA {report['cuda']}, torch {report['torch']})")
    print(f"traced: {traced}")
    for phase, figures in measured["phases"].items():
        print(f"{phase:>14}: " + ", ".join(f"{k} {v:,.0f}" for k, v in figures.items()))
    print(f"attention operators of the last step: {measured['attentionOps'] or 'none'}")
    print(f"{'GPU MiB':>9} {'trace MiB':>9}  {'module':32} operator")
    for m, op, d, t in rows:
        if abs(d - t) >= args.min_mib * MIB:
            print(f"{d / MIB:9.0f} {t / MIB:9.0f}  {m:32} {op}")
    print(f"{sum(measured['kept'].values()) / MIB:9.0f} {sum(traced_kept.values()) / MIB:9.0f}  "
          f"alive at the end of forward and loss")
    if args.out:
        args.out.write_text(json.dumps(report, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
