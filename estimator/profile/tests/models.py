"""Factories for the CLI tests (loaded by path: tests/models.py:NAME)."""

import torch.nn as nn
import torch.nn.functional as F


def mlp(width=64, classes=10):
    return nn.Sequential(nn.Linear(32, width), nn.ReLU(), nn.Linear(width, classes))


class MnistNet(nn.Module):
    """The net of shared/data/model-summaries/mnist_cnn_64.model (1x28x28 input):
    two convs, max pool and dropout, two linear layers; ReLUs and pooling are functions."""

    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(1, 32, 3)
        self.conv2 = nn.Conv2d(32, 64, 3)
        self.dropout1 = nn.Dropout(0.25)
        self.fc1 = nn.Linear(9216, 128)
        self.dropout2 = nn.Dropout(0.5)
        self.fc2 = nn.Linear(128, 10)

    def forward(self, x):
        x = F.max_pool2d(F.relu(self.conv2(F.relu(self.conv1(x)))), 2)
        x = self.dropout2(F.relu(self.fc1(self.dropout1(x).flatten(1))))
        return F.log_softmax(self.fc2(x), dim=1)


def broken():
    raise RuntimeError("no weights here")


def not_a_module():
    return 42
