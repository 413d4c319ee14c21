import random

import pytest

import configs


@pytest.mark.parametrize("family", ["mlp", "cnn", "transformer"])
def test_sampling_is_reproducible(family):
    a = [configs.sample(family, random.Random(7)) for _ in range(3)]
    b = [configs.sample(family, random.Random(7)) for _ in range(3)]
    assert a == b
    rng1, rng2 = random.Random(1), random.Random(2)
    assert configs.sample(family, rng1) != configs.sample(family, rng2)


def test_mlp_space_matches_gpumemnet_ranges():
    rng = random.Random(0)
    seen_arch, seen_act = set(), set()
    for _ in range(2000):
        c = configs.sample_mlp(rng)
        assert 5 <= c["input"] <= 4095 and 1 <= c["output"] <= 1023
        assert 1 <= c["depth"] <= 10 and len(c["hidden"]) == c["depth"]
        assert 4 <= c["batch"] <= 1023
        assert all(h >= c["output"] for h in c["hidden"])
        seen_arch.add(c["arch"])
        seen_act.add(c["activation"])
    assert seen_arch == set(configs.MLP_ARCHS)
    assert seen_act == set(configs.MLP_ACTIVATIONS)


def test_hidden_shapes():
    assert configs.mlp_hidden_sizes(100, 10, 3, "uniform") == [100, 100, 100]
    assert configs.mlp_hidden_sizes(100, 10, 3, "gradual") == [70, 40, 10]
    assert configs.mlp_hidden_sizes(674, 51, 7, "pyramid") == [337, 168, 84, 51, 51, 51, 51]
    assert configs.mlp_hidden_sizes(1000, 10, 5, "bottleneck") == [500, 250, 125, 250, 500]
    with pytest.raises(ValueError):
        configs.mlp_hidden_sizes(10, 1, 1, "diamond")


def test_mlp_layers_follow_gpumemnet_conventions():
    c = {"family": "mlp", "input": 10, "output": 3, "depth": 2, "arch": "uniform", "hidden": [8, 4],
         "batch": 32, "activation": "GELU", "batchnorm": True, "dropout": True, "dropout_rate": 0.1,
         "seed": 1}
    layers = configs.mlp_layers(c)
    assert layers == [
        ("linear", 8, 88), ("batch_normalization", 8, 16), ("GELU", 8, 0), ("dropout", 8, 0),
        ("linear", 4, 36), ("batch_normalization", 4, 8), ("GELU", 4, 0), ("dropout", 4, 0),
        ("linear", 3, 15), ("Softmax", 3, 0),
    ]


def test_cnn_and_transformer_configs_are_buildable():
    rng = random.Random(3)
    for _ in range(500):
        c = configs.sample_cnn(rng)
        assert 2 <= len(c["blocks"]) <= 16 and c["activation"] in configs.CNN_ACTIVATIONS
        hw = c["image"]
        for b in c["blocks"]:
            hw = -(-hw // b["stride"])
            if b["pool"]:
                hw //= 2
            assert hw >= 1
        t = configs.sample_transformer(rng)
        assert t["d_model"] % t["heads"] == 0 and t["ff"] >= 2 * t["d_model"]


def test_filenames_are_unique_and_encode_the_config():
    rng = random.Random(5)
    for family in ("mlp", "cnn", "transformer"):
        names = {configs.filename(configs.sample(family, rng)) for _ in range(300)}
        assert len(names) == 300
    c = configs.sample_mlp(random.Random(9))
    n = configs.filename(c)
    assert n.startswith(f"input:{c['input']}_output:{c['output']}_depth:{c['depth']}_arch:{c['arch']}")
    assert n.endswith(".out")


def test_unknown_family():
    with pytest.raises(ValueError):
        configs.sample("rnn", random.Random(0))
