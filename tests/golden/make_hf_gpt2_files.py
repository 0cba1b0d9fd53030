#!/usr/bin/env python3
"""Writes a tiny GPT-2 checkpoint with Hugging Face transformers itself, plus that model's logits and loss.

tests/test_hf_interop.cpp loads the checkpoint (HF's own safetensors: `transformer.` prefix, tied
lm_head dropped by HF's serializer) into libengine's GPT and compares against these logits: the oracle is
transformers' GPT2LMHeadModel, not our code.

Run with Debian's python3 and transformers installed:
    /usr/bin/python3 tests/golden/make_hf_gpt2_files.py
Output: tests/data/hf_gpt2_tiny/model.safetensors, tests/data/hf_gpt2_tiny/config.json,
        tests/data/hf_gpt2_tiny.logits  (little-endian: magic u32 0x48464C47 'HFLG', version u32 1,
        B, T, V as i32, tokens i32[B*T], labels i32[B*T], logits f32[B*T*V], loss f64)
"""
import pathlib
import struct

import torch
from transformers import GPT2Config, GPT2LMHeadModel

MAGIC, VERSION = 0x48464C47, 1
root = pathlib.Path(__file__).resolve().parents[1] / "data"
out_dir = root / "hf_gpt2_tiny"

torch.manual_seed(20261129)
config = GPT2Config(vocab_size=64, n_positions=16, n_embd=32, n_layer=2, n_head=4, activation_function="gelu_new",
                    resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0, layer_norm_epsilon=1e-5)
model = GPT2LMHeadModel(config).eval()
with torch.no_grad():  # non-trivial LayerNorm parameters so every tensor matters
    for name, parameter in model.named_parameters():
        if "ln" in name:
            parameter.add_(0.1 * torch.randn_like(parameter))
model.save_pretrained(out_dir, safe_serialization=True)

B, T = 2, 12
tokens = torch.randint(0, config.vocab_size, (B, T))
labels = tokens.clone()
labels[1, 9:] = -100  # padding in the second row
with torch.no_grad():
    output = model(input_ids=tokens, labels=labels)
logits = output.logits.float().contiguous()

with open(root / "hf_gpt2_tiny.logits", "wb") as file:
    file.write(struct.pack("<II", MAGIC, VERSION))
    file.write(struct.pack("<iii", B, T, config.vocab_size))
    file.write(struct.pack(f"<{B*T}i", *tokens.flatten().tolist()))
    file.write(struct.pack(f"<{B*T}i", *labels.flatten().tolist()))
    file.write(struct.pack(f"<{logits.numel()}f", *logits.flatten().tolist()))
    file.write(struct.pack("<d", float(output.loss)))
print("wrote", out_dir, "loss", float(output.loss))
