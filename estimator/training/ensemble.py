"""The GPUMemNet-style ensemble: input transform, small MLP members, ONNX export.

The exported graph takes the RAW feature row (float32 [N, F]) and computes, with
plain ONNX operators only (Add, Log, Slice, Mul, Min, Concat, MatMul, Relu,
Reshape, Softmax, ReduceMean):

1. the input transform (`Transform`): `log(x + offset)` of every column
   (offset 1 for counts, i.e. log1p; 2 for the activation's sin/cos), the raw
   columns, and for MLPs batch x activations and batch x activations of nets
   with batch norm / with dropout. Memory is close to linear in the raw
   parameters and batch x activations, which makes the classes nearly linearly
   separable;
2. every member's hidden layers (Linear -> ReLU) and output layer. Standardisation
   (the training mean and standard deviation) is folded into the first layer's
   weights, and the members run side by side as one network with block-structured
   weight matrices: one MatMul + Add + Relu per depth level for all members,
   one MatMul + Add for the logits of the members that end at that level. tract
   pays a fixed cost per operator, so this keeps an estimate to a few microseconds;
3. a softmax per member and the mean of the members' probabilities.

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


@dataclass(frozen=True)
class Transform:
    """Derived inputs: [log(x + log_offset) for every column] ++ [x] ++ products.

    `gated_product` (MLP only): (i, j, gates) adds x_i*x_j and x_i*x_j*min(x_g, 1)
    for each gate column g (a non-negative layer count, so min(., 1) says "has any").
    """

    log_offset: tuple[float, ...]
    gated_product: tuple[int, int, tuple[int, ...]] | None = None

    def width(self) -> int:
        n = 2 * len(self.log_offset)
        if self.gated_product:
            n += 1 + len(self.gated_product[2])
        return n

    def as_dict(self) -> dict:
        return {"log_offset": list(self.log_offset),
                "gated_product": None if self.gated_product is None else
                [self.gated_product[0], self.gated_product[1], list(self.gated_product[2])]}


# MLP: 0 depth, 1 batch, 2 params, 3 activations, 4 batch-norm, 5 dropout, 6 sin, 7 cos.
MLP_TRANSFORM = Transform((1, 1, 1, 1, 1, 1, 2, 2), (1, 3, (4, 5)))
# CNN: 0 depth, 1 activations, 2 activations x batch, 3 parameters, 4 batch,
# 5 conv2d, 6 batch-norm, 7 dropout, 8 sin, 9 cos.
CNN_TRANSFORM = Transform((1, 1, 1, 1, 1, 1, 1, 1, 2, 2))
# Transformer: 0 depth, 1 activations, 2 activations x batch, 3 parameters,
# 4 batch, 5 attention, 6 linear, 7 layer-norm, 8 dropout.
TRANSFORMER_TRANSFORM = Transform((1,) * 9)
TRANSFORMS = {"mlp": MLP_TRANSFORM, "cnn": CNN_TRANSFORM, "transformer": TRANSFORMER_TRANSFORM}


def transform(x: np.ndarray, t: Transform) -> np.ndarray:
    """numpy version of the graph's input transform (float64)."""
    cols = [np.log(x + np.asarray(t.log_offset)), x]
    if t.gated_product:
        i, j, gates = t.gated_product
        prod = x[:, i:i + 1] * x[:, j:j + 1]
        cols += [prod, prod * np.minimum(x[:, list(gates)], 1.0)]
    return np.concatenate(cols, axis=1)


@dataclass
class EnsembleConfig:
    """Hyper-parameters (chosen on the MLP data's 3-fold CV split; see the model card)."""

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
    """A trained ensemble: transform, standardisation, member weights."""

    transform: Transform
    mean: np.ndarray
    std: np.ndarray
    n_classes: int
    # per member: list of (W, b) with the last layer already widened to n_classes
    members: list[list[tuple[np.ndarray, np.ndarray]]]

    def predict_proba(self, x: np.ndarray) -> np.ndarray:
        """float64 reference forward pass (the ONNX graph computes the same in float32)."""
        z = (transform(x, self.transform) - self.mean) / self.std
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


def fit(x: np.ndarray, y: np.ndarray, n_classes: int, t: Transform, cfg: EnsembleConfig) -> Ensemble:
    z = transform(x, t)
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
    return Ensemble(t, mean, std, n_classes, members)


def merged_levels(ens: Ensemble):
    """The members as one block-structured network.

    Returns (hidden, logits): hidden[l] = (W, b) from level l's input (the
    derived features for l = 0, else the level-l activations of all members still
    going) to level l+1's hidden units; logits[l] = (W, b) from level l+1's hidden
    units to the logits of the members whose last hidden layer is l+1 (None if
    none ends there). Standardisation is folded into hidden[0].
    """
    depth = [len(m) - 1 for m in ens.members]  # hidden layers per member
    levels = max(depth)
    n_in = len(ens.mean)
    # column ranges of each member's units at each level
    hidden, logits = [], []
    prev_cols: dict[int, tuple[int, int]] = {}
    prev_width = n_in
    for lvl in range(levels):
        cols: dict[int, tuple[int, int]] = {}
        width = 0
        for m, layers in enumerate(ens.members):
            if depth[m] > lvl:
                n = layers[lvl][0].shape[1]
                cols[m] = (width, width + n)
                width += n
        w = np.zeros((prev_width, width))
        b = np.zeros(width)
        for m, (c0, c1) in cols.items():
            wm, bm = ens.members[m][lvl]
            if lvl == 0:
                w[:, c0:c1] = wm / ens.std[:, None]
                b[c0:c1] = bm - (ens.mean / ens.std) @ wm
            else:
                r0, r1 = prev_cols[m]
                w[r0:r1, c0:c1] = wm
                b[c0:c1] = bm
        hidden.append((w, b))
        ending = [m for m in cols if depth[m] == lvl + 1]
        if ending:
            wl = np.zeros((width, len(ending) * ens.n_classes))
            bl = np.zeros(len(ending) * ens.n_classes)
            for k, m in enumerate(ending):
                wm, bm = ens.members[m][-1]
                c0, c1 = cols[m]
                wl[c0:c1, k * ens.n_classes:(k + 1) * ens.n_classes] = wm
                bl[k * ens.n_classes:(k + 1) * ens.n_classes] = bm
            logits.append((wl, bl, ending))
        else:
            logits.append(None)
        prev_cols, prev_width = cols, width
    return hidden, logits


def to_onnx(ens: Ensemble, n_features: int, doc: str) -> onnx.ModelProto:
    """Export with plain operators; input 'features' float[N, n_features],
    output 'probabilities' float[N, n_classes]."""
    nodes, inits = [], []

    def const(name: str, arr, dtype=np.float32) -> str:
        inits.append(numpy_helper.from_array(np.asarray(arr, dtype=dtype), name))
        return name

    t = ens.transform
    nodes.append(helper.make_node("Add", ["features", const("log_offset", t.log_offset)], ["shifted"]))
    nodes.append(helper.make_node("Log", ["shifted"], ["logs"]))
    parts = ["logs", "features"]
    if t.gated_product:
        i, j, gates = t.gated_product
        if list(gates) != list(range(gates[0], gates[0] + len(gates))):
            raise ValueError("gate columns must be contiguous")
        axis = const("axis1", [1], np.int64)

        def sl(name, a, b):
            nodes.append(helper.make_node(
                "Slice", ["features", const(f"{name}_s", [a], np.int64), const(f"{name}_e", [b], np.int64), axis],
                [name]))
            return name
        nodes.append(helper.make_node("Mul", [sl("col_i", i, i + 1), sl("col_j", j, j + 1)], ["prod"]))
        nodes.append(helper.make_node("Min", [sl("gates", gates[0], gates[0] + len(gates)),
                                              const("one", np.array(1.0))], ["has_gate"]))
        nodes.append(helper.make_node("Mul", ["prod", "has_gate"], ["gated"]))
        parts += ["prod", "gated"]
    nodes.append(helper.make_node("Concat", parts, ["derived"], axis=1))

    hidden, logits = merged_levels(ens)
    h = "derived"
    logit_names, order = [], []
    for lvl, (w, b) in enumerate(hidden):
        nodes.append(helper.make_node("MatMul", [h, const(f"w{lvl}", w)], [f"mm{lvl}"]))
        nodes.append(helper.make_node("Add", [f"mm{lvl}", const(f"b{lvl}", b)], [f"pre{lvl}"]))
        nodes.append(helper.make_node("Relu", [f"pre{lvl}"], [f"h{lvl}"]))
        h = f"h{lvl}"
        if logits[lvl] is not None:
            wl, bl, ending = logits[lvl]
            nodes.append(helper.make_node("MatMul", [h, const(f"wl{lvl}", wl)], [f"lm{lvl}"]))
            nodes.append(helper.make_node("Add", [f"lm{lvl}", const(f"bl{lvl}", bl)], [f"logits{lvl}"]))
            logit_names.append(f"logits{lvl}")
            order += ending
    n_members = len(ens.members)
    if len(logit_names) > 1:
        nodes.append(helper.make_node("Concat", logit_names, ["all_logits"], axis=1))
    else:
        nodes.append(helper.make_node("Identity", logit_names, ["all_logits"]))
    nodes.append(helper.make_node(
        "Reshape", ["all_logits", const("member_shape", [-1, n_members, ens.n_classes], np.int64)],
        ["member_logits"]))
    nodes.append(helper.make_node("Softmax", ["member_logits"], ["member_probs"], axis=2))
    nodes.append(helper.make_node("ReduceMean", ["member_probs"], ["probabilities"], axes=[1], keepdims=0))

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
