#!/usr/bin/env python3
"""ctest peft_roundtrip: LoRA through train_gpt against PEFT itself. On the tiny Llama and GPT-2 directories
train_gpt trains adapters (--lora-r, --lora-target-modules) and writes them (--save-adapter) with the merged model
(--merge); then PEFT's PeftModel.from_pretrained loads the adapter onto transformers' base model with every tensor
accounted for, the adapters changed by training, and its logits (base plus the unmerged adapter path, PEFT's
arithmetic) equal to those of the merged directory libengine wrote, loaded by transformers. An adapter PEFT wrote
(tests/data/peft_llama_lora) continues training in train_gpt through --init-adapter. QLoRA (--load-in-4bit): the
adapter trained over the NF4 base loads in PEFT onto the dense base, whose logits equal --merge's directory.

usage: peft_roundtrip.py TRAIN_GPT DATA_DIR WORK_DIR
Exits 77 (ctest: skipped) when torch, transformers, peft or safetensors is not importable.
"""
import json
import subprocess
import sys

from roundtrip_setup import prepare

try:
    import torch
    from peft import PeftModel
    from safetensors.torch import load_file
    from transformers import AutoModelForCausalLM
except ImportError as error:
    print(f"skipped: {error}")
    sys.exit(77)

train_gpt, data_dir, work, tokens = prepare(11)


def run(arguments):
    command = [train_gpt, "--data", str(work / "train.bin"), "--seq-len", "16", "--per-device-train-batch-size", "4",
               "--gradient-accumulation-steps", "2", "--max-steps", "4", "--learning-rate", "1e-2", "--device", "cpu"]
    completed = subprocess.run(command + arguments, capture_output=True, text=True)
    print(completed.stdout[-1200:], completed.stderr[-1200:])
    if completed.returncode != 0:
        sys.exit(f"train_gpt {' '.join(arguments)} failed with {completed.returncode}")


def check(name, base, targets, extra=()):
    adapter, merged = work / f"{name}_adapter", work / f"{name}_merged"
    run(["--init", str(base), "--lora-r", "4", "--lora-alpha", "16", "--lora-dropout", "0.1",
         "--lora-target-modules", ",".join(targets), "--gradient-checkpointing",
         "--save-adapter", str(adapter), "--merge", str(merged), *extra])
    config = json.loads((adapter / "adapter_config.json").read_text())
    if config["r"] != 4 or config["lora_alpha"] != 16 or sorted(config["target_modules"]) != sorted(targets):
        sys.exit(f"{adapter}: adapter_config.json does not say what was trained: {config}")
    saved = load_file(adapter / "adapter_model.safetensors")
    if not any(key.endswith("lora_B.weight") and torch.count_nonzero(value) > 0 for key, value in saved.items()):
        sys.exit(f"{adapter}: every lora_B is still zero: the adapters did not train")
    model = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(base), adapter).eval()
    state = {key.replace(".default", ""): value for key, value in model.state_dict().items() if "lora_" in key}
    if sorted(state) != sorted(saved):
        sys.exit(f"{adapter}: PEFT's adapter tensors {sorted(state)[:4]}... differ from the file's {sorted(saved)[:4]}...")
    for key, value in saved.items():
        if not torch.equal(state[key], value):
            sys.exit(f"{adapter}: {key}: PEFT holds different values from the file train_gpt wrote")
    merged_model = AutoModelForCausalLM.from_pretrained(merged).eval()
    batch = torch.tensor([tokens[:16], tokens[100:116]])
    with torch.no_grad():
        adapted_logits = model(batch).logits
        merged_logits = merged_model(batch).logits
    error = float((adapted_logits - merged_logits).abs().max() / adapted_logits.abs().max())
    print(f"{name}: {len(saved)} adapter tensors loaded by PEFT; PEFT's logits and libengine's merged model's differ "
          f"by {error:.3g} of the largest")
    if not error < 1e-5:
        sys.exit(f"{name}: PEFT's adapted logits and libengine's merged model's differ by {error:.3g}")


check("llama", data_dir / "hf_llama_tiny", ["q_proj", "v_proj", "down_proj"])
check("gpt2", data_dir / "hf_gpt2_tiny", ["c_attn", "c_fc"])
# QLoRA: adapters trained over the NF4 base load onto the dense base in PEFT (as PEFT users merge a QLoRA adapter
# into the bf16 base), and --merge writes that dense merge. The 4-bit base must have changed what was learned.
check("llama_qlora", data_dir / "hf_llama_tiny", ["q_proj", "v_proj", "down_proj"], ["--load-in-4bit"])
dense = load_file(work / "llama_adapter" / "adapter_model.safetensors")
quantised = load_file(work / "llama_qlora_adapter" / "adapter_model.safetensors")
if sorted(dense) != sorted(quantised) or all(torch.equal(dense[key], quantised[key]) for key in dense):
    sys.exit("--load-in-4bit: the adapter trained over the NF4 base has other names or equals the dense base's")
# PEFT's own adapter continues training in train_gpt, and is written back in PEFT's names.
run(["--init", str(data_dir / "hf_llama_tiny"), "--init-adapter", str(data_dir / "peft_llama_lora"),
     "--save-adapter", str(work / "continued")])
continued = load_file(work / "continued" / "adapter_model.safetensors")
original = load_file(data_dir / "peft_llama_lora" / "adapter_model.safetensors")
if sorted(continued) != sorted(original) or all(torch.equal(continued[key], original[key]) for key in original):
    sys.exit("--init-adapter: the continued adapter has other names or did not train")
print("peft round trips ok")
