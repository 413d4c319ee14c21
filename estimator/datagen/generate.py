#!/usr/bin/env python3
"""Generate a GPUMemNet-style dataset on the GPU this runs on.

    python estimator/datagen/generate.py --family cnn --count 300 \
        --out estimator/datasets/cnn_data.csv [--seed 1] [--steps 50] [--max-seconds 30]

For each random configuration (`configs.py`) a fresh worker process
(`worker.py`, PyTorch) trains the model for a few steps with Adam on synthetic
data while this process samples NVML every 20 ms: the device-level peak of
`memory.used` is GPUMemNet's label (`Max GPU Memory (MiB)`); the worker adds
torch's allocator peaks. Out-of-memory runs are kept with `Status = oom` and the
GPU's total memory as their peak (GPUMemNet labels them as the top class).
Rows are appended as they finish, so an interrupted run resumes with the same
seed. `<out>.provenance.json` records the GPU, driver, CUDA, PyTorch and the
command line.

This process imports neither torch nor NVML until it runs: the sampling, file
names and CSV rows are tested on CPU (`pytest estimator/datagen/tests`).
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import random
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any, Callable

sys.path.insert(0, str(Path(__file__).resolve().parent))

import configs  # noqa: E402
import csvio  # noqa: E402

HERE = Path(__file__).resolve().parent
MiB = 1 << 20


class NvmlSampler:
    """Samples one GPU's memory.used (device and per-process) and utilisation."""

    def __init__(self, index: int, interval: float = 0.02):
        import pynvml  # nvidia-ml-py
        self.nvml = pynvml
        pynvml.nvmlInit()
        self.handle = pynvml.nvmlDeviceGetHandleByIndex(index)
        self.interval = interval

    def info(self) -> dict[str, Any]:
        n = self.nvml

        def s(v):
            return v.decode() if isinstance(v, bytes) else v
        mem = n.nvmlDeviceGetMemoryInfo(self.handle)
        return {
            "gpu": s(n.nvmlDeviceGetName(self.handle)),
            "gpu_total_mib": mem.total / MiB,
            "driver": s(n.nvmlSystemGetDriverVersion()),
            "cuda_driver": n.nvmlSystemGetCudaDriverVersion_v2(),
            "nvml": s(n.nvmlSystemGetNVMLVersion()),
        }

    def used_mib(self) -> float:
        return self.nvml.nvmlDeviceGetMemoryInfo(self.handle).used / MiB

    def watch(self, pid: int, stop: threading.Event, result: dict[str, Any]) -> None:
        n = self.nvml
        peak = proc_peak = 0.0
        util: list[int] = []
        while not stop.is_set():
            try:
                peak = max(peak, self.used_mib())
                for p in n.nvmlDeviceGetComputeRunningProcesses(self.handle):
                    if p.pid == pid and p.usedGpuMemory:
                        proc_peak = max(proc_peak, p.usedGpuMemory / MiB)
                u = n.nvmlDeviceGetUtilizationRates(self.handle).gpu
                if u > 0:
                    util.append(u)
            except n.NVMLError:
                pass
            time.sleep(self.interval)
        result.update(max_gpu_mib=peak, max_process_mib=proc_peak or None,
                      avg_gputl=(sum(util) / len(util)) if util else None)


def run_worker(cfg: dict[str, Any], sampler: NvmlSampler, steps: int, max_seconds: float,
               timeout: float) -> dict[str, Any]:
    """Runs worker.py for one configuration and returns the measurements."""
    idle = sampler.used_mib()
    proc = subprocess.Popen([sys.executable, str(HERE / "worker.py"), "--steps", str(steps),
                             "--max-seconds", str(max_seconds)],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    stop = threading.Event()
    sampled: dict[str, Any] = {}
    t = threading.Thread(target=sampler.watch, args=(proc.pid, stop, sampled), daemon=True)
    t.start()
    try:
        stdout, _ = proc.communicate(json.dumps(cfg), timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        stdout, _ = proc.communicate()
        stdout = json.dumps({"status": "error", "error": f"timed out after {timeout} s"})
    finally:
        stop.set()
        t.join()
    try:
        res = json.loads(stdout.strip().splitlines()[-1])
    except (IndexError, json.JSONDecodeError):
        res = {"status": "error", "error": f"worker exited {proc.returncode} without a result"}
    res.update(sampled)
    res["idle_gpu_mib"] = idle
    return res


def generate(family: str, count: int, seed: int, sink: csvio.CsvSink,
             measure: Callable[[dict[str, Any]], dict[str, Any]],
             gpu_total_mib: float | None = None, log=print) -> dict[str, int]:
    """Samples `count` configurations with `seed` and writes one row per run that
    `measure` completes. Configurations already in the sink are skipped; runs
    that fail for reasons other than OOM are logged and not written."""
    rng = random.Random(seed)
    stats = {"written": 0, "skipped": 0, "oom": 0, "failed": 0}
    for i in range(count):
        cfg = configs.sample(family, rng)
        name = configs.filename(cfg)
        if name in sink.done:
            stats["skipped"] += 1
            continue
        res = measure(cfg)
        status = res.get("status")
        if status == "oom":
            stats["oom"] += 1
            # GPUMemNet labels OOM runs with the top class: record the GPU's size.
            res["max_gpu_mib"] = gpu_total_mib if gpu_total_mib else res.get("max_gpu_mib")
        elif status != "ok" or not res.get("layers"):
            stats["failed"] += 1
            log(f"[{i + 1}/{count}] {name}: {status}: {res.get('error', '')}")
            continue
        layers = [tuple(x) for x in res["layers"]]
        row = csvio.make_row(cfg, layers, res["total_params"], res)
        sink.write(row)
        stats["written"] += 1
        log(f"[{i + 1}/{count}] {name}: {status}, {row[csvio.MEMORY]} MiB")
    return stats


def provenance(path: Path, info: dict[str, Any], args: argparse.Namespace, stats: dict[str, int],
               worker_versions: dict[str, Any]) -> None:
    prov_path = Path(str(path) + ".provenance.json")
    old = json.loads(prov_path.read_text()) if prov_path.exists() else {"runs": []}
    old["runs"].append({
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "command": " ".join(sys.argv),
        "family": args.family, "count": args.count, "seed": args.seed,
        "steps": args.steps, "max_seconds": args.max_seconds,
        "python": platform.python_version(), "host_os": platform.platform(),
        **info, **worker_versions, **stats,
    })
    prov_path.write_text(json.dumps(old, indent=1) + "\n")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--family", required=True, choices=sorted(configs.SAMPLERS))
    ap.add_argument("--count", type=int, required=True, help="configurations to sample")
    ap.add_argument("--out", type=Path, required=True, help="CSV to create or append to")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--steps", type=int, default=50, help="optimizer steps per configuration")
    ap.add_argument("--max-seconds", type=float, default=30.0, help="training time cap per configuration")
    ap.add_argument("--timeout", type=float, default=300.0, help="kill a worker after this many seconds")
    ap.add_argument("--gpu", type=int, default=int(os.environ.get("CARMA_DATAGEN_GPU", 0)),
                    help="NVML index of the GPU (also set CUDA_VISIBLE_DEVICES to match)")
    args = ap.parse_args(argv)

    sampler = NvmlSampler(args.gpu)
    info = sampler.info()
    print(f"GPU {args.gpu}: {info['gpu']}, {info['gpu_total_mib']:.0f} MiB, driver {info['driver']}")
    sink = csvio.CsvSink(args.out, args.family)
    versions: dict[str, Any] = {}

    def measure(cfg):
        res = run_worker(cfg, sampler, args.steps, args.max_seconds, args.timeout)
        for k in ("torch", "cuda", "cudnn"):
            if res.get(k) is not None:
                versions[k] = res[k]
        res["gpu"] = info["gpu"]
        return res

    stats = generate(args.family, args.count, args.seed, sink, measure, info["gpu_total_mib"])
    provenance(args.out, info, args, stats, versions)
    print(json.dumps(stats))
    return 0


if __name__ == "__main__":
    sys.exit(main())
