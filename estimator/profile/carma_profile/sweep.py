"""A sweep of every architecture this helper builds without weights: carma's bound against the trace.

    cd estimator/profile && PYTHONPATH=$PWD python -m carma_profile.sweep \\
        --carma ../../target/debug/carma --out /tmp/carma-sweep

For every torchvision classification model (`torchvision.models.list_models`) and every Hugging
Face `transformers` class with a causal-LM, masked-LM or sequence-classification head that builds
from its model type's default configuration (layer counts cut to 2, so that a CPU traces it in
seconds; widths, heads and vocabularies as the default configuration has them), at two batch sizes:

* the description a user would hand `carma estimate --summary`: a torchsummary table for the
  vision models, an annotated module printout for the token models (`describe.py`);
* carma's reservation for it (`carma estimate --summary … --family … --batch-size …`);
* the floor: the traced training step's largest phase peak of live tensors (`trace.trace_step`,
  fake tensors on the CPU, Adam, fp32) plus the CUDA context measured on the H100 (770 MiB,
  `ALLOCATOR_CONTEXT_MIB`, docs/traced-estimate.md). A GPU run holds at least this much, so a
  reservation below it is an underestimate whatever the allocator does.

Rows go to `<out>/sweep.csv` (one per architecture and batch, with `status` `ok` or why a row has
no comparison) as they finish, so an interrupted sweep keeps what ran; `--resume` skips the
architectures already there. `--only vision|hf`, `--match SUBSTRING`, `--archs A,B` and `--limit N`
run a part,
`--batches 64,128` at other batch sizes;
`--summary` prints the tallies of an existing `sweep.csv`, and `--rescore` the tallies of its rows
estimated again by another carma binary (the descriptions and traced floors are kept: after a
change to the bound, nothing needs tracing again). Nothing is fitted here: this only
measures, and docs/estimator-sweep.md reports it.
"""

from __future__ import annotations

import argparse
import contextlib
import csv
import json
import signal
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
# The CUDA context a training process holds beyond its allocator (H100, torch 2.11, CUDA 13.0;
# ALLOCATOR_CONTEXT_MIB in estimator/src/traced.rs).
CONTEXT_MIB = 770
VISION_BATCHES = (8, 32)
HF_BATCHES = (2, 8)
SEQ_LEN = 128
LAYERS = 2  # every repeated-layer count of a Hugging Face configuration is cut to this
LAYER_KEYS = ("num_hidden_layers", "n_layer", "num_layers", "n_layers", "encoder_layers", "decoder_layers",
              "num_decoder_layers", "num_encoder_layers", "num_blocks")  # num_blocks: xLSTM
HEADS = (("clm", "MODEL_FOR_CAUSAL_LM_MAPPING_NAMES"), ("mlm", "MODEL_FOR_MASKED_LM_MAPPING_NAMES"),
         ("seqcls", "MODEL_FOR_SEQUENCE_CLASSIFICATION_MAPPING_NAMES"))
FIELDS = ("arch", "kind", "head", "family", "batch", "input", "status", "carma_mib", "source", "warnings",
          "peak_mib", "floor_mib", "margin_mib", "seconds")
CASE_SECONDS = 180  # a description or trace that takes longer is recorded as timed out


class Case:
    """One architecture: how to build it, describe it and feed it."""

    def __init__(self, arch: str, kind: str, head: str, family: str, factory, inp: int):
        self.arch, self.kind, self.head, self.family = arch, kind, head, family
        self.factory, self.inp = factory, inp


def vision_cases() -> list[Case]:
    import torchvision

    out = []
    for name in sorted(torchvision.models.list_models(module=torchvision.models)):
        kw = {"init_weights": False} if name in ("inception_v3", "googlenet") else {}
        size = 299 if name == "inception_v3" else 224
        family = "transformer" if name.startswith(("vit_", "swin", "maxvit")) else "cnn"

        def build(name=name, kw=kw):
            return torchvision.models.get_model(name, **kw)

        out.append(Case(name, "torchvision", "class", family, build, size))
    return out


def shrink(config) -> None:
    """Cuts every repeated-layer count of `config` (and of its text sub-configuration) to LAYERS."""
    for c in (config, getattr(config, "text_config", None)):
        if c is None:
            continue
        for key in LAYER_KEYS:
            v = getattr(c, key, None)
            if isinstance(v, int) and not isinstance(v, bool) and v > LAYERS:
                with contextlib.suppress(Exception):
                    setattr(c, key, LAYERS)
        if getattr(c, "pad_token_id", 0) is None:
            with contextlib.suppress(Exception):
                c.pad_token_id = 0


def hf_cases() -> list[Case]:
    import transformers
    from transformers.models.auto import modeling_auto

    out, seen = [], set()
    for head, mapping in HEADS:
        for model_type, cls_name in sorted(getattr(modeling_auto, mapping).items()):
            if isinstance(cls_name, (tuple, list)):
                cls_name = cls_name[0]
            if cls_name in seen:
                continue
            seen.add(cls_name)

            def build(model_type=model_type, cls_name=cls_name):
                config = transformers.AutoConfig.for_model(model_type)
                shrink(config)
                return getattr(transformers, cls_name)(config)

            out.append(Case(cls_name, "transformers", head, "transformer", build, SEQ_LEN))
    return out


class _Timeout(Exception):
    pass


@contextlib.contextmanager
def time_limit(seconds: int):
    def fire(*_):
        raise _Timeout()

    old = signal.signal(signal.SIGALRM, fire)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)


def step_kwargs(torch, case: Case) -> dict:
    if case.kind == "torchvision":
        return {"input_size": (3, case.inp, case.inp)}
    length = case.inp
    kw = {"make_input": lambda b: {"input_ids": torch.zeros((b, length), dtype=torch.long)}}
    if case.head == "seqcls":
        kw["labels"] = lambda b: torch.zeros((b,), dtype=torch.long)
    else:
        kw["labels"] = lambda b: torch.zeros((b, length), dtype=torch.long)
    return kw


def without_cache(kw: dict) -> dict:
    """`kw` with the model called with `use_cache=False`. A hybrid model (Jamba, Zamba, Qwen3-Next:
    attention and linear-attention or Mamba layers by a per-layer type list) whose two layers left
    by the cut are both of the linear kind builds a cache that cannot say its length, and its
    forward asks it. Without a cache the step keeps no more than with one (a cache holds the
    attention layers' keys and values, which backward saves anyway, and the recurrent states), so
    the floor traced so stays a lower bound of the GPU run's; only such a step is traced so."""
    make = kw["make_input"]
    return dict(kw, make_input=lambda b: dict(make(b), use_cache=False))


def describe_case(torch, case: Case) -> str:
    from .describe import printout, torchsummary

    with torch.device("meta"):
        model = case.factory()
    if case.kind == "torchvision":
        return torchsummary(model, case.inp)
    return printout(model)


def estimate(carma: str, case: Case, text_path: Path, batch: int) -> dict:
    args = [carma, "--log", "warn", "estimate", "--summary", str(text_path), "--family", case.family,
            "--batch-size", str(batch)]
    if case.kind != "torchvision":
        args += ["--seq-len", str(case.inp)]
    res = subprocess.run(args, capture_output=True, text=True, timeout=60)
    if res.returncode != 0:
        last = res.stderr.strip().splitlines()[-1] if res.stderr.strip() else f"exit {res.returncode}"
        raise RuntimeError(f"carma: {last[:200]}")
    return json.loads(res.stdout)


def _why(e: Exception) -> str:
    if isinstance(e, _Timeout):
        return f"timed out after {CASE_SECONDS} s"
    first = str(e).splitlines()[0][:160] if str(e) else ""
    return f"{type(e).__name__}: {first}"


def run_case(torch, carma: str, case: Case, out: Path, batches) -> list[dict]:
    """The rows of one architecture: one per batch, each compared or saying why it is not."""
    from .trace import trace_step

    base = {"arch": case.arch, "kind": case.kind, "head": case.head, "family": case.family,
            "input": case.inp}
    try:
        with time_limit(CASE_SECONDS):
            text = describe_case(torch, case)
    except Exception as e:  # noqa: BLE001  a class that does not build from its default config
        return [dict(base, batch=b, status=f"not built: {_why(e)}") for b in batches]
    slug = "".join(c if c.isalnum() else "_" for c in case.arch)
    path = out / "descriptions" / f"{slug}.txt"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    rows = []
    for b in batches:
        row = dict(base, batch=b)
        t0 = time.monotonic()
        try:
            answer = estimate(carma, case, path, b)
        except Exception as e:  # noqa: BLE001
            rows.append(dict(row, status=f"not estimated: {e}"))
            continue
        row.update(carma_mib=answer["estimate_mib"], source=answer["source"],
                   warnings=" | ".join(answer.get("warnings", [])))
        try:
            with time_limit(CASE_SECONDS):
                try:
                    t = trace_step(case.factory, b, **step_kwargs(torch, case))
                except Exception as e:  # noqa: BLE001
                    if "get_seq_length" not in str(e):
                        raise
                    t = trace_step(case.factory, b, **without_cache(step_kwargs(torch, case)))
        except Exception as e:  # noqa: BLE001
            rows.append(dict(row, status=f"not traced: {_why(e)}"))
            continue
        peak = max(t["forwardMiB"], t["backwardMiB"], t["optimizerStepMiB"])
        floor = peak + CONTEXT_MIB
        rows.append(dict(row, status="ok", peak_mib=peak, floor_mib=floor,
                         margin_mib=answer["estimate_mib"] - floor,
                         seconds=round(time.monotonic() - t0, 1)))
    return rows


def rescore(carma: str, out: Path, row: dict) -> dict:
    """`row` with carma's reservation made again by `carma` from its recorded description."""
    if row["status"] != "ok":
        return row
    slug = "".join(c if c.isalnum() else "_" for c in row["arch"])
    case = Case(row["arch"], row["kind"], row["head"], row["family"], None, int(row["input"]))
    answer = estimate(carma, case, out / "descriptions" / f"{slug}.txt", int(row["batch"]))
    return dict(row, carma_mib=answer["estimate_mib"], source=answer["source"],
                warnings=" | ".join(answer.get("warnings", [])),
                margin_mib=answer["estimate_mib"] - int(row["floor_mib"]))


def summarize(rows: list[dict]) -> str:
    ok = [r for r in rows if r["status"] == "ok"]
    under = [r for r in ok if int(r["margin_mib"]) < 0]
    archs = {(r["kind"], r["arch"]) for r in rows}
    lines = [f"{len(archs)} architectures, {len(rows)} architecture × batch pairs, {len(ok)} compared, "
             f"{len(under)} under the trace floor"]
    for kind in ("torchvision", "transformers"):
        k = [r for r in ok if r["kind"] == kind]
        if k:
            u = [r for r in k if int(r["margin_mib"]) < 0]
            mean = sum(int(r["margin_mib"]) for r in k) / len(k)
            lines.append(f"{kind}: {len({r['arch'] for r in k})} architectures, {len(k)} pairs compared, "
                         f"{len(u)} under, mean carma − floor {mean:+,.0f} MiB")
    reasons: dict[str, int] = {}
    for r in rows:
        if r["status"] != "ok":
            key = r["status"].split(":")[0]
            reasons[key] = reasons.get(key, 0) + 1
    for key, n in sorted(reasons.items()):
        lines.append(f"{key}: {n} pairs")
    for r in under:
        lines.append(f"under: {r['arch']} batch {r['batch']}: carma {int(r['carma_mib']):,} < floor "
                     f"{int(r['floor_mib']):,} ({int(r['margin_mib']):+,} MiB), source {r['source']}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--carma", default=str(ROOT / "target" / "debug" / "carma"))
    ap.add_argument("--out", default="/tmp/carma-sweep", type=Path)
    ap.add_argument("--only", choices=("vision", "hf"))
    ap.add_argument("--match", default="", help="only architectures whose name holds this")
    ap.add_argument("--archs", default="", help="only these architectures (comma-separated names), "
                    "e.g. the rows of an earlier run that were not traced")
    ap.add_argument("--limit", type=int, default=0, help="at most this many architectures")
    ap.add_argument("--resume", action="store_true", help="skip architectures already in sweep.csv")
    ap.add_argument("--summary", action="store_true", help="only summarize <out>/sweep.csv")
    ap.add_argument("--rescore", action="store_true",
                    help="estimate the rows of <out>/sweep.csv again with --carma (their descriptions and "
                         "traced floors as recorded) and summarize; the file is not changed")
    ap.add_argument("--batches", default="", help="comma-separated batch sizes in place of the defaults "
                    f"(vision {VISION_BATCHES}, token models {HF_BATCHES})")
    a = ap.parse_args(argv)
    given = tuple(int(b) for b in a.batches.split(",") if b.strip())
    a.out.mkdir(parents=True, exist_ok=True)
    csv_path = a.out / "sweep.csv"
    if a.summary or a.rescore:
        with open(csv_path) as f:
            rows = list(csv.DictReader(f))
        if a.rescore:
            rows = [rescore(a.carma, a.out, r) for r in rows]
        print(summarize(rows))
        return 0
    import torch

    done = set()
    if a.resume and csv_path.exists():
        with open(csv_path) as f:
            done = {r["arch"] for r in csv.DictReader(f)}
    else:
        with open(csv_path, "w", newline="") as f:
            csv.DictWriter(f, FIELDS).writeheader()
    cases = []
    if a.only in (None, "vision"):
        cases += [(c, given or VISION_BATCHES) for c in vision_cases()]
    if a.only in (None, "hf"):
        cases += [(c, given or HF_BATCHES) for c in hf_cases()]
    only = {n.strip() for n in a.archs.split(",") if n.strip()}
    cases = [(c, b) for c, b in cases if a.match in c.arch and c.arch not in done
             and (not only or c.arch in only)]
    if a.limit:
        cases = cases[:a.limit]
    torch.set_num_threads(1)
    for i, (case, batches) in enumerate(cases, 1):
        rows = run_case(torch, a.carma, case, a.out, batches)
        with open(csv_path, "a", newline="") as f:
            w = csv.DictWriter(f, FIELDS)
            for r in rows:
                w.writerow({k: r.get(k, "") for k in FIELDS})
        for r in rows:
            figures = (f" carma {r['carma_mib']} floor {r['floor_mib']} ({r['margin_mib']:+})"
                       if r["status"] == "ok" else "")
            print(f"[{i}/{len(cases)}] {r['arch']} b{r['batch']}: {r['status']}{figures}", flush=True)
    with open(csv_path) as f:
        print(summarize(list(csv.DictReader(f))))
    return 0


if __name__ == "__main__":
    sys.exit(main())
