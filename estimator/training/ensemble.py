"""The GPUMemNet-style ensemble: input transform, small MLP members, ONNX export.

The exported graph takes the RAW feature row (float32 [N, F]) and computes, with
plain ONNX operators only (Add, Log, MatMul, Exp, Concat, Relu, Min, Div):

1. the input transform (`Transform`): `log(x + offset)` of every column
   (offset 1 for counts, i.e. log1p; 2 for the activation's sin/cos), the raw
   columns, and for MLPs (batch + 1)(activations + 1). Memory is close to linear
   in the raw parameters and batch x activations, which makes the classes
   nearly linearly separable;
2. every member's hidden layers (Linear -> ReLU) and output layer. Standardisation
   (the training mean and standard deviation) is folded into the first layer's
   weights, and the members run side by side as one network with block-structured
   weight matrices: one MatMul + Add + Relu per depth level for all members,
   one final MatMul + Add for every member's logits (shallower members carry
   theirs to the end, see `merged_levels`). tract pays a fixed cost per
   operator, so this keeps an estimate to a few microseconds;
3. a softmax per member (logits capped at 80) and the mean of the members'
   probabilities, written as Exp, MatMul and Div.

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
    """Derived inputs: L = log(x + log_offset) for every column, then [L, x] and,
    when `product` = (i, j), exp(L_i + L_j) = (x_i + off_i)(x_j + off_j) - for MLPs
    (batch + 1)(activations + 1), the activation memory's driver.
    """

    log_offset: tuple[float, ...]
    product: tuple[int, int] | None = None

    def width(self) -> int:
        return 2 * len(self.log_offset) + (1 if self.product else 0)

    def as_dict(self) -> dict:
        return {"log_offset": list(self.log_offset),
                "product": None if self.product is None else list(self.product)}


# MLP: 0 depth, 1 batch, 2 params, 3 activations, 4 batch-norm, 5 dropout, 6 sin, 7 cos.
MLP_TRANSFORM = Transform((1, 1, 1, 1, 1, 1, 2, 2), (1, 3))
# CNN: 0 depth, 1 activations, 2 activations x batch, 3 parameters, 4 batch,
# 5 conv2d, 6 batch-norm, 7 dropout, 8 sin, 9 cos.
CNN_TRANSFORM = Transform((1, 1, 1, 1, 1, 1, 1, 1, 2, 2))
# Transformer: 0 depth, 1 activations, 2 activations x batch, 3 parameters,
# 4 batch, 5 attention, 6 linear, 7 layer-norm, 8 dropout.
TRANSFORMER_TRANSFORM = Transform((1,) * 9)
TRANSFORMS = {"mlp": MLP_TRANSFORM, "cnn": CNN_TRANSFORM, "transformer": TRANSFORMER_TRANSFORM}

# Logits are capped before exp so that no input can overflow float32
# (exp(80) * members * classes stays finite); trained logits are far below.
LOGIT_CAP = 80.0


def transform(x: np.ndarray, t: Transform) -> np.ndarray:
    """numpy version of the graph's input transform (float64)."""
    logs = np.log(x + np.asarray(t.log_offset))
    cols = [logs, x]
    if t.product:
        i, j = t.product
        cols.append(np.exp(logs[:, i:i + 1] + logs[:, j:j + 1]))
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
            e = np.exp(np.minimum(h, LOGIT_CAP))  # as the graph computes it
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
    """The members as one block-structured network of plain (MatMul, Add, Relu) levels.

    Returns (hidden, final, order): hidden[l] = (W, b) of level l (input: the
    derived features for l = 0, else level l-1's units; ReLU after each level);
    final = (W, b) from the last level's units to every member's logits, members
    in `order`. Standardisation is folded into hidden[0].

    A member shallower than the deepest one computes its logits at the level
    after its last hidden layer and carries them to the end as the pair
    (relu(v), relu(-v)) - exact through ReLU and identity weights - so every
    member's logits come out of the single final layer.
    """
    c = ens.n_classes
    depth = [len(m) - 1 for m in ens.members]  # hidden layers per member
    levels = max(depth)
    prev: dict[tuple[str, int], tuple[int, int]] = {}
    prev_width = len(ens.mean)
    hidden = []
    for lvl in range(levels):
        cols: dict[tuple[str, int], tuple[int, int]] = {}
        width = 0
        for m in range(len(ens.members)):
            if depth[m] > lvl:
                n = ens.members[m][lvl][0].shape[1]
                cols[("h", m)], width = (width, width + n), width + n
            elif lvl > 0:  # ended at an earlier level: carry its logits as (pos, neg)
                cols[("c", m)], width = (width, width + 2 * c), width + 2 * c
        w = np.zeros((prev_width, width))
        b = np.zeros(width)
        for (kind, m), (c0, c1) in cols.items():
            if kind == "h":
                wm, bm = ens.members[m][lvl]
                if lvl == 0:
                    w[:, c0:c1] = wm / ens.std[:, None]
                    b[c0:c1] = bm - (ens.mean / ens.std) @ wm
                else:
                    r0, r1 = prev[("h", m)]
                    w[r0:r1, c0:c1] = wm
                    b[c0:c1] = bm
            elif ("h", m) in prev:  # logits of a member whose last hidden layer was lvl-1
                wo, bo = ens.members[m][-1]
                r0, r1 = prev[("h", m)]
                w[r0:r1, c0:c0 + c] = wo
                w[r0:r1, c0 + c:c1] = -wo
                b[c0:c0 + c] = bo
                b[c0 + c:c1] = -bo
            else:  # already carried: identity
                r0, _ = prev[("c", m)]
                w[r0:r0 + 2 * c, c0:c1] = np.eye(2 * c)
        hidden.append((w, b))
        prev, prev_width = cols, width
    order = list(range(len(ens.members)))
    wf = np.zeros((prev_width, len(order) * c))
    bf = np.zeros(len(order) * c)
    for k, m in enumerate(order):
        o0, o1 = k * c, (k + 1) * c
        if ("h", m) in prev:
            wo, bo = ens.members[m][-1]
            r0, r1 = prev[("h", m)]
            wf[r0:r1, o0:o1] = wo
            bf[o0:o1] = bo
        else:
            r0, _ = prev[("c", m)]
            wf[r0:r0 + c, o0:o1] = np.eye(c)
            wf[r0 + c:r0 + 2 * c, o0:o1] = -np.eye(c)
    return hidden, (wf, bf), order


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
    if t.product:
        sel = np.zeros((len(t.log_offset), 1))
        sel[list(t.product), 0] = 1.0
        nodes.append(helper.make_node("MatMul", ["logs", const("product_sel", sel)], ["log_product"]))
        nodes.append(helper.make_node("Exp", ["log_product"], ["product"]))
        parts.append("product")
    nodes.append(helper.make_node("Concat", parts, ["derived"], axis=1))

    hidden, (wf, bf), order = merged_levels(ens)
    h = "derived"
    for lvl, (w, b) in enumerate(hidden):
        nodes.append(helper.make_node("MatMul", [h, const(f"w{lvl}", w)], [f"mm{lvl}"]))
        nodes.append(helper.make_node("Add", [f"mm{lvl}", const(f"b{lvl}", b)], [f"pre{lvl}"]))
        nodes.append(helper.make_node("Relu", [f"pre{lvl}"], [f"h{lvl}"]))
        h = f"h{lvl}"
    nodes.append(helper.make_node("MatMul", [h, const("w_out", wf)], ["mm_out"]))
    nodes.append(helper.make_node("Add", ["mm_out", const("b_out", bf)], ["all_logits"]))
    # softmax per member and mean over members, with MatMuls instead of Softmax /
    # ReduceMean (tract runs those per row slowly): e = exp(min(logits, cap));
    # each entry divided by its member's sum (block-of-ones MatMul); averaged
    # per class over the members (MatMul with 1/M).
    m, c = len(order), ens.n_classes
    block = np.kron(np.eye(m), np.ones((c, c)))
    mean = np.tile(np.eye(c), (m, 1)) / m
    nodes.append(helper.make_node("Min", ["all_logits", const("logit_cap", np.array(LOGIT_CAP))], ["capped"]))
    nodes.append(helper.make_node("Exp", ["capped"], ["e"]))
    nodes.append(helper.make_node("MatMul", ["e", const("member_sums", block)], ["e_sum"]))
    nodes.append(helper.make_node("Div", ["e", "e_sum"], ["member_probs"]))
    nodes.append(helper.make_node("MatMul", ["member_probs", const("member_mean", mean)], ["probabilities"]))

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
