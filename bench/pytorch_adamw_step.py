#!/usr/bin/env python3
"""PyTorch's side of bench/compare_host_step.sh: torch.optim.AdamW on the CPU over the same 100 tensors of 2^20
f32 parameters as bench_host_step, followed by the bf16 copy of every updated parameter (what the device's
working copy needs), timed per step, for foreach=True and foreach=False. Prints one JSON line per variant.

usage: pytorch_adamw_step.py THREADS [STEPS]"""
import json
import sys
import time

import torch

threads = int(sys.argv[1])
steps = int(sys.argv[2]) if len(sys.argv) > 2 else 5
torch.set_num_threads(threads)
count, elements = 100, 1 << 20
for foreach in (True, False):
    parameters = [torch.full((elements,), 0.01, requires_grad=True) for _ in range(count)]
    for parameter in parameters:
        parameter.grad = torch.full((elements,), 1e-3)
    working = [torch.empty(elements, dtype=torch.bfloat16) for _ in range(count)]
    optimizer = torch.optim.AdamW(parameters, lr=1e-3, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.1,
                                  foreach=foreach)
    times = []
    for step in range(steps + 1):  # the first step allocates the moments: left out
        start = time.perf_counter()
        optimizer.step()
        with torch.no_grad():
            for copy, parameter in zip(working, parameters):
                copy.copy_(parameter)
        elapsed = time.perf_counter() - start
        if step > 0:
            times.append(elapsed)
    print(json.dumps({"variant": "foreach" if foreach else "per_tensor", "threads": threads,
                      "parameters": count * elements, "seconds": min(times), "median_seconds": sorted(times)[len(times) // 2],
                      "torch": torch.__version__}))
