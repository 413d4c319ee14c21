"""Fast checks of the training pipeline's building blocks (no shared data needed)."""

import json
import math

import numpy as np
import onnxruntime as ort
import pandas as pd

import ensemble as E
import features as F
import train


def test_decide_is_the_cumulative_rule():
    p = np.array([[0.9, 0.1, 0, 0, 0], [0.7, 0.3, 0, 0, 0], [0.5, 0.2, 0.3, 0, 0], [0.2, 0.2, 0.2, 0.2, 0.2]])
    assert F.decide(p, 0.8).tolist() == [0, 1, 2, 3]
    assert F.decide(p, None).tolist() == [0, 0, 0, 0]
    assert F.decide(np.array([[0.1, 0.1, 0.1]]), 0.9).tolist() == [2]  # never reached: top class


def test_memory_classes_are_upper_inclusive():
    assert F.memory_class(np.array([900, 1443, 2000, 2001, 4999, 5000, 5001, 9e9]), F.MLP_CLASSES).tolist() == \
        [0, 0, 0, 1, 3, 3, 4, 4]


def test_activation_encoding():
    assert F.encode_activation("elu", F.MLP_ACTIVATIONS) == (0.0, 1.0)
    assert F.encode_activation("ReLU6", F.MLP_ACTIVATIONS) == F.encode_activation("ReLU", F.MLP_ACTIVATIONS)
    assert F.encode_activation("unknown", F.CNN_ACTIVATIONS) == F.encode_activation("ReLU", F.CNN_ACTIVATIONS)
    s, c = F.encode_activation("Tanh", F.MLP_ACTIVATIONS)
    assert math.isclose(s, math.sin(10 * math.pi / 11)) and math.isclose(c, math.cos(10 * math.pi / 11))


def test_analytic_bound_matches_rust_constants():
    # same figure as estimator/src/analytic.rs `tiny_model_is_context_only`
    assert F.analytic_upper_bound_mib(1, 1, 1) == 1792


def synthetic_mlp(n, rng):
    x = np.column_stack([
        rng.integers(2, 13, n), rng.integers(4, 1024, n), rng.integers(1e3, 1.5e8, n),
        rng.integers(10, 1.5e5, n), rng.integers(0, 5, n), rng.integers(0, 5, n),
        *np.array([F.encode_activation(a, F.MLP_ACTIVATIONS)
                   for a in rng.choice(F.MLP_ACTIVATIONS, n)]).T,
    ]).astype(np.float64)
    mib = 1450 + 20 * x[:, 2] / 2**20 + 3.3 * x[:, 1] * x[:, 3] / 2**20
    return x, F.memory_class(mib, F.MLP_CLASSES)


def test_onnx_export_equals_numpy_forward(tmp_path):
    rng = np.random.default_rng(0)
    x, y = synthetic_mlp(400, rng)
    ens = E.fit(x, y, 5, E.MLP_TRANSFORM,
                E.EnsembleConfig(hidden=[(4,), (4, 3, 3), (5, 2), (3,), (2, 2, 2, 2)], max_iter=200))
    model = E.to_onnx(ens, 8, "test")
    ops = {n.op_type for n in model.graph.node}
    assert ops <= {"Add", "Log", "MatMul", "Exp", "Concat", "Relu", "Min", "Div"}
    path = tmp_path / "m.onnx"
    path.write_bytes(model.SerializeToString())
    sess = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    got = sess.run(["probabilities"], {"features": x.astype(np.float32)})[0]
    assert got.shape == (400, 5)
    assert np.abs(got - ens.predict_proba(x)).max() < 1e-4
    assert np.allclose(got.sum(axis=1), 1, atol=1e-5)


def test_cnn_family_trains_end_to_end_from_a_generated_style_csv(tmp_path):
    """The CNN path the GPU-generated dataset will take: columns as written by
    estimator/datagen, OOM rows labelled as the top class."""
    rng = np.random.default_rng(1)
    n = 300
    params = rng.integers(1e5, 1e8, n)
    acts = rng.integers(1e4, 5e7, n)
    batch = rng.choice([8, 16, 32, 64, 128], n)
    mem = 600 + 16 * params / 2**20 + 8 * acts * batch / 2**20
    status = np.where(mem > 60000, "oom", "ok")
    conv = rng.integers(2, 20, n)
    df = pd.DataFrame({
        "Filename": [f"cnn{i}" for i in range(n)], "Depth": conv * 2 + 2, "Activations-Params": "[]",
        "Activation Function": rng.choice(F.CNN_ACTIVATIONS, n), "Total Activations": acts,
        "Total Parameters": params, "Batch Size": batch, "Conv2d Layers": conv,
        "Batch Normalization Layers": conv, "Dropout Layers": 0, "AdaptiveAvgPool Layers": 1,
        "Linear Layers": 1, "Max GPU Memory (MiB)": np.where(status == "oom", 81559, mem.round()),
        "Status": status,
    })
    data = tmp_path / "cnn_data.csv"
    df.to_csv(data, index=False)
    y = F.memory_class(df["Max GPU Memory (MiB)"].to_numpy(), F.GB8_CLASSES)
    assert min(np.bincount(y)) >= 3, "the synthetic draw must populate every class for 3-fold CV"
    out = tmp_path / "models"
    assert train.main(["--family", "cnn", "--dataset", str(data), "--out-dir", str(out)]) == 0
    side = json.loads((out / "gpumemnet-cnn.json").read_text())
    assert side["features"] == F.CNN_FEATURES
    assert [c["label"] for c in side["classes"]][-1] == ">40000"
    assert side["shipped"]["all"]["rows"] == len(df)
    assert (out / "gpumemnet-cnn.onnx").is_file() and (out / "MODEL_CARD-cnn.md").is_file()


def test_missing_data_is_a_clear_error(tmp_path, capsys):
    assert train.main(["--family", "mlp", "--data-dir", str(tmp_path), "--out-dir", str(tmp_path)]) == 2
    assert "GPUMemNet data not found" in capsys.readouterr().err
    assert train.main(["--family", "cnn", "--dataset", str(tmp_path / "none.csv"), "--out-dir", str(tmp_path)]) == 2
