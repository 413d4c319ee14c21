"""Jobs of architectures that none of carma's fitted constants has seen.

CARMA's 53 measured jobs fit the traced reservation's overheads (`calibrate.py`). The jobs
here are the test set: each one is traced on a CPU (`python -m carma_profile.calibrate
--set heldout`) and run on a real GPU (`python -m carma_profile.measure --set heldout`),
and the two are compared by `carma estimate eval --peaks`. Models are built the same way as
in `calibrate.py`: torchvision builders and Hugging Face config classes, no weights.

A job is `(label, family, factory, input, head, batch, mixed_precision)`: `input` is one
sample's (C, H, W) for a CNN or the sequence length for token models, `head` as in
`calibrate.MODELS`.
"""

from __future__ import annotations

from .calibrate import _hf, _tv

LLAMA_300M = dict(hidden_size=1024, intermediate_size=2816, num_hidden_layers=16, num_attention_heads=16,
                  num_key_value_heads=16, vocab_size=32000, max_position_embeddings=2048)
GPT2_MEDIUM = dict(n_embd=1024, n_layer=24, n_head=16)
ALBERT_BASE = dict(hidden_size=768, num_attention_heads=12, intermediate_size=3072)

# T5Config's defaults are t5-small's; the decoder starts from the pad token, as T5 does.
T5_SMALL = dict(decoder_start_token_id=0, pad_token_id=0)

IMAGENET = (3, 224, 224)

HELD_OUT = [
    # CNNs (ImageNet resolution, 1,000 classes)
    ("resnet101", "cnn", _tv("resnet101"), IMAGENET, "class", 64, False),
    ("resnet152", "cnn", _tv("resnet152"), IMAGENET, "class", 32, False),
    ("resnext50_32x4d", "cnn", _tv("resnext50_32x4d"), IMAGENET, "class", 64, False),
    ("wide_resnet50_2", "cnn", _tv("wide_resnet50_2"), IMAGENET, "class", 32, False),
    ("densenet121", "cnn", _tv("densenet121"), IMAGENET, "class", 64, False),
    ("convnext_tiny", "cnn", _tv("convnext_tiny"), IMAGENET, "class", 64, False),
    ("mobilenet_v3_large", "cnn", _tv("mobilenet_v3_large"), IMAGENET, "class", 64, False),
    ("googlenet", "cnn", _tv("googlenet", init_weights=False), IMAGENET, "class", 64, False),
    ("mnasnet1_0", "cnn", _tv("mnasnet1_0"), IMAGENET, "class", 64, False),
    ("shufflenet_v2_x1_0", "cnn", _tv("shufflenet_v2_x1_0"), IMAGENET, "class", 128, False),
    ("squeezenet1_1", "cnn", _tv("squeezenet1_1"), IMAGENET, "class", 128, False),
    ("alexnet", "cnn", _tv("alexnet"), IMAGENET, "class", 128, False),
    ("efficientnet_b3", "cnn", _tv("efficientnet_b3"), (3, 300, 300), "class", 32, False),
    ("resnet50 (bf16 autocast)", "cnn", _tv("resnet50"), IMAGENET, "class", 128, True),
    # Vision transformers
    ("vit_b_16", "transformer", _tv("vit_b_16"), IMAGENET, "class", 32, False),
    ("swin_t", "transformer", _tv("swin_t"), IMAGENET, "class", 32, False),
    # Token models, sequence length 512 unless stated
    ("roberta-base (masked LM)", "transformer", _hf("RobertaForMaskedLM", "RobertaConfig",
                                                    max_position_embeddings=514), 512, "mlm", 16, False),
    ("distilbert (masked LM)", "transformer", _hf("DistilBertForMaskedLM", "DistilBertConfig"), 512, "mlm",
     32, False),
    ("albert-base (masked LM)", "transformer", _hf("AlbertForMaskedLM", "AlbertConfig", **ALBERT_BASE), 512,
     "mlm", 16, False),
    ("gpt2 (causal LM)", "transformer", _hf("GPT2LMHeadModel", "GPT2Config"), 512, "clm", 16, False),
    ("gpt2-medium (causal LM)", "transformer", _hf("GPT2LMHeadModel", "GPT2Config", **GPT2_MEDIUM), 512, "clm",
     8, False),
    ("opt-125m (causal LM)", "transformer", _hf("OPTForCausalLM", "OPTConfig"), 512, "clm", 16, False),
    ("t5-small (seq2seq)", "transformer", _hf("T5ForConditionalGeneration", "T5Config", **T5_SMALL), 512, "mlm",
     16, False),
    ("llama 300M (causal LM)", "transformer", _hf("LlamaForCausalLM", "LlamaConfig", **LLAMA_300M), 1024, "clm",
     8, False),
    ("bert-base (masked LM, bf16 autocast)", "transformer", _hf("BertForMaskedLM", "BertConfig"), 512, "mlm", 32,
     True),
    ("gpt2 (causal LM, bf16 autocast)", "transformer", _hf("GPT2LMHeadModel", "GPT2Config"), 512, "clm", 16,
     True),
]
