#!/usr/bin/env python3
"""Writes tiny Llama checkpoints with Hugging Face transformers itself, plus that model's logits, loss and
parameter gradients: the oracle tests/test_llama.cpp compares libengine's Llama against.

Run with Debian's python3 (python3-torch) and transformers installed (4.45 was used):
    /usr/bin/python3 tests/golden/make_hf_llama_files.py
Output, under tests/data/:
  hf_llama_tiny/            LlamaForCausalLM, grouped-query attention (4 query heads, 2 key/value heads),
                            untied lm_head, rope_theta 500000, rms_norm_eps 1e-5, float32, save_pretrained
  hf_llama_tiny.logits      its logits and loss (the format of make_hf_gpt2_files.py: magic 'HFLG', version 1,
                            B, T, V as i32, tokens i32[B*T], labels i32[B*T], logits f32[B*T*V], loss f64)
  hf_llama_tiny.grads.safetensors  d loss / d parameter for every parameter (float32, parameter names)
  hf_llama_tiny_sharded/    the same weights saved in several shards with model.safetensors.index.json
  hf_llama_tiny_tied/       a tied-embedding variant (1 key/value head), and hf_llama_tiny_tied.logits
  hf_llama_tiny_bf16/       hf_llama_tiny's weights in bfloat16 (torch_dtype bfloat16)
  hf_llama_rope_tables.safetensors  transformers' LlamaRotaryEmbedding cos and sin (float32) for head size 64 at
                            positions 0..2047, theta 10000 and 500000 ("cos_10000", "sin_10000", ...), each
                            (2048, 32): the first half of the (2048, 64) tables, whose halves are equal
"""
import pathlib
import struct

import torch
from safetensors.torch import save_file
from transformers import LlamaConfig, LlamaForCausalLM
from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding

MAGIC, VERSION = 0x48464C47, 1
root = pathlib.Path(__file__).resolve().parents[1] / "data"


def make_model(seed, **overrides):
    torch.manual_seed(seed)
    settings = dict(vocab_size=64, hidden_size=32, intermediate_size=48, num_hidden_layers=2, num_attention_heads=4,
                    num_key_value_heads=2, max_position_embeddings=16, rms_norm_eps=1e-5, rope_theta=500000.0,
                    tie_word_embeddings=False, attention_bias=False, mlp_bias=False, hidden_act="silu",
                    attn_implementation="eager")
    settings.update(overrides)
    model = LlamaForCausalLM(LlamaConfig(**settings)).eval()
    with torch.no_grad():  # non-trivial RMSNorm gains and larger weights, so every tensor moves the logits
        for name, parameter in model.named_parameters():
            if "norm" in name:
                parameter.add_(0.2 * torch.randn_like(parameter))
            else:
                parameter.mul_(5.0)
    return model


def write_logits(path, model, tokens, labels, with_grads=None):
    output = model(input_ids=tokens, labels=labels)
    logits = output.logits.detach().float().contiguous()
    B, T = tokens.shape
    with open(path, "wb") as file:
        file.write(struct.pack("<II", MAGIC, VERSION))
        file.write(struct.pack("<iii", B, T, model.config.vocab_size))
        file.write(struct.pack(f"<{B*T}i", *tokens.flatten().tolist()))
        file.write(struct.pack(f"<{B*T}i", *labels.flatten().tolist()))
        file.write(struct.pack(f"<{logits.numel()}f", *logits.flatten().tolist()))
        file.write(struct.pack("<d", float(output.loss)))
    if with_grads is not None:
        model.zero_grad()
        output.loss.backward()
        grads = {name: p.grad.detach().float().contiguous() for name, p in model.named_parameters()}
        save_file(grads, str(with_grads))
    return float(output.loss)


B, T = 2, 12
generator = torch.Generator().manual_seed(20261202)
tokens = torch.randint(0, 64, (B, T), generator=generator)
labels = tokens.clone()
labels[1, 8:] = -100  # padding in the second row

model = make_model(1202)
model.save_pretrained(root / "hf_llama_tiny", safe_serialization=True)
model.save_pretrained(root / "hf_llama_tiny_sharded", safe_serialization=True, max_shard_size="12KB")
loss = write_logits(root / "hf_llama_tiny.logits", model, tokens, labels,
                    with_grads=root / "hf_llama_tiny.grads.safetensors")
model.to(torch.bfloat16).save_pretrained(root / "hf_llama_tiny_bf16", safe_serialization=True)

tied = make_model(1203, tie_word_embeddings=True, num_key_value_heads=1)
tied.save_pretrained(root / "hf_llama_tiny_tied", safe_serialization=True)
tied_loss = write_logits(root / "hf_llama_tiny_tied.logits", tied, tokens, labels)
tables = {}
for theta in (10000, 500000):
    rotary = LlamaRotaryEmbedding(config=LlamaConfig(hidden_size=64 * 4, num_attention_heads=4, rope_theta=float(theta),
                                                     max_position_embeddings=2048))
    positions = torch.arange(2048).unsqueeze(0)
    cos, sin = rotary(torch.zeros(1, 2048, 64, dtype=torch.float32), positions)
    assert torch.equal(cos[0, :, :32], cos[0, :, 32:]) and torch.equal(sin[0, :, :32], sin[0, :, 32:])
    tables[f"cos_{theta}"] = cos[0, :, :32].contiguous()
    tables[f"sin_{theta}"] = sin[0, :, :32].contiguous()
save_file(tables, str(root / "hf_llama_rope_tables.safetensors"))
print("wrote", root, "loss", loss, "tied loss", tied_loss)
