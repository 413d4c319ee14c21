"""One training step traced without a GPU: the peak bytes of live tensors in each phase.

The model is built on PyTorch's meta device (no memory for weights) and moved onto fake
tensors (`torch._subclasses.fake_tensor.FakeTensorMode`): every operator computes only
shapes, dtypes and strides, so a model far larger than the machine is traced in seconds to
minutes on a CPU. Two training steps run — zero_grad (grads set to None), forward, loss,
backward, optimizer step — because the optimizer creates its state (Adam's `exp_avg` and
`exp_avg_sq`, SGD's momentum buffer) lazily in the first step: the second step's forward
and backward carry it. Each phase's figure is its peak over both steps.

What is counted: the storages of every tensor alive on the training device — parameters,
buffers, gradients, optimizer state, the activations autograd saves, and the temporaries
operators create and free (a tensor's storage is counted once however many views share
it). A storage is counted when the operator that creates it returns, and uncounted when
its last reference dies (a weak reference on the storage). Each storage is rounded the way
PyTorch's CUDA caching allocator rounds a request: up to a multiple of 512 bytes (its
smallest block), what `torch.cuda.memory_allocated` reports. The allocator's segments
(2 MiB for small blocks, 20 MiB or 2 MiB multiples for large ones), the blocks it keeps
after a free, and the splits it cannot reuse are not modelled: they are fragmentation,
which the reservation's fitted factor covers.

The largest single storage an operator creates during forward and backward is recorded as
well (`largestTensorMiB`): what the trace cannot see grows with it. cuDNN sizes a
convolution's workspace by the tensors it convolves (and, with `cudnn.benchmark`, tries
algorithms whose workspaces are several times larger), and the caching allocator keeps
such blocks, and the segments split from them, reserved after they are freed. The
reservation adds a fitted multiple of it.

What is not counted (the reservation's overheads cover it, `docs/traced-estimate.md`): the
CUDA context and kernels, cuBLAS and cuDNN workspaces (cuDNN picks its convolution
algorithm, and so its workspace, on the GPU), NCCL buffers of multi-GPU jobs, memory the
caching allocator holds but no tensor uses (fragmentation, freed blocks it keeps), the
data loader's pinned host memory (not GPU memory).

The optimizer step uses the multi-tensor (`foreach`) implementation, which PyTorch picks by
default on CUDA: it holds one temporary the size of all parameters at once (Adam's
`sqrt(exp_avg_sq)`). The fake tensors live on the CPU device (the autograd engine will not
run a backward pass on fake CUDA tensors without a GPU), and where the CPU path keeps
different tensors from CUDA's the trace takes CUDA's (`gpu_paths`): dropout keeps a one-byte
mask, and mixed precision (`--mixed-precision`) runs CPU autocast with bfloat16 plus CUDA
autocast's list of operators it runs in fp32 (norms, softmax, `pow`, `exp`, losses).
"""

from __future__ import annotations

import contextlib
import math
from typing import Any, Callable

from .allocator import CachingAllocator
from .core import MAX_BATCH_SIZE, MAX_SEQ_LENGTH, OPTIMIZERS, ProfileError
from .gpu_paths import cuda_autocast_lists, gpu_dropout

MIB = 1 << 20
# PyTorch's CUDA caching allocator (c10/cuda/CUDACachingAllocator.cpp).
MIN_BLOCK = 512  # kMinBlockSize: every request is rounded up to a multiple of it

PHASES = ("forward", "backward", "optimizerStep")


def block_bytes(nbytes: int) -> int:
    """The bytes the CUDA caching allocator hands a tensor of `nbytes`: a multiple of 512."""
    if nbytes <= 0:
        return 0
    return -(-nbytes // MIN_BLOCK) * MIN_BLOCK


class _LiveBytes:
    """Live storage bytes on the fake device, and the peak since `start_phase`."""

    def __init__(self, torch) -> None:
        import weakref

        self._torch = torch
        self._weakref = weakref
        self._refs: dict[int, Any] = {}  # id(storage) -> weak reference
        self.live = 0
        self.peak = 0
        # The largest storage an operator creates while `watch_largest` is on (forward and
        # backward), in allocator blocks.
        self.watch_largest = False
        self.largest = 0
        # The caching allocator's segments, replayed over the same storages.
        self.allocator = CachingAllocator()
        # With a breakdown asked for: who created each live storage, `(module, operator)`.
        self.labels: dict[int, tuple[str, str, int]] | None = None
        self.label = ("parameters and buffers", "")

    def add_tensor(self, t, op: str = "") -> None:
        torch = self._torch
        if not isinstance(t, torch.Tensor):
            return
        try:
            st = t.untyped_storage()
        except Exception:  # sparse or other storage-less tensors
            return
        key = id(st)
        if key in self._refs:
            return
        size = block_bytes(int(st.nbytes()))
        block = self.allocator.malloc(size)

        def freed(_ref, key=key, size=size, block=block):
            if self._refs.pop(key, None) is not None:
                if self.labels is not None:
                    self.labels.pop(key, None)
                self.live -= size
                self.allocator.free(block)

        self._refs[key] = self._weakref.ref(st, freed)
        if self.labels is not None:
            self.labels[key] = (self.label[0], op or self.label[1], size)
        if self.watch_largest:
            self.largest = max(self.largest, size)
        self.live += size
        self.peak = max(self.peak, self.live)

    def start_phase(self) -> None:
        self.peak = self.live

    def breakdown(self) -> dict[tuple[str, str], int]:
        """Live bytes now, by the module and operator that created each storage."""
        out: dict[tuple[str, str], int] = {}
        for module, op, size in (self.labels or {}).values():
            out[(module, op)] = out.get((module, op), 0) + size
        return out


def _mode_class(torch):
    from torch.utils._python_dispatch import TorchDispatchMode
    from torch.utils._pytree import tree_flatten

    class Track(TorchDispatchMode):
        def __init__(self, live: _LiveBytes) -> None:
            super().__init__()
            self.live = live

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            for t in tree_flatten(out)[0]:
                if isinstance(t, torch.Tensor):
                    self.live.add_tensor(t, func.overloadpacket.__name__)
            return out

    return Track


def _module_labels(torch, live: _LiveBytes) -> list:
    """Global module hooks that keep `live.label` on the innermost module running."""
    stack: list[str] = []

    def enter(module, _args):
        stack.append(type(module).__name__)
        live.label = (stack[-1], "")

    def leave(_module, _args, _out):
        if stack:
            stack.pop()
        live.label = (stack[-1] if stack else "outside any module", "")

    return [torch.nn.modules.module.register_module_forward_pre_hook(enter),
            torch.nn.modules.module.register_module_forward_hook(leave, always_call=True)]


def _to_empty_keeping_ties(model, device: str) -> None:
    """`model.to_empty(device=device)` with every parameter and buffer that several modules share
    still shared afterwards. `to_empty` gives each module a new tensor of its own, so a weight
    tied in two places (an LM head on its embedding; T5's encoder, decoder and head on one) would
    be traced twice, with two gradients and two sets of optimizer state, where the GPU keeps one."""
    places: dict[int, list] = {}
    for module in model.modules():
        for table in (module._parameters, module._buffers):
            for name, t in table.items():
                if t is not None:
                    places.setdefault(id(t), []).append((table, name))
    model.to_empty(device=device)
    for shared in places.values():
        first_table, first_name = shared[0]
        for table, name in shared[1:]:
            table[name] = first_table[first_name]


def _loss_of(torch, out):
    """A scalar loss from the model's output: Hugging Face's `loss` when the model computed
    one (labels were given), else the sum of the first floating-point output tensor (whose
    gradient is an expanded scalar, so it adds no memory of its own)."""
    loss = getattr(out, "loss", None)
    if loss is None and isinstance(out, dict):
        loss = out.get("loss")
    if loss is not None:
        return loss
    from torch.utils._pytree import tree_flatten

    for t in tree_flatten(out)[0]:
        if isinstance(t, torch.Tensor) and t.is_floating_point() and t.requires_grad:
            return t.float().sum()
    raise ProfileError("the model's output has no floating-point tensor that needs a gradient; "
                       "it cannot be trained as given")


def _optimizer(torch, name: str, params):
    if name == "sgd":
        return torch.optim.SGD(params, lr=0.01, foreach=True)
    if name == "sgdMomentum":
        return torch.optim.SGD(params, lr=0.01, momentum=0.9, foreach=True)
    return torch.optim.Adam(params, lr=1e-4, foreach=True)


def trace_step(factory: Callable[[], Any], batch_size: int, input_size=None, seq_len: int | None = None,
               *, make_input: Callable[[int], Any] | None = None, labels: Callable[[int], Any] | None = None,
               optimizer: str | None = None, mixed_precision: bool | None = None,
               steps: int = 2, breakdown: dict | None = None) -> dict:
    """The `traced` object of a model profile: `{"forwardMiB", "backwardMiB", "optimizerStepMiB",
    "largestTensorMiB"}`, the first three each the peak of live tensor bytes (parameters
    included) during that phase of a training step, the last the largest single storage an
    operator created during forward or backward (an activation, its gradient, a weight's
    gradient), all in MiB rounded up.

    `factory()` builds the model; it is called on the meta device (no weights in memory)
    and the model then moves onto fake tensors. The input is one of `input_size` (one
    sample's shape, float zeros), `seq_len` (token ids) or `make_input(batch)` (a tensor, a
    tuple of positional arguments or a dict of keyword arguments; it is called under fake
    tensor mode, so `torch.zeros(...)` there makes fake tensors). `labels(batch)`, when
    given, is passed as the `labels` keyword (Hugging Face models then compute their own
    loss); otherwise the loss is the sum of the output. `optimizer` is `sgd`,
    `sgdMomentum` or `adam` (default; `adamw` is `adam`: the same state).

    `breakdown`, when given a dict, is filled with what is alive at the end of the last
    step's forward pass and loss (what backward will use), in bytes per `(module, operator)`:
    the innermost module's class name running when each storage was created ("loss" for the
    loss, "parameters and buffers", "optimizer state") and the ATen operator that created it.
    """
    try:
        import torch
        from torch._subclasses.fake_tensor import FakeTensorMode
    except ImportError:
        raise ProfileError("tracing needs PyTorch 2.1 or later: pip install torch") from None
    if isinstance(batch_size, bool) or not isinstance(batch_size, int) or not 1 <= batch_size <= MAX_BATCH_SIZE:
        raise ProfileError(f"batch_size must be an integer between 1 and {MAX_BATCH_SIZE}, got {batch_size!r}")
    if seq_len is not None and (isinstance(seq_len, bool) or not isinstance(seq_len, int)
                                or not 1 <= seq_len <= MAX_SEQ_LENGTH):
        raise ProfileError(f"seq_len must be an integer between 1 and {MAX_SEQ_LENGTH}, got {seq_len!r}")
    opt_name = "adam" if optimizer is None or optimizer.lower() == "adamw" else optimizer
    if opt_name not in OPTIMIZERS:
        raise ProfileError(f"optimizer must be one of {', '.join(OPTIMIZERS)}, got {optimizer!r}")
    if mixed_precision is not None and not isinstance(mixed_precision, bool):
        raise ProfileError(f"mixed_precision must be True or False, got {mixed_precision!r}")
    if sum(x is not None for x in (input_size, make_input)) + (seq_len is not None and make_input is None) != 1:
        raise ProfileError("give exactly one input: input_size, seq_len, or make_input")
    if not isinstance(steps, int) or steps < 1:
        raise ProfileError(f"steps must be a positive integer, got {steps!r}")
    if isinstance(factory, torch.nn.Module):
        model = factory
        if any(p.device.type != "meta" for p in model.parameters()):
            raise ProfileError("trace_step needs a factory, or a model built on the meta device "
                               "(with torch.device('meta'): model = build())")
    else:
        try:
            with torch.device("meta"):
                model = factory()
        except ProfileError:
            raise
        except Exception as e:
            raise ProfileError(f"building the model on the meta device failed: {type(e).__name__}: {e}") from e
        if not isinstance(model, torch.nn.Module):
            raise ProfileError(f"the factory returned {type(model).__name__}, not a torch.nn.Module")

    if make_input is None:
        if input_size is not None:
            shape = tuple(input_size) if isinstance(input_size, (tuple, list)) else (input_size,)
            if not shape or any(isinstance(d, bool) or not isinstance(d, int) or d < 1 for d in shape):
                raise ProfileError(f"input_size must be positive integers, got {input_size!r}")
            make_input = lambda b: torch.zeros((b, *shape))  # noqa: E731
        else:
            make_input = lambda b: torch.zeros((b, seq_len), dtype=torch.long)  # noqa: E731

    live = _LiveBytes(torch)
    if breakdown is not None:
        live.labels = {}
    hooks = _module_labels(torch, live) if breakdown is not None else []
    peaks = {p: 0 for p in PHASES}
    fake = FakeTensorMode(allow_non_fake_inputs=True)  # the meta model moves in
    Track = _mode_class(torch)
    def amp():
        """A fresh context per step: CPU autocast with CUDA's fp32 list on top, or nothing."""
        stack = contextlib.ExitStack()
        if mixed_precision:
            stack.enter_context(torch.autocast("cpu", dtype=torch.bfloat16))
            stack.enter_context(cuda_autocast_lists(torch))
        return stack
    original_sdpa, fused_sdpa = _fused_sdpa(torch)
    original_dropout, cuda_dropout = gpu_dropout(torch)
    torch.nn.functional.scaled_dot_product_attention = fused_sdpa
    torch.nn.functional.dropout = cuda_dropout
    restore_grouped_mm = _grouped_mm_on_fake_tensors()
    try:
        with fake:
            # Parameters and buffers: fake CPU tensors with no data behind them.
            _to_empty_keeping_ties(model, "cpu")
            model.train()
            for t in [*model.parameters(), *model.buffers()]:
                live.add_tensor(t)
            opt = _optimizer(torch, opt_name, [p for p in model.parameters() if p.requires_grad])
            with Track(live):
                out = loss = None
                for _ in range(steps):
                    opt.zero_grad(set_to_none=True)
                    live.start_phase()
                    live.watch_largest = True
                    live.label = ("input", "")
                    x = make_input(batch_size)
                    kw = {} if labels is None else {"labels": labels(batch_size)}
                    with amp():
                        # As in `out = model(x)` in a training loop, the last step's
                        # output (an LM's logits can be gigabytes) lives until the new
                        # one is assigned.
                        if isinstance(x, dict):
                            new_out = model(**x, **kw)
                        elif isinstance(x, tuple):
                            new_out = model(*x, **kw)
                        else:
                            new_out = model(x, **kw)
                        out = loss = None
                        out = new_out
                        del new_out
                        live.label = ("loss", "")
                        loss = _loss_of(torch, out)
                    peaks["forward"] = max(peaks["forward"], live.peak)
                    if breakdown is not None:
                        breakdown.clear()
                        breakdown.update(live.breakdown())
                    live.label = ("backward", "")
                    live.start_phase()
                    loss.backward()
                    peaks["backward"] = max(peaks["backward"], live.peak)
                    live.watch_largest = False
                    live.start_phase()
                    live.label = ("optimizer state", "")
                    opt.step()
                    peaks["optimizerStep"] = max(peaks["optimizerStep"], live.peak)
    except ProfileError:
        raise
    except Exception as e:  # the user's model: say which step failed
        raise ProfileError(f"tracing a training step with batch {batch_size} failed: "
                           f"{type(e).__name__}: {e}") from e
    finally:
        for h in hooks:
            h.remove()
        torch.nn.functional.scaled_dot_product_attention = original_sdpa
        torch.nn.functional.dropout = original_dropout
        restore_grouped_mm()
    return {
        "forwardMiB": max(1, math.ceil(peaks["forward"] / MIB)),
        "backwardMiB": max(1, math.ceil(peaks["backward"] / MIB)),
        "optimizerStepMiB": max(1, math.ceil(peaks["optimizerStep"] / MIB)),
        "largestTensorMiB": max(1, math.ceil(live.largest / MIB)),
        "reservedMiB": max(1, math.ceil(live.allocator.reserved / MIB)),
    }


def _grouped_mm_on_fake_tensors() -> Callable[[], None]:
    """Makes Hugging Face's mixture-of-experts layers take their own grouped-matmul fallback during
    the trace; returns what undoes it. Their experts multiply the tokens sorted by expert with
    `torch.nn.functional.grouped_mm` (`torch._grouped_mm`), whose CPU kernel takes bfloat16 only:
    an fp32 step on fake CPU tensors stops at "Expected mat_a to be BFloat16", where a GPU runs it.
    The fallback (`transformers::grouped_mm_fallback`, `transformers.integrations.moe`) is a custom
    operator with the same signature whose fake implementation returns the same output, one
    `(tokens, out)` tensor of the input's dtype; its autograd saves the same two tensors as
    `_grouped_mm`'s (the sorted input and the expert weights, views of live tensors), and its
    backward returns the same two gradients, `(tokens, in)` and `(experts, in, out)`. So the live
    tensors are those of the GPU's grouped matmul; only the CPU kernel that would have computed the
    values (which fake tensors never do) differs. Nothing is done where transformers is not
    imported or has no such layer."""
    import sys

    moe = sys.modules.get("transformers.integrations.moe")
    if moe is None or not hasattr(moe, "_can_use_grouped_mm"):
        return lambda: None
    original = moe._can_use_grouped_mm
    moe._can_use_grouped_mm = lambda *_args, **_kw: False

    def restore() -> None:
        moe._can_use_grouped_mm = original

    return restore


def _fused_sdpa(torch):
    """`F.scaled_dot_product_attention` as CUDA runs it: a fused kernel (memory-efficient
    attention) that keeps the output and one log-sum-exp per query, not the
    batch x heads x L x L score and probability tensors. On CPU tensors PyTorch falls
    back to the math implementation whenever dropout is on, which materialises them: a
    trace of that would count gigabytes no GPU run allocates."""
    original = torch.nn.functional.scaled_dot_product_attention

    def sdpa(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None,
             enable_gqa=False, **kw):
        if kw or enable_gqa or query.dim() != 4 or key.shape[-3] != query.shape[-3]:
            return original(query, key, value, attn_mask=attn_mask, dropout_p=dropout_p,
                            is_causal=is_causal, scale=scale, enable_gqa=enable_gqa, **kw)
        bias = attn_mask
        if bias is not None and bias.dtype == torch.bool:
            bias = torch.zeros_like(bias, dtype=query.dtype).masked_fill_(~bias, float("-inf"))
        if bias is not None:
            bias = bias.to(query.dtype).expand(query.shape[0], query.shape[1], query.shape[2], key.shape[2])
        out = torch.ops.aten._scaled_dot_product_efficient_attention(
            query, key, value, bias, True,
            dropout_p, is_causal, scale=scale)
        return out[0]

    return original, sdpa
