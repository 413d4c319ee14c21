import ast
import csv
import random

import pytest

import configs
import csvio

GPUMEMNET_STEP2 = ["Filename", "Depth", "Activations-Params", "Activation Function", "Total Activations",
                   "Total Parameters", "Batch Size", "Batch Normalization Layers", "Dropout Layers",
                   "Max GPU Memory (MiB)", "Avg GPUTL", "Avg GRACT", "Avg SMACT", "Avg SMOCC", "Avg FP32A"]


def measured(**kw):
    base = {"status": "ok", "steps": 50, "max_gpu_mib": 1843.0, "max_process_mib": 1500.2,
            "max_allocated_mib": 120.4, "max_reserved_mib": 140.0, "idle_gpu_mib": 3.0,
            "gpu": "NVIDIA H100 80GB HBM3", "avg_gputl": 41.5}
    base.update(kw)
    return base


def test_mlp_columns_start_with_gpumemnet_step2():
    assert csvio.columns("mlp")[: len(GPUMEMNET_STEP2)] == GPUMEMNET_STEP2
    with pytest.raises(ValueError):
        csvio.columns("rnn")


def test_mlp_row_matches_gpumemnet_semantics():
    c = configs.sample_mlp(random.Random(11))
    c.update(batchnorm=True, dropout=True)
    layers = configs.mlp_layers(c)
    total = sum(p for _, _, p in layers)
    row = csvio.make_row(c, layers, total, measured())
    assert row["Depth"] == c["depth"] + 1  # linear layers, one more than hidden layers
    assert row["Batch Normalization Layers"] == c["depth"]
    assert row["Dropout Layers"] == c["depth"]
    assert row["Total Activations"] == sum(a for _, a, _ in layers)
    assert row["Total Parameters"] == total
    assert row["Max GPU Memory (MiB)"] == 1843
    assert ast.literal_eval(row["Activations-Params"]) == layers
    assert row["Avg SMACT"] == ""  # DCGM metric: not measured without DCGM


def test_cnn_and_transformer_rows():
    cnn = configs.sample_cnn(random.Random(2))
    layers = [("Conv2d", 100, 10), ("BatchNorm2d", 100, 2), ("ReLU", 100, 0), ("Dropout", 100, 0),
              ("AdaptiveAvgPool2d", 4, 0), ("Flatten", 4, 0), ("Linear", 10, 50)]
    row = csvio.make_row(cnn, layers, 62, measured())
    assert (row["Conv2d Layers"], row["Batch Normalization Layers"], row["Dropout Layers"],
            row["AdaptiveAvgPool Layers"], row["Linear Layers"]) == (1, 1, 1, 1, 1)
    assert row["Depth"] == 5
    tr = configs.sample_transformer(random.Random(2))
    layers = [("Embedding", 512, 1000), ("NonDynamicallyQuantizableLinear", 512, 100), ("Linear", 2048, 10),
              ("Dropout", 2048, 0), ("Linear", 512, 10), ("LayerNorm", 512, 2), ("LayerNorm", 512, 2),
              ("Dropout", 512, 0), ("Dropout", 512, 0), ("Linear", 1000, 10)]
    row = csvio.make_row(tr, layers, 1146, measured(status="oom", max_allocated_mib=None))
    assert (row["Attention Layers"], row["Linear Layers"], row["LayerNorm Layers"], row["Dropout Layers"]) == (1, 3, 2, 3)
    assert row["Sequence Length"] == tr["seq_len"]
    assert row["Status"] == "oom" and row["Max Allocated (MiB)"] == ""


def test_sink_writes_header_appends_and_resumes(tmp_path):
    path = tmp_path / "sub" / "mlp.csv"
    sink = csvio.CsvSink(path, "mlp")
    rng = random.Random(1)
    for _ in range(3):
        c = configs.sample_mlp(rng)
        layers = configs.mlp_layers(c)
        sink.write(csvio.make_row(c, layers, 10, measured()))
    with path.open(newline="") as f:
        rows = list(csv.DictReader(f))
    assert len(rows) == 3 and list(rows[0]) == csvio.columns("mlp")
    # the quoted layer list survives the round trip
    assert isinstance(ast.literal_eval(rows[0]["Activations-Params"]), list)
    again = csvio.CsvSink(path, "mlp")
    assert again.done == {r["Filename"] for r in rows}
    with pytest.raises(ValueError):
        csvio.CsvSink(path, "cnn")  # other family's columns
