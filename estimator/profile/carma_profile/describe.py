"""The two descriptions of a model that `carma estimate --summary` reads, written as their tools
print them (the formats are described in estimator/tests/data/describe_models.py, which writes
CARMA's models with them; `summaries` writes the held-out ones).

* `printout(model)`: the module tree as `print(model)` shows it, each module followed by
  `, <n> params`, a shared parameter counted where it first appears.
* `torchsummary(model, size)`: one row per module call, as the torchsummary package lists them,
  from one forward pass in training mode on a batch of 2 images of `size` × `size` on the model's
  device (build it on `meta` to allocate nothing).
"""

from __future__ import annotations

import torch


def printout(model) -> str:
    seen: set[int] = set()

    def own_count(m) -> int:
        n = 0
        for p in m.parameters(recurse=False):
            if id(p) not in seen:
                seen.add(id(p))
                n += p.numel()
        return n

    def walk(m, prefix: str, indent: str, out: list[str]) -> int:
        children = list(m.named_children())
        own = own_count(m)
        if not children:
            # transformers 5 prints Hugging Face's Conv1D as `Conv1D()`; older releases
            # printed its output width, which the parser reads
            args = (f"nf={m.nf}, nx={m.nx}" if type(m).__name__ == "Conv1D"
                    else m.extra_repr())
            out.append(f"{indent}{prefix}{type(m).__name__}({args}), {own:,} params")
            return own
        out.append(f"{indent}{prefix}{type(m).__name__}(")
        total = own
        for name, child in children:
            total += walk(child, f"({name}): ", indent + "  ", out)
        out.append(f"{indent}), {total:,} params")
        return total

    out: list[str] = []
    walk(model, "", "", out)
    return "\n".join(out) + "\n"


def torchsummary(model, size: int) -> str:
    rows: list[tuple[str, list[int], int]] = []
    counter = [0]

    def shape_of(out) -> list[int] | list[list[int]]:
        if isinstance(out, (list, tuple)):
            return [[-1] + list(o.shape[1:]) for o in out if isinstance(o, torch.Tensor)]
        return [-1] + list(out.shape[1:])

    def hook(m, _inp, out):
        counter[0] += 1
        params = 0
        for attr in ("weight", "bias"):
            t = getattr(m, attr, None)
            if isinstance(t, torch.Tensor):
                params += t.numel()
        if not isinstance(out, torch.Tensor) and hasattr(out, "logits"):
            out = [out.logits, out.aux_logits] if out.aux_logits is not None else out.logits
        rows.append((f"{type(m).__name__}-{counter[0]}", shape_of(out), params))

    hooks = [m.register_forward_hook(hook) for m in model.modules()
             if m is not model and not isinstance(m, (torch.nn.Sequential, torch.nn.ModuleList))]
    model.train()
    model(torch.empty(2, 3, size, size, device=next(model.parameters()).device))
    for h in hooks:
        h.remove()
    line = "-" * 64
    out = [line, f"{'Layer (type)':>20}  {'Output Shape':>25} {'Param #':>15}", "=" * 64]
    for name, shape, params in rows:
        out.append(f"{name:>20}  {str(shape):>25} {params:>15,}")
    total = sum(r[2] for r in rows)
    out += ["=" * 64, f"Total params: {total:,}", f"Trainable params: {total:,}",
            "Non-trainable params: 0", line]
    return "\n".join(out) + "\n"
