#!/usr/bin/env python3
"""Compare placement policies in simulation: pack against CARMA's best, or exclusive against it.

carma's own policy (`pack`) against the best of CARMA's six (docs/pack-policy.md), or exclusive
GPUs against CARMA's best on CARMA's traces (docs/queues-on-carma-traces.md).

Every figure is SIMULATED (`carma simulate`, default models). For each workload and queue it runs
all seven policies on the same trace and prints one markdown row.

--table pack (default): CARMA's best makespan and best mean JCT (each with the policy that reached
it), pack's, the change, OOM crashes and the worst wait relative to the task's own exclusive run time;
every v2 CARMA trace and generated workloads (1 × 4 and 16 × 8), queues kube then carma.

--table exclusive: makespan / mean JCT of exclusive GPUs and of the CARMA policy with the shortest
makespan, its OOM crashes, and the worst wait ÷ run per task size of each; CARMA's v2 traces only,
queues carma then kube.

--workload TEXT (rows whose workload contains TEXT) and --queue kube|carma select a slice of a table;
CI regenerates one row that way (ci/checks/policies.sh).

    python3 tools/compare-policies.py [--carma target/debug/carma] [--shared ../shared] [--quick]
        [--table pack|exclusive] [--workload TEXT] [--queue kube|carma] [-- more carma simulate flags]
"""

import argparse
import json
import subprocess
import sys
from pathlib import Path


TRACES = ["philly_mix-90-tasks", "philly_heavy-60-tasks", "philly_trace-t1"]


def workloads(shared: Path, quick: bool):
    v2 = shared / "traces" / "carma" / "v2"
    for name in TRACES:
        yield f"{name} (1×4)", ["--trace", str(v2 / f"{name}.sh")]
    seeds = [1] if quick else [1, 2, 3]
    for seed in seeds:
        yield f"generated seed {seed}, 90 tasks (1×4)", ["--seed", str(seed)]
    for seed in seeds:
        yield (
            f"generated seed {seed}, 1,000 tasks (16×8)",
            ["--seed", str(seed), "--tasks", "1000", "--nodes", "16", "--gpus-per-node", "8"],
        )


def run(carma: str, args: list, queue: str, extra: list) -> dict:
    cmd = [carma, "--log", "warn", "simulate", "--format", "json", "--queue", queue, *args, *extra]
    out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
    return json.loads(out)


def hours(s: float) -> str:
    return f"{s / 3600:.2f} h"


def change(new: float, old: float) -> str:
    return f"{(new - old) / old * 100:+.1f} %" if old else "n/a"


def worst(p: dict) -> float:
    return max((w["wait_over_run"] for w in p.get("worst_wait", [])), default=0.0)


def waits(p: dict) -> str:
    return ", ".join(
        f"{w['gpus']} GPU{'s' if w['gpus'] != 1 else ''} {w['wait_over_run']:.1f}"
        for w in p.get("worst_wait", [])
    )


def exclusive_table(a) -> int:
    """CARMA's traces: exclusive GPUs against the CARMA policy with the shortest makespan."""
    v2 = a.shared / "traces" / "carma" / "v2"
    print("| trace | queue | exclusive | best of CARMA's policies | its OOMs "
          "| worst wait, exclusive | worst wait, best policy |")
    print("|---|---|---|---|---|---|---|")
    for name in TRACES:
        if a.workload and a.workload not in name:
            continue
        for queue in ["carma", "kube"]:
            if a.queue and queue != a.queue:
                continue
            policies = run(a.carma, ["--trace", str(v2 / f"{name}.sh")], queue, a.extra)["policies"]
            excl = next(p for p in policies if p["policy"] == "exclusive")
            paper = [p for p in policies if p["paper"] and p["policy"] != "exclusive"]
            best = min(paper, key=lambda p: p["makespan_s"])
            print(
                f"| {name} | {queue} "
                f"| {excl['makespan_s'] / 3600:.2f} h / {excl['mean_jct_s'] / 3600:.2f} h "
                f"| {best['policy']}: {best['makespan_s'] / 3600:.2f} h / {best['mean_jct_s'] / 3600:.2f} h "
                f"| {best['ooms']} | {waits(excl)} | {waits(best)} |",
                flush=True,
            )
    return 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--carma", default="target/debug/carma")
    ap.add_argument("--shared", default="../shared", type=Path)
    ap.add_argument("--quick", action="store_true", help="one seed per generated workload")
    ap.add_argument("--table", choices=["pack", "exclusive"], default="pack",
                    help="pack against CARMA's best (default), or exclusive against CARMA's best on CARMA's traces")
    ap.add_argument("--workload", metavar="TEXT", help="only the workloads whose label contains TEXT")
    ap.add_argument("--queue", choices=["kube", "carma"], help="only this queue")
    ap.add_argument("extra", nargs="*", help="more `carma simulate` flags (after --), e.g. -- --slowdown-exponent 2")
    a = ap.parse_args()
    if a.table == "exclusive":
        return exclusive_table(a)
    print("| workload | queue | work bound | CARMA best makespan | pack makespan | CARMA best mean JCT "
          "| pack mean JCT | OOMs best / pack | worst wait ÷ run, best / pack |")
    print("|---|---|---|---|---|---|---|---|---|")
    met = total = 0
    for label, args in workloads(a.shared, a.quick):
        if a.workload and a.workload not in label:
            continue
        for queue in ["kube", "carma"]:
            if a.queue and queue != a.queue:
                continue
            result = run(a.carma, args, queue, a.extra)
            policies = result["policies"]
            bound = result.get("makespan_bound_s")
            paper = [p for p in policies if p["paper"] and p["policy"] != "exclusive"]
            pack = next(p for p in policies if p["policy"] == "pack")
            by_makespan = min(paper, key=lambda p: p["makespan_s"])
            by_jct = min(paper, key=lambda p: p["mean_jct_s"])
            ok = (
                pack["makespan_s"] <= 0.9 * by_makespan["makespan_s"]
                and pack["mean_jct_s"] <= 0.9 * by_jct["mean_jct_s"]
                and pack["ooms"] <= min(p["ooms"] for p in paper)
            )
            met += ok
            total += 1
            print(
                f"| {label} | {queue} | {hours(bound) if bound else 'none'} "
                f"| {hours(by_makespan['makespan_s'])} ({by_makespan['policy']}"
                f"{', ' + change(by_makespan['makespan_s'], bound) + ' over the bound' if bound else ''}) "
                f"| {hours(pack['makespan_s'])} ({change(pack['makespan_s'], by_makespan['makespan_s'])}) "
                f"| {hours(by_jct['mean_jct_s'])} ({by_jct['policy']}) "
                f"| {hours(pack['mean_jct_s'])} ({change(pack['mean_jct_s'], by_jct['mean_jct_s'])}) "
                f"| {by_makespan['ooms']} / {pack['ooms']} "
                f"| {worst(by_makespan):.1f} / {worst(pack):.1f} |",
                flush=True,
            )
    print(f"\nGoal (≥ 10 % shorter makespan and mean JCT than CARMA's best, no more OOMs) met on "
          f"{met} of {total} workload × queue pairs.")
    return 0


if __name__ == "__main__":
    sys.exit(main())
