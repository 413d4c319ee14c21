"""The trace takes CUDA's operator paths where the CPU's keep different tensors."""

import pytest

from need import require

from carma_profile import trace_step
from carma_profile.gpu_paths import cuda_autocast_lists

torch = require("torch")

ROWS, WIDTH = 4096, 1024  # 4 M values: 16 MiB in fp32, 8 MiB in bf16, 4 MiB of one-byte mask


def _mib(values: int, nbytes: int) -> float:
    return values * nbytes / (1 << 20)


class _Head(torch.nn.Module):
    """A parameter-free step whose saved tensors are easy to count."""

    def __init__(self, body) -> None:
        super().__init__()
        self.scale = torch.nn.Parameter(torch.ones(WIDTH))
        self.body = body

    def forward(self, x):
        return self.body(x * self.scale)


def _forward(body, **kw) -> int:
    return trace_step(lambda: _Head(body), ROWS, input_size=(WIDTH,), optimizer="sgd", **kw)["forwardMiB"]


def test_dropout_keeps_a_one_byte_mask_as_on_cuda():
    # Dropout adds its output (16 MiB) and a mask: one byte per value on CUDA (4 MiB). The
    # CPU's own path keeps a noise tensor of the input's dtype instead (16 MiB).
    extra = _forward(torch.nn.Dropout(0.1)) - _forward(torch.nn.Identity())
    assert extra == pytest.approx(_mib(ROWS * WIDTH, 4 + 1), abs=1), extra


def test_cuda_autocast_runs_its_fp32_list_in_fp32():
    x = torch.zeros(4, 8, dtype=torch.bfloat16)
    with torch.autocast("cpu", dtype=torch.bfloat16), cuda_autocast_lists(torch):
        assert torch.nn.functional.layer_norm(x, (8,)).dtype == torch.float32
        assert torch.softmax(x, -1).dtype == torch.float32
        assert x.pow(3).dtype == torch.float32
        assert x.sum().dtype == torch.float32
        assert torch.sum(x, dtype=torch.bfloat16).dtype == torch.bfloat16  # a dtype given stays
        assert torch.tanh(x).dtype == torch.bfloat16  # not on the list
    with cuda_autocast_lists(torch):  # outside autocast nothing changes
        assert torch.softmax(x, -1).dtype == torch.bfloat16


def test_mixed_precision_trace_keeps_fp32_where_cuda_autocast_does():
    # x ** 3 after a bf16 matmul: CUDA autocast runs pow in fp32, so its output is 16 MiB,
    # not the 8 MiB CPU autocast alone would keep.
    class Cube(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.linear = torch.nn.Linear(WIDTH, WIDTH, bias=False)

        def forward(self, x):
            return torch.pow(self.linear(x), 3)

    cube = _forward(Cube(), mixed_precision=True)
    linear = _forward(torch.nn.Linear(WIDTH, WIDTH, bias=False), mixed_precision=True)
    assert cube - linear >= _mib(ROWS * WIDTH, 4) - 1, (cube, linear)
