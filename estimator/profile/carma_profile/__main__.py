"""python -m carma_profile MODULE:FACTORY --batch-size N (--input C,H,W | --seq-len L)

Builds the model by calling FACTORY (a function or class in MODULE, a dotted module
name or a path to a .py file) with the `--arg` keyword arguments, and prints its
`carma.io/model-profile` as JSON; `--annotation` and `--yaml` print it ready to paste
into a pod's annotations or a TrainingTask's spec. Bad input exits 2.
"""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import json
import sys
from pathlib import Path

from .core import FAMILIES, OPTIMIZERS, ProfileError, describe
from .trace import trace_step

class UsageError(Exception):
    pass


def load_factory(spec: str):
    mod_name, sep, attr = spec.partition(":")
    if not sep or not mod_name or not attr:
        raise UsageError(f"model {spec!r} must be MODULE:FACTORY, e.g. torchvision.models:resnet18")
    if mod_name.endswith(".py"):
        path = Path(mod_name)
        if not path.is_file():
            raise UsageError(f"model file {mod_name!r} does not exist")
        name = f"_carma_profile_model_{path.stem}"  # never shadows an importable module
        s = importlib.util.spec_from_file_location(name, path)
        module = importlib.util.module_from_spec(s)
        sys.modules[name] = module
        try:
            s.loader.exec_module(module)
        except Exception as e:
            raise UsageError(f"cannot load {mod_name!r}: {type(e).__name__}: {e}") from e
    else:
        sys.path.insert(0, ".")
        try:
            module = importlib.import_module(mod_name)
        except Exception as e:
            raise UsageError(f"cannot import module {mod_name!r}: {type(e).__name__}: {e}") from e
    obj = module
    for part in attr.split("."):
        if not hasattr(obj, part):
            raise UsageError(f"module {mod_name!r} has no {attr!r}")
        obj = getattr(obj, part)
    return obj


def parse_input(text: str) -> tuple[int, ...]:
    try:
        dims = tuple(int(d) for d in text.replace("x", ",").split(","))
    except ValueError:
        raise UsageError(f"--input {text!r} must be positive integers separated by commas, e.g. 3,224,224") from None
    if not dims or any(d < 1 for d in dims):
        raise UsageError(f"--input {text!r} must be positive integers separated by commas, e.g. 3,224,224")
    return dims


def parse_arg(text: str) -> tuple[str, object]:
    key, sep, value = text.partition("=")
    if not sep or not key.isidentifier():
        raise UsageError(f"--arg {text!r} must be NAME=VALUE, e.g. num_classes=100")
    try:
        return key, json.loads(value)
    except json.JSONDecodeError:
        return key, value  # a plain string


def build_model(factory, kwargs: dict, spec: str, meta: bool):
    import torch

    try:
        if meta:
            with torch.device("meta"):
                model = factory(**kwargs)
        else:
            model = factory(**kwargs)
    except Exception as e:
        raise UsageError(f"{spec} failed: {type(e).__name__}: {e}") from e
    if not isinstance(model, torch.nn.Module):
        raise UsageError(f"{spec} returned {type(model).__name__}, not a torch.nn.Module")
    return model


def as_yaml(profile: dict, indent: str = "  ") -> str:
    """The `modelProfile:` block of a TrainingTask spec (at the spec's indentation)."""
    lines = [f"{indent}modelProfile:"]
    for k, v in profile.items():
        if isinstance(v, dict):
            lines.append(f"{indent}  {k}:")
            lines += [f"{indent}    {lk}: {lv}" for lk, lv in v.items()]
        else:
            lines.append(f"{indent}  {k}: {v}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m carma_profile", description=__doc__.split("\n\n")[1],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("model", help="MODULE:FACTORY, e.g. torchvision.models:resnet18 or models.py:build")
    ap.add_argument("--batch-size", type=int, required=True, help="training batch size")
    inp = ap.add_mutually_exclusive_group(required=True)
    inp.add_argument("--input", help="one sample's shape without the batch dimension, e.g. 3,224,224")
    inp.add_argument("--seq-len", type=int, help="sequence length: the input is token ids")
    ap.add_argument("--arg", action="append", default=[], metavar="NAME=VALUE",
                    help="keyword argument for FACTORY (VALUE is JSON, else a string); repeatable")
    ap.add_argument("--family", choices=FAMILIES, help="override the detected family")
    ap.add_argument("--activation", help="override the detected activation function")
    ap.add_argument("--optimizer", choices=[*OPTIMIZERS, "adamw"],
                    help="the training step's optimizer (the estimator assumes adam when absent)")
    ap.add_argument("--mixed-precision", action="store_true", default=None,
                    help="the job trains with autocast/AMP (fp32 assumed when absent)")
    ap.add_argument("--meta", action="store_true",
                    help="build the model on PyTorch's meta device (no memory for weights: for large models)")
    ap.add_argument("--trace", action="store_true",
                    help="also trace one training step on fake tensors (no GPU, no weights) and add its "
                         "phase peaks as `traced` (give the per-GPU batch for multi-GPU jobs)")
    ap.add_argument("--annotation", action="store_true", help="also print the pod annotation line")
    ap.add_argument("--yaml", action="store_true", help="also print the TrainingTask modelProfile: block")
    args = ap.parse_args(argv)
    try:
        try:
            import torch  # noqa: F401
        except ImportError:
            raise UsageError("PyTorch is not installed here: pip install torch (or run this in the training image)")
        input_size = parse_input(args.input) if args.input is not None else None
        kwargs = dict(parse_arg(a) for a in args.arg)
        factory = load_factory(args.model)
        model = build_model(factory, kwargs, args.model, args.meta)
        profile = describe(model, args.batch_size, input_size=input_size, seq_len=args.seq_len,
                           family=args.family, activation=args.activation,
                           optimizer=args.optimizer, mixed_precision=args.mixed_precision)
        if args.trace:
            profile["traced"] = trace_step(lambda: factory(**kwargs), args.batch_size, input_size=input_size,
                                           seq_len=args.seq_len, optimizer=args.optimizer,
                                           mixed_precision=args.mixed_precision)
    except (UsageError, ProfileError) as e:
        print(f"carma_profile: error: {e}", file=sys.stderr)
        return 2
    print(json.dumps(profile, indent=2))
    if args.annotation:
        print(f"\ncarma.io/model-profile: '{json.dumps(profile, separators=(',', ':'))}'")
    if args.yaml:
        print("\n" + as_yaml(profile))
    return 0


if __name__ == "__main__":
    sys.exit(main())
