#!/usr/bin/env python3
"""Writes LoRA adapters with PEFT itself on the tiny transformers models of tests/data, with the adapted models'
logits, loss and every adapter gradient: the oracle tests/test_peft.cpp compares libengine's LoRA against.

Run with Debian's python3 (python3-torch) and pip's peft 0.7.1, transformers 4.36.2 (scripts/install_deps.sh):
    /usr/bin/python3 tests/golden/make_peft_lora_files.py
Output, under tests/data/, for NAME in llama (hf_llama_tiny; q_proj, v_proj, down_proj) and gpt2
(hf_gpt2_tiny; c_attn, c_proj, c_fc):
  peft_NAME_lora/                 PeftModel.save_pretrained: adapter_config.json (r 4, lora_alpha 8, dropout 0) and
                                  adapter_model.safetensors, lora_B drawn non-zero so that it moves the logits
  peft_NAME_lora.logits           the adapted model's logits and loss (the HFLG format of make_hf_gpt2_files.py)
  peft_NAME_lora.grads.safetensors  d loss / d adapter tensor, under the adapter file's names
"""
import pathlib
import struct

import torch
from peft import LoraConfig, get_peft_model
from safetensors.torch import save_file
from transformers import AutoModelForCausalLM

MAGIC, VERSION = 0x48464C47, 1
root = pathlib.Path(__file__).resolve().parents[1] / "data"


def write_logits(path, logits, loss, tokens, labels, vocabulary):
    B, T = tokens.shape
    with open(path, "wb") as file:
        file.write(struct.pack("<II", MAGIC, VERSION))
        file.write(struct.pack("<iii", B, T, vocabulary))
        file.write(struct.pack(f"<{B*T}i", *tokens.flatten().tolist()))
        file.write(struct.pack(f"<{B*T}i", *labels.flatten().tolist()))
        file.write(struct.pack(f"<{logits.numel()}f", *logits.flatten().tolist()))
        file.write(struct.pack("<d", float(loss)))


def make(name, base, targets, seed):
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_pretrained(root / base, torch_dtype=torch.float32)
    peft_model = get_peft_model(model, LoraConfig(r=4, lora_alpha=8, lora_dropout=0.0, target_modules=targets,
                                                  task_type="CAUSAL_LM"))
    with torch.no_grad():  # lora_B starts at zero: give it values so that the adapters move the logits
        for parameter_name, parameter in peft_model.named_parameters():
            if "lora_B" in parameter_name:
                parameter.copy_(0.5 * torch.randn_like(parameter))
    peft_model.peft_config["default"].base_model_name_or_path = f"tests/data/{base}"  # not this machine's path
    peft_model.eval()  # dropout is 0; eval keeps every other path deterministic too
    peft_model.save_pretrained(root / f"peft_{name}_lora", safe_serialization=True)
    (root / f"peft_{name}_lora" / "README.md").unlink()  # the model card: nothing a test reads, and this machine's path
    vocabulary = model.config.vocab_size
    generator = torch.Generator().manual_seed(seed + 1)
    tokens = torch.randint(0, vocabulary, (2, 12), generator=generator)
    labels = tokens.clone()
    labels[1, 8:] = -100  # padding in the second row
    output = peft_model(input_ids=tokens, labels=labels)
    write_logits(root / f"peft_{name}_lora.logits", output.logits.detach().float(), output.loss, tokens, labels,
                 vocabulary)
    output.loss.backward()
    grads = {}
    for parameter_name, parameter in peft_model.named_parameters():
        if parameter.requires_grad:  # PEFT's file names: the adapter name ("default") left out
            grads[parameter_name.replace(".default", "")] = parameter.grad.detach().float().contiguous()
    save_file(grads, str(root / f"peft_{name}_lora.grads.safetensors"))
    print("wrote", name, "loss", float(output.loss), len(grads), "gradients")


make("llama", "hf_llama_tiny", ["q_proj", "v_proj", "down_proj"], 2812)
make("gpt2", "hf_gpt2_tiny", ["c_attn", "c_proj", "c_fc"], 2813)
