"""CSV rows in GPUMemNet's schema (pure Python).

The first columns of each family's file are GPUMemNet's (for MLPs exactly those
of `mlp_data_step2.csv`, so carma's training pipeline and `carma estimate eval`
read generated files unchanged); carma's extra measurements follow at the end.
Columns are matched by name everywhere, never by position.
"""

from __future__ import annotations

import csv
import os
from pathlib import Path
from typing import Any, Iterable

from configs import filename

# GPUMemNet's utilisation columns. Avg GPUTL comes from NVML; the DCGM profiling
# metrics (GRACT, SMACT, SMOCC, FP32A) need DCGM and stay empty without it.
UTIL_COLUMNS = ["Avg GPUTL", "Avg GRACT", "Avg SMACT", "Avg SMOCC", "Avg FP32A"]
MEMORY = "Max GPU Memory (MiB)"

FAMILY_COLUMNS = {
    "mlp": ["Filename", "Depth", "Activations-Params", "Activation Function",
            "Total Activations", "Total Parameters", "Batch Size",
            "Batch Normalization Layers", "Dropout Layers", MEMORY, *UTIL_COLUMNS],
    "cnn": ["Filename", "Depth", "Activations-Params", "Activation Function",
            "Total Activations", "Total Parameters", "Batch Size", "Conv2d Layers",
            "Batch Normalization Layers", "Dropout Layers", "AdaptiveAvgPool Layers",
            "Linear Layers", MEMORY, *UTIL_COLUMNS],
    "transformer": ["Filename", "Depth", "Activations-Params", "Activation Function",
                    "Total Activations", "Total Parameters", "Batch Size", "Sequence Length",
                    "Attention Layers", "Linear Layers", "LayerNorm Layers", "Dropout Layers",
                    MEMORY, *UTIL_COLUMNS],
}

# carma's additions, after GPUMemNet's columns.
EXTRA_COLUMNS = [
    "Status",                   # ok | oom | error
    "Steps",                    # optimizer steps completed
    "Max Process Memory (MiB)", # NVML, this run's process only
    "Max Allocated (MiB)",      # torch.cuda.max_memory_allocated
    "Max Reserved (MiB)",       # torch.cuda.max_memory_reserved
    "Idle GPU Memory (MiB)",    # NVML memory.used before the run started
    "GPU",                      # NVML device name
]


def columns(family: str) -> list[str]:
    if family not in FAMILY_COLUMNS:
        raise ValueError(f"unknown family {family!r}")
    return FAMILY_COLUMNS[family] + EXTRA_COLUMNS


def counts(layers: Iterable[tuple[str, int, int]]) -> dict[str, int]:
    """Layer counts by GPUMemNet's / PyTorch's layer names."""
    c = {"linear": 0, "conv2d": 0, "batch_norm": 0, "dropout": 0, "layer_norm": 0,
         "attention": 0, "adaptive_avg_pool": 0}
    for name, _, _ in layers:
        n = name.lower()
        if n in ("linear",):
            c["linear"] += 1
        elif n == "nondynamicallyquantizablelinear" or n == "multiheadattention":
            c["attention"] += 1
        elif n.startswith("conv2d"):
            c["conv2d"] += 1
        elif n.startswith("batchnorm") or n == "batch_normalization":
            c["batch_norm"] += 1
        elif n.startswith("dropout"):
            c["dropout"] += 1
        elif n == "layernorm":
            c["layer_norm"] += 1
        elif n.startswith("adaptiveavgpool"):
            c["adaptive_avg_pool"] += 1
    return c


def make_row(cfg: dict[str, Any], layers: list[tuple[str, int, int]], total_params: int,
             measured: dict[str, Any]) -> dict[str, Any]:
    """One CSV row from a configuration, its layer list and the measurements.

    `measured` keys: max_gpu_mib (device-level NVML peak, GPUMemNet's label),
    status, steps, max_process_mib, max_allocated_mib, max_reserved_mib,
    idle_gpu_mib, gpu, avg_gputl (any may be None).
    """
    fam = cfg["family"]
    c = counts(layers)
    total_acts = sum(a for _, a, _ in layers)
    row: dict[str, Any] = {
        "Filename": filename(cfg),
        "Activations-Params": repr([(str(n), int(a), int(p)) for n, a, p in layers]),
        "Activation Function": cfg["activation"],
        "Total Activations": total_acts,
        "Total Parameters": int(total_params),
        "Batch Size": cfg["batch"],
        MEMORY: _int_or_blank(measured.get("max_gpu_mib")),
        "Avg GPUTL": _blank(measured.get("avg_gputl")),
        "Avg GRACT": "", "Avg SMACT": "", "Avg SMOCC": "", "Avg FP32A": "",
        "Status": measured.get("status", "ok"),
        "Steps": _blank(measured.get("steps")),
        "Max Process Memory (MiB)": _int_or_blank(measured.get("max_process_mib")),
        "Max Allocated (MiB)": _int_or_blank(measured.get("max_allocated_mib")),
        "Max Reserved (MiB)": _int_or_blank(measured.get("max_reserved_mib")),
        "Idle GPU Memory (MiB)": _int_or_blank(measured.get("idle_gpu_mib")),
        "GPU": measured.get("gpu", ""),
    }
    if fam == "mlp":
        row.update({
            "Depth": c["linear"],
            "Batch Normalization Layers": c["batch_norm"],
            "Dropout Layers": c["dropout"],
        })
    elif fam == "cnn":
        row.update({
            "Depth": c["conv2d"] + c["batch_norm"] + c["dropout"] + c["adaptive_avg_pool"] + c["linear"],
            "Conv2d Layers": c["conv2d"],
            "Batch Normalization Layers": c["batch_norm"],
            "Dropout Layers": c["dropout"],
            "AdaptiveAvgPool Layers": c["adaptive_avg_pool"],
            "Linear Layers": c["linear"],
        })
    elif fam == "transformer":
        row.update({
            "Depth": c["linear"] + c["attention"] + c["layer_norm"] + c["dropout"],
            "Sequence Length": cfg["seq_len"],
            "Attention Layers": c["attention"],
            "Linear Layers": c["linear"],
            "LayerNorm Layers": c["layer_norm"],
            "Dropout Layers": c["dropout"],
        })
    else:
        raise ValueError(f"unknown family {fam!r}")
    missing = set(columns(fam)) - set(row)
    if missing:  # a programming error, not bad data
        raise AssertionError(f"row lacks columns {sorted(missing)}")
    return row


def _blank(v):
    return "" if v is None else v


def _int_or_blank(v):
    return "" if v is None else int(round(v))


class CsvSink:
    """Appends rows to a family's CSV, writing the header for a new file.

    Resumable: `done` holds the file names already present, so an interrupted
    run can continue with the same seed and skip finished configurations.
    """

    def __init__(self, path: Path, family: str):
        self.path = Path(path)
        self.family = family
        self.columns = columns(family)
        self.done: set[str] = set()
        if self.path.exists() and self.path.stat().st_size > 0:
            with self.path.open(newline="") as f:
                reader = csv.DictReader(f)
                if reader.fieldnames != self.columns:
                    raise ValueError(f"{self.path} has other columns than a {family} dataset: "
                                     f"{reader.fieldnames}")
                self.done = {r["Filename"] for r in reader}
        else:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            with self.path.open("w", newline="") as f:
                csv.DictWriter(f, fieldnames=self.columns).writeheader()

    def write(self, row: dict[str, Any]) -> None:
        with self.path.open("a", newline="") as f:
            csv.DictWriter(f, fieldnames=self.columns).writerow(row)
            f.flush()
            os.fsync(f.fileno())
        self.done.add(row["Filename"])
