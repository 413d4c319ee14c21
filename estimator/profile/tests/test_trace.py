"""Tracing a training step on fake tensors (carma_profile.trace_step, `--trace`)."""

import json
import subprocess

import pytest

from need import require

from carma_profile import ProfileError, trace_step
from carma_profile.trace import block_bytes
from test_cli import MODELS, cli

torchvision = require("torchvision")
transformers = require("transformers")


def test_resnet18_phases_hold_parameters_state_and_activations():
    t = trace_step(lambda: torchvision.models.resnet18(num_classes=100), 32, input_size=(3, 32, 32))
    assert set(t) == {"forwardMiB", "backwardMiB", "optimizerStepMiB", "largestTensorMiB", "reservedMiB"}
    # the allocator holds at least the tensors alive at once
    assert t["reservedMiB"] >= max(t["forwardMiB"], t["backwardMiB"], t["optimizerStepMiB"]), t
    # 11.2 M fp32 parameters are 43 MiB; with grads and Adam's two moments, 171 MiB
    # are live in the optimizer step (plus foreach temporaries).
    assert 171 <= t["optimizerStepMiB"] < 260, t
    assert t["forwardMiB"] > 43 * 3  # the second step's forward carries Adam's state
    sgd = trace_step(lambda: torchvision.models.resnet18(num_classes=100), 32, input_size=(3, 32, 32),
                     optimizer="sgd")
    assert sgd["optimizerStepMiB"] < t["optimizerStepMiB"] - 80  # no moments


def test_the_replayed_segments_match_an_h100_within_a_tenth():
    # ResNet-50 at batch 64, Adam: the H100 reserved 6,738 MiB at its peak
    # (estimator/tests/data/h100-carma-peaks.csv); the replay of the traced step's
    # allocations through the allocator model should land near it, and above the
    # live-tensor peak by what the allocator keeps (1,052 MiB on the H100).
    import csv
    from pathlib import Path

    data = Path(__file__).resolve().parents[2] / "tests/data/h100-carma-peaks.csv"
    row = next(r for r in csv.DictReader(data.open()) if r["model"] == "resnet50" and r["batch_size"] == "64")
    t = trace_step(torchvision.models.resnet50, 64, input_size=(3, 224, 224))
    peak = max(t["forwardMiB"], t["backwardMiB"], t["optimizerStepMiB"])
    assert abs(t["reservedMiB"] - int(row["peak_reserved_mib"])) < 0.1 * int(row["peak_reserved_mib"]), t
    assert t["reservedMiB"] - peak > 500, t


def test_the_traced_peak_grows_with_the_batch():
    traces = [trace_step(torchvision.models.resnet18, b, input_size=(3, 64, 64)) for b in (8, 32, 128)]
    peaks = [max(t["forwardMiB"], t["backwardMiB"], t["optimizerStepMiB"]) for t in traces]
    assert peaks[0] < peaks[1] < peaks[2], peaks


def test_the_largest_tensor_is_the_largest_activation_or_gradient():
    # VGG-16 at 224 x 224: the first two convolutions' outputs, 64 x 224 x 224 fp32 values per
    # sample (12.25 MiB), are its largest tensors; at batch 8, 98 MiB. Its 4096 x 25088
    # classifier weight (392 MiB) is a parameter, not created by an operator, but its gradient
    # is: the largest at this batch.
    t = trace_step(torchvision.models.vgg16, 8, input_size=(3, 224, 224))
    assert t["largestTensorMiB"] == 392, t
    t = trace_step(torchvision.models.vgg16, 64, input_size=(3, 224, 224))
    assert t["largestTensorMiB"] == 784, t
    assert t["largestTensorMiB"] < t["backwardMiB"]


def test_a_tiny_bert_traces_without_weights_or_gpu():
    def bert():
        cfg = transformers.BertConfig(hidden_size=64, num_hidden_layers=2, num_attention_heads=2,
                                      intermediate_size=128, vocab_size=1000)
        return transformers.BertForSequenceClassification(cfg)

    import torch

    small, large = (trace_step(bert, b, seq_len=128, labels=lambda n: torch.zeros(n, dtype=torch.long))
                    for b in (4, 64))
    assert all(v >= 1 for v in small.values())
    assert large["backwardMiB"] > small["backwardMiB"]


def test_allocator_blocks_are_512_byte_multiples():
    assert [block_bytes(n) for n in (0, 1, 512, 513, 3 << 20)] == [0, 512, 512, 1024, 3 << 20]


def test_bad_input_names_it():
    with pytest.raises(ProfileError, match="batch_size"):
        trace_step(torchvision.models.resnet18, 0, input_size=(3, 32, 32))
    with pytest.raises(ProfileError, match="optimizer"):
        trace_step(torchvision.models.resnet18, 2, input_size=(3, 32, 32), optimizer="lbfgs")
    with pytest.raises(ProfileError, match="failed"):
        trace_step(torchvision.models.resnet18, 2, input_size=(5, 32, 32))  # 5 channels
    with pytest.raises(ProfileError, match="factory"):
        trace_step(torchvision.models.resnet18(), 2, input_size=(3, 32, 32))  # real weights


def test_trace_flag_output_is_accepted_by_the_rust_estimator(carma_bin):
    r = cli(f"{MODELS}:MnistNet", "--batch-size", "64", "--input", "1,28,28", "--trace")
    assert r.returncode == 0, r.stderr
    profile = json.loads(r.stdout)
    assert set(profile["traced"]) == {"forwardMiB", "backwardMiB", "optimizerStepMiB", "largestTensorMiB",
                                      "reservedMiB"}
    est = subprocess.run([carma_bin, "estimate", "--profile", "-"], input=r.stdout,
                         capture_output=True, text=True, timeout=60)
    assert est.returncode == 0, est.stderr
    out = json.loads(est.stdout)
    assert out["source"] == "traced", out
    assert out["estimate_mib"] > max(profile["traced"].values())


def test_a_tied_weight_is_traced_once():
    """An LM head tied to its embedding holds one weight, one gradient and one optimizer state."""
    torch = require("torch")

    class Tied(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.embed = torch.nn.Embedding(4096, 256)
            self.head = torch.nn.Linear(256, 4096, bias=False)
            self.head.weight = self.embed.weight

        def forward(self, x):
            return self.head(self.embed(x))

    def untied():
        m = Tied()
        m.head.weight = torch.nn.Parameter(torch.empty(4096, 256))
        return m

    tied = trace_step(Tied, 1, make_input=lambda b: torch.zeros((b, 1), dtype=torch.long), optimizer="sgd")
    two = trace_step(untied, 1, make_input=lambda b: torch.zeros((b, 1), dtype=torch.long), optimizer="sgd")
    weight_mib = 4096 * 256 * 4 / (1 << 20)  # 4 MiB
    # the step with two weights holds a weight and a gradient more
    assert two["optimizerStepMiB"] - tied["optimizerStepMiB"] == pytest.approx(2 * weight_mib, abs=1), (tied, two)
    assert tied["optimizerStepMiB"] <= 2 * weight_mib + 1, tied


def test_a_mixture_of_experts_traces_as_its_grouped_matmul(monkeypatch):
    """Hugging Face's experts multiply with `torch._grouped_mm`, whose CPU kernel takes bfloat16
    only: an fp32 step traces through transformers' own fallback operator, which keeps the same
    live tensors (the bfloat16 step, which the CPU kernel does run, holds the same peaks either
    way)."""
    import torch

    import carma_profile.trace as trace

    def mixtral(dtype=torch.float32):
        def build():
            cfg = transformers.MixtralConfig(hidden_size=512, intermediate_size=1024, num_hidden_layers=2,
                                             num_attention_heads=2, num_key_value_heads=2, num_local_experts=4,
                                             num_experts_per_tok=2, vocab_size=1000)
            return transformers.MixtralForCausalLM(cfg).to(dtype)
        return build

    labels = lambda n: torch.zeros((n, 256), dtype=torch.long)  # noqa: E731
    fp32 = trace_step(mixtral(), 8, seq_len=256, labels=labels)
    fallback = trace_step(mixtral(torch.bfloat16), 8, seq_len=256, labels=labels)
    monkeypatch.setattr(trace, "_grouped_mm_on_fake_tensors", lambda: (lambda: None))
    native = trace_step(mixtral(torch.bfloat16), 8, seq_len=256, labels=labels)
    # 259 MiB at the end of forward in bfloat16, the experts' outputs among it
    assert fallback == native and native["forwardMiB"] > 200, (fallback, native)
    assert fp32["optimizerStepMiB"] > native["optimizerStepMiB"]
    with pytest.raises(ProfileError, match="BFloat16"):  # as before the fallback
        trace_step(mixtral(), 8, seq_len=256, labels=labels)
