"""The operator paths a CUDA GPU takes, on the fake CPU tensors a trace runs on.

A trace cannot put its fake tensors on a CUDA device without a GPU: the autograd engine asks
the CUDA driver about the device before it runs a backward pass. So the trace runs on the
CPU device, and where PyTorch's CPU path keeps different tensors from its CUDA path, this
module makes it take the CUDA one:

- **Dropout.** On CUDA, `F.dropout` runs the fused `native_dropout` kernel, which keeps a
  one-byte mask for backward. On the CPU it multiplies by a noise tensor of the input's
  dtype, four bytes per value in fp32. [`gpu_dropout`] calls `native_dropout`, whose mask is
  one byte on the CPU too.
- **Autocast.** CPU autocast casts the same compute-heavy operators to 16 bits as CUDA's
  (matmul, linear, convolution), but CUDA's autocast also runs a list of operators in fp32
  that CPU autocast leaves in the input's dtype: layer and group norm, softmax and
  log-softmax, `pow`, `exp`, `log`, `sum`, `rsqrt`, the losses, and others (PyTorch's
  "CUDA Ops that can autocast to float32"). Their outputs, and what backward saves of
  them, are twice the size. [`CudaAutocastLists`] applies that list on top of CPU autocast.
"""

from __future__ import annotations

# CUDA autocast's fp32 list, by the name of the Python function or Tensor method that
# reaches each operator (PyTorch's "CUDA Ops that can autocast to float32"). The inputs of
# these are cast to fp32 before the operator runs.
CUDA_FP32_OPS = frozenset({
    "__pow__", "__rpow__", "__rdiv__", "__rtruediv__", "pow", "acos", "asin", "cosh", "sinh", "tan",
    "erfinv", "exp", "expm1", "log", "log10", "log1p", "log2", "reciprocal", "rsqrt",
    "binary_cross_entropy_with_logits", "cosine_embedding_loss", "cdist", "cosine_similarity",
    "cross_entropy", "dist", "group_norm", "hinge_embedding_loss", "kl_div", "l1_loss",
    "layer_norm", "margin_ranking_loss", "mse_loss", "multilabel_margin_loss",
    "multi_margin_loss", "nll_loss", "norm", "normalize", "pdist", "poisson_nll_loss",
    "smooth_l1_loss", "soft_margin_loss", "softplus", "renorm", "triplet_margin_loss",
})
# Operators CUDA autocast runs with `dtype=torch.float32` when none is given: the output is
# fp32, the 16-bit input is read as it is (no fp32 copy of it is made).
CUDA_FP32_OUTPUT_OPS = frozenset({"softmax", "log_softmax", "softmin", "cumsum", "cumprod", "prod", "sum"})


def gpu_dropout(torch):
    """`F.dropout` as CUDA runs it in training: `native_dropout`, with a one-byte mask."""
    original = torch.nn.functional.dropout

    def dropout(input, p=0.5, training=True, inplace=False):
        if not training or p == 0.0 or not input.is_floating_point():
            return original(input, p, training, inplace)
        out = torch.native_dropout(input, p, True)[0]
        if inplace:
            return input.copy_(out)
        return out

    return original, dropout


def _half(torch, t) -> bool:
    return isinstance(t, torch.Tensor) and t.dtype in (torch.bfloat16, torch.float16)


def cuda_autocast_lists(torch):
    """A `TorchFunctionMode` that, while CPU autocast is on, runs CUDA autocast's fp32
    operators in fp32 (see the module's docs). Outside autocast it changes nothing."""
    from torch.overrides import TorchFunctionMode
    from torch.utils._pytree import tree_map

    def up(t):
        return t.float() if _half(torch, t) else t

    class CudaAutocastLists(TorchFunctionMode):
        def __torch_function__(self, func, types, args=(), kwargs=None):
            kwargs = kwargs or {}
            name = getattr(func, "__name__", "")
            if torch.is_autocast_enabled("cpu"):
                if name in CUDA_FP32_OPS:
                    args, kwargs = tree_map(up, (args, kwargs))
                elif (name in CUDA_FP32_OUTPUT_OPS and kwargs.get("dtype") is None and args
                      and _half(torch, args[0]) and not any(isinstance(a, torch.dtype) for a in args)):
                    kwargs = {**kwargs, "dtype": torch.float32}
            return func(*args, **kwargs)

    return CudaAutocastLists()
