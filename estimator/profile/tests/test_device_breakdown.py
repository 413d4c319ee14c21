"""carma_profile.device_breakdown: the trace's bookkeeping on real tensors, and its refusal without a GPU."""

import pytest

from need import require

from carma_profile.device_breakdown import device_step, differences, main
from carma_profile.trace import trace_step

torch = require("torch")

from models import ResidualBlock  # noqa: E402


def test_real_tensors_keep_what_fake_ones_do():
    traced: dict = {}
    figures = trace_step(ResidualBlock, 512, input_size=(256,), optimizer="adam", breakdown=traced)
    real = device_step(ResidualBlock, 512, device="cpu", input_size=(256,))
    assert real["kept"] == traced, (real["kept"], traced)
    # the same phase peaks as the trace, from the same storages
    assert real["phases"]["forward"]["storagesMiB"] == pytest.approx(figures["forwardMiB"], abs=1)
    assert real["atForwardEnd"]["storagesMiB"] * (1 << 20) == sum(traced.values())
    # no GPU: only the storages are counted, nothing read from an allocator
    assert "allocatedMiB" not in real["phases"]["backward"]


def test_the_math_attention_path_is_seen():
    class Attend(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.mha = torch.nn.MultiheadAttention(64, 4, batch_first=True, dropout=0.1)

        def forward(self, x):
            return self.mha(x, x, x, need_weights=True)[0]

    real = device_step(Attend, 2, device="cpu", input_size=(16, 64))
    assert real["attentionOps"].get("bmm", 0) > 0, real["attentionOps"]


def test_differences_put_the_largest_first():
    rows = differences({("A", "x"): 10, ("B", "y"): 100}, {("B", "y"): 40, ("C", "z"): 200})
    assert rows[0] == ("C", "z", 0, 200)
    assert rows[1] == ("B", "y", 100, 40)
    assert rows[2] == ("A", "x", 10, 0)


def test_without_a_gpu_it_refuses(monkeypatch, capsys):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert main(["gpt2 (causal LM)"]) == 2
    assert "needs a CUDA GPU" in capsys.readouterr().err


def test_the_command_runs_a_held_out_job_end_to_end_on_the_cpu(tmp_path, capsys):
    import json

    out = tmp_path / "squeezenet.json"
    assert main(["squeezenet1_1", "--batch", "2", "--device", "cpu", "--out", str(out)]) == 0
    report = json.loads(out.read_text())
    assert report["gpu"] == "none (CPU run)" and report["batch"] == 2
    rows = {(r["module"], r["operator"]): r for r in report["keptAtForwardEnd"]}
    # the CPU's convolutions keep what the trace's do: the groups agree to the byte
    conv = [r for (m, op), r in rows.items() if m == "Conv2d"]
    assert conv and all(r["deviceMiB"] == r["tracedMiB"] for r in conv), conv
    assert "alive at the end of forward and loss" in capsys.readouterr().out
