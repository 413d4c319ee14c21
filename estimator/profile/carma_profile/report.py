"""python -m carma_profile.report: the tables of docs/traced-estimate.md.

Reads estimator/tests/data/traced-peaks.csv (python -m carma_profile.calibrate), the
measured peaks (line 8 of shared/traces/carma/v2/workloads/*.rad) and the constants of
estimator/src/traced.rs, and prints one Markdown row per distinct model and batch with the
shipped constants, then the same rows leave-one-architecture-out: the constants refitted
(by `fit`, the procedure that chose the shipped ones) on every other architecture's jobs
and applied to the left-out one's.
"""

from __future__ import annotations

import csv
import math
import re
import sys
from pathlib import Path


def constants(repo: Path) -> dict[str, int]:
    text = (repo / "estimator/src/traced.rs").read_text()
    return {k: int(v.replace("_", "")) for k, v in re.findall(r"pub const (\w+): u64 = ([\d_]+);", text)}


def reservation(c: dict, family: str, gpus: int, peak: int, largest: int) -> int:
    """estimator/src/traced.rs's traced_reservation_mib."""
    b = c["TRANSFORMER_LARGEST_FACTOR_MILLI"] if family == "transformer" else c["CNN_LARGEST_FACTOR_MILLI"]
    tensors = -(-(peak * 1000 + largest * b) // 1000) + max(0, gpus - 1) * c["MULTI_GPU_MIB"]
    return max(c["FLOOR_MIB"], c["CONTEXT_MIB"] + tensors)


def fit(rows: list[dict], floor: int) -> dict[str, int]:
    """Constants that underestimate none of `rows` with the least mean over-reservation.

    The traced peak counts once; the floor is fixed (it is one job's measurement, see
    traced.rs); the Transformer largest-tensor factor is 0 (the BERT jobs measure at their
    traced peak). Searched: the context in steps of 10 MiB, with the least CNN factor (in
    steps of 0.01) that covers every single-GPU CNN job above the floor, then the least
    multi-GPU term (MiB per GPU beyond the first) that covers the multi-GPU jobs.
    """
    single = [r for r in rows if r["gpus"] == 1 and r["measured"] > floor]
    best = None
    for context in range(0, floor + 1, 10):
        if any(context + r["peak"] < r["measured"] for r in single if r["family"] == "transformer"):
            continue
        need = [(r["measured"] - context - r["peak"]) / r["largest"] for r in single if r["family"] != "transformer"]
        b = max(0, math.ceil(max(need, default=0) * 100) * 10)
        c = {"CONTEXT_MIB": context, "FLOOR_MIB": floor, "CNN_LARGEST_FACTOR_MILLI": b,
             "TRANSFORMER_LARGEST_FACTOR_MILLI": 0, "MULTI_GPU_MIB": 0}
        need = [(r["measured"] - reservation(c, r["family"], r["gpus"], r["peak"], r["largest"])) / (r["gpus"] - 1)
                for r in rows if r["gpus"] > 1]
        c["MULTI_GPU_MIB"] = max(0, math.ceil(max(need, default=0)))
        over = sum(reservation(c, r["family"], r["gpus"], r["peak"], r["largest"]) - r["measured"] for r in rows)
        if best is None or over < best[0]:
            best = (over, c)
    return best[1]


def read_rows(repo: Path) -> list[dict]:
    rad_dir = repo.parent / "shared/traces/carma/v2/workloads"
    seen, rows = set(), []
    for r in csv.DictReader((repo / "estimator/tests/data/traced-peaks.csv").open()):
        key = (r["model"], r["batch_size"], r["gpus"], "cifar" in r["job"])
        if key in seen:
            continue
        seen.add(key)
        rows.append({
            "job": r["job"], "model": r["model"], "family": r["family"], "batch": int(r["batch_size"]),
            "gpus": int(r["gpus"]), "cifar": "cifar" in r["job"],
            "measured": int((rad_dir / f"{r['job']}.rad").read_text().splitlines()[8]),
            "peak": max(int(r["forward_mib"]), int(r["backward_mib"]), int(r["optimizer_step_mib"])),
            "largest": int(r["largest_tensor_mib"]),
        })
    return sorted(rows, key=lambda x: (x["family"], x["model"], x["cifar"], x["batch"]))


def summary(name: str, rows: list[dict], key: str) -> str:
    out = []
    for family in ("cnn", "transformer"):
        over = [r[key] - r["measured"] for r in rows if r["family"] == family]
        out.append(f"{name}, {family}: {len(over)} model/batch pairs, {sum(o < 0 for o in over)} underestimated, "
                   f"mean over {sum(over) / len(over):,.0f} MiB")
    return "\n".join(out)


def main() -> int:
    repo = Path(__file__).resolve().parents[3]
    c = constants(repo)
    rows = read_rows(repo)
    refit = fit(rows, c["FLOOR_MIB"])
    shipped = {k: c[k] for k in refit}
    if refit != shipped:
        print(f"note: fitting on every job gives {refit}, traced.rs has {shipped}", file=sys.stderr)
    for arch in sorted({r["model"] for r in rows}):
        k = fit([r for r in rows if r["model"] != arch], c["FLOOR_MIB"])
        for r in rows:
            if r["model"] == arch:
                r["held_out"] = reservation(k, r["family"], r["gpus"], r["peak"], r["largest"])
                r["held_out_constants"] = k
    for r in rows:
        r["reservation"] = reservation(c, r["family"], r["gpus"], r["peak"], r["largest"])
    print("| model | batch/GPU | GPUs | measured | traced peak | largest tensor | reservation | over "
          "| held out: reservation | over |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        print(f"| {r['model']}{' (CIFAR-100)' if r['cifar'] else ''} | {r['batch']} | {r['gpus']} "
              f"| {r['measured']:,} | {r['peak']:,} | {r['largest']:,} | {r['reservation']:,} "
              f"| {r['reservation'] - r['measured']:+,} | {r['held_out']:,} | {r['held_out'] - r['measured']:+,} |")
    print()
    print(summary("shipped constants", rows, "reservation"))
    print(summary("leave-one-architecture-out", rows, "held_out"))
    print("\nconstants refitted without each architecture (context MiB, CNN factor, multi-GPU MiB):")
    for arch in sorted({r["model"] for r in rows}):
        k = next(r["held_out_constants"] for r in rows if r["model"] == arch)
        print(f"- without {arch}: {k['CONTEXT_MIB']}, {k['CNN_LARGEST_FACTOR_MILLI'] / 1000:.2f}, "
              f"{k['MULTI_GPU_MIB']:,}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
