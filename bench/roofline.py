#!/usr/bin/env python3
"""The roofline model of a GPT-2 training step on one H200 (docs/PERF.md): every CUDA kernel the step
launches, with its FLOPs and the bytes it moves, its lower bound (max of FLOPs / peak and bytes / bandwidth),
and a predicted time (the bound divided by the efficiency this kernel class is expected to reach). Written
before any GPU run; bench/gpu_check.sh prints its benchmark predictions beside what the GPU measures.

  roofline.py step [--batch 16] [--seq 1024] [--math tf32|fp32|bf16] [--recompute 0|1] [--markdown]

bf16 is mixed precision (--precision bf16): bf16 tensor cores for the GEMMs and attention, bf16 activations
(half the bytes of every activation stream), f32 weight gradients out of the weight GEMMs, and the f32
masters, moments and gradients in the optimizer's streams; the update writes the bf16 working copies and the
zeroed gradients in its own pass (the step's epilogue).
  roofline.py benchmarks   JSON: benchmark name -> predicted microseconds, for bench_kernels_cuda's shapes
"""
import argparse
import json
import sys

# H200 SXM ceilings (device/H200.md): HBM3e bandwidth and dense tensor-core or CUDA-core rates.
BANDWIDTH = 4.3e12  # bytes/s
PEAK = {"tf32": 495e12, "fp32": 67e12, "bf16": 990e12}
LAUNCH_GAP_S = 2e-6  # back-to-back kernels on one stream: the device-side gap between two launches
# What the step really queues (kernels, cuBLAS calls, memsets and copies; not events), counted by the emulated device
# for GPT-2 124M's step in bf16 (tests/cuda_emulator/test_step_census.cpp, 2026-12-07): a fixed part, a count per
# layer (no recompute, every layer recomputed) and the multi-tensor launches (the gradient norm's 4, the AdamW
# update's 3: one per 64 of the 148 parameter tensors, which also writes the bf16 copies and zeroes the gradients).
# The kernels modelled below are fewer (15 memsets and the small reductions are lumped or left out), so the launch
# gaps are charged on the census; their bytes are still the modelled kernels' only.
CENSUS_FIXED, CENSUS_PER_LAYER, CENSUS_LISTS = 25, {0: 39, 1: 49}, 7
LLM_C_TOKENS_PER_S = 470e3  # llm.c, GPT-2 124M, bf16, one H100 (the reference figure)

# Predicted efficiency of each class of kernel: the fraction of its bound it reaches. These are the
# predictions the first GPU run tests; each is argued in docs/PERF.md.
EFFICIENCY = {
    "gemm": 0.60,            # cuBLAS at these shapes: 60% of the tensor-core peak (fp32: 75% of the CUDA cores')
    "gemm_fp32": 0.75,
    "memory": 0.75,          # streaming kernels with 128-bit accesses: 75% of HBM bandwidth
    "reduction": 0.50,       # two-pass partial sums: the second pass and the tails cost a quarter more
}
# Attention is bound by shared-memory traffic and mma issue in the wmma kernels, not by HBM or the tensor
# cores' peak: its predicted rates come from the kernels' own analysis (docs/PERF.md, "Tensor-core attention:
# second round"), in FLOP/s of the conventional count (forward 4·T²/2·d per head, backward 2.5x that);
# 3xTF32 (fp32-accurate) runs three mmas per step, about half the rate.
# bf16 wmma (m16n16k16): twice the k per mma of tf32's m16n16k8 and half the shared-memory bytes per element,
# so the same kernels are predicted at 1.6x the tf32 rates (the softmax work per tile is unchanged).
ATTENTION_RATE = {"tf32": {"forward": 75e12, "backward": 30e12}, "fp32": {"forward": 37e12, "backward": 15e12},
                  "bf16": {"forward": 120e12, "backward": 48e12}}

F32 = 4
BF16 = 2


def activation_bytes(math):
    return BF16 if math == "bf16" else F32


class Kernel:
    def __init__(self, name, flops, bytes_moved, kind, count=1, rate=None):
        self.name, self.flops, self.bytes, self.kind, self.count, self.rate = name, flops, bytes_moved, kind, count, rate

    def bound_s(self, math):
        peak = PEAK[math]
        return max(self.flops / peak, self.bytes / BANDWIDTH)

    def predicted_s(self, math):
        if self.rate is not None:  # attention: its own predicted rate
            return max(self.flops / self.rate, self.bytes / (EFFICIENCY["memory"] * BANDWIDTH))
        if self.kind == "gemm":
            efficiency = EFFICIENCY["gemm"] if math != "fp32" else EFFICIENCY["gemm_fp32"]  # bf16 as tf32: 60%
            return max(self.flops / (efficiency * PEAK[math]), self.bytes / (EFFICIENCY["memory"] * BANDWIDTH))
        return self.bound_s(math) / EFFICIENCY[self.kind]


def gemm(name, m, n, k, count=1, accumulate=False, element=F32, output_element=None):
    # Each operand read once and the result written once (read too when it accumulates, beta = 1).
    output_element = element if output_element is None else output_element
    bytes_moved = element * (m * k + k * n) + output_element * m * n * (2 if accumulate else 1)
    return Kernel(name, 2.0 * m * n * k, bytes_moved, "gemm", count)


def stream(name, elements, passes, count=1, kind="memory", element=F32):
    return Kernel(name, 0.0, element * elements * passes, kind, count)


def attention(batch, seq, heads, head_size, math, count):
    element = activation_bytes(math)  # qkv, out and their gradients
    forward_flops = 4.0 * batch * heads * (seq * (seq + 1) / 2) * head_size
    qkv = 3 * batch * seq * heads * head_size
    out = batch * seq * heads * head_size
    rates = ATTENTION_RATE[math]
    return [
        Kernel("attention forward", forward_flops, element * (qkv + out), "attention", count, rates["forward"]),
        # reads qkv, out, dout, logsumexp; dqkv += (read and written)
        Kernel("attention backward", 2.5 * forward_flops, element * (qkv + 2 * out + 2 * qkv), "attention", count,
               rates["backward"]),
    ]


def step_kernels(batch, seq, math, recompute, layers=12, width=768, heads=12, vocabulary=50257):
    padded_vocabulary = (vocabulary + 127) // 128 * 128
    n = batch * seq  # tokens
    c = width
    forwards = 1 + recompute  # a checkpointed block runs its forward twice
    L = layers
    a = activation_bytes(math)
    w = F32  # the weight gradients' element: f32 also under bf16 (they accumulate there)

    def gemm(name, m, n, k, count=1, accumulate=False, weight_gradient=False):
        return globals()["gemm"](name, m, n, k, count, accumulate, a, w if weight_gradient else a)

    def stream(name, elements, passes, count=1, kind="memory"):
        return globals()["stream"](name, elements, passes, count, kind, a)

    kernels = [
        stream("embedding forward", n * c, 3),  # token row + position row read, out written
        stream("embedding backward", n * c, 3, kind="reduction"),  # dout read, table rows += (read, written)
    ]
    for direction, count in (("forward", L * forwards), ("backward", L)):
        if direction == "forward":
            kernels += [
                stream("layernorm forward", n * c, 2, 2 * count),  # x read, y written (means, rstd: negligible)
                # each linear's bias is added in its GEMM's cuBLASLt epilogue: no separate pass over the output
                gemm("qkv gemm", n, 3 * c, c, count),
                gemm("attention projection gemm", n, c, c, count),
                stream("residual forward", n * c, 3, 2 * count),
                gemm("fc gemm", n, 4 * c, c, count),
                stream("gelu forward", n * 4 * c, 2, count),
                gemm("fc projection gemm", n, c, 4 * c, count),
            ]
            kernels += attention(batch, seq, heads, c // heads, math, count)[:1]
        else:
            kernels += [
                # dx (+=): dout, x read, dx read and written; dγ/dβ partials fused in the same pass
                stream("layernorm backward", n * c, 4, 2 * count, kind="reduction"),
                # each linear: dinput = dout·Wᵀ, written (β = 0: each is its input's first gradient) and dW += xᵀ·dout
                gemm("qkv gemm dinput", n, c, 3 * c, count), gemm("qkv gemm dweight", c, 3 * c, n, count, True, weight_gradient=True),
                gemm("attention projection gemm dinput", n, c, c, count),
                gemm("attention projection gemm dweight", c, c, n, count, True, weight_gradient=True),
                gemm("fc gemm dinput", n, c, 4 * c, count), gemm("fc gemm dweight", c, 4 * c, n, count, True, weight_gradient=True),
                gemm("fc projection gemm dinput", n, 4 * c, c, count),
                gemm("fc projection gemm dweight", 4 * c, c, n, count, True, weight_gradient=True),
                stream("bias backward (all four)", n * 9 * c, 1, count, kind="reduction"),
                stream("gelu backward", n * 4 * c, 3, count),  # dout, x read; dx written (its first gradient)
                # both inputs' first gradients: dout copied into each (a copy, not a kernel)
                stream("residual backward (dout copied)", n * c, 2, 4 * count),
            ]
            kernels += attention(batch, seq, heads, c // heads, math, count)[1:]
    kernels += [
        stream("layernorm forward (ln_f)", n * c, 2), stream("layernorm backward (ln_f)", n * c, 4, kind="reduction"),
        gemm("lm head gemm", n, padded_vocabulary, c),
        # the fused classifier: logits read twice (max/sum, then the gradient) and written once, in place
        stream("fused classifier", n * padded_vocabulary, 3),
        gemm("lm head gemm dinput", n, c, padded_vocabulary, 1),
        gemm("lm head gemm dweight", padded_vocabulary, c, n, 1, True, weight_gradient=True),
    ]
    parameters = 12 * L * c * c + 13 * L * c + (padded_vocabulary + 1024) * c + 2 * c
    optimizer_stream = globals()["stream"]  # masters, gradients and moments are f32 in every mode
    # The update with its epilogue: param, grad, m, v read; param, m, v written; the gradient zeroed and (bf16) the
    # working copy written in the same pass, one launch per 64 tensors.
    update_bytes = 8 * F32 + (BF16 if math == "bf16" else 0)
    kernels += [
        optimizer_stream("gradient norm (sum of squares)", parameters, 1, kind="reduction"),
        Kernel("adamw update, copies and zeroed gradients", 0.0, update_bytes * parameters / 3, "memory", 3),
    ]
    return kernels


def model_flops_per_token(seq, layers=12, width=768, vocabulary=50257):
    # 6 per parameter per token (forward + backward) plus causal attention's QKᵀ and PV (PaLM's count, halved
    # for causality): what MFU is measured against. Recomputation is not useful work and does not count.
    parameters = 12 * layers * width * width + vocabulary * width
    return 6 * parameters + 6 * layers * seq * width


def step_report(args):
    kernels = step_kernels(args.batch, args.seq, args.math, args.recompute)
    tokens = args.batch * args.seq
    rows = []
    bound_total = predicted_total = 0.0
    launches = 0
    for kernel in kernels:
        bound = kernel.bound_s(args.math) * kernel.count
        predicted = kernel.predicted_s(args.math) * kernel.count
        bound_total += bound
        predicted_total += predicted
        launches += kernel.count
        rows.append((kernel.name, kernel.count, kernel.flops * kernel.count / 1e9, kernel.bytes * kernel.count / 1e9,
                     bound * 1e3, predicted * 1e3))
    census = CENSUS_FIXED + CENSUS_PER_LAYER[args.recompute] * 12 + CENSUS_LISTS if args.math == "bf16" else launches
    predicted_total += max(census, launches) * LAUNCH_GAP_S
    rows.sort(key=lambda row: -row[5])
    useful = model_flops_per_token(args.seq) * tokens
    tokens_per_s = tokens / predicted_total
    mfu = useful / predicted_total / PEAK[args.math]
    if args.markdown:
        print("| kernel | launches | GFLOP | GB | bound ms | predicted ms | share |")
        print("|---|---:|---:|---:|---:|---:|---:|")
        for name, count, gflop, gb, bound, predicted in rows:
            print(f"| {name} | {count} | {gflop:.1f} | {gb:.2f} | {bound:.2f} | {predicted:.2f} | "
                  f"{100 * predicted / (predicted_total * 1e3):.1f}% |")
    else:
        for name, count, gflop, gb, bound, predicted in rows:
            print(f"{name:36s} x{count:<4d} {gflop:9.1f} GFLOP {gb:8.2f} GB  bound {bound:7.2f} ms  "
                  f"predicted {predicted:7.2f} ms  ({100 * predicted / (predicted_total * 1e3):4.1f}%)")
    counted = f"{launches} launches modelled, {census} in the step's census" if census != launches else f"{launches} launches"
    print(f"\nB={args.batch} T={args.seq} math={args.math} recompute={args.recompute}: {counted}; "
          f"bound {bound_total * 1e3:.1f} ms, predicted {predicted_total * 1e3:.1f} ms per step; "
          f"{tokens_per_s / 1e3:.0f}K tokens/s; MFU {100 * mfu:.1f}% of {PEAK[args.math] / 1e12:.0f} TFLOP/s; "
          f"{tokens_per_s / LLM_C_TOKENS_PER_S:.2f}x llm.c's {LLM_C_TOKENS_PER_S / 1e3:.0f}K (bf16, H100)")


def benchmark_predictions():
    """bench/cuda/bench_kernels_cuda.cpp's shapes (B=8, T=1024, C=768, NH=12, V=50257) -> predicted µs."""
    b, t, c, heads, v = 8, 1024, 768, 12, 50257
    n = b * t
    parameters = 124_000_000
    out = {}

    def put(name, kernel, math="tf32"):
        out[name] = kernel.predicted_s(math) * 1e6

    put("BM_gemm/0", gemm("", n, 4 * c, c), "fp32")
    put("BM_gemm/1", gemm("", n, 4 * c, c), "tf32")
    put("BM_gemm_bias/0", gemm("", n, 4 * c, c), "fp32")  # the epilogue's bias read is negligible
    put("BM_gemm_bias/1", gemm("", n, 4 * c, c), "tf32")
    put("BM_layernorm_forward", stream("", n * c, 2))
    put("BM_layernorm_backward", stream("", n * c, 4, kind="reduction"))
    put("BM_gelu_forward", stream("", n * 4 * c, 2))
    put("BM_gelu_backward", stream("", n * 4 * c, 4))
    put("BM_residual_forward", stream("", n * c, 3))
    put("BM_bias_backward", stream("", n * 4 * c, 1, kind="reduction"))
    put("BM_dropout_forward", stream("", n * c, 2))
    put("BM_embedding_forward", stream("", n * c, 3))
    put("BM_embedding_backward", stream("", n * c, 3, kind="reduction"))
    for arg, math in ((0, "fp32"), (1, "tf32")):
        forward, backward = attention(b, t, heads, c // heads, math, 1)
        put(f"BM_attention_forward/{arg}", forward, math)
        put(f"BM_attention_backward/{arg}", backward, math)
        out[f"BM_attention_forward_backward/{arg}"] = (forward.predicted_s(math) + backward.predicted_s(math)) * 1e6
    put("BM_cross_entropy_forward", stream("", n * v, 1))  # the plain loss: one read of the logits
    put("BM_cross_entropy_backward", stream("", n * v, 3))  # logits read, dlogits read and written
    # the fused classifier: logits read (online max and sum), then read and written with the gradient
    put("BM_cross_entropy_fused_forward", stream("", n * v, 3))
    put("BM_cross_entropy_fused_forward_padded", stream("", n * ((v + 127) // 128 * 128), 3))
    put("BM_sum_of_squares", stream("", parameters, 1, kind="reduction"))
    put("BM_adamw_update", stream("", parameters, 7))
    put("BM_adamw_update_list", Kernel("", 0.0, (8 * F32 + BF16) * parameters, "memory"))
    return out


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("what", choices=["step", "benchmarks"])
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--seq", type=int, default=1024)
    parser.add_argument("--math", choices=["tf32", "fp32", "bf16"], default="tf32")
    parser.add_argument("--recompute", type=int, choices=[0, 1], default=0)
    parser.add_argument("--markdown", action="store_true")
    args = parser.parse_args()
    if args.what == "step":
        step_report(args)
    else:
        json.dump(benchmark_predictions(), sys.stdout, indent=1, sort_keys=True)
        print()


if __name__ == "__main__":
    main()
