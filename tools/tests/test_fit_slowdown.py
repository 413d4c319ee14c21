"""tools/fit-slowdown.py: planted parameters are recovered, bad input is refused cleanly."""

from __future__ import annotations

import importlib.util
import itertools
import subprocess
import sys
from pathlib import Path

import pytest

TOOL = Path(__file__).resolve().parent.parent / "fit-slowdown.py"
spec = importlib.util.spec_from_file_location("fit_slowdown", TOOL)
fit = importlib.util.module_from_spec(spec)
spec.loader.exec_module(fit)

HEADER = "scenario,jobs_sharing,job,steps,seconds,steps_per_s,activity,activity_metric\n"
ACTIVITIES = {"a": 0.12, "b": 0.3, "c": 0.45, "d": 0.62, "e": 0.78, "f": 0.9, "g": 0.97}
ALONE_SPS = {"a": 100.0, "b": 40.0, "c": 25.0, "d": 12.5, "e": 30.0, "f": 8.0, "g": 11.0}


def synthetic_csv(path: Path, rates_of, skip_alone: str | None = None) -> Path:
    """Alone rows for every job, then every pair and triple with rates from `rates_of(jobs)`."""
    lines = [HEADER]
    for j, s in ACTIVITIES.items():
        if j != skip_alone:
            lines.append(f"{j},1,{j},0,5.00,{ALONE_SPS[j]:.6f},{s:.4f},gpm.sm_util\n")
    for k in (2, 3):
        for jobs in itertools.combinations(ACTIVITIES, k):
            rates = rates_of(jobs)
            for j in jobs:
                lines.append(f"{'+'.join(jobs)},{k},{j},0,5.00,{ALONE_SPS[j] * rates[j]:.6f},0.5,gpm.sm_util\n")
    path.write_text("".join(lines))
    return path


def run_cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(TOOL), *args], capture_output=True, text=True, timeout=300)


def test_rate_matches_the_simulator():
    # the cases of workload/src/model/slowdown.rs's unit tests
    assert fit.current_rate(0.8, 1.0, 0.2, 0.6) == 1.0
    assert fit.current_rate(0.8, 1.0, 0.95, 0.95) == 1.0
    assert abs(fit.current_rate(0.8, 1.0, 0.8, 1.6) - 0.5) < 1e-12
    assert abs(fit.current_rate(0.8, 2.0, 0.8, 1.6) - 0.25) < 1e-12


@pytest.mark.parametrize("theta,gamma", [(0.6, 1.5), (0.8, 1.0), (0.45, 0.7)])
def test_planted_current_form_is_recovered(tmp_path, theta, gamma):
    def rates(jobs):
        d = sum(ACTIVITIES[j] for j in jobs)
        return {j: fit.current_rate(theta, gamma, ACTIVITIES[j], d) for j in jobs}

    csv = synthetic_csv(tmp_path / "planted.csv", rates)
    scenarios = fit.load(csv, "planted")
    got = fit.fit_current(scenarios, fit.frange(0.3, 1.0, 0.01))
    assert got["theta"] == pytest.approx(theta, abs=0.005)
    assert got["gamma"] == pytest.approx(gamma, abs=1e-3)
    assert got["sse"] < 1e-6


def test_planted_time_slicing_is_recovered(tmp_path):
    theta, beta, eta = 0.7, 0.8, 0.9

    def rates(jobs):
        return dict(zip(jobs, fit.timeslice_rates([ACTIVITIES[j] for j in jobs], theta, beta, eta)))

    csv = synthetic_csv(tmp_path / "planted.csv", rates)
    got = fit.fit_timeslice(fit.load(csv, "planted"), fit.frange(0.3, 1.0, 0.01))
    assert (got["theta"], got["beta"], got["eta"]) == pytest.approx((theta, beta, eta), abs=0.011)
    assert got["sse"] < 1e-4


def test_time_slicing_shares():
    # two jobs that need the GPU all the time split it; a light one is served in full
    assert fit.timeslice_rates([0.9, 0.9], 0.8, 1.0, 1.0) == [0.5, 0.5]
    light, heavy = fit.timeslice_rates([0.2, 0.9], 0.8, 1.0, 1.0)
    assert light == 1.0 and heavy == pytest.approx(0.75)
    assert fit.timeslice_rates([0.2, 0.3], 0.8, 1.0, 0.9) == [1.0, 1.0]


def test_missing_alone_row_is_a_clear_error(tmp_path):
    csv = synthetic_csv(tmp_path / "no-alone.csv", lambda jobs: {j: 0.5 for j in jobs}, skip_alone="d")
    r = run_cli(str(csv))
    assert r.returncode == 2, r.stderr
    assert "no alone row for job d" in r.stderr
    assert "Traceback" not in r.stderr
    assert r.stdout == ""


@pytest.mark.parametrize("content,needle", [
    ("scenario,job\nx,x\n", "missing column(s) jobs_sharing, steps_per_s, activity"),
    (HEADER + "a,1,a,0,5.00,fast,0.1,gpm.sm_util\n", "steps_per_s is 'fast'"),
    (HEADER + "a,1,a,0,5.00,10,0.1,gpm.sm_util\n", "no shared scenarios"),
    (HEADER, "no rows"),
])
def test_bad_files_exit_2_without_traceback(tmp_path, content, needle):
    csv = tmp_path / "bad.csv"
    csv.write_text(content)
    r = run_cli(str(csv))
    assert r.returncode == 2
    assert needle in r.stderr
    assert "Traceback" not in r.stderr


def test_unreadable_file(tmp_path):
    r = run_cli(str(tmp_path / "absent.csv"))
    assert r.returncode == 2 and "cannot read" in r.stderr and "Traceback" not in r.stderr


def test_h100_data_reports_both_forms():
    r = run_cli("--table")
    assert r.returncode == 0, r.stderr
    assert "| model | mean abs. error of rate |" in r.stdout
    assert "time-slicing (max-min), fitted" in r.stdout
    assert "Run-to-run spread (20 shared rows" in r.stdout
    # the committed H100 data: time-slicing fits far better than the simulator's form
    scenarios = [sc for p in fit.DEFAULT_CSVS for sc in fit.load(p, p.stem)]
    thetas = fit.frange(0.3, 1.0, 0.01)
    assert fit.fit_timeslice(scenarios, thetas)["sse"] < fit.fit_current(scenarios, thetas)["sse"] / 5


def test_documented_tables_match_the_script():
    # docs/slowdown-on-h100.md embeds `python3 tools/fit-slowdown.py --table` under "## Results"
    doc = (TOOL.parent.parent / "docs/slowdown-on-h100.md").read_text()
    r = run_cli("--table")
    assert r.returncode == 0, r.stderr
    section = doc.split("## Results\n\n", 1)[1].split("\n## ", 1)[0]
    assert section.strip() == r.stdout.strip(), "rerun: python3 tools/fit-slowdown.py --table"
