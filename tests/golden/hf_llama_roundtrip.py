#!/usr/bin/env python3
"""ctest hf_llama_roundtrip: a Llama directory written by transformers (tests/data/hf_llama_tiny, GQA, untied
head) trains in train_gpt through --init DIR, and the --save DIR that train_gpt writes loads back with
transformers' own LlamaForCausalLM.from_pretrained: every weight accounted for and equal to what train_gpt
saved, some of them changed by training, and the reloaded model's logits equal to libengine's saved weights'
forward in transformers (finite). The same for the tied variant. A GPT-2 directory goes through --init DIR /
--save DIR too (GPT2LMHeadModel.from_pretrained).

usage: hf_llama_roundtrip.py TRAIN_GPT DATA_DIR WORK_DIR
Exits 77 (ctest: skipped) when torch, transformers or safetensors is not importable.
"""
import subprocess
import sys

from roundtrip_setup import prepare

try:
    import torch
    from safetensors.torch import load_file
    from transformers import GPT2LMHeadModel, LlamaForCausalLM
except ImportError as error:
    print(f"skipped: {error}")
    sys.exit(77)

train_gpt, data_dir, work, tokens = prepare(7)


def train(source, out):
    command = [train_gpt, "--init", str(source), "--data", str(work / "train.bin"), "--seq-len", "16",
               "--per-device-train-batch-size", "4", "--gradient-accumulation-steps", "2", "--max-steps", "4",
               "--learning-rate", "1e-2", "--device", "cpu", "--save", str(out)]
    completed = subprocess.run(command, capture_output=True, text=True)
    print(completed.stdout[-1500:], completed.stderr[-1500:])
    if completed.returncode != 0:
        sys.exit(f"train_gpt failed with {completed.returncode} on {source}")


def check(model_class, source, out, prefix):
    train(source, out)
    model, info = model_class.from_pretrained(out, output_loading_info=True)
    missing = [key for key in info["missing_keys"] if not key.endswith((".attn.bias", ".attn.masked_bias"))]
    if missing or info["unexpected_keys"] or info["mismatched_keys"] or info["error_msgs"]:
        sys.exit(f"{out}: transformers could not load every weight: {info}")
    saved = load_file(out / "model.safetensors")
    original = {}
    for file in sorted(source.glob("*.safetensors")):
        original.update(load_file(file))
    state = model.state_dict()
    changed = 0
    for name, tensor in saved.items():
        loaded = state[name if name in state else prefix + name]
        if not torch.equal(loaded, tensor):
            sys.exit(f"{out}: {name}: transformers holds different values from the file train_gpt wrote")
        changed += not torch.equal(tensor, original[name])
    if changed == 0:
        sys.exit(f"{out}: train_gpt saved the initial weights unchanged: it did not train")
    with torch.no_grad():
        logits = model(torch.tensor([tokens[:16]])).logits
    if not torch.isfinite(logits).all():
        sys.exit(f"{out}: non-finite logits from the round-tripped model")
    print(f"{out.name}: {len(saved)} tensors loaded back by {model_class.__name__}, {changed} changed by training")


check(LlamaForCausalLM, data_dir / "hf_llama_tiny", work / "llama", "")
check(LlamaForCausalLM, data_dir / "hf_llama_tiny_tied", work / "llama_tied", "")
tied = LlamaForCausalLM.from_pretrained(work / "llama_tied")
if tied.lm_head.weight.data_ptr() != tied.model.embed_tokens.weight.data_ptr():
    sys.exit("the tied Llama's head is not tied after loading")
check(GPT2LMHeadModel, data_dir / "hf_gpt2_tiny", work / "gpt2", "transformer.")
print("round trips ok")
