#!/usr/bin/env python3
"""ctest hf_roundtrip: a checkpoint written by transformers trains in train_gpt, and the result loads back
into transformers' GPT2LMHeadModel with every weight accounted for and equal to what train_gpt saved.

usage: hf_roundtrip.py TRAIN_GPT DATA_DIR WORK_DIR
Exits 77 (ctest: skipped) when torch, transformers or safetensors is not importable.
"""
import shutil
import subprocess
import sys

from roundtrip_setup import prepare

try:
    import torch
    from safetensors.torch import load_file
    from transformers import GPT2LMHeadModel
except ImportError as error:
    print(f"skipped: {error}")
    sys.exit(77)

train_gpt, data_dir, work, tokens = prepare(7)
(work / "out").mkdir()
source = data_dir / "hf_gpt2_tiny"

command = [train_gpt, "--vocab-size", "64", "--max-seq-len", "16", "--n-layer", "2", "--n-head", "4", "--n-embd", "32",
           "--init", str(source / "model.safetensors"), "--data", str(work / "train.bin"), "--seq-len", "16",
           "--per-device-train-batch-size", "4", "--gradient-accumulation-steps", "2", "--max-steps", "4",
           "--learning-rate", "1e-2", "--device", "cpu", "--save", str(work / "out" / "model.safetensors")]
completed = subprocess.run(command, capture_output=True, text=True)
print(completed.stdout[-2000:], completed.stderr[-2000:])
if completed.returncode != 0:
    sys.exit(f"train_gpt failed with {completed.returncode}")

shutil.copy(source / "config.json", work / "out" / "config.json")
model, info = GPT2LMHeadModel.from_pretrained(work / "out", output_loading_info=True)
missing = [key for key in info["missing_keys"] if not key.endswith((".attn.bias", ".attn.masked_bias"))]
if missing or info["unexpected_keys"] or info["mismatched_keys"] or info["error_msgs"]:
    sys.exit(f"transformers could not load every weight: {info}")

saved = load_file(work / "out" / "model.safetensors")
original = load_file(source / "model.safetensors")
state = model.state_dict()
changed = 0
for name, tensor in saved.items():
    loaded = state["transformer." + name]
    if not torch.equal(loaded, tensor):
        sys.exit(f"{name}: transformers holds different values from the file train_gpt wrote")
    changed += not torch.equal(tensor, original["transformer." + name])
if not torch.equal(state["lm_head.weight"], saved["wte.weight"]):
    sys.exit("lm_head is not tied to wte after loading")
if changed == 0:
    sys.exit("train_gpt saved the initial weights unchanged: it did not train")
with torch.no_grad():
    logits = model(torch.tensor([tokens[:16]])).logits
if not torch.isfinite(logits).all():
    sys.exit("non-finite logits from the round-tripped model")
print(f"round trip ok: {len(saved)} tensors loaded back, {changed} changed by training")
