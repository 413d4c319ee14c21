"""What a traced training step keeps for backward, by module and operator.

    python -m carma_profile.breakdown "gpt2 (causal LM)"        # a held-out job (heldout.py)
    python -m carma_profile.breakdown "bert-base (masked LM)" --batch 32   # one of CARMA's

Traces the job (`trace.trace_step`, CPU only) and prints the tensors alive at the end of the
last step's forward pass and loss, grouped by the innermost module running when each was
created and the ATen operator that created it: the terms a module printout must account for,
module outputs or not (residual sums, the attention's context, a gated feed-forward's product).
"""

from __future__ import annotations

import argparse
import sys

from .core import ProfileError

MIB = 1 << 20


def jobs() -> dict[str, tuple]:
    """Every traceable job by label: `(factory, input, head, batch, mixed_precision)`."""
    from .calibrate import MODELS
    from .heldout import HELD_OUT

    out: dict[str, tuple] = {}
    for label, _family, factory, shape, head in MODELS.values():  # the ImageNet build of a label first
        out.setdefault(label, (factory, shape, head, None, False))
    for label, _family, factory, shape, head, batch, amp in HELD_OUT:
        out[label] = (factory, shape, head, batch, amp)
    return out


def breakdown(label: str, batch: int | None = None, mixed_precision: bool | None = None) -> tuple[dict, dict]:
    """The traced step's figures and its breakdown, `{(module, operator): bytes}`."""
    import torch

    from .calibrate import step_inputs
    from .trace import trace_step

    known = jobs()
    if label not in known:
        raise ProfileError(f"no job {label!r}; known: {', '.join(sorted(known))}")
    factory, shape, head, default_batch, amp = known[label]
    batch = batch or default_batch
    if batch is None:
        raise ProfileError(f"{label} has no batch of its own: give --batch")
    kw, _ = step_inputs(torch, shape, head)
    kept: dict = {}
    traced = trace_step(factory, batch, mixed_precision=(mixed_precision if mixed_precision is not None
                                                          else amp) or None, breakdown=kept, **kw)
    return traced, kept


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m carma_profile.breakdown", description=__doc__.split("\n\n")[2])
    ap.add_argument("job", help="a label of carma_profile.heldout or of CARMA's architectures (calibrate.MODELS)")
    ap.add_argument("--batch", type=int, help="per-GPU batch (default: the held-out job's own)")
    ap.add_argument("--mixed-precision", action="store_true", default=None)
    ap.add_argument("--min-mib", type=float, default=8.0, help="hide groups smaller than this")
    args = ap.parse_args(argv)
    try:
        traced, kept = breakdown(args.job, args.batch, args.mixed_precision)
    except ProfileError as e:
        print(f"breakdown: error: {e}", file=sys.stderr)
        return 2
    print(f"{args.job}: traced {traced}")
    print(f"{'MiB':>9}  {'module':32} operator")
    for (module, op), size in sorted(kept.items(), key=lambda kv: -kv[1]):
        if size >= args.min_mib * MIB:
            print(f"{size / MIB:9.0f}  {module:32} {op}")
    print(f"{sum(kept.values()) / MIB:9.0f}  alive at the end of forward and loss")
    return 0


if __name__ == "__main__":
    sys.exit(main())
