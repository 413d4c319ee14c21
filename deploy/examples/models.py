"""The models of the example TrainingTasks and pod, for carma_profile (estimator/profile).

Each example's modelProfile was printed by the command in its header comment, e.g.
    python -m carma_profile deploy/examples/models.py:mlp_synthetic --batch-size 512 --input 1024 --yaml
These factories build the same modules, in the same order, as the examples' inline
training scripts. estimator/profile/tests/test_examples.py reruns every command and
checks that the example still carries its output.
"""

import torch.nn as nn


def mlp_synthetic():
    """trainingtask-mlp.yaml: 5 x (Linear 1024, BatchNorm, ReLU, Dropout) + a 10-way head."""
    layers = []
    for _ in range(5):
        layers += [nn.Linear(1024, 1024), nn.BatchNorm1d(1024), nn.ReLU(), nn.Dropout(0.1)]
    return nn.Sequential(*layers, nn.Linear(1024, 10))


def mlp_plain():
    """pod-plain.yaml: 784 -> 1024 -> 512 -> 256 -> 10 with ReLUs."""
    return nn.Sequential(nn.Linear(784, 1024), nn.ReLU(), nn.Linear(1024, 512), nn.ReLU(),
                         nn.Linear(512, 256), nn.ReLU(), nn.Linear(256, 10))


class Encoder(nn.Module):
    """trainingtask-transformer.yaml: embedding, 12 encoder layers (d 768, 12 heads,
    feed-forward 3072, GELU), vocabulary head."""

    def __init__(self, vocab=30522, d=768, heads=12, ff=3072, layers=12):
        super().__init__()
        self.emb = nn.Embedding(vocab, d)
        layer = nn.TransformerEncoderLayer(d, heads, ff, activation="gelu", batch_first=True)
        self.enc = nn.TransformerEncoder(layer, layers, enable_nested_tensor=False)
        self.head = nn.Linear(d, vocab)

    def forward(self, tokens):
        return self.head(self.enc(self.emb(tokens)))


def encoder_12l():
    return Encoder()
