"""A sample of the architecture sweep (`python -m carma_profile.sweep`, docs/estimator-sweep.md), a few
seconds: carma's bound for a torchsummary table and for a module printout is at least the traced step's
largest phase peak plus the measured CUDA context (the fixes the sweep led to are held by
estimator/tests/sweep.rs)."""

import csv

import pytest

from need import require

sweep = pytest.importorskip("carma_profile.sweep")


def case(name: str, cases):
    found = [c for c in cases if c.arch == name]
    assert found, f"{name} is not among the sweep's architectures"
    return found[0]


@pytest.fixture(scope="module")
def vision():
    require("torchvision")
    return sweep.vision_cases()


@pytest.fixture(scope="module")
def hf():
    require("transformers")
    return sweep.hf_cases()


def compared(torch, carma_bin, c, tmp_path, batches):
    rows = sweep.run_case(torch, str(carma_bin), c, tmp_path, batches)
    assert [r["status"] for r in rows] == ["ok"] * len(batches), rows
    return rows


def test_the_sweep_lists_every_head_and_torchvision(vision, hf):
    assert len(vision) >= 60, len(vision)
    assert {c.head for c in hf} == {"clm", "mlm", "seqcls"}
    assert len(hf) >= 150, len(hf)


@pytest.mark.parametrize("name", ["resnet18", "mobilenet_v3_small"])
def test_a_table_is_not_under_the_trace_floor(name, vision, carma_bin, tmp_path):
    import torch

    for r in compared(torch, carma_bin, case(name, vision), tmp_path, (2,)):
        assert r["floor_mib"] == r["peak_mib"] + sweep.CONTEXT_MIB
        assert r["margin_mib"] >= 0, r


@pytest.mark.parametrize("name", ["BertForMaskedLM", "GPT2ForSequenceClassification"])
def test_a_printout_is_not_under_the_trace_floor(name, hf, carma_bin, tmp_path):
    import torch

    for r in compared(torch, carma_bin, case(name, hf), tmp_path, (2,)):
        assert r["margin_mib"] >= 0, r


def test_a_row_that_cannot_run_says_why(tmp_path, carma_bin):
    import torch

    def broken():
        raise ValueError("no default config")

    c = sweep.Case("Broken", "transformers", "clm", "transformer", broken, 8)
    rows = sweep.run_case(torch, str(carma_bin), c, tmp_path, (1, 2))
    assert [r["status"] for r in rows] == ["not built: ValueError: no default config"] * 2
    out = tmp_path / "sweep.csv"
    with open(out, "w", newline="") as f:
        w = csv.DictWriter(f, sweep.FIELDS)
        w.writeheader()
        for r in rows:
            w.writerow({k: r.get(k, "") for k in sweep.FIELDS})
    with open(out) as f:
        text = sweep.summarize(list(csv.DictReader(f)))
    assert text.startswith("1 architectures, 2 architecture × batch pairs, 0 compared, 0 under"), text
    assert "not built: 2 pairs" in text


def test_a_hybrid_whose_cut_layers_are_all_linear_attention_is_traced_without_a_cache(hf, carma_bin, tmp_path):
    """Lfm3's two layers left by the cut are both of the linear kind: its cache cannot say its length,
    and its forward asks it; the step is traced with `use_cache=False`."""
    import torch

    for r in compared(torch, carma_bin, case("Lfm3ForCausalLM", hf), tmp_path, (2,)):
        assert r["margin_mib"] >= 0, r
