"""GPUMemNet features, memory classes and the safe-side decision rule.

Everything here is pure numpy/pandas so that the training script, the tests and
the model card use one definition. The Rust crate (`carma-estimator`) implements
the same feature order, encoding, classes and decision rule; the JSON sidecar
written next to the ONNX model carries the parameters both sides must agree on.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

# Activation functions in GPUMemNet's index order. The index i of N is encoded as
# (sin(i*pi/N), cos(i*pi/N)).
MLP_ACTIVATIONS = [
    "ELU", "GELU", "Identity", "LeakyReLU", "Mish", "PReLU",
    "ReLU", "SELU", "SiLU", "Softplus", "Tanh",
]
CNN_ACTIVATIONS = [a for a in MLP_ACTIVATIONS if a != "Identity"]

# Raw model inputs, in this order, for each family (see reference/gpumemnet.md).
MLP_FEATURES = [
    "depth", "batch_size", "total_parameters", "total_activations",
    "batch_norm_layers", "dropout_layers", "act_sin", "act_cos",
]
CNN_FEATURES = [
    "depth", "total_activations", "activations_x_batch", "total_parameters",
    "batch_size", "conv2d_layers", "batch_norm_layers", "dropout_layers",
    "act_sin", "act_cos",
]
TRANSFORMER_FEATURES = [
    "depth", "total_activations", "activations_x_batch", "total_parameters",
    "batch_size", "attention_layers", "linear_layers", "layer_norm_layers",
    "dropout_layers",
]

MEMORY_COLUMN = "Max GPU Memory (MiB)"


@dataclass(frozen=True)
class ClassSpec:
    """One memory class: (lower, upper] MiB; upper None = open-ended top class."""

    label: str
    lower_mib: int
    upper_mib: int | None


# GPUMemNet's 1 GB bins for the MLP data. Values at or below 1000 MiB cannot be
# measured (the CUDA context alone is larger) and fall into the first class.
MLP_CLASSES = [
    ClassSpec("(1000,2000]", 1000, 2000),
    ClassSpec("(2000,3000]", 2000, 3000),
    ClassSpec("(3000,4000]", 3000, 4000),
    ClassSpec("(4000,5000]", 4000, 5000),
    ClassSpec(">5000", 5000, None),
]


# GPUMemNet's 8 GB bins for CNN and Transformer data, in carma's (lower, upper]
# convention; runs that crashed out of memory belong to the open top class.
GB8_CLASSES = [
    ClassSpec("(0,8000]", 0, 8000),
    ClassSpec("(8000,16000]", 8000, 16000),
    ClassSpec("(16000,24000]", 16000, 24000),
    ClassSpec("(24000,32000]", 24000, 32000),
    ClassSpec("(32000,40000]", 32000, 40000),
    ClassSpec(">40000", 40000, None),
]


def normalise_activation(name: str, known: list[str]) -> str:
    """Map an activation-function name onto the family's list.

    Case-insensitive; ReLU6 counts as ReLU; anything unknown becomes ReLU
    (GPUMemNet's default and by far the most common choice).
    """
    n = name.strip().lower()
    if n == "relu6":
        n = "relu"
    for k in known:
        if k.lower() == n:
            return k
    return "ReLU"


def encode_activation(name: str, known: list[str]) -> tuple[float, float]:
    """(sin(i*pi/N), cos(i*pi/N)) for the activation's index i in `known`."""
    i = known.index(normalise_activation(name, known))
    n = len(known)
    return math.sin(i * math.pi / n), math.cos(i * math.pi / n)


# CSV column of each count feature (GPUMemNet's names; carma's datagen for CNN and
# Transformer). A missing count column means "none of these layers" (step-1 files).
FEATURE_COLUMNS = {
    "depth": "Depth",
    "batch_size": "Batch Size",
    "total_parameters": "Total Parameters",
    "total_activations": "Total Activations",
    "batch_norm_layers": "Batch Normalization Layers",
    "dropout_layers": "Dropout Layers",
    "conv2d_layers": "Conv2d Layers",
    "attention_layers": "Attention Layers",
    "linear_layers": "Linear Layers",
    "layer_norm_layers": "LayerNorm Layers",
}
OPTIONAL_COUNT_COLUMNS = {"Batch Normalization Layers", "Dropout Layers"}


def features_from_frame(df: pd.DataFrame, names: list[str], activations: list[str] | None) -> np.ndarray:
    """The named features of every row, in order (float64)."""
    n = len(df)
    cols = []
    enc = None
    for name in names:
        if name in ("act_sin", "act_cos"):
            if enc is None:
                enc = np.array([encode_activation(a, activations) for a in df["Activation Function"]])
            cols.append(enc[:, 0 if name == "act_sin" else 1])
        elif name == "activations_x_batch":
            cols.append(df["Total Activations"].to_numpy(np.float64) * df["Batch Size"].to_numpy(np.float64))
        else:
            col = FEATURE_COLUMNS[name]
            if col in df:
                cols.append(df[col].fillna(0).to_numpy(np.float64))
            elif col in OPTIONAL_COUNT_COLUMNS:
                cols.append(np.zeros(n))
            else:
                raise ValueError(f"missing column {col!r} for feature {name!r}")
    return np.column_stack(cols)


def memory_class(mib: np.ndarray, classes: list[ClassSpec]) -> np.ndarray:
    """Class index of each measured peak (upper edges inclusive; below-range -> 0)."""
    uppers = np.array([c.upper_mib for c in classes[:-1]], dtype=np.float64)
    return np.searchsorted(uppers, np.asarray(mib, dtype=np.float64), side="left")


def load_csvs(paths: list[Path], features: list[str], activations: list[str] | None,
              classes: list[ClassSpec]) -> tuple[pd.DataFrame, np.ndarray, np.ndarray, np.ndarray]:
    """Read dataset CSVs; returns (frame, features, class index, measured MiB).

    Rows of carma's generated datasets with `Status = error` are dropped; rows
    with `Status = oom` belong to the top class (GPUMemNet's convention).
    """
    frames = []
    for p in paths:
        d = pd.read_csv(p)
        d["__source"] = p.name
        d["__row"] = np.arange(len(d))  # 0-based data row within its file
        for c in OPTIONAL_COUNT_COLUMNS:
            if c not in d:  # step-1 files: plain ReLU MLPs without either
                d[c] = 0
        frames.append(d)
    df = pd.concat(frames, ignore_index=True)
    if "Status" in df:
        df = df[df["Status"].fillna("ok") != "error"].reset_index(drop=True)
    missing = [c for c in ["Total Parameters", "Total Activations", "Batch Size", MEMORY_COLUMN]
               if c not in df]
    if missing:
        raise ValueError(f"missing columns {missing} in {[str(p) for p in paths]}")
    x = features_from_frame(df, features, activations)
    mib = df[MEMORY_COLUMN].to_numpy(np.float64)
    y = memory_class(mib, classes)
    if "Status" in df:
        y[(df["Status"] == "oom").to_numpy()] = len(classes) - 1
    return df, x, y, mib


# --- the safe-side decision rule ------------------------------------------------


def decide(probs: np.ndarray, threshold: float | None) -> np.ndarray:
    """Chosen class per row.

    threshold None: argmax. Otherwise the smallest class whose cumulative
    probability (summed from the lowest class up) reaches `threshold`: the
    reservation then covers the job with the model's probability >= threshold,
    which leans toward the next-higher class whenever the model is unsure.
    Ties and rounding: `>=` on float32 sums, lowest class first - the Rust
    implementation does the same.
    """
    p = np.asarray(probs, dtype=np.float32)
    if threshold is None:
        return p.argmax(axis=1)
    c = np.cumsum(p, axis=1, dtype=np.float32)
    hit = c >= np.float32(threshold)
    # A row whose sum never reaches the threshold (numerically impossible for
    # thresholds <= 0.99) takes the top class.
    hit[:, -1] = True
    return hit.argmax(axis=1)


# --- the analytic upper bound (same constants as estimator/src/analytic.rs) -------

ANALYTIC_CONTEXT_MIB = 1536
ANALYTIC_BYTES_PER_PARAMETER = 24
ANALYTIC_BYTES_PER_ACTIVATION = 4
ANALYTIC_ACTIVATION_FACTOR = 2


def analytic_upper_bound_mib(params: np.ndarray, activations: np.ndarray, batch: np.ndarray) -> np.ndarray:
    """fp32 training upper bound in MiB, rounded up to a multiple of 256 MiB."""
    b = (ANALYTIC_BYTES_PER_PARAMETER * np.asarray(params, dtype=np.float64)
         + ANALYTIC_BYTES_PER_ACTIVATION * ANALYTIC_ACTIVATION_FACTOR
         * np.asarray(activations, dtype=np.float64) * np.asarray(batch, dtype=np.float64))
    mib = ANALYTIC_CONTEXT_MIB + np.ceil(b / (1 << 20))
    return np.ceil(mib / 256.0) * 256.0


# The open-ended top class reserves the analytic bound, but never less than this.
OPEN_CLASS_MIN_RESERVATION_MIB = 6144


@dataclass(frozen=True)
class FamilySpec:
    """Everything family-specific the pipeline needs."""

    name: str
    features: list[str]
    activations: list[str] | None
    classes: list[ClassSpec]
    open_min_mib: int  # least reservation of the open top class


FAMILIES = {
    "mlp": FamilySpec("mlp", MLP_FEATURES, MLP_ACTIVATIONS, MLP_CLASSES, OPEN_CLASS_MIN_RESERVATION_MIB),
    "cnn": FamilySpec("cnn", CNN_FEATURES, CNN_ACTIVATIONS, GB8_CLASSES, 48000),
    "transformer": FamilySpec("transformer", TRANSFORMER_FEATURES, None, GB8_CLASSES, 48000),
}


def reservation_mib(chosen: np.ndarray, classes: list[ClassSpec], x: np.ndarray,
                    features: list[str] = MLP_FEATURES,
                    open_min: int = OPEN_CLASS_MIN_RESERVATION_MIB) -> np.ndarray:
    """Reserved MiB for chosen classes: the class's upper edge; the open top class
    reserves the analytic upper bound, never less than `open_min`."""
    ip, ia, ib = (features.index(n) for n in ("total_parameters", "total_activations", "batch_size"))
    out = np.empty(len(chosen), dtype=np.float64)
    top = len(classes) - 1
    for i, c in enumerate(chosen):
        if c < top:
            out[i] = classes[c].upper_mib
        else:
            ana = analytic_upper_bound_mib(x[i, ip], x[i, ia], x[i, ib])
            out[i] = max(float(ana), open_min)
    return out


def metrics(y: np.ndarray, chosen: np.ndarray, mib: np.ndarray, reserved: np.ndarray,
            n_classes: int) -> dict:
    """Accuracy, underestimate rate, per-class recall, confusion, over-reservation."""
    y = np.asarray(y)
    chosen = np.asarray(chosen)
    conf = np.zeros((n_classes, n_classes), dtype=int)
    for t, p in zip(y, chosen):
        conf[t, p] += 1
    recall = []
    for k in range(n_classes):
        n = conf[k].sum()
        recall.append(None if n == 0 else float(conf[k, k] / n))
    over = np.clip(reserved - mib, 0, None)
    return {
        "rows": int(len(y)),
        "accuracy": float((chosen == y).mean()),
        "underestimate_rate": float((chosen < y).mean()),
        "underestimates": int((chosen < y).sum()),
        "per_class_recall": recall,
        "confusion": conf.tolist(),
        "mean_over_reservation_mib": float(over.mean()),
    }
