"""The GPUMemNet-style ensemble: input transform, small MLP members, ONNX export.

The exported graph takes the RAW feature row (float32 [N, F]) and does, with
plain ONNX operators only (Slice, Add, Log, Mul, Min, Concat, Sub, Div, MatMul,
Relu, Softmax):

1. the input transform (`TRANSFORMS`): log1p of the count features, the two
   activation-encoding columns unchanged, and four physically motivated
   products (parameters; batch x activations; batch x activations when the net
   has batch norm / dropout) that make the memory classes nearly linearly
   separable;
2. standardisation with the training set's mean and standard deviation;
3. every member: (MatMul, Add, Relu) per hidden layer, then MatMul, Add,
   Softmax;
4. the mean of the members' probabilities.

No ZipMap, no Scaler: tract-onnx runs it as is.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass, field

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper
from sklearn.exceptions import ConvergenceWarning
from sklearn.neural_network import MLPClassifier

OPSET = 13

# Derived inputs of the MLP family, over the raw columns of features.MLP_FEATURES
# (0 depth, 1 batch, 2 params, 3 activations, 4 batch-norm, 5 dropout, 6 sin, 7 cos).
#   ("log1p", i)        log(1 + x_i)
#   ("raw", i)          x_i
#   ("prod", i, j)      x_i * x_j
#   ("prod_any", i, j, k)  x_i * x_j * min(x_k, 1)   (x_k is a non-negative count)
MLP_TRANSFORMS = [
    ("log1p", 0), ("log1p", 1), ("log1p", 2), ("log1p", 3), ("log1p", 4), ("log1p", 5),
    ("raw", 6), ("raw", 7),
    ("raw", 2),
    ("prod", 1, 3),
    ("prod_any", 1, 3, 4),
    ("prod_any", 1, 3, 5),
]

# CNN: 0 depth, 1 activations, 2 activations x batch, 3 parameters, 4 batch,
# 5 conv2d, 6 batch-norm, 7 dropout, 8 sin, 9 cos.
CNN_TRANSFORMS = [("log1p", i) for i in range(8)] + [("raw", 8), ("raw", 9), ("raw", 3), ("raw", 2)]
# Transformer: 0 depth, 1 activations, 2 activations x batch, 3 parameters,
# 4 batch, 5 attention, 6 linear, 7 layer-norm, 8 dropout.
TRANSFORMER_TRANSFORMS = [("log1p", i) for i in range(9)] + [("raw", 3), ("raw", 2)]
TRANSFORMS = {"mlp": MLP_TRANSFORMS, "cnn": CNN_TRANSFORMS, "transformer": TRANSFORMER_TRANSFORMS}


def transform(x: np.ndarray, spec: list[tuple]) -> np.ndarray:
    """numpy version of the graph's input transform (float64)."""
    cols = []
    for t in spec:
        kind = t[0]
        if kind == "log1p":
            cols.append(np.log1p(x[:, t[1]]))
        elif kind == "raw":
            cols.append(x[:, t[1]])
        elif kind == "prod":
            cols.append(x[:, t[1]] * x[:, t[2]])
        elif kind == "prod_any":
            cols.append(x[:, t[1]] * x[:, t[2]] * np.minimum(x[:, t[3]], 1.0))
        else:
            raise ValueError(f"unknown transform {kind}")
    return np.column_stack(cols)


@dataclass
class EnsembleConfig:
    """Hyper-parameters (chosen on the 3-fold CV split; see the model card)."""

    hidden: list[tuple[int, ...]] = field(
        default_factory=lambda: [(8,), (8, 4), (8, 4, 4), (8, 4, 4, 4)] * 2)
    alpha: float = 3.0  # L2 penalty; strong regularisation calibrates the probabilities
    max_iter: int = 3000
    tol: float = 1e-7
    seed: int = 0  # member k uses seed + k

    def as_dict(self) -> dict:
        return {
            "members": [list(h) for h in self.hidden],
            "solver": "lbfgs",
            "activation": "relu",
            "alpha": self.alpha,
            "max_iter": self.max_iter,
            "tol": self.tol,
            "seed": self.seed,
        }


@dataclass
class Ensemble:
    """A trained ensemble: transform spec, standardisation, member weights."""

    spec: list[tuple]
    mean: np.ndarray
    std: np.ndarray
    n_classes: int
    # per member: list of (W, b) with the last layer already widened to n_classes
    members: list[list[tuple[np.ndarray, np.ndarray]]]

    def predict_proba(self, x: np.ndarray) -> np.ndarray:
        """float64 reference forward pass (the ONNX graph computes the same in float32)."""
        z = (transform(x, self.spec) - self.mean) / self.std
        total = np.zeros((len(x), self.n_classes))
        for layers in self.members:
            h = z
            for i, (w, b) in enumerate(layers):
                h = h @ w + b
                if i < len(layers) - 1:
                    h = np.maximum(h, 0.0)
            h = h - h.max(axis=1, keepdims=True)
            e = np.exp(h)
            total += e / e.sum(axis=1, keepdims=True)
        return total / len(self.members)

    def n_parameters(self) -> int:
        return int(sum(w.size + b.size for layers in self.members for w, b in layers))


# Logit bias for classes absent from the training data: exp(-1e4) is exactly 0
# in float32, so such a class gets probability 0 and is never chosen by argmax.
ABSENT_CLASS_BIAS = -1.0e4


def fit(x: np.ndarray, y: np.ndarray, n_classes: int, spec: list[tuple],
        cfg: EnsembleConfig) -> Ensemble:
    z = transform(x, spec)
    mean = z.mean(axis=0)
    std = z.std(axis=0)
    std[std == 0] = 1.0
    zs = (z - mean) / std
    members = []
    for k, hidden in enumerate(cfg.hidden):
        clf = MLPClassifier(hidden_layer_sizes=hidden, activation="relu", solver="lbfgs",
                            alpha=cfg.alpha, max_iter=cfg.max_iter, tol=cfg.tol,
                            random_state=cfg.seed + k)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", ConvergenceWarning)
            clf.fit(zs, y)
        if len(clf.classes_) < 3:
            raise ValueError("need at least three classes in the training data")
        layers = [(w.copy(), b.copy()) for w, b in zip(clf.coefs_, clf.intercepts_)]
        w_last, b_last = layers[-1]
        w_full = np.zeros((w_last.shape[0], n_classes))
        b_full = np.full(n_classes, ABSENT_CLASS_BIAS)
        w_full[:, clf.classes_] = w_last
        b_full[clf.classes_] = b_last
        layers[-1] = (w_full, b_full)
        members.append(layers)
    return Ensemble(spec, mean, std, n_classes, members)


def to_onnx(ens: Ensemble, n_features: int, doc: str) -> onnx.ModelProto:
    """Export with plain operators; input 'features' float[N, n_features],
    output 'probabilities' float[N, n_classes]."""
    nodes, inits = [], []

    def const(name: str, arr) -> str:
        inits.append(numpy_helper.from_array(np.asarray(arr, dtype=np.float32), name))
        return name

    def const_i64(name: str, arr) -> str:
        inits.append(numpy_helper.from_array(np.asarray(arr, dtype=np.int64), name))
        return name

    one = const("one", np.array(1.0))
    axis1 = const_i64("axis1", [1])
    cols: dict[int, str] = {}

    def column(i: int) -> str:
        if i not in cols:
            s = const_i64(f"start{i}", [i])
            e = const_i64(f"end{i}", [i + 1])
            out = f"x{i}"
            nodes.append(helper.make_node("Slice", ["features", s, e, axis1], [out], name=f"slice{i}"))
            cols[i] = out
        return cols[i]

    parts = []
    for k, t in enumerate(ens.spec):
        kind = t[0]
        out = f"t{k}"
        if kind == "log1p":
            nodes.append(helper.make_node("Add", [column(t[1]), one], [f"{out}_p1"]))
            nodes.append(helper.make_node("Log", [f"{out}_p1"], [out]))
        elif kind == "raw":
            out = column(t[1])
        elif kind == "prod":
            nodes.append(helper.make_node("Mul", [column(t[1]), column(t[2])], [out]))
        elif kind == "prod_any":
            nodes.append(helper.make_node("Mul", [column(t[1]), column(t[2])], [f"{out}_m"]))
            nodes.append(helper.make_node("Min", [column(t[3]), one], [f"{out}_ind"]))
            nodes.append(helper.make_node("Mul", [f"{out}_m", f"{out}_ind"], [out]))
        else:
            raise ValueError(kind)
        parts.append(out)
    nodes.append(helper.make_node("Concat", parts, ["derived"], axis=1))
    nodes.append(helper.make_node("Sub", ["derived", const("mean", ens.mean)], ["centred"]))
    nodes.append(helper.make_node("Div", ["centred", const("std", ens.std)], ["z"]))

    prob_names = []
    for m, layers in enumerate(ens.members):
        h = "z"
        for i, (w, b) in enumerate(layers):
            wn = const(f"m{m}_w{i}", w)
            bn = const(f"m{m}_b{i}", b)
            nodes.append(helper.make_node("MatMul", [h, wn], [f"m{m}_mm{i}"]))
            nodes.append(helper.make_node("Add", [f"m{m}_mm{i}", bn], [f"m{m}_a{i}"]))
            if i < len(layers) - 1:
                nodes.append(helper.make_node("Relu", [f"m{m}_a{i}"], [f"m{m}_h{i}"]))
                h = f"m{m}_h{i}"
            else:
                h = f"m{m}_a{i}"
        nodes.append(helper.make_node("Softmax", [h], [f"m{m}_p"], axis=1))
        prob_names.append(f"m{m}_p")
    acc = prob_names[0]
    for k, p in enumerate(prob_names[1:], start=1):
        nodes.append(helper.make_node("Add", [acc, p], [f"sum{k}"]))
        acc = f"sum{k}"
    inv = const("inv_members", np.array(1.0 / len(prob_names)))
    nodes.append(helper.make_node("Mul", [acc, inv], ["probabilities"]))

    graph = helper.make_graph(
        nodes, "gpumemnet_ensemble",
        [helper.make_tensor_value_info("features", TensorProto.FLOAT, ["N", n_features])],
        [helper.make_tensor_value_info("probabilities", TensorProto.FLOAT, ["N", ens.n_classes])],
        inits,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)],
                              producer_name="carma-estimator/training", doc_string=doc)
    model.ir_version = 8
    onnx.checker.check_model(model, full_check=True)
    return model
