"""python -m carma_profile.measure [--set heldout|carma] [--out CSV] [--deadline-s S]

Runs three training steps of each job on a real CUDA GPU and writes the memory it took, one
row per job: the ground truth that the traced estimate (`calibrate`) is compared with. The
step is the traced one (`trace.trace_step`): zero_grad, forward, loss, backward, Adam
step with the multi-tensor implementation, the same inputs and loss, the model built on the
GPU from the same builder (random weights, nothing downloaded).

Columns (MiB):
* `peak_allocated_mib`: `torch.cuda.max_memory_allocated`, the peak of live tensor bytes:
  what the trace models.
* `peak_reserved_mib`: `torch.cuda.max_memory_reserved`, what the caching allocator held
  from the driver at its peak (live tensors, the blocks it keeps after frees, the splits it
  cannot reuse, cuBLAS and cuDNN workspaces).
* `context_mib`: this process's memory as the driver reports it (NVML's running compute
  processes, what `nvidia-smi` shows) minus what the allocator holds: the CUDA context,
  kernels and library handles.
* `measured_mib`: `context_mib + peak_reserved_mib`, the process's peak as `nvidia-smi`
  would show it: the figure CARMA's measured jobs give, and the one a reservation must
  cover.

Each job runs in a process of its own. In one process, a later job's `peak_reserved_mib`
would include segments of an earlier one that a long-lived block (cuBLAS's workspace, say)
keeps from being freed: measured so, CIFAR-sized jobs on an H100 showed 1.9 GiB reserved
for 0.1 GiB allocated. A job that kills its process (a CUDA error poisons it) is recorded
with the error. Rows are appended as they are measured, so a run cut short keeps them.
"""

from __future__ import annotations

import argparse
import csv
import gc
import json
import os
import subprocess
import sys
import time
from pathlib import Path

MIB = 1 << 20
COLUMNS = ["job", "family", "model", "batch_size", "seq_len", "mixed_precision", "peak_allocated_mib",
           "peak_reserved_mib", "context_mib", "measured_mib", "context_source", "step_ms", "gpu", "driver", "torch_version",
           "error"]


WORKLOADS = Path(__file__).resolve().parents[3].parent / "shared/traces/carma/v2/workloads"


def jobs(which: str, workloads: Path = WORKLOADS) -> list[tuple]:
    """`(label, family, factory, input, head, batch, mixed_precision)` for each job of the set."""
    if which == "heldout":
        from .heldout import HELD_OUT

        return list(HELD_OUT)
    from .calibrate import MODELS

    from .calibrate import read_rad

    seen, out = set(), []
    for path in sorted(workloads.glob("*.rad")):
        r = read_rad(path)
        if r is None or r["script"] not in MODELS or r["gpus"] != 1:
            continue
        label, family, factory, shape, head = MODELS[r["script"]]
        key = (r["script"], r["batch_size"])
        if key not in seen:
            seen.add(key)
            if shape == (3, 32, 32):
                label = f"{label} (CIFAR-100)"
            out.append((label, family, factory, shape, head, r["batch_size"], False))
    return out


def process_used_mib(pid: int) -> int | None:
    """This process's GPU memory as the driver reports it, or None where NVML cannot say."""
    try:
        import pynvml

        pynvml.nvmlInit()
        h = pynvml.nvmlDeviceGetHandleByIndex(int(os.environ.get("CUDA_VISIBLE_DEVICES", "0").split(",")[0] or 0))
        for p in pynvml.nvmlDeviceGetComputeRunningProcesses(h):
            if p.pid == pid and p.usedGpuMemory is not None:
                return p.usedGpuMemory // MIB
        return None
    except Exception:
        return None


def device_used_mib() -> int | None:
    try:
        import pynvml

        pynvml.nvmlInit()
        return pynvml.nvmlDeviceGetMemoryInfo(pynvml.nvmlDeviceGetHandleByIndex(0)).used // MIB
    except Exception:
        return None


class TrainingLoop:
    """The traced training loop (`trace.trace_step`) on the current CUDA device: the model
    built there by `factory`, Adam with the multi-tensor implementation, and the previous
    step's output alive until the next one is assigned, as `out = model(x)` in a loop keeps
    it. `tools/measure-interference.py` and `tools/gpu-probe-attention.py` run it too."""

    def __init__(self, torch, factory, batch: int, *, input_size=None, make_input=None, labels=None,
                 mixed_precision: bool = False) -> None:
        from .trace import _loss_of, _optimizer

        self.torch, self.batch, self.labels, self._loss_of = torch, batch, labels, _loss_of
        with torch.device("cuda"):
            self.model = factory()
        self.model.to("cuda").train()
        self.opt = _optimizer(torch, "adam", [p for p in self.model.parameters() if p.requires_grad])
        if make_input is None:
            shape = tuple(input_size)
            make_input = lambda b: torch.zeros((b, *shape))  # noqa: E731
        self.make_input = make_input
        self.mixed_precision = mixed_precision
        self.out = None

    def step(self) -> None:
        torch = self.torch
        self.opt.zero_grad(set_to_none=True)
        # tensors a model creates without naming a device land on the GPU too
        with torch.device("cuda"):
            x = self.make_input(self.batch)
            kw = {} if self.labels is None else {"labels": self.labels(self.batch)}
            with torch.autocast("cuda", dtype=torch.bfloat16, enabled=self.mixed_precision):
                new_out = self.model(**x, **kw) if isinstance(x, dict) else self.model(x, **kw)
                self.out = None
                self.out = new_out
                del new_out
                loss = self._loss_of(torch, self.out)
            loss.backward()
            self.opt.step()


def measure_step(torch, factory, batch: int, *, steps: int = 3, **inputs) -> dict:
    """Peak allocated and reserved bytes of `steps` training steps on the current CUDA device
    (`inputs`: those of `TrainingLoop`)."""
    gc.collect()
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats()
    loop = TrainingLoop(torch, factory, batch, **inputs)
    t0 = time.perf_counter()
    for _ in range(steps):
        loop.step()
    torch.cuda.synchronize()
    step_ms = (time.perf_counter() - t0) * 1000 / steps
    result = {"peak_allocated_mib": -(-torch.cuda.max_memory_allocated() // MIB),
              "peak_reserved_mib": -(-torch.cuda.max_memory_reserved() // MIB),
              "reserved_now_mib": torch.cuda.memory_reserved() // MIB,
              "step_ms": round(step_ms, 1)}
    del loop
    return result


def driver_version() -> str:
    """The NVIDIA driver's version from NVML; empty when NVML is missing (recorded so, not guessed)."""
    try:
        import pynvml

        pynvml.nvmlInit()
        driver = pynvml.nvmlSystemGetDriverVersion()
        return driver.decode() if isinstance(driver, bytes) else driver
    except Exception:  # noqa: BLE001
        return ""


def measure_job(job: tuple, baseline_used: int | None) -> dict:
    """Measures one job in this process (a fresh one: nothing of an earlier job is cached)."""
    import torch

    from .calibrate import step_inputs

    label, family, factory, shape, head, batch, amp = job
    torch.zeros(1, device="cuda")
    props = torch.cuda.get_device_properties(0)
    driver = driver_version()
    kw, seq_len = step_inputs(torch, shape, head)
    row = {"job": label, "family": family, "model": label, "batch_size": batch, "seq_len": seq_len,
           "mixed_precision": int(bool(amp)), "gpu": props.name, "driver": driver,
           "torch_version": torch.__version__, "error": ""}
    try:
        m = measure_step(torch, factory, batch, mixed_precision=amp, **kw)
    except torch.cuda.OutOfMemoryError as e:
        row["error"] = f"out of memory: {str(e).splitlines()[0][:200]}"
        return row
    except Exception as e:  # noqa: BLE001 — the model failed: recorded in its row
        first = str(e).splitlines()[0][:200] if str(e) else ""
        row["error"] = f"{type(e).__name__}: {first}"
        return row
    row.update({k: m[k] for k in ("peak_allocated_mib", "peak_reserved_mib", "step_ms")})
    used, source = process_used_mib(os.getpid()), "nvml process"
    if used is None and baseline_used is not None:
        # NVML lists no processes here (a container's PID namespace): the device's used
        # memory less what it held before the run; only right with one job at a time.
        now = device_used_mib()
        used, source = (None if now is None else now - baseline_used), "nvml device"
    if used is not None:
        row["context_mib"] = used - m["reserved_now_mib"]
        row["measured_mib"] = row["context_mib"] + m["peak_reserved_mib"]
        row["context_source"] = source
    return row


def append_row(out: Path, row: dict) -> None:
    new = not out.exists() or out.stat().st_size == 0
    with out.open("a", newline="") as f:
        w = csv.DictWriter(f, fieldnames=COLUMNS, lineterminator="\n", extrasaction="ignore")
        if new:
            w.writeheader()
        w.writerow(row)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m carma_profile.measure", description=__doc__.split("\n\n")[1])
    ap.add_argument("--set", choices=["carma", "heldout"], default="heldout")
    ap.add_argument("--workloads", type=Path, default=WORKLOADS,
                    help="CARMA's .rad task files (the carma set's jobs: each single-GPU model and batch once)")
    ap.add_argument("--out", type=Path, required=True, help="CSV the rows are appended to")
    ap.add_argument("--parallel", type=int, default=1,
                    help="jobs measured at once, each in its own process (more than 1 needs NVML to list "
                         "processes, and GPU memory for all of them)")
    ap.add_argument("--deadline-s", type=float, default=600, help="start no job after this long")
    ap.add_argument("--limit", type=int, help="measure at most this many jobs (the set's first)")
    ap.add_argument("--job", type=int, help=argparse.SUPPRESS)
    ap.add_argument("--baseline-used", type=int, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    todo = jobs(args.set, args.workloads)[: args.limit]
    if args.job is not None:
        print(json.dumps(measure_job(todo[args.job], args.baseline_used)))
        return 0
    if not todo:
        print(f"measure: error: no jobs in the {args.set} set (task files: {args.workloads})", file=sys.stderr)
        return 2
    baseline = device_used_mib()
    t0, running, nxt, done, measured = time.time(), {}, 0, 0, 0
    while nxt < len(todo) or running:
        while nxt < len(todo) and len(running) < max(1, args.parallel) and time.time() - t0 < args.deadline_s:
            cmd = [sys.executable, "-m", "carma_profile.measure", "--set", args.set, "--workloads",
                   str(args.workloads), "--out", str(args.out), "--job", str(nxt)]
            if baseline is not None:
                cmd += ["--baseline-used", str(baseline)]
            running[nxt] = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
            nxt += 1
        if nxt < len(todo) and time.time() - t0 >= args.deadline_s and not running:
            print(f"measure: deadline reached, {len(todo) - nxt} jobs not run", file=sys.stderr)
            break
        time.sleep(0.2)
        for i, p in list(running.items()):
            if p.poll() is None:
                continue
            out, err = p.communicate()
            del running[i]
            label = todo[i][0]
            try:
                row = json.loads(out.strip().splitlines()[-1])
            except (ValueError, IndexError):
                tail = " | ".join(err.strip().splitlines()[-2:])[:300]
                row = {"job": label, "model": label, "batch_size": todo[i][5],
                       "error": f"worker exited with {p.returncode}: {tail}"}
            append_row(args.out, row)
            done += 1
            measured += bool(row.get("measured_mib") or row.get("peak_reserved_mib"))
            print(f"{label} b{todo[i][5]}: {row.get('measured_mib', '')} MiB {row.get('error', '')}",
                  file=sys.stderr, flush=True)
    print(f"measure: {done} of {len(todo)} jobs run, {measured} measured, {time.time() - t0:.0f} s",
          file=sys.stderr)
    if measured == 0:
        print(f"measure: error: no job was measured (see the error column of {args.out})", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
