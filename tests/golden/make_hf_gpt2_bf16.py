#!/usr/bin/python3
"""Writes the tiny GPT-2 of make_hf_gpt2_files.py as Hugging Face stores a bf16 model, plus that model's
logits, so tests/test_hf_interop.cpp can check that a BF16 checkpoint loads (into f32 masters) and trains.

The oracle is transformers itself: it loads tests/data/hf_gpt2_tiny (F32), converts it with
model.to(torch.bfloat16) (round to nearest even), saves it with save_pretrained (BF16 safetensors,
config.json torch_dtype bfloat16), then computes the logits of those bf16 weights widened back to float32,
in float32, on the same tokens as hf_gpt2_tiny.logits.

Run with Debian's python3-torch and pip's transformers:
    /usr/bin/python3 tests/golden/make_hf_gpt2_bf16.py
Output: tests/data/hf_gpt2_tiny_bf16/{model.safetensors,config.json},
        tests/data/hf_gpt2_tiny_bf16.logits (the hf_gpt2_tiny.logits format: magic 'HFLG', version 1, B, T, V,
        tokens, labels, logits f32, loss f64)
"""
import pathlib
import struct

import torch
from transformers import GPT2LMHeadModel

MAGIC, VERSION = 0x48464C47, 1
root = pathlib.Path(__file__).resolve().parents[1] / "data"

model = GPT2LMHeadModel.from_pretrained(root / "hf_gpt2_tiny", torch_dtype=torch.float32).eval()
bf16 = model.to(torch.bfloat16)
bf16.save_pretrained(root / "hf_gpt2_tiny_bf16", safe_serialization=True)

# The reference tokens and labels of the F32 checkpoint's file.
with open(root / "hf_gpt2_tiny.logits", "rb") as file:
    magic, version = struct.unpack("<II", file.read(8))
    assert (magic, version) == (MAGIC, VERSION)
    B, T, V = struct.unpack("<iii", file.read(12))
    tokens = torch.tensor(struct.unpack(f"<{B*T}i", file.read(4 * B * T))).reshape(B, T)
    labels = torch.tensor(struct.unpack(f"<{B*T}i", file.read(4 * B * T))).reshape(B, T)

widened = GPT2LMHeadModel.from_pretrained(root / "hf_gpt2_tiny_bf16", torch_dtype=torch.float32).eval()
with torch.no_grad():
    output = widened(input_ids=tokens, labels=labels)
logits = output.logits.float().contiguous()
with open(root / "hf_gpt2_tiny_bf16.logits", "wb") as file:
    file.write(struct.pack("<II", MAGIC, VERSION))
    file.write(struct.pack("<iii", B, T, V))
    file.write(struct.pack(f"<{B*T}i", *tokens.flatten().tolist()))
    file.write(struct.pack(f"<{B*T}i", *labels.flatten().tolist()))
    file.write(struct.pack(f"<{logits.numel()}f", *logits.flatten().tolist()))
    file.write(struct.pack("<d", float(output.loss)))
print("wrote", root / "hf_gpt2_tiny_bf16", "loss", float(output.loss))
