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
