"""carma_profile.breakdown: what a traced step keeps, by module and operator."""

import pytest

from need import require

from carma_profile import ProfileError
from carma_profile.breakdown import breakdown, main
from carma_profile.trace import trace_step

torch = require("torch")

from models import ResidualBlock  # noqa: E402


def test_the_residual_sum_is_kept_and_named_by_its_block():
    kept: dict = {}
    trace_step(ResidualBlock, 1024, input_size=(256,), optimizer="sgd", breakdown=kept)
    one = 1024 * 256 * 4  # one fp32 activation: 1 MiB
    assert kept[("ResidualBlock", "add")] == one, kept
    # the linear's output only feeds the sum, which saves nothing: it is gone
    assert ("Linear", "addmm") not in kept, kept
    assert kept[("input", "zeros")] == one, kept  # the linear saves its input
    assert kept[("LayerNorm", "native_layer_norm")] >= one, kept  # output, mean and rstd
    assert ("parameters and buffers", "") in kept


def test_unknown_jobs_are_named():
    with pytest.raises(ProfileError, match="no job 'nope'"):
        breakdown("nope")
    assert main(["nope"]) == 2
