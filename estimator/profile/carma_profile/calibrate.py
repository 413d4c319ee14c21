"""python -m carma_profile.calibrate [--workloads DIR] [--out CSV]

Traces one training step of each of CARMA's measured jobs (the `.rad` task files of
`shared/traces/carma/v2/workloads`) and writes the traced figures, one row per job, to
`estimator/tests/data/traced-peaks.csv`. The Rust test `estimator/tests/traced.rs` reads
them with the measured peaks (line 8 of each `.rad`) and checks the traced reservation
against them; `docs/traced-estimate.md` is made from the same rows.

How each job's model is built (no weights are downloaded: torchvision builders and Hugging
Face config classes, on the meta device):

* ImageNet CNNs: torchvision's `resnet50`, `mobilenet_v2`, `efficientnet_b0`, `vgg16`
  (224 x 224) and `inception_v3` (299 x 299, auxiliary classifier on, as torchvision
  trains it), 1,000 classes. Xception is not in torchvision (it is in timm, which this
  environment does not have): its jobs are not traced.
* CIFAR-100 CNNs (32 x 32, 100 classes): torchvision's `resnet18`, `resnet34` and
  `efficientnet_b0` (the parameter counts equal the jobs' torchsummary tables), and
  `mobilenet_v3_small` for `mobilenet_cifar100` (the published figures name it
  S_mobilenetv3; its torchsummary table in shared/ is a copy of EfficientNet's).
* MNIST: the two-convolution network of the torchsummary table `mnist_cnn_64` (1,199,882
  parameters), 1 x 28 x 28.
* Transformers, sequence length 512 (the printout of XLNet-base states batch 8, sequence
  512): BERT on WikiText-2 as masked-LM training (`BertForMaskedLM`: a language-model
  corpus), GPT-2 large as causal-LM training (`GPT2LMHeadModel`), XLNet as
  `XLNetForSequenceClassification` with 2 labels (the class of the XLNet printout), each
  with the published architecture's config (BERT base/large, GPT-2 large, XLNet
  base/large). Hugging Face computes the loss from `labels`.
* Two-GPU jobs: the `.rad` batch is the job's global batch, split over its GPUs (as
  `nn.DataParallel` and `DistributedDataParallel` with a per-GPU share do), so each GPU
  is traced at batch / GPUs. A GPU-0 replica's extra (gradient reduction, replica
  broadcast, NCCL) is not traced.
* Not traced: UNet (its input resolution is not in the task file, and its batch is 32 in
  the task file but 8 in the published figures), Mask R-CNN (detection heads have
  data-dependent shapes — proposals after NMS — that fake tensors cannot follow), DLRM
  (its embedding tables are sized by the dataset, which the command does not state in
  full), GPT-2 XL (no measured peak).

Every job trains with Adam in fp32 (the estimator's default; the task files do not say).
"""

from __future__ import annotations

import argparse
import csv
import sys
import time
from pathlib import Path

from .core import ProfileError
from .trace import trace_step

COLUMNS = ["job", "family", "model", "batch_size", "seq_len", "gpus", "forward_mib", "backward_mib",
           "optimizer_step_mib", "largest_tensor_mib", "reserved_mib", "torch_version"]


def mnist_cnn():
    """The network of the `mnist_cnn_64` torchsummary table."""
    import torch.nn as nn

    class MnistCnn(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.conv1 = nn.Conv2d(1, 32, 3)
            self.conv2 = nn.Conv2d(32, 64, 3)
            self.dropout1 = nn.Dropout(0.25)
            self.fc1 = nn.Linear(9216, 128)
            self.dropout2 = nn.Dropout(0.5)
            self.fc2 = nn.Linear(128, 10)

        def forward(self, x):
            import torch
            import torch.nn.functional as F

            x = F.relu(self.conv2(F.relu(self.conv1(x))))
            x = self.dropout1(F.max_pool2d(x, 2))
            x = self.dropout2(F.relu(self.fc1(torch.flatten(x, 1))))
            return F.log_softmax(self.fc2(x), dim=1)

    return MnistCnn()


def _tv(name: str, **kw):
    def build():
        import torchvision.models as m

        return getattr(m, name)(**kw)

    return build


def _hf(cls: str, config: str, **kw):
    def build():
        import transformers

        return getattr(transformers, cls)(getattr(transformers, config)(**kw))

    return build


BERT_LARGE = dict(hidden_size=1024, num_hidden_layers=24, num_attention_heads=16, intermediate_size=4096)
GPT2_LARGE = dict(n_embd=1280, n_layer=36, n_head=20)
XLNET_BASE = dict(d_model=768, n_layer=12, n_head=12, d_inner=3072, mem_len=None)
XLNET_LARGE = dict(d_model=1024, n_layer=24, n_head=16, d_inner=4096, mem_len=None)

# Task-file script name -> (model label, family, factory, input: (C,H,W) or seq len, head).
# head: "class" (cross-entropy on class logits), "mlm"/"clm" (token labels), "seqcls".
MODELS = {
    "resnet50.py": ("resnet50", "cnn", _tv("resnet50"), (3, 224, 224), "class"),
    "mobilenet.py": ("mobilenet_v2", "cnn", _tv("mobilenet_v2"), (3, 224, 224), "class"),
    "efficientNet.py": ("efficientnet_b0", "cnn", _tv("efficientnet_b0"), (3, 224, 224), "class"),
    "vgg.py": ("vgg16", "cnn", _tv("vgg16"), (3, 224, 224), "class"),
    "Inception.py": ("inception_v3", "cnn", _tv("inception_v3", init_weights=False), (3, 299, 299), "class"),
    "resnet18_cifar100.py": ("resnet18", "cnn", _tv("resnet18", num_classes=100), (3, 32, 32), "class"),
    "resnet34_cifar100.py": ("resnet34", "cnn", _tv("resnet34", num_classes=100), (3, 32, 32), "class"),
    "efficientNet_cifar100.py": ("efficientnet_b0", "cnn", _tv("efficientnet_b0", num_classes=100),
                                 (3, 32, 32), "class"),
    "mobilenet_cifar100.py": ("mobilenet_v3_small", "cnn", _tv("mobilenet_v3_small", num_classes=100),
                              (3, 32, 32), "class"),
    "mnist_train.py": ("mnist_cnn", "cnn", mnist_cnn, (1, 28, 28), "class"),
    "BERT_base_on_wiki.py": ("bert-base (masked LM)", "transformer",
                             _hf("BertForMaskedLM", "BertConfig"), 512, "mlm"),
    "BERT_large_on_wiki.py": ("bert-large (masked LM)", "transformer",
                              _hf("BertForMaskedLM", "BertConfig", **BERT_LARGE), 512, "mlm"),
    "gpt2_large_on_wiki.py": ("gpt2-large (causal LM)", "transformer",
                              _hf("GPT2LMHeadModel", "GPT2Config", **GPT2_LARGE), 512, "clm"),
    "xlnet_base_cased.py": ("xlnet-base (sequence classification)", "transformer",
                            _hf("XLNetForSequenceClassification", "XLNetConfig", **XLNET_BASE), 512, "seqcls"),
    "xlnet_large_cased.py": ("xlnet-large (sequence classification)", "transformer",
                             _hf("XLNetForSequenceClassification", "XLNetConfig", **XLNET_LARGE), 512,
                             "seqcls"),
}


def read_rad(path: Path) -> dict | None:
    """The fields of a `.rad` task file this tool uses, or None when it names no script."""
    lines = path.read_text().splitlines()
    if len(lines) < 8:
        return None
    script = Path(lines[2].split()[1]).name if len(lines[2].split()) > 1 else ""
    return {"job": path.stem, "script": script, "batch_size": int(lines[5]), "gpus": int(lines[7])}


def step_inputs(torch, shape, head: str) -> tuple[dict, object]:
    """The input keywords of `trace_step` (and of `measure.measure_step`) for a model's input
    and head, and the sequence length column ("" for CNNs). `torch.zeros` is called when a
    step runs, so the tensors land on the step's device (fake, or the GPU)."""
    kw: dict = {}
    if head == "class":
        kw["input_size"] = shape
        return kw, ""  # the loss is the logits' sum: a cross-entropy adds a batch x classes tensor
    kw["make_input"] = lambda b: {"input_ids": torch.zeros((b, shape), dtype=torch.long)}
    if head == "seqcls":
        kw["labels"] = lambda b: torch.zeros((b,), dtype=torch.long)
    else:
        kw["labels"] = lambda b: torch.zeros((b, shape), dtype=torch.long)
    return kw, shape


def trace_job(rad: dict) -> dict:
    label, family, factory, shape, head = MODELS[rad["script"]]
    return trace_one(rad["job"], label, family, factory, shape, head, rad["batch_size"] // rad["gpus"],
                     gpus=rad["gpus"])


def trace_one(job: str, label: str, family: str, factory, shape, head: str, batch: int, *, gpus: int = 1,
              mixed_precision: bool = False) -> dict:
    import torch

    kw, seq_len = step_inputs(torch, shape, head)
    t = trace_step(factory, batch, mixed_precision=mixed_precision or None, **kw)
    return {"job": job, "family": family, "model": label, "batch_size": batch, "seq_len": seq_len,
            "gpus": gpus, "forward_mib": t["forwardMiB"], "backward_mib": t["backwardMiB"],
            "optimizer_step_mib": t["optimizerStepMiB"],
            "largest_tensor_mib": t["largestTensorMiB"], "reserved_mib": t["reservedMiB"],
            "torch_version": torch.__version__.split("+")[0]}


def trace_heldout(out: Path) -> int:
    """Traces the held-out jobs (`heldout.HELD_OUT`) into `out`."""
    from .heldout import HELD_OUT

    rows = []
    for label, family, factory, shape, head, batch, amp in HELD_OUT:
        t0 = time.time()
        try:
            rows.append(trace_one(label, label, family, factory, shape, head, batch, mixed_precision=amp))
        except ProfileError as e:
            print(f"calibrate: error: {label}: {e}", file=sys.stderr)
            return 2
        print(f"{label}: {rows[-1]['backward_mib']} MiB ({time.time() - t0:.1f} s)", file=sys.stderr)
    write_rows(out, rows)
    print(f"wrote {len(rows)} held-out jobs to {out}", file=sys.stderr)
    return 0


def write_rows(out: Path, rows: list[dict]) -> None:
    out.parent.mkdir(parents=True, exist_ok=True)
    with out.open("w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=COLUMNS, lineterminator="\n")
        w.writeheader()
        w.writerows(rows)


def main(argv: list[str] | None = None) -> int:
    here = Path(__file__).resolve()
    repo = here.parents[3]
    ap = argparse.ArgumentParser(prog="python -m carma_profile.calibrate", description=__doc__.split("\n\n")[1])
    ap.add_argument("--workloads", type=Path, default=repo.parent / "shared/traces/carma/v2/workloads",
                    help="the directory of CARMA's .rad task files")
    ap.add_argument("--set", choices=["carma", "heldout"], default="carma",
                    help="carma: CARMA's measured jobs (the fitting set); heldout: architectures none of "
                         "the constants has seen (carma_profile/heldout.py), measured by carma_profile.measure")
    ap.add_argument("--out", type=Path, help="default: estimator/tests/data/traced-peaks.csv (carma) or "
                                             "traced-heldout.csv (heldout)")
    args = ap.parse_args(argv)
    data = repo / "estimator/tests/data"
    if args.set == "heldout":
        return trace_heldout(args.out or data / "traced-heldout.csv")
    args.out = args.out or data / "traced-peaks.csv"
    if not args.workloads.is_dir():
        print(f"calibrate: error: {args.workloads} is not a directory (CARMA's task files, "
              "shared/traces/carma/v2/workloads)", file=sys.stderr)
        return 2
    rows, skipped = [], []
    for path in sorted(args.workloads.glob("*.rad")):
        rad = read_rad(path)
        if rad is None or rad["script"] not in MODELS:
            skipped.append(path.stem)
            continue
        t0 = time.time()
        try:
            rows.append(trace_job(rad))
        except ProfileError as e:
            print(f"calibrate: error: {path.name}: {e}", file=sys.stderr)
            return 2
        print(f"{path.stem}: {rows[-1]['backward_mib']} MiB ({time.time() - t0:.1f} s)", file=sys.stderr)
    write_rows(args.out, rows)
    print(f"wrote {len(rows)} jobs to {args.out}; not traced: {', '.join(skipped)}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
