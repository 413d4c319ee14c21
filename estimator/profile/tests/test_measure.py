"""carma_profile.measure: the job sets, and what a run records when a job cannot run (here:
no GPU). The measurement itself needs a CUDA GPU (tools/gpu-measure.sh)."""

import csv
import subprocess
import sys
from pathlib import Path

import pytest

from need import missing, require

from carma_profile import measure

HERE = Path(__file__).resolve().parent
WORKLOADS = HERE.parents[3] / "shared/traces/carma/v2/workloads"


def test_the_held_out_set_names_each_job_once():
    jobs = measure.jobs("heldout")
    labels = [j[0] for j in jobs]
    assert len(labels) == len(set(labels)) == 26
    assert {j[1] for j in jobs} == {"cnn", "transformer"}


def test_the_carma_set_is_each_single_gpu_model_and_batch_once():
    if not WORKLOADS.is_dir():
        missing("CARMA's task files", f"{WORKLOADS} comes with ../shared beside the repository")
    jobs = measure.jobs("carma", WORKLOADS)
    keys = [(j[0], j[5]) for j in jobs]
    assert len(keys) == len(set(keys)) == 30
    # the CIFAR-100 EfficientNet is not the ImageNet one
    assert ("efficientnet_b0 (CIFAR-100)", 32) in keys and ("efficientnet_b0", 32) in keys


def test_a_job_that_cannot_run_is_recorded_and_a_run_with_none_measured_fails(tmp_path):
    torch = require("torch")
    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU: the job would run")
    out = tmp_path / "m.csv"
    r = subprocess.run([sys.executable, "-m", "carma_profile.measure", "--set", "heldout", "--limit", "1",
                        "--out", str(out)], capture_output=True, text=True, timeout=300,
                       cwd=HERE.parent)
    assert r.returncode == 1, r.stderr
    assert "no job was measured" in r.stderr
    rows = list(csv.DictReader(out.open()))
    assert [row["model"] for row in rows] == ["resnet101"]
    assert rows[0]["error"].startswith("worker exited with 1"), rows[0]
    assert not rows[0]["measured_mib"]
