"""Factories for the CLI tests (loaded by path: tests/models.py:NAME)."""

import torch.nn as nn

from carma_profile.calibrate import mnist_cnn


def mlp(width=64, classes=10):
    return nn.Sequential(nn.Linear(32, width), nn.ReLU(), nn.Linear(width, classes))


# The net of shared/data/model-summaries/mnist_cnn_64.model (1x28x28 input): two convs, max pool and
# dropout, two linear layers; ReLUs and pooling are functions. One definition, the calibration's.
MnistNet = mnist_cnn


def broken():
    raise RuntimeError("no weights here")


def not_a_module():
    return 42


class ResidualBlock(nn.Module):
    """A residual block: the sum is no module's output, and the norm after it saves it."""

    def __init__(self) -> None:
        super().__init__()
        self.linear = nn.Linear(256, 256)
        self.norm = nn.LayerNorm(256)

    def forward(self, x):
        return self.norm(x + self.linear(x))
