"""describe() on the model of a shared torchsummary table equals the table's figures,
and the Rust estimator gives the same estimate for both (`--profile` vs `--summary`)."""

import json
import re
import subprocess

from carma_profile import describe
from carma_profile.core import layer_kind
from models import MnistNet

TABLE = "model-summaries/mnist_cnn_64.model"


def table_figures(text):
    """(activations per sample, parameters, layer counts) of a torchsummary table."""
    acts = params = 0
    counts = {}
    for m in re.finditer(r"^\s*(\w+)-\d+\s+\[-1, ([\d, ]+)\]\s+([\d,]+)\s*$", text, re.M):
        size = 1
        for d in m.group(2).split(","):
            size *= int(d)
        acts += size
        params += int(m.group(3).replace(",", ""))
        kind = layer_kind(m.group(1))
        if kind:
            counts[kind] = counts.get(kind, 0) + 1
    total = int(re.search(r"Total params: ([\d,]+)", text).group(1).replace(",", ""))
    assert params == total
    return acts, params, counts


def test_mnist_net_equals_its_table(shared):
    acts, params, counts = table_figures((shared / TABLE).read_text())
    assert (acts, params) == (67978, 1199882)  # the table, summed by hand once
    p = describe(MnistNet(), 64, input_size=(1, 28, 28))
    assert (p["activations"], p["parameters"]) == (acts, params)
    assert {k: v for k, v in p["layers"].items() if v} == counts
    assert p["family"] == "cnn" and p["depth"] == 2 + 2 + 2  # conv2d, dropout, linear


def test_rust_estimates_agree(shared, carma_bin):
    p = describe(MnistNet(), 64, input_size=(1, 28, 28))

    def estimate(*args, stdin=None):
        r = subprocess.run([carma_bin, "estimate", *args], input=stdin, capture_output=True,
                           text=True, timeout=60)
        assert r.returncode == 0, r.stderr
        return json.loads(r.stdout)

    from_table = estimate("--summary", str(shared / TABLE), "--family", "cnn", "--batch-size", "64")
    from_model = estimate("--profile", "-", stdin=json.dumps(p))
    # a table is read layer by layer, and the answer says what that bound counts
    terms = from_table.pop("terms")
    assert terms["total_mib"] == from_table["estimate_mib"]
    assert from_model == from_table
