"""describe() equals the datagen's rows: the definitions carma's CNN and Transformer
training data are generated with (estimator/datagen: configs -> worker.build ->
worker.describe -> csvio.make_row)."""

import random
import sys

import pytest
import torch

from carma_profile import describe
from conftest import REPO

sys.path.insert(0, str(REPO / "estimator" / "datagen"))
import configs  # noqa: E402
import csvio  # noqa: E402
import worker  # noqa: E402


def cheap(cfg) -> bool:
    """Configurations whose CPU forward pass (the datagen's describe) takes well under 1 s."""
    if cfg["family"] == "cnn":
        macs, hw, ch = 0, cfg["image"], cfg["in_channels"]
        for b in cfg["blocks"]:
            hw = -(-hw // b["stride"])
            macs += ch * b["out"] * b["kernel"] ** 2 * hw * hw
            hw = hw // 2 if b["pool"] else hw
            ch = b["out"]
        return macs < 3e8
    if cfg["family"] == "transformer":
        return cfg["vocab"] * cfg["d_model"] <= 16000 * 768 and cfg["seq_len"] * cfg["layers"] <= 4096
    return cfg["input"] * max(cfg["hidden"] + [1]) < 4e6


def sampled(family, n, seed=14):
    rng, out = random.Random(seed), []
    while len(out) < n:
        cfg = configs.sample(family, rng)
        if cheap(cfg):
            out.append(cfg)
    return out


def input_of(cfg):
    if cfg["family"] == "mlp":
        return {"input_size": (cfg["input"],)}
    if cfg["family"] == "cnn":
        return {"input_size": (cfg["in_channels"], cfg["image"], cfg["image"])}
    return {"seq_len": cfg["seq_len"]}


COLUMNS = {  # CSV column -> profile key (layers.* for counts)
    "Depth": "depth", "Total Activations": "activations", "Total Parameters": "parameters",
    "Batch Size": "batchSize", "Sequence Length": "seqLength",
    "Batch Normalization Layers": "layers.batchNorm", "Dropout Layers": "layers.dropout",
    "Conv2d Layers": "layers.conv2d", "AdaptiveAvgPool Layers": "layers.adaptiveAvgPool",
    "Linear Layers": "layers.linear", "Attention Layers": "layers.attention",
    "LayerNorm Layers": "layers.layerNorm",
}


@pytest.mark.parametrize("family, n", [("mlp", 12), ("cnn", 12), ("transformer", 6)])
def test_profile_equals_datagen_row(family, n):
    for cfg in sampled(family, n):
        torch.manual_seed(cfg["seed"])
        model = worker.build(cfg, torch)
        rows = worker.describe(model, cfg, torch)
        row = csvio.make_row(cfg, rows, sum(p.numel() for p in model.parameters()), {})
        p = describe(model, cfg["batch"], **input_of(cfg))
        assert p["family"] == family
        checked = 0
        for col, key in COLUMNS.items():
            if col not in row:
                continue
            got = p["layers"][key[7:]] if key.startswith("layers.") else p[key]
            assert got == row[col], (configs.filename(cfg), col, got, row[col])
            checked += 1
        assert checked >= 5
        # CNN/MLP: the activation modules; Transformer: TransformerEncoderLayer's function
        assert p["activation"] == cfg["activation"], configs.filename(cfg)
