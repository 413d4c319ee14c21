"""Random model configurations for GPUMemNet-style dataset generation (pure Python).

No torch here: sampling, file names and the MLP layer description run anywhere,
so they are tested on CPU (`estimator/datagen/tests`). `worker.py` builds the
PyTorch model from the same dictionaries on the GPU machine.

Method (after GPUMemNet): draw a random architecture of the family, train it for
a few steps with Adam on synthetic data, record the peak memory. The spaces
below cover the ranges of GPUMemNet's MLP data (input 5-4095, output 1-1023,
1-10 hidden layers, batch 4-1023, 11 activations, optional batch norm and
dropout) and comparable spaces for CNNs and Transformer encoders.
"""

from __future__ import annotations

import math
import random
from typing import Any

MLP_ACTIVATIONS = [
    "ELU", "GELU", "Identity", "LeakyReLU", "Mish", "PReLU",
    "ReLU", "SELU", "SiLU", "Softplus", "Tanh",
]
CNN_ACTIVATIONS = [a for a in MLP_ACTIVATIONS if a != "Identity"]
TRANSFORMER_ACTIVATIONS = ["ReLU", "GELU"]  # what nn.TransformerEncoderLayer accepts
MLP_ARCHS = ["uniform", "gradual", "pyramid", "bottleneck"]

Config = dict[str, Any]


def sample_mlp(rng: random.Random) -> Config:
    """One random MLP: hidden sizes shaped by `arch`, optional BN and dropout."""
    inp = rng.randint(5, 4095)
    out = rng.randint(1, min(1023, inp))
    depth = rng.randint(1, 10)  # hidden layers; linear layers = depth + 1
    arch = rng.choice(MLP_ARCHS)
    return {
        "family": "mlp",
        "input": inp,
        "output": out,
        "depth": depth,
        "arch": arch,
        "hidden": mlp_hidden_sizes(inp, out, depth, arch),
        "batch": rng.randint(4, 1023),
        "activation": rng.choice(MLP_ACTIVATIONS),
        "batchnorm": rng.random() < 0.5,
        "dropout": rng.random() < 0.5,
        "dropout_rate": round(rng.uniform(0.05, 0.5), 3),
        "seed": rng.randrange(2**31),
    }


def mlp_hidden_sizes(inp: int, out: int, depth: int, arch: str) -> list[int]:
    """Hidden widths: uniform (all = input), gradual (linear from input to
    output), pyramid (halving, never below output), bottleneck (halving to the
    middle, then widening back)."""
    if arch == "uniform":
        return [inp] * depth
    if arch == "gradual":
        step = (inp - out) / depth
        return [max(out, round(inp - step * (i + 1))) for i in range(depth)]
    if arch == "pyramid":
        return [max(out, inp >> (i + 1)) for i in range(depth)]
    if arch == "bottleneck":
        half = (depth + 1) // 2
        down = [max(out, inp >> (i + 1)) for i in range(half)]
        up = list(reversed(down[: depth - half]))
        return down + up
    raise ValueError(f"unknown MLP arch {arch!r}")


def mlp_layers(cfg: Config) -> list[tuple[str, int, int]]:
    """GPUMemNet's `Activations-Params` list for an MLP config:
    (layer, output size per sample, parameters), in forward order. The output
    layer is followed by a Softmax entry, as in GPUMemNet's data."""
    layers: list[tuple[str, int, int]] = []
    prev = cfg["input"]
    for width in cfg["hidden"]:
        layers.append(("linear", width, prev * width + width))
        if cfg["batchnorm"]:
            layers.append(("batch_normalization", width, 2 * width))
        layers.append((cfg["activation"], width, 1 if cfg["activation"] == "PReLU" else 0))  # nn.PReLU(): one weight
        if cfg["dropout"]:
            layers.append(("dropout", width, 0))
        prev = width
    layers.append(("linear", cfg["output"], prev * cfg["output"] + cfg["output"]))
    layers.append(("Softmax", cfg["output"], 0))
    return layers


def sample_cnn(rng: random.Random) -> Config:
    """One random CNN: conv blocks (conv, optional BN, activation, optional max
    pool, optional dropout), global average pooling, 1-3 linear layers."""
    size = rng.choice([32, 64, 96, 128, 160, 224])
    blocks = []
    hw = size
    for _ in range(rng.randint(2, 16)):
        out_ch = rng.choice([16, 32, 64, 96, 128, 192, 256, 384, 512])
        kernel = rng.choice([1, 3, 3, 5, 7])
        stride = 2 if (hw >= 8 and rng.random() < 0.25) else 1
        pool = hw >= 8 and rng.random() < 0.2
        blocks.append({"out": out_ch, "kernel": kernel, "stride": stride, "pool": pool})
        hw = math.ceil(hw / stride)
        if pool:
            hw //= 2
    n_linear = rng.randint(1, 3)
    hidden = [rng.choice([128, 256, 512, 1024, 2048]) for _ in range(n_linear - 1)]
    return {
        "family": "cnn",
        "image": size,
        "in_channels": 3,
        "classes": rng.choice([10, 100, 1000]),
        "blocks": blocks,
        "hidden": hidden,
        "batchnorm": rng.random() < 0.7,
        "dropout": rng.random() < 0.4,
        "dropout_rate": round(rng.uniform(0.05, 0.5), 3),
        "activation": rng.choice(CNN_ACTIVATIONS),
        "batch": rng.choice([4, 8, 16, 32, 64, 128, 256, 512]),
        "seed": rng.randrange(2**31),
    }


def sample_transformer(rng: random.Random) -> Config:
    """One random Transformer encoder (token classification / language-model head)."""
    heads = rng.choice([2, 4, 8, 12, 16])
    head_dim = rng.choice([32, 48, 64, 80, 96, 128])
    d_model = heads * head_dim
    return {
        "family": "transformer",
        "vocab": rng.choice([1000, 8000, 16000, 32000, 50257]),
        "seq_len": rng.choice([64, 128, 256, 512, 1024]),
        "d_model": d_model,
        "heads": heads,
        "layers": rng.randint(1, 24),
        "ff": d_model * rng.choice([2, 3, 4]),
        "dropout_rate": round(rng.uniform(0.0, 0.3), 3),
        "activation": rng.choice(TRANSFORMER_ACTIVATIONS),
        "batch": rng.choice([1, 2, 4, 8, 16, 32, 64, 128]),
        "seed": rng.randrange(2**31),
    }


SAMPLERS = {"mlp": sample_mlp, "cnn": sample_cnn, "transformer": sample_transformer}


def sample(family: str, rng: random.Random) -> Config:
    try:
        return SAMPLERS[family](rng)
    except KeyError:
        raise ValueError(f"unknown family {family!r}; expected one of {sorted(SAMPLERS)}") from None


def filename(cfg: Config) -> str:
    """A unique, human-readable run name encoding the configuration (like
    GPUMemNet's `Filename` column)."""
    f = cfg["family"]
    if f == "mlp":
        return (f"input:{cfg['input']}_output:{cfg['output']}_depth:{cfg['depth']}_arch:{cfg['arch']}"
                f"_batch:{cfg['batch']}_act:{cfg['activation'].lower()}_dropout:{cfg['dropout_rate']}"
                f"_dropout:{cfg['dropout']}_batchnorm:{cfg['batchnorm']}_seed:{cfg['seed']}.out")
    if f == "cnn":
        convs = "-".join(f"{b['out']}k{b['kernel']}s{b['stride']}{'p' if b['pool'] else ''}" for b in cfg["blocks"])
        return (f"cnn_image:{cfg['image']}_convs:{convs}_fc:{'-'.join(map(str, cfg['hidden'])) or 'none'}"
                f"_classes:{cfg['classes']}_batch:{cfg['batch']}_act:{cfg['activation'].lower()}"
                f"_bn:{cfg['batchnorm']}_dropout:{cfg['dropout']}_seed:{cfg['seed']}.out")
    if f == "transformer":
        return (f"transformer_vocab:{cfg['vocab']}_seq:{cfg['seq_len']}_dmodel:{cfg['d_model']}"
                f"_heads:{cfg['heads']}_layers:{cfg['layers']}_ff:{cfg['ff']}_batch:{cfg['batch']}"
                f"_act:{cfg['activation'].lower()}_seed:{cfg['seed']}.out")
    raise ValueError(f"unknown family {f!r}")
