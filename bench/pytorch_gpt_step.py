#!/usr/bin/env python3
# PyTorch's side of bench/compare_pytorch.sh: times one GPT-2 training step (forward, backward, clip, AdamW,
# zero_grad) on the CPU in fp32, with train_gpt's architecture and optimizer settings, on random tokens.
"""Times train_gpt's GPT-2 step in plain PyTorch (no transformers: it may be absent).

The model mirrors nn/gpt.cpp: learned positions, pre-LayerNorm blocks (attention, then a GELU-tanh MLP of 4x
width), a final LayerNorm and a head tied to the token table. The optimizer mirrors train_gpt's defaults:
AdamW with betas (0.9, 0.95), eps 1e-8, weight decay 0.1 on 2-D weights only, a constant learning rate, and
the gradient norm clipped to 1.0. The last line printed is `RESULT {json}` for the calling script.
"""
import argparse
import json
import math
import os
import statistics
import sys
import time

try:
    import torch
    import torch.nn as nn
    import torch.nn.functional as F
except ImportError as error:  # the calling script installs python3-torch; say so rather than a traceback
    sys.exit(f"pytorch_gpt_step.py: cannot import torch ({error}); install Debian's python3-torch")


class CausalSelfAttention(nn.Module):
    def __init__(self, n_embd, n_head):
        super().__init__()
        self.n_head = n_head
        self.c_attn = nn.Linear(n_embd, 3 * n_embd)
        self.c_proj = nn.Linear(n_embd, n_embd)

    def forward(self, x):
        B, T, C = x.shape
        q, k, v = self.c_attn(x).split(C, dim=2)
        head_size = C // self.n_head
        q, k, v = (t.view(B, T, self.n_head, head_size).transpose(1, 2) for t in (q, k, v))  # (B,NH,T,HS)
        # Explicit scores and softmax, as train_gpt's attention computes them: torch 1.13 (Debian's) has no
        # scaled_dot_product_attention, and a fused kernel would compare a different algorithm.
        scores = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(head_size))  # (B,NH,T,T)
        mask = torch.ones(T, T, dtype=torch.bool, device=x.device).triu(1)
        scores = scores.masked_fill(mask, float("-inf"))
        y = F.softmax(scores, dim=-1) @ v  # (B,NH,T,HS)
        return self.c_proj(y.transpose(1, 2).contiguous().view(B, T, C))


class Block(nn.Module):
    def __init__(self, n_embd, n_head):
        super().__init__()
        self.ln_1 = nn.LayerNorm(n_embd)
        self.attn = CausalSelfAttention(n_embd, n_head)
        self.ln_2 = nn.LayerNorm(n_embd)
        self.c_fc = nn.Linear(n_embd, 4 * n_embd)
        self.c_proj = nn.Linear(4 * n_embd, n_embd)

    def forward(self, x):
        x = x + self.attn(self.ln_1(x))
        return x + self.c_proj(F.gelu(self.c_fc(self.ln_2(x)), approximate="tanh"))


class GPT(nn.Module):
    def __init__(self, vocab_size, max_seq_len, n_layer, n_head, n_embd):
        super().__init__()
        self.wte = nn.Embedding(vocab_size, n_embd)
        self.wpe = nn.Embedding(max_seq_len, n_embd)
        self.h = nn.ModuleList(Block(n_embd, n_head) for _ in range(n_layer))
        self.ln_f = nn.LayerNorm(n_embd)
        for module in self.modules():  # GPT-2's initialisation; the timing does not depend on it
            if isinstance(module, (nn.Linear, nn.Embedding)):
                nn.init.normal_(module.weight, mean=0.0, std=0.02)
            if isinstance(module, nn.Linear) and module.bias is not None:
                nn.init.zeros_(module.bias)

    def forward(self, idx, targets):
        B, T = idx.shape
        x = self.wte(idx) + self.wpe(torch.arange(T, device=idx.device))
        for block in self.h:
            x = block(x)
        logits = self.ln_f(x) @ self.wte.weight.t()  # the tied head, (B,T,V)
        return F.cross_entropy(logits.view(B * T, -1), targets.view(B * T))


def main():
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--vocab-size", type=int, required=True)
    parser.add_argument("--max-seq-len", type=int, required=True)
    parser.add_argument("--n-layer", type=int, required=True)
    parser.add_argument("--n-head", type=int, required=True)
    parser.add_argument("--n-embd", type=int, required=True)
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--seq-len", type=int, default=128)
    parser.add_argument("--warmup", type=int, default=2, help="steps run and not timed")
    parser.add_argument("--steps", type=int, default=3, help="steps timed after the warm-up")
    parser.add_argument("--threads", type=int, default=os.cpu_count())
    parser.add_argument("--learning-rate", type=float, default=3e-4)
    parser.add_argument("--seed", type=int, default=42)
    args = parser.parse_args()
    if args.seq_len > args.max_seq_len:
        sys.exit(f"pytorch_gpt_step.py: --seq-len {args.seq_len} exceeds --max-seq-len {args.max_seq_len}")
    if args.steps < 1 or args.warmup < 0:
        sys.exit("pytorch_gpt_step.py: --steps must be >= 1 and --warmup >= 0")

    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    model = GPT(args.vocab_size, args.max_seq_len, args.n_layer, args.n_head, args.n_embd)
    model.train()
    decay = [p for p in model.parameters() if p.dim() == 2]  # train_gpt: weight decay on 2-D weights only
    no_decay = [p for p in model.parameters() if p.dim() != 2]
    optimizer = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1}, {"params": no_decay, "weight_decay": 0.0}],
                                  lr=args.learning_rate, betas=(0.9, 0.95), eps=1e-8)
    parameters = sum(p.numel() for p in model.parameters())
    print(f"pytorch {torch.__version__}: {parameters} parameters, {torch.get_num_threads()} threads, "
          f"B={args.batch} T={args.seq_len}, {args.warmup} warm-up + {args.steps} timed steps", flush=True)

    seconds = []
    for step in range(args.warmup + args.steps):
        # Random tokens, drawn before the clock starts (train_gpt's loader reads a shard inside its step; that
        # costs microseconds).
        tokens = torch.randint(0, args.vocab_size, (args.batch, args.seq_len + 1))
        inputs, targets = tokens[:, :-1].contiguous(), tokens[:, 1:].contiguous()
        start = time.perf_counter()
        loss = model(inputs, targets)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        optimizer.zero_grad()  # torch 1.13's default keeps the buffers and zeroes them, as train_gpt does
        elapsed = time.perf_counter() - start
        timed = step >= args.warmup
        if timed:
            seconds.append(elapsed)
        print(f"step {step + 1}: loss {loss.item():.4f}, {elapsed:.3f} s{'' if timed else ' (warm-up)'}", flush=True)

    mean = statistics.mean(seconds)
    result = {"framework": "pytorch", "torch_version": torch.__version__, "threads": torch.get_num_threads(),
              "parameters": parameters, "batch": args.batch, "seq_len": args.seq_len, "warmup": args.warmup,
              "steps": args.steps, "step_seconds": seconds, "mean_step_seconds": mean,
              "tokens_per_second": args.batch * args.seq_len / mean}
    print("RESULT " + json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
