"""tools/compare-policies.py: --slowdown-model reaches `carma simulate`, and the grid's rows follow it.

A stand-in for `carma` records its arguments and prints a fixed `--format json` answer, so these
tests need no build.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

TOOL = Path(__file__).resolve().parent.parent / "compare-policies.py"

FAKE = r'''#!/usr/bin/env python3
import json, sys
with open(sys.argv[0] + ".log", "a") as f:
    f.write(json.dumps(sys.argv[1:]) + "\n")
policies = []
for i, p in enumerate(["exclusive", "ff", "bf", "magm", "lug", "rr", "pack"]):
    policies.append({"policy": p, "paper": p != "pack", "makespan_s": 7200.0 + 360 * i,
                     "mean_jct_s": 3600.0 - 60 * i, "ooms": 0, "failed": 0, "worst_wait": []})
print(json.dumps({"makespan_bound_s": 3600.0, "policies": policies}))
'''


def fake_carma(tmp_path: Path, script: str = FAKE) -> Path:
    carma = tmp_path / "carma"
    carma.write_text(script)
    carma.chmod(0o755)
    return carma


def invoke(carma: Path, tmp_path: Path, *args: str) -> subprocess.CompletedProcess:
    """The tool on one workload (philly_trace-t1), one run at a time, with `carma` as its binary."""
    return subprocess.run(
        [sys.executable, str(TOOL), "--carma", str(carma), "--shared", str(tmp_path), "--jobs", "1",
         "--workload", "philly_trace-t1", *args],
        capture_output=True, text=True, timeout=60,
    )


def run(tmp_path: Path, *args: str, fake: str = FAKE) -> tuple[str, list[list[str]]]:
    carma = fake_carma(tmp_path, fake)
    done = invoke(carma, tmp_path, *args)
    done.check_returncode()
    out = done.stdout
    calls = [json.loads(line) for line in Path(str(carma) + ".log").read_text().splitlines()]
    return out, calls


def test_grid_under_time_slicing_runs_one_row_per_queue_without_gamma(tmp_path):
    out, calls = run(tmp_path, "--table", "grid", "--slowdown-model", "time-slicing")
    assert len(calls) == 2  # kube and carma, no γ
    for call in calls:
        assert call[call.index("--slowdown-model") + 1] == "time-slicing"
        assert "--slowdown-exponent" not in call
    assert "| workload | queue | slowdown | makespan bound |" in out
    assert "| philly_trace-t1 (1×4) | kube | time-slicing | 1.00 h |" in out


def test_grid_default_is_the_saturation_form_over_gammas(tmp_path):
    out, calls = run(tmp_path, "--table", "grid")
    assert len(calls) == 4  # two queues × γ = 1, 2
    assert all("--slowdown-model" not in call for call in calls)
    assert sorted(call[call.index("--slowdown-exponent") + 1] for call in calls) == ["1", "1", "2", "2"]
    assert "| workload | queue | γ | makespan bound |" in out


def test_other_tables_pass_the_model_through(tmp_path):
    _, calls = run(tmp_path, "--table", "pack", "--queue", "kube", "--slowdown-model", "time-slicing")
    assert len(calls) == 1
    assert calls[0][calls[0].index("--slowdown-model") + 1] == "time-slicing"


def test_gpu_choice_runs_each_row_in_both_orders_and_reports_the_change(tmp_path):
    # device order: 10 % longer makespan, 5 % shorter mean JCT, one OOM crash more for rr
    fake = FAKE.replace(
        'print(json.dumps(',
        'dra = "device-order" in sys.argv\n'
        'for p in policies:\n'
        '    if dra:\n'
        '        p["makespan_s"] *= 1.10; p["mean_jct_s"] *= 0.95; p["ooms"] += p["policy"] == "rr"\n'
        'print(json.dumps(',
    )
    out, calls = run(tmp_path, "--queue", "kube", "--gammas", "1", "--table", "gpu-choice", fake=fake)
    assert sorted(c[c.index("--gpu-choice") + 1] for c in calls) == ["device-order"] * 3 + ["policy"]
    assert sum("--no-telemetry-memory-test" in c for c in calls) == 1
    assert sum(c[c.index("--warm-up") + 1] == "0" for c in calls if "--warm-up" in c) == 2
    assert "| philly_trace-t1 (1×4) | kube | 1 | +10.0 % / -5.0 % / 0→0 |" in out
    assert "Device order, against the policy as carma places it" in out
    assert ("  rr: makespan +10.0 % (worst +10.0 %), mean JCT -5.0 % (worst -5.0 %), OOM crashes +1 in all"
            " (largest in one row +1)") in out


def test_candidate_args_reach_the_candidate_alone(tmp_path):
    out, calls = run(tmp_path, "--table", "grid", "--queue", "kube", "--gammas", "1",
                     "--candidate-args", "--queue-order shortest-first", "--", "--warm-up", "0")
    assert len(calls) == 2  # CARMA's five, then the candidate on its own
    base, cand = calls
    assert base[base.index("--policy") + 1] == "ff,bf,magm,lug,rr"
    assert "--queue-order" not in base and "--warm-up" in base
    assert cand[cand.index("--policy") + 1] == "pack"
    assert cand[cand.index("--queue-order") + 1] == "shortest-first" and "--warm-up" in cand
    assert "pack (--queue-order shortest-first): goal met on" in out


def test_without_candidate_args_every_policy_shares_one_run(tmp_path):
    out, calls = run(tmp_path, "--table", "grid", "--queue", "kube", "--gammas", "1")
    assert len(calls) == 1
    assert calls[0][calls[0].index("--policy") + 1] == "ff,bf,magm,lug,rr,pack"
    assert "\npack: goal met on" in out


def test_grid_over_lags_runs_each_row_per_lag_and_compares_the_means(tmp_path):
    # pack: 720 s longer and one OOM crash at a telemetry lag of 17 s, as it is at 15 s
    fake = FAKE.replace(
        'print(json.dumps(',
        'lag = int(sys.argv[sys.argv.index("--telemetry-lag") + 1]) if "--telemetry-lag" in sys.argv else 15\n'
        'for p in policies:\n'
        '    if p["policy"] == "pack" and lag == 17:\n'
        '        p["makespan_s"] += 720; p["ooms"] = 1\n'
        'print(json.dumps(',
    )
    out, calls = run(tmp_path, "--queue", "kube", "--gammas", "1", "--table", "grid", "--lags", "15,17",
                     fake=fake)
    assert sorted(c[c.index("--telemetry-lag") + 1] for c in calls) == ["15", "17"]
    assert "mean over 2 runs, one per telemetry lag (15, 17 s)" in out
    # pack's makespan: (9,360 + 10,080) / 2 = 9,720 s; the stand-in's best 7,200 s in both runs.
    row = next(line for line in out.splitlines() if line.startswith("| philly_trace-t1"))
    assert "| 2.00 h (exclusive) | 2.70 h (+35.0 %) |" in row
    assert "| 0 / 1 |" in row  # the OOM crashes summed over the runs
    assert "short: makespan, mean JCT, OOMs" in row
    # pack's makespan moves by 720 s over a mean of 9,720 s; every other policy's not at all.
    assert "median 0.0 %, largest 7.4 % (pack: philly_trace-t1 (1×4), kube, γ = 1)" in out


def test_lags_that_are_not_whole_seconds_are_refused_by_name(tmp_path):
    carma = fake_carma(tmp_path)
    done = invoke(carma, tmp_path, "--table", "grid", "--lags", "13,1.5")
    assert done.returncode == 2
    assert "argument --lags: '13,1.5': expected whole seconds" in done.stderr
    assert "(1.5 is not)" in done.stderr
    # A digit Python knows but `carma simulate --telemetry-lag` does not.
    done = invoke(carma, tmp_path, "--table", "grid", "--lags", "13,²")
    assert done.returncode == 2
    assert "(² is not)" in done.stderr
    assert not Path(str(carma) + ".log").exists()  # nothing was run


def test_a_failing_carma_is_reported_with_its_command_and_message_not_a_traceback(tmp_path):
    # The stand-in refuses a flag as clap does: a message on stderr, exit status 2.
    fake = FAKE.replace(
        "policies = []",
        'if "--reservations" in sys.argv:\n'
        '    sys.stderr.write("error: unexpected argument \'--reservations\' found\\n")\n'
        "    sys.exit(2)\n"
        "policies = []",
    )
    carma = fake_carma(tmp_path, fake)
    done = invoke(carma, tmp_path, "--table", "grid", "--", "--reservations", "oracle")
    assert done.returncode == 2
    assert "Traceback" not in done.stderr
    assert "carma simulate failed (exit status 2)" in done.stderr
    assert "--reservations oracle" in done.stderr  # the command that failed
    assert "error: unexpected argument '--reservations' found" in done.stderr
    assert done.stdout == ""  # no half table


def test_a_missing_carma_binary_is_named_with_how_to_build_it(tmp_path):
    missing = tmp_path / "no-such-carma"
    done = invoke(missing, tmp_path, "--table", "grid")
    assert done.returncode == 2
    assert "Traceback" not in done.stderr
    assert "carma simulate could not start" in done.stderr  # no exit status it never had
    assert f"cannot run {missing}: No such file or directory" in done.stderr
    assert "cargo build -p carma" in done.stderr
