#!/usr/bin/env python3
"""Retrain carma's GPUMemNet estimators and rewrite their model cards.

    python estimator/training/train.py [--family F ...] [--data-dir DIR] [--out-dir DIR] [--threshold T]

MLP: reads `mlp_data_step1.csv` and `mlp_data_step2.csv` from `--data-dir`
(default: $GPUMEMNET_DATA, else `../shared/data/gpumemnet` relative to the
repository root). CNN / Transformer: reads `estimator/datasets/<family>_data.csv`
(written by `estimator/datagen/generate.py` on a GPU machine) when it exists,
or the files given with `--dataset`.

For each family: stratified 3-fold cross-validation (shuffle, seed 42), then the
shipped ensemble trained on all rows, written into `--out-dir` (default
`estimator/models`):

* `gpumemnet-<family>.onnx` - the ensemble (raw features in, class probabilities out);
* `gpumemnet-<family>.json` - the sidecar the Rust crate reads (features, classes,
  decision rule, training range, CV and shipped-model figures);
* `fixture-<family>.json`   - input rows and onnxruntime outputs for the Rust parity test;
* `MODEL_CARD.md` (MLP) / `MODEL_CARD-<family>.md` - the model card (latency
  from `latency.json`, which `record_latency.py` writes from a criterion run).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import platform
import sys
import time
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import sklearn
from sklearn.model_selection import StratifiedKFold

sys.path.insert(0, str(Path(__file__).resolve().parent))

import card  # noqa: E402
import ensemble as ens_mod  # noqa: E402
import features as F  # noqa: E402

REPO = Path(__file__).resolve().parents[2]
DEFAULT_DATA = REPO.parent / "shared" / "data" / "gpumemnet"
DATASETS = REPO / "estimator" / "datasets"
MLP_FILES = ["mlp_data_step1.csv", "mlp_data_step2.csv"]
CV_FOLDS = 3
CV_SEED = 42
DEFAULT_THRESHOLD = 0.8
TRADEOFF_THRESHOLDS = [0.5, 0.6, 0.7, 0.8, 0.9, 0.95]


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def rule_name(t: float | None) -> str:
    return "argmax" if t is None else f"cumulative >= {t:g}"


class Run:
    """One family's data and the helpers that need its spec."""

    def __init__(self, spec: F.FamilySpec, paths: list[Path]):
        self.spec = spec
        self.paths = paths
        self.df, self.x, self.y, self.mib = F.load_csvs(paths, spec.features, spec.activations, spec.classes)
        self.n_classes = len(spec.classes)

    def reserve(self, chosen, rows=slice(None)):
        return F.reservation_mib(chosen, self.spec.classes, self.x[rows], self.spec.features,
                                 self.spec.open_min_mib)

    def evaluate(self, probs, threshold, rows=slice(None)):
        chosen = F.decide(probs, threshold)
        return F.metrics(self.y[rows], chosen, self.mib[rows], self.reserve(chosen, rows), self.n_classes)

    def analytic(self):
        s = self.spec.features
        return F.analytic_upper_bound_mib(self.x[:, s.index("total_parameters")],
                                          self.x[:, s.index("total_activations")],
                                          self.x[:, s.index("batch_size")])


def cross_validate(run: Run, cfg, thresholds, report_threshold):
    skf = StratifiedKFold(n_splits=CV_FOLDS, shuffle=True, random_state=CV_SEED)
    oof = np.zeros((len(run.y), run.n_classes))
    per_fold = {t: [] for t in thresholds}
    for k, (tr, te) in enumerate(skf.split(run.x, run.y)):
        t0 = time.time()
        model = ens_mod.fit(run.x[tr], run.y[tr], run.n_classes, ens_mod.TRANSFORMS[run.spec.name], cfg)
        p = model.predict_proba(run.x[te]).astype(np.float32)
        oof[te] = p
        for t in thresholds:
            per_fold[t].append(run.evaluate(p, t, te))
        m = per_fold[report_threshold][-1]
        print(f"  fold {k + 1}/{CV_FOLDS}: accuracy {m['accuracy']:.4f}, "
              f"underestimates {m['underestimate_rate']:.4f} ({time.time() - t0:.1f} s)", flush=True)
    return oof, per_fold


def summarise_folds(folds: list[dict]) -> dict:
    acc = np.array([f["accuracy"] for f in folds])
    und = np.array([f["underestimate_rate"] for f in folds])
    over = np.array([f["mean_over_reservation_mib"] for f in folds])
    return {
        "accuracy_mean": float(acc.mean()),
        "accuracy_std": float(acc.std()),
        "underestimate_rate_mean": float(und.mean()),
        "underestimate_rate_std": float(und.std()),
        "mean_over_reservation_mib": float(over.mean()),
    }


def pick_fixture_rows(y: np.ndarray, rng: np.random.Generator, per_class: int = 6) -> list[int]:
    rows = []
    for k in range(int(y.max()) + 1):
        idx = np.flatnonzero(y == k)
        if len(idx):
            rows.extend(rng.choice(idx, size=min(per_class, len(idx)), replace=False).tolist())
    return sorted(rows)


def mlp_extra_fixture_rows() -> np.ndarray:
    """Synthetic MLP rows: tiny, beyond range, every kind of layer count."""
    enc = lambda a: F.encode_activation(a, F.MLP_ACTIVATIONS)  # noqa: E731
    return np.array([
        [2, 1, 10, 10, 0, 0, *enc("ReLU")],
        [12, 1023, 1.5e8, 1.4e5, 11, 11, *enc("GELU")],
        [6, 512, 3.0e7, 2.0e4, 5, 0, *enc("Tanh")],
        [4, 64, 1.0e6, 5.0e3, 0, 3, *enc("Identity")],
    ])


def train_family(run: Run, out_dir: Path, threshold: float, latency: dict | None,
                 data_info: dict) -> dict:
    spec = run.spec
    counts = np.bincount(run.y, minlength=run.n_classes).tolist()
    print(f"[{spec.name}] {len(run.y)} rows; class counts {counts}")
    cfg = ens_mod.EnsembleConfig()
    thresholds = [None] + sorted(set(TRADEOFF_THRESHOLDS + [threshold]))
    print(f"[{spec.name}] {CV_FOLDS}-fold stratified CV (shuffle, seed {CV_SEED}) ...", flush=True)
    oof, per_fold = cross_validate(run, cfg, thresholds, threshold)

    tradeoff = []
    for t in thresholds:
        s = summarise_folds(per_fold[t])
        s["rule"] = rule_name(t)
        s["threshold"] = t
        tradeoff.append(s)
    ana = run.analytic()
    # OOM rows (generated datasets) have no measured peak to bound
    ok = (run.df["Status"] != "oom").to_numpy() if "Status" in run.df else np.ones(len(run.y), bool)
    analytic = {
        "underestimate_rate": float((ana < run.mib).mean()),
        "mean_over_reservation_mib": float(np.clip(ana - run.mib, 0, None).mean()),
        "covers": int((ana[ok] >= run.mib[ok]).sum()),
        "of": int(ok.sum()),
    }
    pooled = run.evaluate(oof, threshold)
    pooled_argmax = run.evaluate(oof, None)
    sources = sorted(set(run.df["__source"]))
    by_source = {}
    for src in sources:
        m = (run.df["__source"] == src).to_numpy()
        by_source[src] = run.evaluate(oof[m], threshold, m)
    default = summarise_folds(per_fold[threshold])

    print(f"[{spec.name}] training the shipped ensemble on all rows ...", flush=True)
    final = ens_mod.fit(run.x, run.y, run.n_classes, ens_mod.TRANSFORMS[spec.name], cfg)
    doc = (f"carma GPUMemNet {spec.name}-family ensemble. Input 'features' float32[N,{len(spec.features)}] "
           f"raw: {', '.join(spec.features)}. Output 'probabilities' float32[N,{run.n_classes}] over "
           + ", ".join(c.label for c in spec.classes) + " MiB.")
    model = ens_mod.to_onnx(final, len(spec.features), doc)
    out_dir.mkdir(parents=True, exist_ok=True)
    onnx_path = out_dir / f"gpumemnet-{spec.name}.onnx"
    onnx.save(model, onnx_path)

    sess = ort.InferenceSession(str(onnx_path), providers=["CPUExecutionProvider"])
    probs = sess.run(["probabilities"], {"features": run.x.astype(np.float32)})[0]
    gap = float(np.abs(probs - final.predict_proba(run.x)).max())
    print(f"[{spec.name}] onnxruntime vs numpy reference: max |diff| = {gap:.2e}")
    if gap > 1e-4:
        raise SystemExit(f"error: exported {spec.name} graph disagrees with the trained ensemble")

    shipped = {}
    for src in sources:
        m = (run.df["__source"] == src).to_numpy()
        shipped[src] = run.evaluate(probs[m], threshold, m)
    shipped["all"] = run.evaluate(probs, threshold)

    rng = np.random.default_rng(CV_SEED)
    fixture_rows = pick_fixture_rows(run.y, rng)
    fx = run.x[fixture_rows]
    extra = mlp_extra_fixture_rows() if spec.name == "mlp" else np.zeros((0, len(spec.features)))
    fx_all = np.vstack([fx, extra]).astype(np.float32)
    fprobs = sess.run(["probabilities"], {"features": fx_all})[0]
    sources_of = fixture_rows + [-1] * len(extra)
    fixture = {
        "model": onnx_path.name,
        "features": spec.features,
        "threshold": threshold,
        "rows": [
            {
                "source": ({"file": str(run.df["__source"].iloc[i]), "row": int(run.df["__row"].iloc[i])}
                           if i >= 0 else None),
                "features": [float(v) for v in fx_all[j]],
                "probabilities": [float(v) for v in fprobs[j]],
                "class": int(F.decide(fprobs[j:j + 1], threshold)[0]),
            }
            for j, i in enumerate(sources_of)
        ],
    }
    (out_dir / f"fixture-{spec.name}.json").write_text(json.dumps(fixture, indent=1) + "\n")

    maxima = {name: float(run.x[:, i].max()) for i, name in enumerate(spec.features)
              if not name.startswith("act_")}
    ib, ia = spec.features.index("batch_size"), spec.features.index("total_activations")
    maxima["batch_x_activations"] = float((run.x[:, ib] * run.x[:, ia]).max())
    sidecar = {
        "schema_version": 1,
        "family": spec.name,
        "model_file": onnx_path.name,
        "input": "features",
        "output": "probabilities",
        "features": spec.features,
        "activation_functions": spec.activations or [],
        "classes": [{"label": c.label, "lower_mib": c.lower_mib, "upper_mib": c.upper_mib}
                    for c in spec.classes],
        "open_class_min_reservation_mib": spec.open_min_mib,
        "decision": {"rule": "cumulative-probability", "threshold": threshold},
        "training_max": maxima,
        "cv": {
            "folds": CV_FOLDS, "seed": CV_SEED, "stratified": True, "shuffle": True,
            "rows": int(len(run.y)),
            "rule": rule_name(threshold),
            **default,
            "pooled": pooled,
            "argmax_pooled": pooled_argmax,
            "by_source": by_source,
            "tradeoff": tradeoff,
            "analytic_upper_bound": analytic,
        },
        "shipped": shipped,
        "training": {
            **cfg.as_dict(),
            "transform": ens_mod.TRANSFORMS[spec.name].as_dict(),
            "derived_features": ens_mod.TRANSFORMS[spec.name].width(),
            "parameters": final.n_parameters(),
            "data": {p.name: {"rows": int((run.df["__source"] == p.name).sum()), "sha256": sha256(p)}
                     for p in run.paths},
            **data_info,
            "python": platform.python_version(),
            "numpy": np.__version__,
            "scikit_learn": sklearn.__version__,
            "onnx": onnx.__version__,
            "onnxruntime": ort.__version__,
            "opset": ens_mod.OPSET,
        },
    }
    (out_dir / f"gpumemnet-{spec.name}.json").write_text(json.dumps(sidecar, indent=1) + "\n")
    card_name = "MODEL_CARD.md" if spec.name == "mlp" else f"MODEL_CARD-{spec.name}.md"
    (out_dir / card_name).write_text(card.render(sidecar, latency if spec.name == "mlp" else None))
    print(f"[{spec.name}] CV ({rule_name(threshold)}): accuracy {default['accuracy_mean'] * 100:.2f} "
          f"± {default['accuracy_std'] * 100:.2f} %, underestimates "
          f"{default['underestimate_rate_mean'] * 100:.2f} %, mean over-reservation "
          f"{default['mean_over_reservation_mib']:.0f} MiB")
    print(f"[{spec.name}] wrote {onnx_path.name}, {onnx_path.stem}.json, fixture-{spec.name}.json, {card_name}")
    return sidecar


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--family", action="append", choices=sorted(F.FAMILIES),
                    help="train only this family (repeatable); default: every family with data")
    ap.add_argument("--data-dir", type=Path,
                    default=Path(os.environ.get("GPUMEMNET_DATA", DEFAULT_DATA)),
                    help="directory holding mlp_data_step1.csv and mlp_data_step2.csv")
    ap.add_argument("--dataset", type=Path, action="append", default=[],
                    help="CSV(s) for a single non-MLP --family (default estimator/datasets/<family>_data.csv)")
    ap.add_argument("--out-dir", type=Path, default=REPO / "estimator" / "models")
    ap.add_argument("--threshold", type=float, default=DEFAULT_THRESHOLD,
                    help="cumulative-probability threshold of the safe-side rule")
    args = ap.parse_args(argv)
    started = time.time()
    if not 0 < args.threshold <= 1:
        print("error: --threshold must be in (0, 1]", file=sys.stderr)
        return 2
    explicit = args.family is not None
    families = args.family or list(F.FAMILIES)
    if args.dataset and (len(families) != 1 or families[0] == "mlp"):
        print("error: --dataset needs exactly one non-MLP --family", file=sys.stderr)
        return 2
    latency_path = args.out_dir / "latency.json"
    latency = json.loads(latency_path.read_text()) if latency_path.is_file() else None

    for fam in families:
        if fam == "mlp":
            paths = [args.data_dir / f for f in MLP_FILES]
            missing = [str(p) for p in paths if not p.is_file()]
            if missing:
                print(f"error: GPUMemNet data not found: {missing}\n"
                      f"  pass --data-dir or set GPUMEMNET_DATA (expected ../shared/data/gpumemnet)",
                      file=sys.stderr)
                return 2
            info = {"source": "GPUMemNet MLP datasets (A100 40 GB), CC-BY-4.0"}
        else:
            paths = args.dataset or [DATASETS / f"{fam}_data.csv"]
            missing = [str(p) for p in paths if not p.is_file()]
            if missing:
                msg = (f"[{fam}] no dataset ({', '.join(missing)}): generate one with "
                       f"estimator/datagen/generate.py on a GPU machine")
                if explicit:
                    print("error: " + msg, file=sys.stderr)
                    return 2
                print(msg + "; skipped")
                continue
            prov = [Path(str(p) + ".provenance.json") for p in paths]
            info = {"source": "carma estimator/datagen",
                    "provenance": [json.loads(p.read_text()) for p in prov if p.is_file()]}
        run = Run(F.FAMILIES[fam], paths)
        train_family(run, args.out_dir, args.threshold, latency, info)
    print(f"done in {time.time() - started:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
