#!/usr/bin/env python3
"""Fits the simulator's slowdown model to measured GPU-sharing throughput.

    python3 tools/fit-slowdown.py [CSV ...] [--table]

Reads one or more `interference.csv` files written by `tools/measure-interference.py`
(default: the two H100 runs under workload/tests/data/). For every job in every shared
scenario it computes the measured rate, the job's steps per second while sharing divided
by its steps per second alone (the alone row of the same file), and its alone SM activity
`s`; `D` is the sum of the alone activities of the jobs in the scenario.

Three forms are fitted to all shared rows of all files together, by least squares on log rate:

* `current`, the simulator's form (workload/src/model/slowdown.rs):
  rate = (max(θ, s) / max(θ, D))^γ. Grid over θ, γ in closed form for each θ.
* `timeslice`, round-robin time-slicing: a job needs a fraction
  b = min(1, (s/θ)^β) of the GPU's time alone; the GPU hands out η of its time
  (η < 1: what context switching costs), and each job gets
  min(b, L) with L the level at which the shares sum to η (jobs that need less than
  an equal share get all they need, the rest split what is left equally);
  rate = min(b, L) / b, and 1 while the demands sum to at most η. Grid over θ, β, η.
* `proportional`: the same demands, but every job of a crowded GPU runs at η / Σb.

Each form is also fitted once per job without that job's scenarios and scored on them
("each job left out of the fit").

Prints the fits, each row's measured and predicted rates (fitted forms, the defaults
θ = 0.8 γ = 1, and θ = 0.8 γ = 2), the summed rate of each scenario (more than 1: sharing
gained throughput), the errors, and the run-to-run spread of rows present in more than one
file. `--table` prints the same as markdown. Exit status 2 on unusable input.
"""

from __future__ import annotations

import argparse
import csv
import math
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_CSVS = [
    ROOT / "workload/tests/data/h100-interference.csv",
    ROOT / "workload/tests/data/h100-interference-repeat.csv",
]
COLUMNS = ("scenario", "jobs_sharing", "job", "steps_per_s", "activity")
DEFAULT_THETA, DEFAULT_GAMMA = 0.8, 1.0
MAX_GAMMA = 10.0  # the simulator's largest --slowdown-exponent


class InputError(Exception):
    """Input that cannot be fitted; the message says which file and row."""


def frange(lo: float, hi: float, step: float) -> list[float]:
    n = int(round((hi - lo) / step))
    return [round(lo + i * step, 10) for i in range(n + 1)]


def load(path: Path, label: str) -> list[dict]:
    """The shared scenarios of one CSV: [{run, scenario, jobs: [{job, s, rate}], D}]."""
    try:
        with path.open(newline="") as f:
            rows = list(csv.DictReader(f))
            fields = set(rows[0].keys()) if rows else set()
    except OSError as e:
        raise InputError(f"{path}: cannot read: {e.strerror or e}") from None
    if not rows:
        raise InputError(f"{path}: no rows")
    missing = [c for c in COLUMNS if c not in fields]
    if missing:
        raise InputError(f"{path}: missing column(s) {', '.join(missing)}")

    def num(r: dict, col: str, line: int) -> float:
        try:
            v = float(r[col])
        except (TypeError, ValueError):
            raise InputError(f"{path}:{line}: {col} is {r[col]!r}, not a number") from None
        if not math.isfinite(v) or v < 0:
            raise InputError(f"{path}:{line}: {col} is {r[col]!r}; it must be finite and not negative")
        return v

    alone: dict[str, tuple[float, float]] = {}
    shared: dict[str, list[tuple[str, float, int]]] = {}
    for line, r in enumerate(rows, start=2):
        jobs = (r["scenario"] or "").split("+")
        if r["job"] not in jobs:
            raise InputError(f"{path}:{line}: job {r['job']!r} is not in scenario {r['scenario']!r}")
        sps = num(r, "steps_per_s", line)
        if len(jobs) == 1:
            act = num(r, "activity", line)
            if sps <= 0:
                raise InputError(f"{path}:{line}: job {r['job']} made no steps alone")
            alone[r["job"]] = (sps, act)
        else:
            shared.setdefault(r["scenario"], []).append((r["job"], sps, line))
    out = []
    for scenario, members in shared.items():
        jobs = scenario.split("+")
        lacking = [j for j in jobs if j not in alone]
        if lacking:
            raise InputError(
                f"{path}: no alone row for job {', '.join(lacking)} (needed by scenario {scenario}); "
                "its rate while sharing cannot be computed")
        present = {m[0] for m in members}
        if present != set(jobs):
            raise InputError(f"{path}: scenario {scenario} has no row for job "
                             f"{', '.join(j for j in jobs if j not in present)}")
        stalled = [j for j, sps, _ in members if sps <= 0]
        if stalled:
            raise InputError(f"{path}: job {', '.join(stalled)} made no steps in scenario {scenario}; "
                             "a rate of 0 cannot be fitted on a log scale")
        d = sum(alone[j][1] for j in jobs)
        out.append({
            "acts": [alone[j][1] for j in jobs],
            "run": label,
            "scenario": scenario,
            "D": d,
            "jobs": [{"job": j, "s": alone[j][1], "rate": sps / alone[j][0]} for j, sps, _ in members],
        })
    if not out:
        raise InputError(f"{path}: no shared scenarios (only jobs alone)")
    return out


def alone_rows(path: Path) -> dict[str, tuple[float, float]]:
    with path.open(newline="") as f:
        return {r["job"]: (float(r["steps_per_s"]), float(r["activity"]))
                for r in csv.DictReader(f) if "+" not in r["scenario"]}


# ---- the simulator's form ----------------------------------------------------------------

def current_rate(theta: float, gamma: float, s: float, d: float) -> float:
    """core/src/slowdown.rs: saturation_rate (the simulator's SlowdownModel::rate)."""
    theta = max(theta, 1e-6)
    num = max(theta, s)
    den = max(theta, d, num)
    return min(1.0, max(1e-6, (num / den) ** gamma))


def fit_current(scenarios: list[dict], thetas: list[float]) -> dict:
    """θ on the grid, γ in closed form (log rate = γ · log ratio), least squares on log rate."""
    best = None
    for theta in thetas:
        xs, ys = [], []
        for sc in scenarios:
            for j in sc["jobs"]:
                num = max(theta, j["s"])
                xs.append(math.log(num / max(theta, sc["D"], num)))
                ys.append(math.log(j["rate"]))
        sxx = sum(x * x for x in xs)
        gamma = sum(x * y for x, y in zip(xs, ys)) / sxx if sxx > 0 else DEFAULT_GAMMA
        gamma = min(MAX_GAMMA, max(0.0, gamma))
        sse = sum((gamma * x - y) ** 2 for x, y in zip(xs, ys))
        if best is None or sse < best["sse"] - 1e-12:
            best = {"theta": theta, "gamma": gamma, "sse": sse}
    return best


# ---- time-slicing ------------------------------------------------------------------------

def timeslice_rates(activities: list[float], theta: float, beta: float, eta: float) -> list[float]:
    """Rates of jobs with these alone activities under max-min (round-robin) time-slicing."""
    demand = [min(1.0, (max(s, 1e-9) / theta) ** beta) for s in activities]
    if sum(demand) <= eta:
        return [1.0] * len(demand)
    # water level: the smallest demands are met in full, the rest share what is left equally
    left, n, level = eta, len(demand), 0.0
    for i, b in enumerate(sorted(demand)):
        share = left / (n - i)
        if b <= share:
            left -= b
        else:
            level = share
            break
    return [min(b, level) / b if b > level else 1.0 for b in demand]


def proportional_rates(activities: list[float], theta: float, beta: float, eta: float) -> list[float]:
    """Rates when each job's share of the GPU's time is proportional to its demand: all equal."""
    demand = [min(1.0, (max(s, 1e-9) / theta) ** beta) for s in activities]
    total = sum(demand)
    return [1.0 if total <= eta else eta / total] * len(demand)


def demand_sse(scenarios: list[dict], form, theta: float, beta: float, eta: float) -> float:
    sse = 0.0
    for sc in scenarios:
        rates = dict(zip(sc["scenario"].split("+"), form(sc["acts"], theta, beta, eta)))
        for j in sc["jobs"]:
            sse += (math.log(rates[j["job"]]) - math.log(j["rate"])) ** 2
    return sse


def fit_demand(scenarios: list[dict], thetas: list[float], form=None) -> dict:
    """(θ, β, η) of a demand-based form: a coarse grid, then a fine grid around its best point."""
    form = form or timeslice_rates

    def search(ths, bes, ets):
        best = None
        for th in ths:
            for be in bes:
                for et in ets:
                    sse = demand_sse(scenarios, form, th, be, et)
                    if best is None or sse < best["sse"] - 1e-12:
                        best = {"theta": th, "beta": be, "eta": et, "sse": sse}
        return best

    coarse = search(sorted(set(thetas[::5] + [thetas[-1]])), frange(0.1, 2.0, 0.1), frange(0.5, 1.0, 0.05))

    def near(v, lo, hi, width):
        return [x for x in frange(max(lo, v - width), min(hi, v + width), 0.01) if lo <= x <= hi]

    th = [t for t in thetas if abs(t - coarse["theta"]) <= 0.05 + 1e-9]
    return search(th, near(coarse["beta"], 0.05, 2.0, 0.1), near(coarse["eta"], 0.5, 1.0, 0.05))


def fit_timeslice(scenarios: list[dict], thetas: list[float]) -> dict:
    return fit_demand(scenarios, thetas, timeslice_rates)


def fit_proportional(scenarios: list[dict], thetas: list[float]) -> dict:
    return fit_demand(scenarios, thetas, proportional_rates)


def rates_of(model: str, params: dict, sc: dict) -> dict[str, float]:
    """Predicted rate of each job of a scenario under one of the fitted forms."""
    names = sc["scenario"].split("+")
    if model == "current":
        return {j["job"]: current_rate(params["theta"], params["gamma"], j["s"], sc["D"]) for j in sc["jobs"]}
    form = timeslice_rates if model == "timeslice" else proportional_rates
    return dict(zip(names, form(sc["acts"], params["theta"], params["beta"], params["eta"])))


FITTERS = {"current": fit_current, "timeslice": fit_timeslice, "proportional": fit_proportional}


def leave_one_job_out(scenarios: list[dict], thetas: list[float], model: str) -> float | None:
    """Mean absolute error of rate on the scenarios of each job, fitted without them."""
    jobs = sorted({n for sc in scenarios for n in sc["scenario"].split("+")})
    errs = []
    for job in jobs:
        train = [sc for sc in scenarios if job not in sc["scenario"].split("+")]
        test = [sc for sc in scenarios if job in sc["scenario"].split("+")]
        if not train:
            return None
        params = FITTERS[model](train, thetas)
        for sc in test:
            pred = rates_of(model, params, sc)
            errs += [abs(pred[j["job"]] - j["rate"]) for j in sc["jobs"]]
    return sum(errs) / len(errs) if errs else None


# ---- report ------------------------------------------------------------------------------

def predict(scenarios: list[dict], fits: dict[str, dict]) -> list[dict]:
    rows = []
    for sc in scenarios:
        pred = {m: rates_of(m, fits[m], sc) for m in ("timeslice", "proportional")}
        for j in sc["jobs"]:
            c = fits["current"]
            rows.append({
                "run": sc["run"], "scenario": sc["scenario"], "job": j["job"], "s": j["s"], "D": sc["D"],
                "measured": j["rate"],
                "current": current_rate(c["theta"], c["gamma"], j["s"], sc["D"]),
                "default": current_rate(DEFAULT_THETA, DEFAULT_GAMMA, j["s"], sc["D"]),
                "gamma2": current_rate(DEFAULT_THETA, 2.0, j["s"], sc["D"]),
                "timeslice": pred["timeslice"][j["job"]],
                "proportional": pred["proportional"][j["job"]],
            })
    return rows


# (key, long label, column heading)
MODELS = [
    ("current", "current form, fitted", "current fit"),
    ("default", "current form, defaults θ=0.8 γ=1", "θ=0.8 γ=1"),
    ("gamma2", "current form, θ=0.8 γ=2", "θ=0.8 γ=2"),
    ("timeslice", "time-slicing (max-min), fitted", "time-slicing fit"),
    ("proportional", "proportional share, fitted", "proportional fit"),
]


def errors(rows: list[dict], key: str) -> dict:
    diffs = [abs(r[key] - r["measured"]) for r in rows]
    logs = [(math.log(r[key]) - math.log(r["measured"])) ** 2 for r in rows]
    worst = max(rows, key=lambda r: abs(r[key] - r["measured"]))
    return {"mae": sum(diffs) / len(diffs), "rmse_log": math.sqrt(sum(logs) / len(logs)), "worst": worst,
            "worst_err": worst[key] - worst["measured"]}


def spread(paths: list[Path], scenarios: list[dict]) -> dict | None:
    """Run-to-run differences of rows present in more than one file."""
    if len(paths) < 2:
        return None
    rates: dict[tuple[str, str], list[float]] = {}
    for sc in scenarios:
        for j in sc["jobs"]:
            rates.setdefault((sc["scenario"], j["job"]), []).append(j["rate"])
    rate_spreads = {k: max(v) - min(v) for k, v in rates.items() if len(v) > 1}
    if not rate_spreads:
        return None
    alone = [alone_rows(p) for p in paths]
    sps, act = {}, {}
    for job in set().union(*alone):
        vals = [a[job] for a in alone if job in a]
        if len(vals) > 1:
            s = [v[0] for v in vals]
            sps[job] = (max(s) - min(s)) / (sum(s) / len(s))
            a = [v[1] for v in vals]
            act[job] = max(a) - min(a)
    worst = max(rate_spreads, key=rate_spreads.get)
    return {"n": len(rate_spreads), "mean": sum(rate_spreads.values()) / len(rate_spreads),
            "max": rate_spreads[worst], "worst": worst, "alone_sps": sps, "alone_act": act}


def describe(model: str, f: dict) -> str:
    if model == "current":
        return f"θ = {f['theta']:.2f}, γ = {f['gamma']:.3f}"
    return f"θ = {f['theta']:.2f}, β = {f['beta']:.2f}, η = {f['eta']:.2f}"


def report(paths: list[Path], scenarios: list[dict], fits: dict[str, dict], extra: dict, table: bool) -> str:
    rows = predict(scenarios, fits)
    multi = len({sc["run"] for sc in scenarios}) > 1
    out = []
    p = out.append
    def shown(path: Path) -> str:
        try:
            return str(path.resolve().relative_to(ROOT))
        except ValueError:
            return str(path)

    p(f"Files: {', '.join(shown(x) for x in paths)}")
    p(f"Shared rows: {len(rows)} (jobs in {len(scenarios)} shared scenarios)")
    p("")
    bullet = "* " if table else ""
    p(f"{bullet}current form (max(θ,s)/max(θ,D))^γ, fitted: {describe('current', fits['current'])}, "
      f"SSE(log rate) = {fits['current']['sse']:.4f}")
    p(f"{bullet}current form with θ held at {DEFAULT_THETA}: γ = {extra['gamma_at_default']['gamma']:.3f}, "
      f"SSE(log rate) = {extra['gamma_at_default']['sse']:.4f}")
    p(f"{bullet}time-slicing (max-min), demand b = min(1,(s/θ)^β), shares sum to η, fitted: "
      f"{describe('timeslice', fits['timeslice'])}, SSE(log rate) = {fits['timeslice']['sse']:.4f}")
    ts = fits["timeslice"]
    demands = {}
    for sc in scenarios:
        for j in sc["jobs"]:
            demands.setdefault(j["job"], []).append(min(1.0, (max(j["s"], 1e-9) / ts["theta"]) ** ts["beta"]))
    p(f"{bullet}time-slicing demand b of each job (fraction of the GPU's time it needs, from its s): "
      + ", ".join(f"{j} {min(v):.3f}" + (f"-{max(v):.3f}" if max(v) - min(v) >= 0.0005 else "")
                  for j, v in sorted(demands.items())))
    p(f"{bullet}proportional share (every job at η/Σb), fitted: {describe('proportional', fits['proportional'])}, "
      f"SSE(log rate) = {fits['proportional']['sse']:.4f}")
    for run, f in extra["per_file"].items():
        p(f"{bullet}fitted to {run} only: current form {describe('current', f['current'])}; "
          f"time-slicing {describe('timeslice', f['timeslice'])}")
    p("")
    errs = {k: errors(rows, k) for k, _, _ in MODELS}
    lojo = extra["lojo"]

    def name(r):
        return (f"{r['run']}: " if multi else "") + f"{r['scenario']} / {r['job']}"

    def held_out(k):
        return f"{lojo[k]:.3f}" if lojo.get(k) is not None else "-"

    if table:
        p("| model | mean abs. error of rate | RMS error of log rate | worst row | its error "
          "| mean abs. error, each job left out of the fit |")
        p("|---|---:|---:|---|---:|---:|")
        for k, label, _ in MODELS:
            e = errs[k]
            p(f"| {label} | {e['mae']:.3f} | {e['rmse_log']:.3f} | {name(e['worst'])} | {e['worst_err']:+.3f} "
              f"| {held_out(k)} |")
        p("")
        lead_h, lead_r = ("| run ", "|---") if multi else ("", "")
        cols = " | ".join(c for _, _, c in MODELS)
        p(f"{lead_h}| scenario | job | s | D | measured | {cols} |")
        p(lead_r + "|---|---|---:|---:|---:|" + "---:|" * len(MODELS))
        for r in rows:
            lead = f"| {r['run']} " if multi else ""
            vals = " | ".join(f"{r[k]:.3f}" for k, _, _ in MODELS)
            p(f"{lead}| {r['scenario']} | {r['job']} | {r['s']:.3f} | {r['D']:.3f} | {r['measured']:.3f} | {vals} |")
        p("")
        p(f"{lead_h}| scenario | D | summed rate, measured | {cols} |")
        p(lead_r + "|---|---:|---:|" + "---:|" * len(MODELS))
    else:
        p(f"{'model':36s} {'MAE rate':>9s} {'RMSE log':>9s} {'held out':>9s}  worst row (error)")
        for k, label, _ in MODELS:
            e = errs[k]
            p(f"{label:36s} {e['mae']:9.3f} {e['rmse_log']:9.3f} {held_out(k):>9s}  "
              f"{name(e['worst'])} ({e['worst_err']:+.3f})")
        p("(held out: mean absolute error of rate on each job's scenarios, fitted without them)")
        p("")
        heads = " ".join(f"{h:>6s}" for h in ("cur.", "dflt", "γ=2", "t.s.", "prop."))
        p(f"{'row':68s} {'s':>6s} {'D':>6s} {'meas.':>6s} {heads}")
        for r in rows:
            vals = " ".join(f"{r[k]:6.3f}" for k, _, _ in MODELS)
            p(f"{name(r):68s} {r['s']:6.3f} {r['D']:6.3f} {r['measured']:6.3f} {vals}")
        p("")
        p(f"{'summed rate per scenario':68s} {'':6s} {'D':>6s} {'meas.':>6s} {heads}")
    groups: dict[tuple[str, str], list[dict]] = {}
    for r in rows:
        groups.setdefault((r["run"], r["scenario"]), []).append(r)
    for (run, scenario), rs in groups.items():
        sums = {k: sum(r[k] for r in rs) for k in ["measured"] + [m for m, _, _ in MODELS]}
        if table:
            lead = f"| {run} " if multi else ""
            vals = " | ".join(f"{sums[k]:.3f}" for k, _, _ in MODELS)
            p(f"{lead}| {scenario} | {rs[0]['D']:.3f} | {sums['measured']:.3f} | {vals} |")
        else:
            label = (f"{run}: " if multi else "") + scenario
            vals = " ".join(f"{sums[k]:6.3f}" for k, _, _ in MODELS)
            p(f"{label:68s} {'':6s} {rs[0]['D']:6.3f} {sums['measured']:6.3f} {vals}")
    sp = spread(paths, scenarios)
    if sp:
        p("")
        p(f"Run-to-run spread ({sp['n']} shared rows in more than one file): rate differs by {sp['mean']:.3f} "
          f"on average, at most {sp['max']:.3f} ({sp['worst'][0]} / {sp['worst'][1]})")
        p("")
        p("Alone, between files: steps/s differ by "
          + ", ".join(f"{j} {v * 100:.1f} %" for j, v in sorted(sp["alone_sps"].items()))
          + "; SM activity by "
          + ", ".join(f"{j} {v:.4f}" for j, v in sorted(sp["alone_act"].items())))
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("csv", nargs="*", type=Path, help="interference.csv files (default: the H100 runs)")
    ap.add_argument("--table", action="store_true", help="print markdown tables")
    ap.add_argument("--theta-min", type=float, default=0.3)
    ap.add_argument("--theta-max", type=float, default=1.0)
    ap.add_argument("--theta-step", type=float, default=0.01)
    args = ap.parse_args(argv)
    paths = args.csv or DEFAULT_CSVS
    if not (0 < args.theta_min <= args.theta_max) or args.theta_step <= 0:
        print("fit-slowdown: error: need 0 < --theta-min <= --theta-max and --theta-step > 0", file=sys.stderr)
        return 2
    labels = [p.stem for p in paths]
    if len(set(labels)) < len(labels):
        labels = [str(p) for p in paths]
    per_file = {}
    try:
        for p, label in zip(paths, labels):
            per_file[label] = load(p, label)
    except InputError as e:
        print(f"fit-slowdown: error: {e}", file=sys.stderr)
        return 2
    scenarios = [sc for scs in per_file.values() for sc in scs]
    thetas = frange(args.theta_min, args.theta_max, args.theta_step)
    fits = {m: fit(scenarios, thetas) for m, fit in FITTERS.items()}
    extra = {
        "gamma_at_default": fit_current(scenarios, [DEFAULT_THETA]),
        "per_file": ({label: {"current": fit_current(scs, thetas), "timeslice": fit_timeslice(scs, thetas)}
                      for label, scs in per_file.items()} if len(per_file) > 1 else {}),
        "lojo": {m: leave_one_job_out(scenarios, thetas, m) for m in FITTERS},
    }
    print(report(paths, scenarios, fits, extra, args.table))
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except BrokenPipeError:  # output piped into `head` and the like
        sys.stderr.close()
        sys.exit(0)
