"""describe() on small models whose figures are worked out by hand."""

import pytest
import torch
import torch.nn as nn

from carma_profile import ProfileError, describe


def mlp():
    layers = []
    for _ in range(5):
        layers += [nn.Linear(1024, 1024), nn.BatchNorm1d(1024), nn.ReLU(), nn.Dropout(0.1)]
    return nn.Sequential(*layers, nn.Linear(1024, 10))


def small_cnn():
    return nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.ReLU(), nn.AdaptiveAvgPool2d(1),
                         nn.Flatten(), nn.Linear(8, 4))


def test_mlp_by_hand():
    p = describe(mlp(), batch_size=512, input_size=(1024,))
    assert p == {
        "family": "mlp", "batchSize": 512,
        # 5 x (1024*1024 + 1024) + 5 x 2*1024 (batch norm) + 1024*10 + 10
        "parameters": 5 * 1049600 + 5 * 2048 + 10250,
        # every layer's output: 5 x (linear, batch norm, ReLU, dropout) x 1024 + 10
        "activations": 5 * 4 * 1024 + 10,
        "depth": 6, "activation": "ReLU",
        "layers": {"linear": 6, "conv2d": 0, "batchNorm": 5, "dropout": 5, "layerNorm": 0,
                   "attention": 0, "adaptiveAvgPool": 0},
    }


def test_cnn_by_hand():
    p = describe(small_cnn(), batch_size=32, input_size=(3, 8, 8))
    assert p["family"] == "cnn"
    assert p["parameters"] == 3 * 8 * 9 + 8 + 8 * 4 + 4
    assert p["activations"] == 512 + 512 + 8 + 8 + 4  # conv, ReLU, pool, flatten, linear
    assert p["depth"] == 3  # conv2d + adaptive avg pool + linear
    assert p["layers"]["conv2d"] == 1 and p["layers"]["adaptiveAvgPool"] == 1


def encoder(batch_first):
    torch.manual_seed(0)
    layer = nn.TransformerEncoderLayer(32, 4, 64, dropout=0.1, activation="gelu", batch_first=batch_first)
    return nn.TransformerEncoder(layer, 2, enable_nested_tensor=False)


def test_transformer_counts_attention_as_one_layer_and_any_batch_dim():
    seq = 10
    first = describe(encoder(True), 4, make_input=lambda b: torch.zeros(b, seq, 32), seq_len=seq)
    second = describe(encoder(False), 4, make_input=lambda b: torch.zeros(seq, b, 32), seq_len=seq)
    assert first == second
    # per encoder layer: attention, linear1, dropout, linear2, norm1, norm2, dropout1, dropout2
    assert first["layers"] == {"linear": 4, "conv2d": 0, "batchNorm": 0, "dropout": 6, "layerNorm": 4,
                               "attention": 2, "adaptiveAvgPool": 0}
    assert first["activations"] == 2 * seq * (32 + 64 + 64 + 32 + 32 + 32 + 32 + 32)
    assert first["family"] == "transformer" and first["seqLength"] == seq
    assert first["activation"] == "GELU"  # a function in TransformerEncoderLayer, not a module
    assert first["parameters"] == sum(p.numel() for p in encoder(True).parameters())


def test_meta_device_gives_the_same_profile():
    with torch.device("meta"):
        m = mlp()
    assert describe(m, 512, input_size=(1024,)) == describe(mlp(), 512, input_size=(1024,))


def test_model_is_left_as_it_was():
    m = mlp().train()
    before = [p.clone() for p in m.parameters()]
    describe(m, 8, input_size=1024)
    assert m.training
    assert all(torch.equal(a, b) for a, b in zip(before, m.parameters()))
    assert not any(mod._forward_hooks for mod in m.modules())


def test_activation_choice():
    # most frequent of the family's list; ReLU6 is ReLU; a tie goes to the first
    m = nn.Sequential(nn.Linear(4, 4), nn.ReLU6(), nn.Linear(4, 4), nn.ReLU(), nn.Linear(4, 4), nn.Tanh())
    assert describe(m, 2, input_size=4)["activation"] == "ReLU"
    m = nn.Sequential(nn.Linear(4, 4), nn.Mish(), nn.Linear(4, 1), nn.Identity())
    assert describe(m, 2, input_size=4)["activation"] == "Mish"
    m = nn.Sequential(nn.Linear(4, 4), nn.Hardswish(), nn.Linear(4, 1))
    assert describe(m, 2, input_size=4)["activation"] == "ReLU"  # not in GPUMemNet's list
    assert describe(m, 2, input_size=4, activation=" silu ")["activation"] == "SiLU"


@pytest.mark.parametrize("kwargs, message", [
    ({"batch_size": 0, "input_size": (1024,)}, "batch_size"),
    ({"batch_size": 2**20 + 1, "input_size": (1024,)}, "batch_size"),
    ({"batch_size": 8}, "exactly one input"),
    ({"batch_size": 8, "input_size": (1024,), "seq_len": 4}, "exactly one input"),
    ({"batch_size": 8, "input_size": (1024, 0)}, "input_size"),
    ({"batch_size": 8, "input_size": (3, 32, 32)}, "forward pass with batch 1 failed"),
    ({"batch_size": 8, "input_size": (1024,), "family": "cnn"}, "no Conv2d"),
    ({"batch_size": 8, "input_size": (1024,), "family": "rnn"}, "family must be"),
    ({"batch_size": 8, "seq_len": 0}, "seq_len"),
    ({"batch_size": 8, "input_size": (1024,), "activation": "Swishy"}, "not a torch.nn activation"),
    ({"batch_size": 8, "input_size": (1024,), "optimizer": "lbfgs"}, "optimizer must be one of"),
    ({"batch_size": 8, "input_size": (1024,), "mixed_precision": "yes"}, "mixed_precision"),
])
def test_bad_input_names_the_problem(kwargs, message):
    with pytest.raises(ProfileError, match=message):
        describe(mlp(), **kwargs)


def test_not_a_module():
    with pytest.raises(ProfileError, match="torch.nn.Module"):
        describe(lambda x: x, 8, input_size=4)


def test_cnn_family_rejects_attention_in_mlp():
    m = nn.Sequential(nn.Conv2d(1, 2, 3), nn.Flatten(), nn.Linear(2 * 4 * 4, 2))
    with pytest.raises(ProfileError, match="family 'mlp'.*1 Conv2d"):
        describe(m, 8, input_size=(1, 6, 6), family="mlp")


class TwiceAndUnused(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(8, 8)
        self.drop = nn.Dropout(0.1)
        self.unused = nn.Dropout(0.1)

    def forward(self, x):
        return self.drop(self.fc(self.drop(x)))


def test_modules_count_once_and_calls_add_activations():
    p = describe(TwiceAndUnused(), 4, input_size=8)
    assert p["layers"]["dropout"] == 1 and p["layers"]["linear"] == 1  # `unused` is not called
    assert p["activations"] == 8 * 3  # dropout twice, linear once


class SelfAttention(nn.Module):
    """A Hugging Face-style block: projections are modules the block calls."""

    def __init__(self, d=16):
        super().__init__()
        self.q, self.k, self.v = nn.Linear(d, d), nn.Linear(d, d), nn.Linear(d, d)
        self.drop = nn.Dropout(0.1)

    def forward(self, x):
        probs = self.drop((self.q(x) @ self.k(x).transpose(1, 2)).softmax(-1))
        return probs @ self.v(x)


class Block(nn.Module):
    def __init__(self, d=16):
        super().__init__()
        self.emb = nn.Embedding(100, d)
        self.attn = SelfAttention(d)
        self.norm = nn.LayerNorm(d)

    def forward(self, tokens):
        return self.norm(self.attn(self.emb(tokens)))


def test_an_attention_block_counts_once_with_the_layers_it_calls():
    seq = 6
    p = describe(Block(), 2, seq_len=seq)
    assert p["family"] == "transformer"
    assert p["layers"]["attention"] == 1 and p["layers"]["linear"] == 3
    assert p["layers"]["dropout"] == 1 and p["layers"]["layerNorm"] == 1
    # embedding, q, k, v, the dropout of the scores, norm; the block's own output is not added
    assert p["activations"] == seq * 16 + 3 * seq * 16 + seq * seq + seq * 16
