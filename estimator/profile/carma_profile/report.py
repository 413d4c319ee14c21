"""python -m carma_profile.report: the table of docs/traced-estimate.md.

Reads estimator/tests/data/traced-peaks.csv (python -m carma_profile.calibrate), the
measured peaks (line 8 of shared/traces/carma/v2/workloads/*.rad) and the constants of
estimator/src/traced.rs, and prints one Markdown row per distinct model and batch.
"""

from __future__ import annotations

import csv
import math
import re
import sys
from pathlib import Path

FITTED = {"resnet50", "mobilenet_v2", "efficientnet_b0", "resnet18", "mobilenet_v3_small",
          "bert-base (masked LM)", "xlnet-base (sequence classification)", "gpt2-large (causal LM)"}


def constants(repo: Path) -> dict[str, int]:
    text = (repo / "estimator/src/traced.rs").read_text()
    return {k: int(v.replace("_", "")) for k, v in re.findall(r"pub const (\w+): u64 = ([\d_]+);", text)}


def reservation(c: dict, family: str, gpus: int, peak: int) -> int:
    factor = c["TRANSFORMER_FACTOR_MILLI"] if family == "transformer" else c["CNN_FACTOR_MILLI"]
    multi = c["MULTI_GPU_FACTOR_MILLI"] if gpus > 1 else 1000
    return c["CONTEXT_MIB"] + -(-peak * factor * multi // 1_000_000)


def main() -> int:
    repo = Path(__file__).resolve().parents[3]
    rad_dir = repo.parent / "shared/traces/carma/v2/workloads"
    c = constants(repo)
    seen, rows = set(), []
    for r in csv.DictReader((repo / "estimator/tests/data/traced-peaks.csv").open()):
        key = (r["model"], r["batch_size"], r["gpus"], "cifar" in r["job"])
        if key in seen:
            continue
        seen.add(key)
        measured = int((rad_dir / f"{r['job']}.rad").read_text().splitlines()[8])
        peak = max(int(r["forward_mib"]), int(r["backward_mib"]), int(r["optimizer_step_mib"]))
        res = reservation(c, r["family"], int(r["gpus"]), peak)
        rows.append((r["model"] in FITTED, r, measured, peak, res))
    print("| model | batch/GPU | GPUs | set | measured | traced peak | reservation | over |")
    print("|---|---:|---:|---|---:|---:|---:|---:|")
    for fitted, r, m, p, res in sorted(rows, key=lambda x: (not x[0], x[1]["model"], int(x[1]["batch_size"]))):
        print(f"| {r['model']}{' (CIFAR-100)' if 'cifar' in r['job'] else ''} | {r['batch_size']} | {r['gpus']} | {'fit' if fitted else 'held out'} "
              f"| {m:,} | {p:,} | {res:,} | {res - m:+,} |")
    for name, sel in (("fit", [x for x in rows if x[0]]), ("held out", [x for x in rows if not x[0]])):
        over = [x[4] - x[2] for x in sel]
        under = sum(o < 0 for o in over)
        print(f"\n{name}: {len(sel)} model/batch pairs, mean over {sum(over) / len(over):,.0f} MiB, "
              f"{under} underestimated", end="")
    print()
    return 0


if __name__ == "__main__":
    sys.exit(main())
