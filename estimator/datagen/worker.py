#!/usr/bin/env python3
"""Train one configuration on the GPU and report what it used (needs PyTorch + CUDA).

    echo '<config json>' | python worker.py --steps 50 --max-seconds 30

Run by `generate.py` in a fresh process per configuration, so each run has its
own CUDA context (as in GPUMemNet, one job at a time) and an out-of-memory crash
cannot poison the next run. Prints one JSON object on stdout:

    {"status": "ok"|"oom"|"error", "steps": n, "layers": [[name, acts, params], ...],
     "total_params": n, "max_allocated_mib": x, "max_reserved_mib": x,
     "torch": "2.x", "cuda": "12.x", "cudnn": n, "error": "..."}

The device-level NVML peak (GPUMemNet's label) is sampled by the parent process
while this one runs.
"""

from __future__ import annotations

import argparse
import json
import sys
import time


def build(cfg, torch):
    nn = torch.nn
    act = lambda: getattr(nn, cfg["activation"])()  # noqa: E731
    fam = cfg["family"]
    if fam == "mlp":
        layers, prev = [], cfg["input"]
        for w in cfg["hidden"]:
            layers.append(nn.Linear(prev, w))
            if cfg["batchnorm"]:
                layers.append(nn.BatchNorm1d(w))
            layers.append(act())
            if cfg["dropout"]:
                layers.append(nn.Dropout(cfg["dropout_rate"]))
            prev = w
        layers += [nn.Linear(prev, cfg["output"]), nn.Softmax(dim=1)]
        return nn.Sequential(*layers)
    if fam == "cnn":
        layers, ch = [], cfg["in_channels"]
        for b in cfg["blocks"]:
            layers.append(nn.Conv2d(ch, b["out"], b["kernel"], stride=b["stride"], padding=b["kernel"] // 2,
                                    bias=not cfg["batchnorm"]))
            if cfg["batchnorm"]:
                layers.append(nn.BatchNorm2d(b["out"]))
            layers.append(act())
            if b["pool"]:
                layers.append(nn.MaxPool2d(2))
            if cfg["dropout"]:
                layers.append(nn.Dropout(cfg["dropout_rate"]))
            ch = b["out"]
        layers += [nn.AdaptiveAvgPool2d(1), nn.Flatten()]
        prev = ch
        for h in cfg["hidden"]:
            layers += [nn.Linear(prev, h), act()]
            prev = h
        layers.append(nn.Linear(prev, cfg["classes"]))
        return nn.Sequential(*layers)
    if fam == "transformer":
        class Encoder(nn.Module):
            def __init__(self):
                super().__init__()
                self.embed = nn.Embedding(cfg["vocab"], cfg["d_model"])
                layer = nn.TransformerEncoderLayer(cfg["d_model"], cfg["heads"], cfg["ff"],
                                                   cfg["dropout_rate"], activation=cfg["activation"].lower(),
                                                   batch_first=True)
                self.encoder = nn.TransformerEncoder(layer, cfg["layers"], enable_nested_tensor=False)
                self.head = nn.Linear(cfg["d_model"], cfg["vocab"])

            def forward(self, x):
                return self.head(self.encoder(self.embed(x)))
        return Encoder()
    raise ValueError(f"unknown family {fam!r}")


def synthetic_batch(cfg, torch, device):
    fam, b = cfg["family"], cfg["batch"]
    if fam == "mlp":
        return torch.randn(b, cfg["input"], device=device), torch.randint(0, cfg["output"], (b,), device=device)
    if fam == "cnn":
        s = cfg["image"]
        return (torch.randn(b, cfg["in_channels"], s, s, device=device),
                torch.randint(0, cfg["classes"], (b,), device=device))
    x = torch.randint(0, cfg["vocab"], (b, cfg["seq_len"]), device=device)
    return x, torch.randint(0, cfg["vocab"], (b, cfg["seq_len"]), device=device)


def describe(model, cfg, torch):
    """(layer name, output size per sample, own parameters) of every leaf module
    (and MultiheadAttention, whose projections are not called as modules) in
    forward order, from one forward pass on the CPU with batch size 2."""
    nn = torch.nn
    rows = []
    hooks = []
    mha_children = set()
    for m in model.modules():
        if isinstance(m, nn.MultiheadAttention):
            mha_children.update(id(c) for c in m.modules() if c is not m)

    def hook(name, params):
        def f(_m, _inp, out):
            t = out[0] if isinstance(out, tuple) else out
            rows.append((name, int(t[0].numel()), params))
        return f

    gpumemnet_names = {"Linear": "linear", "BatchNorm1d": "batch_normalization", "Dropout": "dropout"}
    for m in model.modules():
        leaf = not any(True for _ in m.children())
        if id(m) in mha_children or not (leaf or isinstance(m, nn.MultiheadAttention)):
            continue
        kind = type(m).__name__
        name = gpumemnet_names.get(kind, kind) if cfg["family"] == "mlp" else kind
        if isinstance(m, nn.MultiheadAttention):
            name = "NonDynamicallyQuantizableLinear"  # counted as one attention block
            params = sum(p.numel() for p in m.parameters())
        else:
            params = sum(p.numel() for p in m.parameters(recurse=False))
        hooks.append(m.register_forward_hook(hook(name, int(params))))
    x, _ = synthetic_batch({**cfg, "batch": 2}, torch, "cpu")
    model.eval()
    with torch.no_grad():
        model(x)
    model.train()
    for h in hooks:
        h.remove()
    return rows


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=50)
    ap.add_argument("--max-seconds", type=float, default=30.0)
    ap.add_argument("--device", default="cuda",
                    help="`cpu` runs a smoke test anywhere torch is installed (no memory figures)")
    args = ap.parse_args()
    cfg = json.loads(sys.stdin.read())
    out = {"status": "error", "steps": 0}
    try:
        import torch  # imported here: the rest of datagen runs without torch
        out.update(torch=torch.__version__, cuda=torch.version.cuda,
                   cudnn=torch.backends.cudnn.version())
        torch.manual_seed(cfg["seed"])
        model = build(cfg, torch)
        out["layers"] = describe(model, cfg, torch)
        out["total_params"] = int(sum(p.numel() for p in model.parameters()))
        device = torch.device(args.device)
        cuda = device.type == "cuda"
        if cuda:
            torch.cuda.reset_peak_memory_stats(device)
        model = model.to(device)
        opt = torch.optim.Adam(model.parameters(), lr=1e-3)
        loss_fn = torch.nn.CrossEntropyLoss()
        started = time.time()
        try:
            for step in range(args.steps):
                x, y = synthetic_batch(cfg, torch, device)
                opt.zero_grad(set_to_none=True)
                logits = model(x)
                if cfg["family"] == "transformer":
                    loss = loss_fn(logits.reshape(-1, logits.shape[-1]), y.reshape(-1))
                else:
                    loss = loss_fn(logits, y)
                loss.backward()
                opt.step()
                if cuda:
                    torch.cuda.synchronize(device)
                out["steps"] = step + 1
                if time.time() - started > args.max_seconds:
                    break
            out["status"] = "ok"
        except torch.cuda.OutOfMemoryError as e:
            out["status"] = "oom"
            out["error"] = str(e).splitlines()[0]
        if cuda:
            out["max_allocated_mib"] = torch.cuda.max_memory_allocated(device) / 2**20
            out["max_reserved_mib"] = torch.cuda.max_memory_reserved(device) / 2**20
    except Exception as e:  # reported, not raised: the parent records the row
        out["error"] = f"{type(e).__name__}: {e}"
    print(json.dumps(out), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
