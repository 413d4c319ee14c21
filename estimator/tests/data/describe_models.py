"""Writes the model descriptions under estimator/tests/data/ that `carma estimate eval --peaks`
reads beside ../shared/data: annotated module printouts of the Transformers CARMA measured
(model-printouts/) and torchsummary tables of the ImageNet CNNs it measured (model-summaries/).

The models are built from their architecture alone (Hugging Face config classes, torchvision
constructors) on PyTorch's `meta` device: no weights are downloaded and nothing is allocated.

    ~/.cache/carma/venv-profile-*/bin/python estimator/tests/data/describe_models.py

Written with torch 2.14.1, torchvision 0.29.2 and transformers 5.23.0; the output is
deterministic for those versions.

Printout format (GPUMemNet's Transformer data, what estimator/src/printout.rs reads): the
module tree as `print(model)` shows it, each module followed by `, <n> params`. A parameter
shared by two modules (tied input and output embeddings) is counted where it first appears
in printed order, so a module's count is the sum of its children's plus its own and the
root's count is `model.parameters()`'s.

torchsummary format (what estimator/src/torchsummary.rs reads): one row per module call in
the order calls return, every module but the root, `Sequential` and `ModuleList`, as the
torchsummary package lists them; a row's parameters are its `weight` and `bias` only;
output shapes with batch -1.
"""

from __future__ import annotations

import pathlib
import sys

import torch
import torchvision
import transformers

HERE = pathlib.Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parents[1] / "profile"))
from carma_profile.describe import printout, torchsummary  # noqa: E402

# (file stem as the CARMA task file names the model, batch, sequence length, constructor).
# Batch and sequence are in the name only: a printout does not depend on them.
TRANSFORMERS = [
    ("BERT_base", 32, 512, lambda: transformers.BertForMaskedLM(transformers.BertConfig())),
    ("BERT_large", 8, 512, lambda: transformers.BertForMaskedLM(transformers.BertConfig(
        hidden_size=1024, num_hidden_layers=24, num_attention_heads=16,
        intermediate_size=4096))),
    ("gpt2_large", 8, 512, lambda: transformers.GPT2LMHeadModel(transformers.GPT2Config(
        n_embd=1280, n_layer=36, n_head=20))),
    ("gpt2_xl", 2, 512, lambda: transformers.GPT2LMHeadModel(transformers.GPT2Config(
        n_embd=1600, n_layer=48, n_head=25))),
    ("xlnet_large_cased", 8, 512, lambda: transformers.XLNetForSequenceClassification(
        transformers.XLNetConfig(vocab_size=32000, d_model=1024, n_layer=24, n_head=16,
                                 d_inner=4096, ff_activation="gelu"))),
]

# (file name CARMA's task files give without the batch suffix, constructor, input size).
CNNS = [
    ("resnet50", torchvision.models.resnet50, 224),
    ("vgg", torchvision.models.vgg16, 224),
    ("mobilenet", torchvision.models.mobilenet_v2, 224),
    ("efficientNet", torchvision.models.efficientnet_b0, 224),
    ("Inception", lambda: torchvision.models.inception_v3(init_weights=False), 299),
]


# Held-out jobs (carma_profile/heldout.py, measured on an H100) whose patterns the bound has rules
# or fallbacks for, written into held-out/ for estimator/tests/caveats.rs: (file, job label), and
# XLNet with its language-model head (the two-stream objective), which no job measured.
HELD_OUT = [
    ("albert_base_mlm_bs16_sl512.txt", "albert-base (masked LM)"),
    ("t5_small_bs16_sl512.txt", "t5-small (seq2seq)"),
    ("efficientnet_b3_bs32.model", "efficientnet_b3"),
]


def held_out() -> None:
    from carma_profile.heldout import HELD_OUT as JOBS

    (HERE / "held-out").mkdir(exist_ok=True)
    jobs = {job[0]: job for job in JOBS}
    for name, label in HELD_OUT:
        _, _, make, inp, _, _, _ = jobs[label]
        with torch.device("meta"):
            model = make()
        text = torchsummary(model, inp[1]) if isinstance(inp, tuple) else printout(model)
        (HERE / "held-out" / name).write_text(text)
        print(name, sum(p.numel() for p in model.parameters()))
    with torch.device("meta"):
        model = transformers.XLNetLMHeadModel(transformers.XLNetConfig(
            vocab_size=32000, d_model=768, n_layer=12, n_head=12, d_inner=3072,
            ff_activation="gelu"))
    (HERE / "held-out" / "xlnet_base_lm_head.txt").write_text(printout(model))
    print("xlnet_base_lm_head.txt", sum(p.numel() for p in model.parameters()))


def main() -> None:
    held_out()
    (HERE / "model-printouts").mkdir(exist_ok=True)
    (HERE / "model-summaries").mkdir(exist_ok=True)
    for stem, batch, seq, make in TRANSFORMERS:
        with torch.device("meta"):
            model = make()
        path = HERE / "model-printouts" / f"{stem}_bs{batch}_sl{seq}.txt"
        path.write_text(printout(model))
        print(path.name, sum(p.numel() for p in model.parameters()))
    for stem, make, size in CNNS:
        with torch.device("meta"):
            model = make()
        path = HERE / "model-summaries" / f"{stem}.model"
        path.write_text(torchsummary(model, size))
        print(path.name, sum(p.numel() for p in model.parameters()))


if __name__ == "__main__":
    main()
