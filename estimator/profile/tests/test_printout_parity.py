"""describe() on XLNet-base (Hugging Face) against GPUMemNet's printout of that model
(shared/data/model-printouts), which the Rust printout parser reads."""

import re

import torch
import transformers

from carma_profile import describe

PRINTOUT = "model-printouts/xlnet_base_cased_bs8_sl512.txt"


def xlnet_base():
    cfg = transformers.XLNetConfig(vocab_size=32000, d_model=768, n_layer=12, n_head=12,
                                   d_inner=3072, ff_activation="gelu")
    torch.manual_seed(0)
    return transformers.XLNetForSequenceClassification(cfg)


def test_xlnet_base_equals_its_printout(shared):
    text = (shared / PRINTOUT).read_text()
    printed = {kind: len(re.findall(rf"\): \w*{kind}\(", text))
               for kind in ("Linear", "LayerNorm", "Dropout", "Attention")}
    total = int(re.search(r"^\), ([\d,]+) params$", text, re.M).group(1).replace(",", ""))
    model = xlnet_base()
    p = describe(model, 8, seq_len=32)  # counts and parameters do not depend on the length
    assert p["family"] == "transformer" and p["activation"] == "GELU"
    assert p["parameters"] == total == 117_310_466
    assert p["layers"]["linear"] == printed["Linear"] == 26
    assert p["layers"]["layerNorm"] == printed["LayerNorm"] == 24
    assert p["layers"]["attention"] == printed["Attention"] == 12
    # The printout lists every module; describe() counts the ones a forward pass calls,
    # as the datagen does. XLNetLayer's own `dropout` is defined but never called.
    called = set()
    hooks = [layer.dropout.register_forward_hook(lambda m, i, o: called.add(id(m)))
             for layer in model.transformer.layer]
    describe(model, 8, seq_len=32)
    for h in hooks:
        h.remove()
    assert not called
    assert p["layers"]["dropout"] == printed["Dropout"] - len(model.transformer.layer) == 26
