#!/usr/bin/env python3
"""Retrain carma's GPUMemNet MLP-family estimator and rewrite its model card.

    python estimator/training/train.py [--data-dir DIR] [--out-dir DIR] [--threshold T]

Reads `mlp_data_step1.csv` and `mlp_data_step2.csv` from `--data-dir` (default:
$GPUMEMNET_DATA, else `../shared/data/gpumemnet` relative to the repository
root), runs stratified 3-fold cross-validation (shuffle, seed 42), trains the
shipped ensemble on all rows and writes into `--out-dir` (default
`estimator/models`):

* `gpumemnet-mlp.onnx`  - the ensemble (raw features in, class probabilities out);
* `gpumemnet-mlp.json`  - the sidecar the Rust crate reads (features, classes,
  decision rule, training range, CV and shipped-model figures);
* `fixture-mlp.json`    - input rows and onnxruntime outputs for the Rust parity test;
* `MODEL_CARD.md`       - the model card (latency from `latency.json`, which
  `record_latency.py` writes from a criterion run).
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

import ensemble as ens_mod  # noqa: E402
import features as F  # noqa: E402
import card  # noqa: E402

REPO = Path(__file__).resolve().parents[2]
DEFAULT_DATA = REPO.parent / "shared" / "data" / "gpumemnet"
DATA_FILES = ["mlp_data_step1.csv", "mlp_data_step2.csv"]
CV_FOLDS = 3
CV_SEED = 42
DEFAULT_THRESHOLD = 0.8
TRADEOFF_THRESHOLDS = [None, 0.5, 0.6, 0.7, 0.8, 0.9, 0.95]


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def rule_name(t: float | None) -> str:
    return "argmax" if t is None else f"cumulative >= {t:g}"


def evaluate_rule(probs, y, mib, x, threshold):
    chosen = F.decide(probs, threshold)
    reserved = F.reservation_mib(chosen, F.MLP_CLASSES, x)
    return F.metrics(y, chosen, mib, reserved, len(F.MLP_CLASSES))


def cross_validate(x, y, mib, cfg, thresholds):
    skf = StratifiedKFold(n_splits=CV_FOLDS, shuffle=True, random_state=CV_SEED)
    oof = np.zeros((len(y), len(F.MLP_CLASSES)))
    per_fold = {t: [] for t in thresholds}
    for k, (tr, te) in enumerate(skf.split(x, y)):
        t0 = time.time()
        model = ens_mod.fit(x[tr], y[tr], len(F.MLP_CLASSES), ens_mod.MLP_TRANSFORMS, cfg)
        p = model.predict_proba(x[te]).astype(np.float32)
        oof[te] = p
        for t in thresholds:
            per_fold[t].append(evaluate_rule(p, y[te], mib[te], x[te], t))
        m = per_fold[DEFAULT_THRESHOLD if DEFAULT_THRESHOLD in thresholds else thresholds[0]][-1]
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
    for k in range(len(F.MLP_CLASSES)):
        idx = np.flatnonzero(y == k)
        if len(idx):
            rows.extend(rng.choice(idx, size=min(per_class, len(idx)), replace=False).tolist())
    return sorted(rows)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data-dir", type=Path,
                    default=Path(os.environ.get("GPUMEMNET_DATA", DEFAULT_DATA)),
                    help="directory holding mlp_data_step1.csv and mlp_data_step2.csv")
    ap.add_argument("--out-dir", type=Path, default=REPO / "estimator" / "models")
    ap.add_argument("--threshold", type=float, default=DEFAULT_THRESHOLD,
                    help="cumulative-probability threshold of the safe-side rule")
    args = ap.parse_args(argv)
    started = time.time()

    paths = [args.data_dir / f for f in DATA_FILES]
    missing = [str(p) for p in paths if not p.is_file()]
    if missing:
        print(f"error: GPUMemNet data not found: {missing}\n"
              f"  pass --data-dir or set GPUMEMNET_DATA (expected ../shared/data/gpumemnet)",
              file=sys.stderr)
        return 2
    df, x, y, mib = F.load_mlp_csvs(paths)
    n_classes = len(F.MLP_CLASSES)
    print(f"loaded {len(y)} rows; class counts {np.bincount(y, minlength=n_classes).tolist()}")

    cfg = ens_mod.EnsembleConfig()
    thresholds = sorted(set(TRADEOFF_THRESHOLDS[1:] + [args.threshold]))
    thresholds = [None] + thresholds
    print(f"{CV_FOLDS}-fold stratified CV (shuffle, seed {CV_SEED}) ...", flush=True)
    oof, per_fold = cross_validate(x, y, mib, cfg, thresholds)

    tradeoff = []
    for t in thresholds:
        s = summarise_folds(per_fold[t])
        s["rule"] = rule_name(t)
        s["threshold"] = t
        tradeoff.append(s)
    # the analytic upper bound for comparison (no model at all)
    ana = F.analytic_upper_bound_mib(x[:, 2], x[:, 3], x[:, 1])
    ana_under = float((ana < mib).mean())
    ana_over = float(np.clip(ana - mib, 0, None).mean())

    chosen_oof = F.decide(oof, args.threshold)
    pooled = F.metrics(y, chosen_oof, mib, F.reservation_mib(chosen_oof, F.MLP_CLASSES, x), n_classes)
    argmax_oof = F.decide(oof, None)
    pooled_argmax = F.metrics(y, argmax_oof, mib, F.reservation_mib(argmax_oof, F.MLP_CLASSES, x), n_classes)
    by_source = {}
    for src in DATA_FILES:
        m = (df["__source"] == src).to_numpy()
        by_source[src] = F.metrics(y[m], chosen_oof[m], mib[m],
                                   F.reservation_mib(chosen_oof[m], F.MLP_CLASSES, x[m]), n_classes)
    default = summarise_folds(per_fold[args.threshold])

    print("training the shipped ensemble on all rows ...", flush=True)
    final = ens_mod.fit(x, y, n_classes, ens_mod.MLP_TRANSFORMS, cfg)
    doc = ("carma GPUMemNet MLP-family ensemble. Input 'features' float32[N,8] raw: "
           + ", ".join(F.MLP_FEATURES) + ". Output 'probabilities' float32[N,5] over "
           + ", ".join(c.label for c in F.MLP_CLASSES) + " MiB.")
    model = ens_mod.to_onnx(final, len(F.MLP_FEATURES), doc)
    args.out_dir.mkdir(parents=True, exist_ok=True)
    onnx_path = args.out_dir / "gpumemnet-mlp.onnx"
    onnx.save(model, onnx_path)

    sess = ort.InferenceSession(str(onnx_path), providers=["CPUExecutionProvider"])
    probs = sess.run(["probabilities"], {"features": x.astype(np.float32)})[0]
    ref = final.predict_proba(x)
    gap = float(np.abs(probs - ref).max())
    print(f"onnxruntime vs numpy reference: max |diff| = {gap:.2e}")
    if gap > 1e-4:
        print("error: exported graph disagrees with the trained ensemble", file=sys.stderr)
        return 1

    shipped = {}
    for src in DATA_FILES:
        m = (df["__source"] == src).to_numpy()
        ch = F.decide(probs[m], args.threshold)
        shipped[src] = F.metrics(y[m], ch, mib[m], F.reservation_mib(ch, F.MLP_CLASSES, x[m]), n_classes)
    ch_all = F.decide(probs, args.threshold)
    shipped["all"] = F.metrics(y, ch_all, mib, F.reservation_mib(ch_all, F.MLP_CLASSES, x), n_classes)

    rng = np.random.default_rng(CV_SEED)
    fixture_rows = pick_fixture_rows(y, rng)
    fx = x[fixture_rows].astype(np.float32)
    extra = np.array([  # synthetic rows: tiny, huge, every activation, bn/dropout
        [2, 1, 10, 10, 0, 0, *F.encode_activation("ReLU", F.MLP_ACTIVATIONS)],
        [12, 1023, 1.5e8, 1.4e5, 11, 11, *F.encode_activation("GELU", F.MLP_ACTIVATIONS)],
        [6, 512, 3.0e7, 2.0e4, 5, 0, *F.encode_activation("Tanh", F.MLP_ACTIVATIONS)],
        [4, 64, 1.0e6, 5.0e3, 0, 3, *F.encode_activation("Identity", F.MLP_ACTIVATIONS)],
    ], dtype=np.float32)
    fx_all = np.vstack([fx, extra])
    fprobs = sess.run(["probabilities"], {"features": fx_all})[0]
    fixture = {
        "model": onnx_path.name,
        "features": F.MLP_FEATURES,
        "threshold": args.threshold,
        "rows": [
            {
                "source": ({"file": str(df["__source"].iloc[i]), "row": int(df["__row"].iloc[i])}
                           if i >= 0 else None),
                "features": [float(v) for v in fx_all[j]],
                "probabilities": [float(v) for v in fprobs[j]],
                "class": int(F.decide(fprobs[j:j + 1], args.threshold)[0]),
            }
            for j, i in enumerate(fixture_rows + [-1] * len(extra))
        ],
    }
    (args.out_dir / "fixture-mlp.json").write_text(json.dumps(fixture, indent=1) + "\n")

    maxima = {name: float(x[:, i].max()) for i, name in enumerate(F.MLP_FEATURES[:6])}
    maxima["batch_x_activations"] = float((x[:, 1] * x[:, 3]).max())
    sidecar = {
        "schema_version": 1,
        "family": "mlp",
        "model_file": onnx_path.name,
        "input": "features",
        "output": "probabilities",
        "features": F.MLP_FEATURES,
        "activation_functions": F.MLP_ACTIVATIONS,
        "classes": [{"label": c.label, "lower_mib": c.lower_mib, "upper_mib": c.upper_mib}
                    for c in F.MLP_CLASSES],
        "open_class_min_reservation_mib": F.OPEN_CLASS_MIN_RESERVATION_MIB,
        "decision": {"rule": "cumulative-probability", "threshold": args.threshold},
        "training_max": maxima,
        "cv": {
            "folds": CV_FOLDS, "seed": CV_SEED, "stratified": True, "shuffle": True,
            "rows": int(len(y)),
            "rule": rule_name(args.threshold),
            **default,
            "pooled": pooled,
            "argmax_pooled": pooled_argmax,
            "by_source": by_source,
            "tradeoff": tradeoff,
            "analytic_upper_bound": {"underestimate_rate": ana_under, "mean_over_reservation_mib": ana_over},
        },
        "shipped": shipped,
        "training": {
            **cfg.as_dict(),
            "transform": [list(t) for t in ens_mod.MLP_TRANSFORMS],
            "parameters": final.n_parameters(),
            "data": {p.name: {"rows": int((df["__source"] == p.name).sum()), "sha256": sha256(p)} for p in paths},
            "python": platform.python_version(),
            "numpy": np.__version__,
            "scikit_learn": sklearn.__version__,
            "onnx": onnx.__version__,
            "onnxruntime": ort.__version__,
            "opset": ens_mod.OPSET,
        },
    }
    (args.out_dir / "gpumemnet-mlp.json").write_text(json.dumps(sidecar, indent=1) + "\n")

    latency_path = args.out_dir / "latency.json"
    latency = json.loads(latency_path.read_text()) if latency_path.is_file() else None
    (args.out_dir / "MODEL_CARD.md").write_text(card.render(sidecar, latency))
    print(f"CV ({rule_name(args.threshold)}): accuracy {default['accuracy_mean'] * 100:.2f} "
          f"± {default['accuracy_std'] * 100:.2f} %, underestimates "
          f"{default['underestimate_rate_mean'] * 100:.2f} %, mean over-reservation "
          f"{default['mean_over_reservation_mib']:.0f} MiB")
    print(f"wrote {onnx_path}, gpumemnet-mlp.json, fixture-mlp.json, MODEL_CARD.md "
          f"in {time.time() - started:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
