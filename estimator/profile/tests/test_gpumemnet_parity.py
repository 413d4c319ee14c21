"""describe() on GPUMemNet's own MLPs equals the feature columns of their CSV rows.

Each row's `Activations-Params` lists the real model's layers in forward order
(GPUMemNet's names, output width, parameters); the test builds that model with torch
(on the meta device: shapes only, so all 4,801 rows take seconds) and compares.
"""

import ast
import csv

import pytest
import torch
import torch.nn as nn

from carma_profile import describe
from carma_profile.core import MLP_ACTIVATIONS

FILES = ["mlp_data_step1.csv", "mlp_data_step2.csv"]


def build(layers):
    """nn.Sequential from GPUMemNet's (name, width, params) list; returns (model, input width)."""
    mods, width, first = [], None, None
    for name, out, params in layers:
        if name == "linear":
            inp = params // out - 1  # params = in*out + out
            assert inp * out + out == params and (width is None or inp == width), (name, out, params)
            first = inp if first is None else first
            mods.append(nn.Linear(inp, out))
        elif name == "batch_normalization":
            mods.append(nn.BatchNorm1d(out))
        elif name == "dropout":
            mods.append(nn.Dropout(0.1))
        elif name == "Softmax":
            mods.append(nn.Softmax(dim=1))
        else:
            mods.append(getattr(nn, name)())
        width = out
    return nn.Sequential(*mods), first


def rows(shared, name):
    with open(shared / "gpumemnet" / name, newline="") as f:
        return list(csv.DictReader(f))


@pytest.mark.parametrize("name", FILES)
def test_every_row(shared, name):
    data = rows(shared, name)
    assert len(data) >= 2400
    for r in data:
        layers = ast.literal_eval(r["Activations-Params"])
        with torch.device("meta"):
            model, width = build(layers)
        p = describe(model, int(r["Batch Size"]), input_size=(width,))
        where = f"{name} {r['Filename']}"
        assert p["family"] == "mlp", where
        assert p["activations"] == int(r["Total Activations"]), where
        # GPUMemNet lists nn.PReLU() with 0 parameters; torch gives it its one weight
        prelu = sum(1 for n, _, _ in layers if n == "PReLU")
        assert p["parameters"] == int(r["Total Parameters"]) + prelu, where
        assert p["depth"] == int(r["Depth"]), where
        assert p["layers"]["batchNorm"] == int(r.get("Batch Normalization Layers") or 0), where
        assert p["layers"]["dropout"] == int(r.get("Dropout Layers") or 0), where
        assert p["activation"] in MLP_ACTIVATIONS
        assert p["activation"].lower() == r["Activation Function"].lower(), where


def test_meta_equals_cpu_on_a_sample(shared):
    data = rows(shared, "mlp_data_step2.csv")[:25]
    for r in data:
        layers = ast.literal_eval(r["Activations-Params"])
        with torch.device("meta"):
            meta, width = build(layers)
        cpu, _ = build(layers)
        assert describe(meta, 64, input_size=width) == describe(cpu, 64, input_size=width)
