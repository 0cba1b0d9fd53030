#!/usr/bin/python3
"""Writes tests/data/gpt_tiny.golden: logits, causal-LM loss and every parameter gradient of a tiny GPT-2,
computed in float64 by an independent PyTorch implementation (written here from the architecture, not
from the C++ code). tests/test_golden_gpt.cpp compares the C++ engine against it without needing Python.

Run with Debian's python3-torch:  /usr/bin/python3 tests/golden/make_gpt_golden.py
The file format is in docs/FORMATS.md ("Golden file"). Everything is little-endian.
"""
import math
import os
import struct

import torch

MAGIC = 0x474F4C44  # "GOLD" read as a big-endian word
VERSION = 1

VOCAB, MAX_T, LAYERS, HEADS, WIDTH, BATCH = 37, 9, 2, 2, 12, 3
T = MAX_T
VALID_LENGTHS = [9, 6, 4]  # rows 1 and 2 are padded: label -100, input token 0
SEED = 1234
EPS = 1e-5


def parameter_shapes():
    """Names and shapes in the C++ model's named_parameters() order (HF GPT-2 names, Conv1D (in,out))."""
    C = WIDTH
    shapes = [("wte.weight", (VOCAB, C)), ("wpe.weight", (MAX_T, C))]
    for layer in range(LAYERS):
        p = f"h.{layer}."
        shapes += [
            (p + "ln_1.weight", (C,)), (p + "ln_1.bias", (C,)),
            (p + "attn.c_attn.weight", (C, 3 * C)), (p + "attn.c_attn.bias", (3 * C,)),
            (p + "attn.c_proj.weight", (C, C)), (p + "attn.c_proj.bias", (C,)),
            (p + "ln_2.weight", (C,)), (p + "ln_2.bias", (C,)),
            (p + "mlp.c_fc.weight", (C, 4 * C)), (p + "mlp.c_fc.bias", (4 * C,)),
            (p + "mlp.c_proj.weight", (4 * C, C)), (p + "mlp.c_proj.bias", (C,)),
        ]
    shapes += [("ln_f.weight", (C,)), ("ln_f.bias", (C,))]
    return shapes


def make_parameters():
    # Larger than GPT-2's 0.02 and with non-trivial LayerNorm affine terms, so that every path carries
    # a gradient well above rounding.
    parameters = {}
    for name, shape in parameter_shapes():
        if name.endswith("ln_1.weight") or name.endswith("ln_2.weight") or name == "ln_f.weight":
            value = 1.0 + 0.1 * torch.randn(shape, dtype=torch.float64)
        elif name.endswith(".bias"):
            value = 0.1 * torch.randn(shape, dtype=torch.float64)
        else:
            value = 0.3 * torch.randn(shape, dtype=torch.float64)
        parameters[name] = value.requires_grad_(True)
    return parameters


def layer_norm(x, weight, bias):
    mean = x.mean(dim=-1, keepdim=True)
    variance = ((x - mean) ** 2).mean(dim=-1, keepdim=True)  # biased, as LayerNorm
    return (x - mean) / torch.sqrt(variance + EPS) * weight + bias


def gelu_tanh(x):
    return 0.5 * x * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * x ** 3)))


def attention(qkv):
    B, T_, three_c = qkv.shape
    C = three_c // 3
    head_size = C // HEADS
    q, k, v = qkv.split(C, dim=2)
    q, k, v = [t.reshape(B, T_, HEADS, head_size).transpose(1, 2) for t in (q, k, v)]  # (B,NH,T,hs)
    scores = q @ k.transpose(-2, -1) / math.sqrt(head_size)                          # (B,NH,T,T)
    future = torch.triu(torch.ones(T_, T_, dtype=torch.bool), diagonal=1)
    scores = scores.masked_fill(future, float("-inf"))
    y = torch.softmax(scores, dim=-1) @ v                                              # (B,NH,T,hs)
    return y.transpose(1, 2).reshape(B, T_, C)


def forward(p, tokens):
    B, T_ = tokens.shape
    x = p["wte.weight"][tokens] + p["wpe.weight"][:T_]  # (B,T,C)
    for layer in range(LAYERS):
        h = f"h.{layer}."
        a = layer_norm(x, p[h + "ln_1.weight"], p[h + "ln_1.bias"])
        a = attention(a @ p[h + "attn.c_attn.weight"] + p[h + "attn.c_attn.bias"])
        x = x + a @ p[h + "attn.c_proj.weight"] + p[h + "attn.c_proj.bias"]
        m = layer_norm(x, p[h + "ln_2.weight"], p[h + "ln_2.bias"])
        m = gelu_tanh(m @ p[h + "mlp.c_fc.weight"] + p[h + "mlp.c_fc.bias"])
        x = x + m @ p[h + "mlp.c_proj.weight"] + p[h + "mlp.c_proj.bias"]
    x = layer_norm(x, p["ln_f.weight"], p["ln_f.bias"])
    return x @ p["wte.weight"].t()  # (B,T,V), tied head


def causal_lm_loss(logits, labels):
    # Position t predicts labels[t+1]; mean over the targets that are not -100.
    shifted_logits = logits[:, :-1, :].reshape(-1, VOCAB)
    shifted_labels = labels[:, 1:].reshape(-1)
    valid = shifted_labels != -100
    log_probabilities = torch.log_softmax(shifted_logits[valid], dim=-1)
    picked = log_probabilities.gather(1, shifted_labels[valid].unsqueeze(1)).squeeze(1)
    return -picked.sum() / valid.sum()


def main():
    torch.manual_seed(SEED)
    parameters = make_parameters()
    tokens = torch.randint(0, VOCAB, (BATCH, T), dtype=torch.int64)
    labels = tokens.clone()
    for row, length in enumerate(VALID_LENGTHS):
        tokens[row, length:] = 0
        labels[row, length:] = -100

    logits = forward(parameters, tokens)
    loss = causal_lm_loss(logits, labels)
    loss.backward()

    out = bytearray()
    out += struct.pack("<ii", MAGIC, VERSION)
    out += struct.pack("<7i", VOCAB, MAX_T, LAYERS, HEADS, WIDTH, BATCH, T)
    out += struct.pack(f"<{BATCH * T}i", *tokens.flatten().tolist())
    out += struct.pack(f"<{BATCH * T}i", *labels.flatten().tolist())
    names = [name for name, _ in parameter_shapes()]
    out += struct.pack("<i", len(names))
    for name in names:
        value = parameters[name].detach()
        encoded = name.encode("ascii")
        out += struct.pack("<i", len(encoded)) + encoded
        out += struct.pack("<i", value.dim()) + struct.pack(f"<{value.dim()}q", *value.shape)
        out += struct.pack(f"<{value.numel()}d", *value.flatten().tolist())
    out += struct.pack("<d", loss.item())
    for name in names:
        gradient = parameters[name].grad
        out += struct.pack(f"<{gradient.numel()}d", *gradient.flatten().tolist())
    out += struct.pack(f"<{logits.numel()}d", *logits.detach().flatten().tolist())

    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "data", "gpt_tiny.golden")
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "wb") as file:
        file.write(out)
    print(f"wrote {os.path.normpath(path)}: {len(out)} bytes, loss {loss.item():.17g}")


if __name__ == "__main__":
    main()
