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

--table grid: the default-policy grid. Every workload above, both queues and each interference
exponent γ in --gammas (default 1 and 2); per row the makespan bound, CARMA's best makespan, the
candidate's (--candidate, default pack) and the share of the gap between CARMA's best and the bound
that it closes (negative: longer than CARMA's best), CARMA's best mean JCT and the candidate's
change, OOM crashes, the longest wait relative to the task's own run time (starvation; CARMA's
figure is the lowest of its five), and whether the row meets the goal: makespan at most 1 % above
CARMA's best, mean JCT at least 10 % below it, no more OOM crashes than the CARMA policy with the
fewest. Runs in parallel (--jobs, default the number of CPUs).

--table gpu-choice: the grid's rows, every policy as carma places it and under what kube-scheduler's
DRA allocator lacks, one thing more at a time: the policy's GPU order (`--gpu-choice device-order`:
the first passing GPUs of the node the policy ranked first, idle or not), the warm-up lock
(`--warm-up 0`), the telemetry memory test (`--no-telemetry-memory-test`). Per row and policy the
change device order alone makes to makespan and mean JCT and the OOM crashes, then the mean and
worst change of each variant per policy (docs/dra-gpu-choice.md).

--slowdown-model time-slicing runs every table under the time-slicing form measured on an H100
(docs/slowdown-on-h100.md, its parameters at their fitted defaults) instead of the default saturation
form; the grid then has one row per workload and queue (--gammas is the saturation form's exponent
and is not used), its third column naming the model (docs/policies-under-measured-slowdown.md).

--lags S,S,... (grid) runs every row once per telemetry lag (`carma simulate --telemetry-lag`) and
compares the policies by their mean makespan and mean JCT over those runs (OOM crashes and failures
summed, the worst wait the largest; CARMA's best is then the policy with the best mean). On the 1 × 4
rows a second's change of lag can move one policy's makespan by a tenth, so a row's single run says
more about which tasks happen to end last than about the policy (docs/grid-sensitivity.md).

--workload TEXT (rows whose workload contains TEXT) and --queue kube|carma select a slice of a table;
CI regenerates one row that way (ci/checks/policies.sh).

--candidate-args 'FLAGS' gives the grid's candidate, and it alone, more `carma simulate` flags (a run
of its own per row; CARMA's five run as they are), e.g. `--candidate-args '--queue-order
shortest-first'` (docs/queue-order.md); flags after -- go to every policy.

    python3 tools/compare-policies.py [--carma target/debug/carma] [--shared ../shared] [--quick]
        [--table pack|exclusive|grid|gpu-choice] [--workload TEXT] [--queue kube|carma] [--gammas 1,2]
        [--candidate POLICY] [--candidate-args FLAGS] [--jobs N]
        [--slowdown-model saturation|time-slicing] [--lags S,S,...]
        [-- more carma simulate flags]
"""

import argparse
import json
import os
import shlex
import subprocess
from concurrent.futures import ThreadPoolExecutor
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


class CarmaFailed(Exception):
    """A `carma simulate` run that could not start or exited with an error: what happened, the
    command, and why."""

    def __init__(self, what: str, cmd: list, why: str):
        super().__init__(f"carma simulate {what}: {shlex.join(cmd)}\n{why.rstrip()}")


def run(carma: str, args: list, queue: str, extra: list) -> dict:
    cmd = [carma, "--log", "warn", "simulate", "--format", "json", "--queue", queue, *args, *extra]
    try:
        done = subprocess.run(cmd, capture_output=True, text=True)
    except OSError as e:
        raise CarmaFailed("could not start", cmd, f"cannot run {carma}: {e.strerror} (build it: "
                          "cargo build -p carma, or name it with --carma)") from e
    if done.returncode != 0:
        raise CarmaFailed(f"failed (exit status {done.returncode})", cmd, done.stderr)
    return json.loads(done.stdout)


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


def grid_cases(a) -> list:
    """The grid's (label, simulate args, queue, γ) rows, as --workload, --queue and --gammas select;
    one γ of None under the time-slicing form."""
    sliced = a.slowdown_model == "time-slicing"
    gammas = [None] if sliced else [g.strip() for g in a.gammas.split(",") if g.strip()]
    return [
        (label, args, queue, gamma)
        for label, args in workloads(a.shared, a.quick)
        if not a.workload or a.workload in label
        for queue in ["kube", "carma"]
        if not a.queue or queue == a.queue
        for gamma in gammas
    ]


def grid_table(a) -> int:
    """Every workload × queue × γ: the candidate against CARMA's best and the makespan bound."""
    sliced = a.slowdown_model == "time-slicing"
    rows = grid_cases(a)
    policies = f"ff,bf,magm,lug,rr,{a.candidate}"

    cand_args = shlex.split(a.candidate_args)

    def one(row):
        label, args, queue, gamma = row
        model = ["--slowdown-model", a.slowdown_model] if sliced else ["--slowdown-exponent", gamma]
        if not cand_args:
            return run(a.carma, args, queue, ["--policy", policies, *model, *a.extra])
        # The candidate alone gets --candidate-args: a run of its own, CARMA's five as they are.
        base = run(a.carma, args, queue, ["--policy", "ff,bf,magm,lug,rr", *model, *a.extra])
        cand = run(a.carma, args, queue, ["--policy", a.candidate, *model, *a.extra, *cand_args])
        base["policies"] = [p for p in base["policies"] if p["policy"] != a.candidate] + [
            p for p in cand["policies"] if p["policy"] == a.candidate]
        return base

    lags = a.lags or []
    members = [(row, lag) for row in rows for lag in (lags or [None])]

    def member(m):
        row, lag = m
        label, args, queue, gamma = row
        return one((label, [*args, "--telemetry-lag", lag] if lag else args, queue, gamma))

    with ThreadPoolExecutor(max_workers=a.jobs) as pool:
        runs = list(pool.map(member, members))
    per_row = len(lags) or 1
    groups = [runs[i:i + per_row] for i in range(0, len(runs), per_row)]
    results = [ensemble_mean(g) for g in groups]
    if lags:
        print(f"Each figure is the mean over {per_row} runs, one per telemetry lag ({', '.join(lags)} s); "
              "OOM crashes and failures are their sums, the worst wait their largest.\n")
    print(f"| workload | queue | {'slowdown' if sliced else 'γ'} | makespan bound | CARMA best makespan | candidate makespan "
          "| gap closed | CARMA best mean JCT | candidate mean JCT | OOMs fewest / candidate "
          "| worst wait ÷ run, CARMA's best / candidate | goal |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    met, closed, short = 0, [], []
    for (label, _, queue, gamma), result in zip(rows, results):
        ps = result["policies"]
        bound = result["makespan_bound_s"]
        paper = [p for p in ps if p["paper"]]
        cand = next(p for p in ps if p["policy"] == a.candidate)
        by_makespan = min(paper, key=lambda p: p["makespan_s"])
        by_jct = min(paper, key=lambda p: p["mean_jct_s"])
        fewest = min(p["ooms"] for p in paper)
        gap = by_makespan["makespan_s"] - bound
        share = (by_makespan["makespan_s"] - cand["makespan_s"]) / gap if gap > 0 else 0.0
        closed.append(share)
        misses = []
        if cand["failed"]:
            misses.append(f"{cand['failed']} failed")
        if cand["makespan_s"] > 1.01 * by_makespan["makespan_s"]:
            misses.append("makespan")
        if cand["mean_jct_s"] > 0.9 * by_jct["mean_jct_s"]:
            misses.append("mean JCT")
        if cand["ooms"] > fewest:
            misses.append("OOMs")
        met += not misses
        if misses:
            short.append(f"{label}, {queue}{'' if sliced else f', γ = {gamma}'}: {', '.join(misses)}")
        print(
            f"| {label} | {queue} | {a.slowdown_model if sliced else gamma} | {hours(bound)} "
            f"| {hours(by_makespan['makespan_s'])} ({by_makespan['policy']}) "
            f"| {hours(cand['makespan_s'])} ({change(cand['makespan_s'], by_makespan['makespan_s'])}) "
            f"| {share * 100:.0f} % "
            f"| {hours(by_jct['mean_jct_s'])} ({by_jct['policy']}) "
            f"| {hours(cand['mean_jct_s'])} ({change(cand['mean_jct_s'], by_jct['mean_jct_s'])}) "
            f"| {fewest} / {cand['ooms']} "
            f"| {min(worst(p) for p in paper):.1f} / {worst(cand):.1f} "
            f"| {'met' if not misses else 'short: ' + ', '.join(misses)} |",
            flush=True,
        )
    mean = sum(closed) / len(closed) if closed else 0.0
    who = f"{a.candidate} ({a.candidate_args})" if cand_args else a.candidate
    print(f"\n{who}: goal met on {met} of {len(rows)} rows; mean share of the gap between "
          f"CARMA's best makespan and the bound closed: {mean * 100:.0f} % (goal: 50 %).")
    for s in short:
        print(f"  short: {s}")
    if lags:
        print(spread_line(rows, groups, sliced))
    return 0


def spread_line(rows: list, groups: list, sliced: bool) -> str:
    """How far one policy's makespan on one row moves with the lag alone: (largest − smallest) ÷
    mean over the row's runs, the median over every policy and row, and the largest."""
    spreads = []
    for (label, _, queue, gamma), runs in zip(rows, groups):
        for p in runs[0]["policies"]:
            ms = [next(q for q in r["policies"] if q["policy"] == p["policy"])["makespan_s"] for r in runs]
            mean = sum(ms) / len(ms)
            if mean > 0:
                where = f"{label}, {queue}{'' if sliced else f', γ = {gamma}'}"
                spreads.append(((max(ms) - min(ms)) / mean, p["policy"], where))
    if not spreads:
        return "Makespan spread over the lags: no runs."
    spreads.sort()
    median = spreads[len(spreads) // 2][0]
    top, policy, where = spreads[-1]
    return (f"Makespan spread over the lags, (largest − smallest) ÷ mean of one policy on one row: "
            f"median {median * 100:.1f} %, largest {top * 100:.1f} % ({policy}: {where}).")


def lag_list(text: str) -> list:
    """--lags: whole seconds, comma-separated, each 0 to 86400 (what `carma simulate
    --telemetry-lag` takes), at least one."""
    lags = [part.strip() for part in text.split(",") if part.strip()]
    bad = [lag for lag in lags if not (lag.isascii() and lag.isdigit()) or int(lag) > 86400]
    if not lags or bad:
        raise argparse.ArgumentTypeError(
            f"{text!r}: expected whole seconds from 0 to 86400, comma-separated"
            + (f" ({', '.join(bad)} is not)" if bad else ""))
    return lags


def ensemble_mean(results: list) -> dict:
    """One result from runs of the same row that differ in a nuisance setting: per policy the mean
    makespan and mean JCT, the summed OOM crashes and failures, the largest worst wait; the mean
    bound. A single run is returned as it is."""
    if len(results) == 1:
        return results[0]
    n = len(results)
    first = results[0]
    out = dict(first)
    out["makespan_bound_s"] = sum(r["makespan_bound_s"] for r in results) / n
    policies = []
    for p in first["policies"]:
        same = [next(q for q in r["policies"] if q["policy"] == p["policy"]) for r in results]
        merged = dict(p)
        merged["makespan_s"] = sum(q["makespan_s"] for q in same) / n
        merged["mean_jct_s"] = sum(q["mean_jct_s"] for q in same) / n
        merged["ooms"] = sum(q["ooms"] for q in same)
        merged["failed"] = sum(q["failed"] for q in same)
        worst_of = max(same, key=worst)
        merged["worst_wait"] = worst_of.get("worst_wait", [])
        policies.append(merged)
    out["policies"] = policies
    return out


DRA_VARIANTS = [
    ("device order", ["--gpu-choice", "device-order"]),
    ("device order, no warm-up lock", ["--gpu-choice", "device-order", "--warm-up", "0"]),
    ("device order, no warm-up lock, booked capacity only (all three DRA lacks)",
     ["--gpu-choice", "device-order", "--warm-up", "0", "--no-telemetry-memory-test"]),
]


def gpu_choice_table(a) -> int:
    """Every workload × queue × γ, each policy as carma places it and under what DRA's allocator
    lacks, one thing more at a time: the policy's GPU order, the warm-up lock, the telemetry memory
    test. The table shows device order alone; the summary every variant."""
    sliced = a.slowdown_model == "time-slicing"
    names = ["ff", "bf", "magm", "lug", "rr", "pack"]
    variants = [("policy order", ["--gpu-choice", "policy"]), *DRA_VARIANTS]
    cases = grid_cases(a)
    rows = [(case, flags) for case in cases for _, flags in variants]

    def one(row):
        (label, args, queue, gamma), flags = row
        model = ["--slowdown-model", a.slowdown_model] if sliced else ["--slowdown-exponent", gamma]
        extra = ["--policy", ",".join(names), *flags, *model, *a.extra]
        return {p["policy"]: p for p in run(a.carma, args, queue, extra)["policies"]}

    with ThreadPoolExecutor(max_workers=a.jobs) as pool:
        results = list(pool.map(one, rows))
    n = len(variants)
    by_case = [results[i * n:(i + 1) * n] for i in range(len(cases))]
    print(f"| workload | queue | {'slowdown' if sliced else 'γ'} | "
          + " | ".join(f"{p}: makespan / mean JCT / OOMs" for p in names) + " |")
    print("|---|---|---|" + "---|" * len(names))
    for (label, _, queue, gamma), res in zip(cases, by_case):
        own, dra = res[0], res[1]
        cells = [f"{(dra[p]['makespan_s'] / own[p]['makespan_s'] - 1) * 100:+.1f} % / "
                 f"{(dra[p]['mean_jct_s'] / own[p]['mean_jct_s'] - 1) * 100:+.1f} % / "
                 f"{own[p]['ooms']}→{dra[p]['ooms']}" for p in names]
        print(f"| {label} | {queue} | {a.slowdown_model if sliced else gamma} | " + " | ".join(cells) + " |",
              flush=True)
    for v, (title, _) in enumerate(variants[1:], start=1):
        print(f"\n{title[0].upper() + title[1:]}, against the policy as carma places it, over the rows (mean, worst):")
        for p in names:
            d = [(r[v][p]["makespan_s"] / r[0][p]["makespan_s"] - 1, r[v][p]["mean_jct_s"] / r[0][p]["mean_jct_s"] - 1,
                  r[v][p]["ooms"] - r[0][p]["ooms"]) for r in by_case]
            if not d:
                continue
            print(f"  {p}: makespan {sum(x[0] for x in d) / len(d) * 100:+.1f} % (worst {max(x[0] for x in d) * 100:+.1f} %), "
                  f"mean JCT {sum(x[1] for x in d) / len(d) * 100:+.1f} % (worst {max(x[1] for x in d) * 100:+.1f} %), "
                  f"OOM crashes {sum(x[2] for x in d):+d} in all (largest in one row {max(x[2] for x in d):+d})")
    return 0


def main() -> int:
    try:
        return compare()
    except CarmaFailed as e:
        print(f"compare-policies: {e}", file=sys.stderr)
        return 2


def compare() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--carma", default="target/debug/carma")
    ap.add_argument("--shared", default="../shared", type=Path)
    ap.add_argument("--quick", action="store_true", help="one seed per generated workload")
    ap.add_argument("--table", choices=["pack", "exclusive", "grid", "gpu-choice"], default="pack",
                    help="pack against CARMA's best (default), exclusive against CARMA's best on CARMA's "
                         "traces, the default-policy grid over queues and γ, or every policy with GPUs in "
                         "its own order against device order (DRA)")
    ap.add_argument("--gammas", default="1,2", help="grid: interference exponents, comma-separated")
    ap.add_argument("--candidate", default="pack", help="grid: the policy compared with CARMA's")
    ap.add_argument("--candidate-args", default="", metavar="FLAGS",
                    help="grid: `carma simulate` flags for the candidate alone, run on its own "
                         "(e.g. '--queue-order shortest-first'); flags after -- go to every policy")
    ap.add_argument("--jobs", type=int, default=os.cpu_count() or 1, help="grid: runs at once")
    ap.add_argument("--workload", metavar="TEXT", help="only the workloads whose label contains TEXT")
    ap.add_argument("--queue", choices=["kube", "carma"], help="only this queue")
    ap.add_argument("--lags", metavar="S,S,...", type=lag_list,
                    help="grid: run every row once per telemetry lag (seconds) and compare the "
                         "means, e.g. 13,14,15,16,17")
    ap.add_argument("--slowdown-model", choices=["saturation", "time-slicing"], default="saturation",
                    help="carma simulate's slowdown model (time-slicing: the H100 fit; the grid then ignores --gammas)")
    ap.add_argument("extra", nargs="*", help="more `carma simulate` flags (after --), e.g. -- --slowdown-exponent 2")
    a = ap.parse_args()
    if a.slowdown_model != "saturation" and a.table != "grid":
        a.extra = ["--slowdown-model", a.slowdown_model, *a.extra]
    if a.table == "exclusive":
        return exclusive_table(a)
    if a.table == "grid":
        return grid_table(a)
    if a.table == "gpu-choice":
        return gpu_choice_table(a)
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
