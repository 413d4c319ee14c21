#!/usr/bin/env python3
"""Measures how much training jobs slow each other down when they share one GPU.

    PYTHONPATH=estimator/profile python3 tools/measure-interference.py --out DIR [--window-s 8]

Needs a CUDA GPU and NVML. Each job of JOBS runs in its own process (its own CUDA context,
as two pods sharing a GPU do) and trains without pause while it is active; the parent makes
one job, then each pair of jobs, active together, and counts the training steps each
completes in a window. It samples the GPU's SM activity meanwhile (NVML GPM `SM_UTIL`, the
figure DCGM calls `DCGM_FI_PROF_SM_ACTIVE` and carma gates on; where GPM is not supported
it records NVML's `utilization.gpu` instead and says so in the `activity_metric` column).

Written to DIR:
* `interference.csv`, one row per job per scenario: the jobs active, this job's steps per
  second, and the SM activity measured over the window.
* `activity.log`, every activity sample with the scenario it belongs to.

`tools/fit-slowdown.py` reads `interference.csv` and fits the simulator's slowdown model
(`workload/src/model/slowdown.rs`): each job's rate while sharing, relative to alone, against
`(max(θ, s) / max(θ, D))^γ`, with `s` its SM activity alone and `D` the sum of the alone
activities of the jobs sharing the GPU.
"""

from __future__ import annotations

import argparse
import csv
import itertools
import multiprocessing as mp
import sys
import time
from pathlib import Path

# name -> (builder module attribute, batch): built from carma_profile's builders.
JOBS = {
    "resnet50-b64": ("resnet50", 64),
    "bert-base-b8": ("bert-base", 8),
    "mobilenet_v2-b32": ("mobilenet_v2", 32),
    "resnet18-cifar-b32": ("resnet18-cifar", 32),
    "gpt2-b8": ("gpt2", 8),
}


def builder(which: str):
    """The factory, input and head of one of JOBS' models, from carma_profile's builders."""
    from carma_profile.calibrate import MODELS, _hf

    table = {
        "resnet50": MODELS["resnet50.py"][2:5],
        "mobilenet_v2": MODELS["mobilenet.py"][2:5],
        "resnet18-cifar": MODELS["resnet18_cifar100.py"][2:5],
        "bert-base": MODELS["BERT_base_on_wiki.py"][2:5],
        "gpt2": (_hf("GPT2LMHeadModel", "GPT2Config"), 512, "clm"),
    }
    return table[which]


def job_process(name: str, active, steps, ready, stop) -> None:
    import torch

    from carma_profile.calibrate import step_inputs
    from carma_profile.measure import TrainingLoop

    which, batch = JOBS[name]
    factory, shape, head = builder(which)
    kw, _ = step_inputs(torch, shape, head)
    loop = TrainingLoop(torch, factory, batch, **kw)

    def step():
        loop.step()
        torch.cuda.synchronize()

    for _ in range(3):  # warm up: kernels chosen, allocator filled, optimizer state made
        step()
    ready.set()
    while not stop.is_set():
        if active.value:
            step()
            with steps.get_lock():
                steps.value += 1
        else:
            time.sleep(0.005)


class Activity:
    """SM activity from NVML GPM (Hopper and newer), else `utilization.gpu`."""

    def __init__(self) -> None:
        import pynvml

        self.nvml = pynvml
        pynvml.nvmlInit()
        self.handle = pynvml.nvmlDeviceGetHandleByIndex(0)
        self.metric = "utilization.gpu"
        try:
            if pynvml.nvmlGpmQueryDeviceSupport(self.handle).isSupportedDevice:
                self.samples = (pynvml.nvmlGpmSampleAlloc(), pynvml.nvmlGpmSampleAlloc())
                pynvml.nvmlGpmSampleGet(self.handle, self.samples[0])
                self.metric = "gpm.sm_util"
        except Exception as e:  # noqa: BLE001 — the fallback is recorded in every row
            print(f"interference: GPM unavailable ({type(e).__name__}: {e}); using utilization.gpu",
                  file=sys.stderr)

    def sample(self) -> float:
        """Activity (0..1) since the previous call (GPM) or over the driver's last period."""
        n = self.nvml
        if self.metric == "gpm.sm_util":
            first, second = self.samples
            n.nvmlGpmSampleGet(self.handle, second)
            get = n.c_nvmlGpmMetricsGet_t()
            get.version = n.NVML_GPM_METRICS_GET_VERSION
            get.numMetrics = 1
            get.sample1 = first
            get.sample2 = second
            get.metrics[0].metricId = n.NVML_GPM_METRIC_SM_UTIL
            n.nvmlGpmMetricsGet(get)
            self.samples = (second, first)
            return get.metrics[0].value / 100.0
        return n.nvmlDeviceGetUtilizationRates(self.handle).gpu / 100.0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--window-s", type=float, default=8.0)
    ap.add_argument("--settle-s", type=float, default=2.0)
    ap.add_argument("--jobs", default=",".join(JOBS), help="comma-separated names of JOBS")
    ap.add_argument("--deadline-s", type=float, default=600, help="start no scenario after this long")
    ap.add_argument("--triples", action="store_true", help="after the pairs, every three jobs together")
    args = ap.parse_args()
    names = [n for n in args.jobs.split(",") if n]
    unknown = [n for n in names if n not in JOBS]
    if unknown:
        print(f"interference: error: unknown job(s) {', '.join(unknown)}; known: {', '.join(JOBS)}",
              file=sys.stderr)
        return 2
    args.out.mkdir(parents=True, exist_ok=True)
    t0 = time.time()
    ctx = mp.get_context("spawn")
    stop = ctx.Event()
    procs = {}
    for n in names:
        active, steps, ready = ctx.Value("b", 0), ctx.Value("q", 0), ctx.Event()
        p = ctx.Process(target=job_process, args=(n, active, steps, ready, stop), daemon=True)
        p.start()
        procs[n] = (p, active, steps, ready)
    for n, (p, _, _, ready) in procs.items():
        while not ready.wait(1):
            if not p.is_alive():
                print(f"interference: error: job {n} exited with {p.exitcode} before it was ready",
                      file=sys.stderr)
                stop.set()
                return 1
    print(f"interference: {len(names)} jobs ready after {time.time() - t0:.0f} s", file=sys.stderr)
    activity = Activity()
    scenarios = [(n,) for n in names] + list(itertools.combinations(names, 2))
    if args.triples:
        scenarios += list(itertools.combinations(names, 3))
    csv_path = args.out / "interference.csv"
    with csv_path.open("w", newline="") as f, (args.out / "activity.log").open("w") as log:
        w = csv.writer(f, lineterminator="\n")
        w.writerow(["scenario", "jobs_sharing", "job", "steps", "seconds", "steps_per_s", "activity",
                    "activity_metric"])
        for sc in scenarios:
            if time.time() - t0 > args.deadline_s:
                print("interference: deadline reached", file=sys.stderr)
                break
            label = "+".join(sc)
            for n in sc:
                procs[n][1].value = 1
            time.sleep(args.settle_s)
            start_steps = {n: procs[n][2].value for n in sc}
            activity.sample()
            ts, samples = time.time(), []
            while time.time() - ts < args.window_s:
                time.sleep(1.0)
                v = activity.sample()
                samples.append(v)
                log.write(f"{label}\t{time.time() - t0:.1f}\t{v:.4f}\n")
            secs = time.time() - ts
            done = {n: procs[n][2].value - start_steps[n] for n in sc}
            for n in sc:
                procs[n][1].value = 0
            mean = sum(samples) / len(samples) if samples else float("nan")
            for n in sc:
                w.writerow([label, len(sc), n, done[n], f"{secs:.2f}", f"{done[n] / secs:.3f}", f"{mean:.4f}",
                            activity.metric])
            f.flush()
            log.flush()
            print(f"{label}: " + ", ".join(f"{n} {done[n] / secs:.2f}/s" for n in sc) + f"; activity {mean:.2f}",
                  file=sys.stderr, flush=True)
            time.sleep(0.5)  # the last steps drain
    stop.set()
    for p, *_ in procs.values():
        p.join(timeout=10)
    print(f"interference: done in {time.time() - t0:.0f} s -> {csv_path}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
