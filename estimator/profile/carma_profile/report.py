"""python -m carma_profile.report: the tables of docs/traced-estimate.md.

Reads the traced figures (estimator/tests/data/traced-peaks.csv and traced-heldout.csv,
python -m carma_profile.calibrate), the measured peaks (CARMA's A100 jobs: line 8 of
shared/traces/carma/v2/workloads/*.rad; carma's own H100 runs: h100-carma-peaks.csv and
h100-heldout-peaks.csv, python -m carma_profile.measure) and the constants of
estimator/src/traced.rs. Prints one Markdown row per measured model and batch:

* the fitting set, CARMA's architectures measured on A100s (CARMA's figures) and on an H100
  (carma's), with the shipped constants, and each row again leave-one-architecture-out:
  the constants refitted (by `fit`, the procedure that chose the shipped ones) on every
  other architecture's rows and applied to the left-out one's;
* the held-out set, 26 jobs of architectures no constant was fitted on, measured on the H100.
"""

from __future__ import annotations

import csv
import math
import re
import sys
from pathlib import Path

DATA = "estimator/tests/data"


def constants(repo: Path) -> dict[str, int]:
    text = (repo / "estimator/src/traced.rs").read_text()
    return {k: int(v.replace("_", "")) for k, v in re.findall(r"pub const (\w+): u64 = ([\d_]+);", text)}


def reservation(c: dict, family: str, gpus: int, peak: int, largest: int, reserved: int | None = None) -> int:
    """estimator/src/traced.rs's traced_reservation_mib: from the replayed allocator's
    segments when the trace has them, else from the live-tensor peak."""
    extra = max(0, gpus - 1)
    if reserved is not None:
        b = (c["ALLOCATOR_TRANSFORMER_LARGEST_FACTOR_MILLI"] if family == "transformer"
             else c["ALLOCATOR_CNN_LARGEST_FACTOR_MILLI"])
        tensors = reserved + -(-(largest * b) // 1000) + extra * c["ALLOCATOR_MULTI_GPU_MIB"]
        return max(c["FLOOR_MIB"], c["ALLOCATOR_CONTEXT_MIB"] + tensors)
    b = c["TRANSFORMER_LARGEST_FACTOR_MILLI"] if family == "transformer" else c["CNN_LARGEST_FACTOR_MILLI"]
    tensors = -(-(peak * 1000 + largest * b) // 1000) + extra * c["MULTI_GPU_MIB"]
    return max(c["FLOOR_MIB"], c["CONTEXT_MIB"] + tensors)


def reserve(c: dict, r: dict) -> int:
    return reservation(c, r["family"], r["gpus"], r["peak"], r["largest"], r.get("reserved"))


def fit(rows: list[dict], floor: int, context: int) -> dict[str, int]:
    """The allocator-model constants that underestimate none of `rows`, each the least that does.

    The context is not fitted: it is the CUDA context measured on the H100 (`context`). The
    floor is fixed (one job's measurement, see traced.rs). Per family, the least factor on the
    largest tensor (in steps of 0.01) that covers every single-GPU row above the floor; then
    the least multi-GPU term (MiB per GPU beyond the first) that covers the multi-GPU rows.
    """
    c = {"ALLOCATOR_CONTEXT_MIB": context, "FLOOR_MIB": floor, "ALLOCATOR_MULTI_GPU_MIB": 0}
    single = [r for r in rows if r["gpus"] == 1 and r["measured"] > floor]
    for family, key in (("cnn", "ALLOCATOR_CNN_LARGEST_FACTOR_MILLI"),
                        ("transformer", "ALLOCATOR_TRANSFORMER_LARGEST_FACTOR_MILLI")):
        need = [(r["measured"] - context - r["reserved"]) / r["largest"] for r in single
                if (r["family"] == "transformer") == (family == "transformer")]
        c[key] = max(0, math.ceil(max(need, default=0) * 100) * 10)
    need = [(r["measured"] - reserve(c, r)) / (r["gpus"] - 1) for r in rows if r["gpus"] > 1]
    c["ALLOCATOR_MULTI_GPU_MIB"] = max(0, math.ceil(max(need, default=0)))
    return c


def traced_by_label(path: Path) -> dict[tuple, dict]:
    """Traced rows keyed by (model label, per-GPU batch, GPUs); CIFAR-100 jobs' labels say so."""
    out: dict[tuple, dict] = {}
    for r in csv.DictReader(path.open()):
        label = r["model"] + (" (CIFAR-100)" if "cifar" in r["job"].lower() else "")
        out.setdefault((label, int(r["batch_size"]), int(r["gpus"])), r)
    return out


def row(label: str, traced: dict, measured: int, gpu: str) -> dict:
    return {
        "model": label, "arch": traced["model"], "family": traced["family"], "batch": int(traced["batch_size"]),
        "gpus": int(traced["gpus"]), "gpu": gpu, "measured": measured,
        "peak": max(int(traced["forward_mib"]), int(traced["backward_mib"]), int(traced["optimizer_step_mib"])),
        "largest": int(traced["largest_tensor_mib"]), "reserved": int(traced["reserved_mib"]),
    }


def read_rows(repo: Path) -> tuple[list[dict], list[dict]]:
    """(fitting rows, held-out rows)."""
    rad_dir = repo.parent / "shared/traces/carma/v2/workloads"
    seen, fitting = set(), []
    for r in csv.DictReader((repo / DATA / "traced-peaks.csv").open()):
        label = r["model"] + (" (CIFAR-100)" if "cifar" in r["job"].lower() else "")
        key = (label, r["batch_size"], r["gpus"])
        if key in seen:
            continue
        seen.add(key)
        measured = int((rad_dir / f"{r['job']}.rad").read_text().splitlines()[8])
        fitting.append(row(label, r, measured, "A100"))
    carma = traced_by_label(repo / DATA / "traced-peaks.csv")
    for m in csv.DictReader((repo / DATA / "h100-carma-peaks.csv").open()):
        if m["measured_mib"]:
            t = carma[(m["model"], int(m["batch_size"]), 1)]
            fitting.append(row(m["model"], t, int(m["measured_mib"]), "H100"))
    held = traced_by_label(repo / DATA / "traced-heldout.csv")
    held_out = [row(m["model"], held[(m["model"], int(m["batch_size"]), 1)], int(m["measured_mib"]), "H100")
                for m in csv.DictReader((repo / DATA / "h100-heldout-peaks.csv").open()) if m["measured_mib"]]
    order = lambda x: (x["family"], x["model"], x["batch"], x["gpu"])  # noqa: E731
    return sorted(fitting, key=order), sorted(held_out, key=order)


def summary(name: str, rows: list[dict], key: str) -> str:
    out = []
    for family in ("cnn", "transformer"):
        over = sorted(r[key] - r["measured"] for r in rows if r["family"] == family)
        if over:
            p95 = over[min(len(over) - 1, math.ceil(0.95 * len(over)) - 1)]
            out.append(f"{name}, {family}: {len(over)} model/batch pairs, {sum(o < 0 for o in over)} underestimated, "
                       f"mean reservation − measured {sum(over) / len(over):+,.0f} MiB, p95 {p95:+,}")
    return "\n".join(out)


def table(rows: list[dict], held: bool) -> None:
    extra = "" if held else " held out: reservation | over |"
    print(f"| model | batch/GPU | GPUs | GPU | measured | traced peak | replayed reserved | largest tensor "
          f"| reservation | over |{extra}")
    print("|---|---:|---:|---|---:|---:|---:|---:|---:|---:|" + ("" if held else "---:|---:|"))
    for r in rows:
        cells = (f"| {r['model']} | {r['batch']} | {r['gpus']} | {r['gpu']} | {r['measured']:,} | {r['peak']:,} "
                 f"| {r['reserved']:,} | {r['largest']:,} | {r['reservation']:,} | {r['reservation'] - r['measured']:+,} |")
        if not held:
            cells += f" {r['held_out']:,} | {r['held_out'] - r['measured']:+,} |"
        print(cells)


def main() -> int:
    repo = Path(__file__).resolve().parents[3]
    c = constants(repo)
    fitting, held_out = read_rows(repo)
    refit = fit(fitting, c["FLOOR_MIB"], c["ALLOCATOR_CONTEXT_MIB"])
    shipped = {k: c[k] for k in refit}
    if refit != shipped:
        print(f"note: fitting on every job gives {refit}, traced.rs has {shipped}", file=sys.stderr)
    refits = {}
    for arch in sorted({r["arch"] for r in fitting}):
        k = refits[arch] = fit([r for r in fitting if r["arch"] != arch], c["FLOOR_MIB"], c["ALLOCATOR_CONTEXT_MIB"])
        for r in fitting:
            if r["arch"] == arch:
                r["held_out"] = reserve({**c, **k}, r)
    for r in fitting + held_out:
        r["reservation"] = reserve(c, r)
        # the previous form (live-tensor peak, no allocator replay), for comparison
        r["previous"] = reservation(c, r["family"], r["gpus"], r["peak"], r["largest"])
    print("### Fitting set: CARMA's architectures\n")
    table(fitting, held=False)
    print()
    print(summary("shipped constants", fitting, "reservation"))
    print(summary("leave-one-architecture-out", fitting, "held_out"))
    print("\n### Held out: architectures no constant was fitted on (H100)\n")
    table(held_out, held=True)
    print()
    print(summary("held out, shipped constants", held_out, "reservation"))
    print(summary("held out, previous form (live-tensor peak)", held_out, "previous"))
    print("\nconstants refitted without each architecture (CNN factor, Transformer factor, multi-GPU MiB):")
    for arch, k in refits.items():
        print(f"- without {arch}: {k['ALLOCATOR_CNN_LARGEST_FACTOR_MILLI'] / 1000:.2f}, "
              f"{k['ALLOCATOR_TRANSFORMER_LARGEST_FACTOR_MILLI'] / 1000:.2f}, {k['ALLOCATOR_MULTI_GPU_MIB']:,}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
