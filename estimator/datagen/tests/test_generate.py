"""The generation loop with a fake measurement (no GPU, no torch, no NVML)."""

import csv

import configs
import csvio
import generate


def fake_measure(calls):
    def measure(cfg):
        calls.append(cfg)
        if cfg["family"] == "mlp":
            layers = configs.mlp_layers(cfg)
            n = len(calls)
            if n == 2:
                return {"status": "oom", "steps": 0, "layers": layers, "total_params": 5}
            if n == 3:
                return {"status": "error", "error": "boom"}
            return {"status": "ok", "steps": 50, "layers": layers,
                    "total_params": sum(p for _, _, p in layers), "max_gpu_mib": 1500 + n}
        raise AssertionError
    return measure


def test_generate_writes_ok_and_oom_rows_and_resumes(tmp_path):
    path = tmp_path / "mlp.csv"
    calls = []
    stats = generate.generate("mlp", 5, 42, csvio.CsvSink(path, "mlp"), fake_measure(calls),
                              gpu_total_mib=81559, log=lambda *_: None)
    assert stats == {"written": 4, "skipped": 0, "oom": 1, "failed": 1}
    with path.open(newline="") as f:
        rows = list(csv.DictReader(f))
    assert len(rows) == 4
    oom = [r for r in rows if r["Status"] == "oom"]
    assert len(oom) == 1 and oom[0]["Max GPU Memory (MiB)"] == "81559"
    # same seed again: finished configurations are skipped, the failed one retried
    calls2 = []
    stats = generate.generate("mlp", 5, 42, csvio.CsvSink(path, "mlp"),
                              lambda cfg: (calls2.append(cfg), {"status": "ok", "layers": configs.mlp_layers(cfg),
                                                               "total_params": 1, "max_gpu_mib": 1})[1],
                              log=lambda *_: None)
    assert stats["skipped"] == 4 and stats["written"] == 1 and len(calls2) == 1


def test_no_torch_or_nvml_needed_to_import():
    import sys
    assert "torch" not in sys.modules
    assert "pynvml" not in sys.modules
