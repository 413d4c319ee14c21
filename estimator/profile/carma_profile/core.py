"""The `carma.io/model-profile` of a PyTorch model, by the estimator's definitions.

Definitions (the same as `estimator/datagen/worker.py` + `csvio.py`, which produce the
estimator's training data, and GPUMemNet's MLP data in `shared/data/gpumemnet`):

* A *layer* is one call of a leaf module (a module without children) in a forward
  pass, or of an attention block: the innermost module whose class name contains
  `Attention` (`nn.MultiheadAttention`, Hugging Face's `BertSelfAttention`, ...),
  as the Rust printout parser counts them. The layers a block calls are layers too;
  a block that calls none (`nn.MultiheadAttention`, whose projections are not called
  as modules) adds its own output, as the datagen counts it.
* `activations`: the sum over layer calls of the output size for one sample (the
  first tensor of the output; the sequence dimension included). It is measured as
  the difference between a forward pass with batch 2 and one with batch 1, so the
  batch dimension may be anywhere and batch-independent outputs count 0.
* `parameters`: every parameter of the model (`model.parameters()`, shared ones once).
* `layers`: the modules called (each once, however often it is called), counted by
  class name as the Rust estimator counts torchsummary rows and printout modules:
  `Linear`, `Conv2d*`, `BatchNorm*`/`SyncBatchNorm`, `Dropout*`/`AlphaDropout`,
  `LayerNorm`, attention modules, `AdaptiveAvgPool*`.
* `depth`: MLP linear; CNN conv2d + batchNorm + dropout + adaptiveAvgPool + linear;
  Transformer linear + attention + layerNorm + dropout.
* `activation`: the most frequent activation layer among the family's GPUMemNet list
  (ties: the first one in forward order; `ReLU6` counts as `ReLU`); `ReLU` if none.
"""

from __future__ import annotations

from collections import Counter
from typing import Any, Callable

# GPUMemNet's activation lists (estimator/src/features.rs, training/features.py).
MLP_ACTIVATIONS = ["ELU", "GELU", "Identity", "LeakyReLU", "Mish", "PReLU",
                   "ReLU", "SELU", "SiLU", "Softplus", "Tanh"]
CNN_ACTIVATIONS = [a for a in MLP_ACTIVATIONS if a != "Identity"]
FAMILIES = ("mlp", "cnn", "transformer")
# torch.nn activation names the Rust profile accepts (estimator/src/profile.rs).
TORCH_ACTIVATIONS = ("CELU ELU GELU GLU Hardshrink Hardsigmoid Hardswish Hardtanh Identity LeakyReLU "
                     "LogSigmoid LogSoftmax Mish PReLU RReLU ReLU ReLU6 SELU SiLU Sigmoid Softmax "
                     "Softmax2d Softmin Softplus Softshrink Softsign Tanh Tanhshrink Threshold").split()
OPTIMIZERS = ("sgd", "sgdMomentum", "adam")  # estimator/src/profile.rs (`adamw` is `adam`)

# Ranges of estimator/src/profile.rs.
MAX_BATCH_SIZE = 1 << 20
MAX_PARAMETERS = 10**12
MAX_ACTIVATIONS = 10**12
MAX_LAYERS = 100_000
MAX_SEQ_LENGTH = 1 << 20

LAYER_KEYS = ("linear", "conv2d", "batchNorm", "dropout", "layerNorm", "attention",
              "adaptiveAvgPool")


class ProfileError(ValueError):
    """Bad input to `describe`, or a model whose profile would be invalid."""


def layer_kind(class_name: str) -> str | None:
    """The `layers` key a module class counts under, or None."""
    n = class_name
    if n in ("Linear", "LazyLinear", "Conv1D"):  # Conv1D: Hugging Face GPT-2's linear
        return "linear"
    if "Attention" in n or n == "NonDynamicallyQuantizableLinear":
        return "attention"
    if n.startswith("Conv2d") or n == "LazyConv2d":
        return "conv2d"
    if n.startswith("BatchNorm") or n.startswith("SyncBatchNorm"):
        return "batchNorm"
    if n.startswith("Dropout") or n == "AlphaDropout":
        return "dropout"
    if n == "LayerNorm":
        return "layerNorm"
    if n.startswith("AdaptiveAvgPool"):
        return "adaptiveAvgPool"
    return None


def activation_name(class_name: str, known: list[str]) -> str | None:
    """The entry of `known` a module class is (`GELUActivation` is `GELU`), or None."""
    n = class_name[:-len("Activation")] if class_name.endswith("Activation") else class_name
    n = "ReLU" if n.lower() == "relu6" else n
    return next((k for k in known if k.lower() == n.lower()), None)


def depth_of(family: str, c: dict[str, int]) -> int:
    if family == "mlp":
        return c["linear"]
    if family == "cnn":
        return c["conv2d"] + c["batchNorm"] + c["dropout"] + c["adaptiveAvgPool"] + c["linear"]
    return c["linear"] + c["attention"] + c["layerNorm"] + c["dropout"]


def _positive_int(key: str, v: Any, hi: int) -> int:
    if isinstance(v, bool) or not isinstance(v, int) or not 1 <= v <= hi:
        raise ProfileError(f"{key} must be an integer between 1 and {hi}, got {v!r}")
    return v


def _first_tensor(torch, out):
    if isinstance(out, torch.Tensor):
        return out
    if isinstance(out, dict):
        out = list(out.values())
    if isinstance(out, (list, tuple)):
        for o in out:
            t = _first_tensor(torch, o)
            if t is not None:
                return t
    return None


def _is_attention(m) -> bool:
    return "Attention" in type(m).__name__


def _layers(model):
    """(module, is attention block) of every module that is a layer: the leaves, and
    the innermost modules whose class name contains `Attention` (not the projection
    inside `nn.MultiheadAttention`, which is part of its block)."""
    picked, projections = [], set()
    for m in model.modules():
        if _is_attention(m) and not any(_is_attention(c) for c in m.modules() if c is not m):
            picked.append((m, True))
            projections.update(id(c) for c in m.modules()
                               if type(c).__name__ == "NonDynamicallyQuantizableLinear")
    picked += [(m, False) for m in model.modules()
               if not any(True for _ in m.children()) and not _is_attention(m)
               and id(m) not in projections]
    return picked


def _trace(torch, model, make_input, batch: int):
    """[(class name, output numel, module id)] of every layer call, in forward order (an
    attention block's row comes after the layers it called, and has numel 0 when it
    called any)."""
    rows: list[tuple[str, int, int]] = []
    open_blocks: list[int] = []

    def leaf(m, _inp, out):
        t = _first_tensor(torch, out)
        rows.append((type(m).__name__, 0 if t is None else int(t.numel()), id(m)))

    def block_start(_m, _inp):
        open_blocks.append(len(rows))

    def block_end(m, _inp, out):
        t = _first_tensor(torch, out)
        called_layers = len(rows) > open_blocks.pop()
        rows.append((type(m).__name__, 0 if t is None or called_layers else int(t.numel()), id(m)))

    handles = []
    for m, block in _layers(model):
        if block:
            handles += [m.register_forward_pre_hook(block_start), m.register_forward_hook(block_end)]
        else:
            handles.append(m.register_forward_hook(leaf))
    try:
        x = make_input(batch)
        with torch.no_grad():
            if isinstance(x, dict):
                model(**x)
            elif isinstance(x, tuple):
                model(*x)
            else:
                model(x)
    except ProfileError:
        raise
    except Exception as e:  # the user's model: report which step failed
        raise ProfileError(f"the forward pass with batch {batch} failed: {type(e).__name__}: {e}") from e
    finally:
        for h in handles:
            h.remove()
    return rows


def _functional_activation(model, known: list[str]) -> str | None:
    """An activation given as a function (nn.TransformerEncoderLayer's `activation`)."""
    for m in model.modules():
        f = getattr(m, "activation", None)
        if callable(f) and not hasattr(f, "parameters"):
            a = activation_name(getattr(f, "__name__", ""), known)
            if a:
                return a
    return None


def describe(model, batch_size: int, input_size=None, seq_len: int | None = None, *,
             family: str | None = None, activation: str | None = None,
             make_input: Callable[[int], Any] | None = None,
             optimizer: str | None = None, mixed_precision: bool | None = None) -> dict:
    """The `carma.io/model-profile` dict of `model` trained at `batch_size`.

    The input is one of: `input_size` (the shape of one sample without the batch
    dimension, e.g. `(3, 224, 224)`, float zeros), `seq_len` (token ids of that length,
    zeros), or `make_input(batch)` returning the model's input (a tensor, a tuple of
    positional arguments or a dict of keyword arguments); `seq_len` may be given with
    `make_input` to record `seqLength`. `family` defaults to `transformer` when the
    model has attention layers (or a `seq_len` and LayerNorm), else `cnn` when it has
    Conv2d layers, else `mlp`. `activation` overrides the detected one. `optimizer`
    (sgd, sgdMomentum, adam) and `mixed_precision` describe the training step, not the
    model: they are passed through when given (the estimator assumes adam and fp32).
    Two forward passes (batch 1 and 2) run under `torch.no_grad()` in eval mode on
    the model's device (`meta` works); the model's mode is restored afterwards.
    """
    try:
        import torch
    except ImportError:
        raise ProfileError("carma_profile needs PyTorch: pip install torch") from None
    if not isinstance(model, torch.nn.Module):
        raise ProfileError(f"model must be a torch.nn.Module, got {type(model).__name__}")
    batch_size = _positive_int("batch_size", batch_size, MAX_BATCH_SIZE)
    if seq_len is not None:
        seq_len = _positive_int("seq_len", seq_len, MAX_SEQ_LENGTH)
    if activation is not None:
        match = [a for a in TORCH_ACTIVATIONS if a.lower() == str(activation).strip().lower()]
        if not match:
            raise ProfileError(f"activation {activation!r} is not a torch.nn activation (e.g. ReLU, GELU, SiLU)")
        activation = match[0]
    if optimizer is not None:
        optimizer = "adam" if optimizer.lower() == "adamw" else optimizer
        if optimizer not in OPTIMIZERS:
            raise ProfileError(f"optimizer must be one of {', '.join(OPTIMIZERS)}, got {optimizer!r}")
    if mixed_precision is not None and not isinstance(mixed_precision, bool):
        raise ProfileError(f"mixed_precision must be True or False, got {mixed_precision!r}")
    if family is not None and family not in FAMILIES:
        raise ProfileError(f"family must be one of {', '.join(FAMILIES)}, got {family!r}")
    given = sum(x is not None for x in (input_size, make_input))
    if given > 1 or (given == 0 and seq_len is None) or (input_size is not None and seq_len is not None):
        raise ProfileError("give exactly one input: input_size, seq_len, or make_input")
    p = next(model.parameters(), None)
    device = p.device if p is not None else torch.device("cpu")
    if make_input is None:
        if input_size is not None:
            shape = tuple(input_size) if isinstance(input_size, (tuple, list)) else (input_size,)
            for d in shape:
                _positive_int("input_size", d, MAX_ACTIVATIONS)
            make_input = lambda b: torch.zeros((b, *shape), device=device)  # noqa: E731
        else:
            make_input = lambda b: torch.zeros((b, seq_len), dtype=torch.long, device=device)  # noqa: E731

    was_training = model.training
    model.eval()
    try:
        one = _trace(torch, model, make_input, 1)
        two = _trace(torch, model, make_input, 2)
    finally:
        model.train(was_training)
    if [(n, i) for n, _, i in one] != [(n, i) for n, _, i in two]:
        raise ProfileError("the model calls different layers at batch 1 and batch 2; "
                           "its layers cannot be counted from a forward pass")
    activations = sum(b[1] - a[1] for a, b in zip(one, two))
    called = list({i: n for n, _, i in two}.values())  # each module once, first-call order
    counts = Counter(layer_kind(n) for n in called)
    layers = {k: counts.get(k, 0) for k in LAYER_KEYS}

    if family is None:
        if layers["attention"] or (seq_len is not None and layers["layerNorm"]):
            family = "transformer"
        else:
            family = "cnn" if layers["conv2d"] else "mlp"
    _check_family(family, layers)
    known = CNN_ACTIVATIONS if family == "cnn" else MLP_ACTIVATIONS
    if activation is None:
        acts = [a for a in (activation_name(n, known) for n in called) if a]
        freq = Counter(acts)
        # most frequent; ties go to the first in forward order
        activation = (max(acts, key=lambda a: (freq[a], -acts.index(a))) if acts
                      else _functional_activation(model, known) or "ReLU")

    profile = {
        "family": family,
        "batchSize": batch_size,
        "parameters": sum(q.numel() for q in model.parameters()),
        "activations": activations,
        "depth": depth_of(family, layers),
        "activation": activation,
        "layers": layers,
    }
    if seq_len is not None:
        profile["seqLength"] = seq_len
    if optimizer is not None:
        profile["optimizer"] = optimizer
    if mixed_precision is not None:
        profile["mixedPrecision"] = mixed_precision
    _check_ranges(profile)
    return profile


def _check_family(family: str, c: dict[str, int]) -> None:
    why = None
    if family == "mlp" and (c["conv2d"] or c["attention"]):
        why = f"it has {c['conv2d']} Conv2d and {c['attention']} attention layers"
    elif family == "cnn" and not c["conv2d"]:
        why = "it has no Conv2d layer"
    elif family == "transformer" and not (c["attention"] or c["layerNorm"]):
        why = "it has no attention or LayerNorm layer"
    if why:
        raise ProfileError(f"the model does not fit family {family!r}: {why}")


def _check_ranges(p: dict) -> None:
    for key, hi in (("parameters", MAX_PARAMETERS), ("activations", MAX_ACTIVATIONS),
                    ("depth", MAX_LAYERS)):
        if not 1 <= p[key] <= hi:
            raise ProfileError(f"the model's {key} is {p[key]}; the estimator accepts 1 to {hi}")
    for k, v in p["layers"].items():
        if v > MAX_LAYERS:
            raise ProfileError(f"the model has {v} {k} layers; the estimator accepts at most {MAX_LAYERS}")
