// Throughput of the shipped CPU kernels (kernels/cpu/cpu_kernels.h, float) at small GPT-2-like shapes
// (B=4, T=64, C=128, NH=4, V=512), the CPU twin of bench/cuda/bench_kernels_cuda.cpp.
// Memory-bound kernels report bytes/s as the minimum traffic of the kernel's contract: each input read
// once, each output written once, `+=` outputs counted twice (read and write), int32 indices included.
// GEMM and attention report FLOP/s (counter "FLOPS", 2 per multiply-add).
//
//   bench_kernels_cpu --benchmark_min_time=0.05          the whole suite in well under a minute on 2 cores
//   bench_kernels_cpu --benchmark_filter=gemm            one family
//
// At these shapes the activation-sized working sets (0.1-2 MiB) live in L2 and the parameter-sized ones
// (4-16 MiB) in L3, so their bytes/s are cache bandwidth; the large variants of axpy and adamw stream
// 256 MiB arrays (0.5-1 GiB in all, beyond any cache) to show DRAM bandwidth. Every kernel is timed on the
// wall clock: OpenBLAS runs its own threads for GEMM, and the other kernels run on OpenMP threads
// (kernels/cpu/parallel.h; OMP_NUM_THREADS=1 for one core). The CPU column is the whole process's CPU time,
// so CPU/Time is how many cores a kernel kept busy.
#include <benchmark/benchmark.h>

#include <algorithm>
#include <cstring>
#include <cstdint>
#include <vector>

#include "kernels/cpu/cpu_kernels.h"

namespace {

namespace cpu = engine::kernels::cpu;
namespace kernels = engine::kernels;
using engine::bfloat16;

constexpr int B = 4, T = 64, C = 128, NH = 4, V = 512;
constexpr int64_t tokens = int64_t(B) * T;
// About the parameter count of a 6-layer GPT at C=128 and V=512 (12·C² per block plus the embeddings).
constexpr int64_t parameter_count = int64_t(1) << 20;
constexpr int64_t large_count = int64_t(1) << 26; // 256 MiB per float array: beyond L3, streams DRAM

constexpr double f = sizeof(float);
constexpr double index_bytes = sizeof(int32_t);

// Deterministic values in [-1,1) from a cheap integer hash: fast enough for 256 MiB arrays, and never NaN,
// so no kernel takes a degenerate path (layernorm of a constant row, all-equal attention scores).
std::vector<float> values(int64_t count, uint32_t seed = 1) {
    std::vector<float> data(static_cast<size_t>(count));
    uint32_t state = seed * 2654435761u + 1u;
    for (float& value : data) {
        state ^= state << 13;
        state ^= state >> 17;
        state ^= state << 5;
        value = static_cast<float>(state >> 8) * (2.0f / 16777216.0f) - 1.0f;
    }
    return data;
}

std::vector<int32_t> indices(int64_t count, int bound, uint32_t seed = 7) {
    std::vector<int32_t> data(static_cast<size_t>(count));
    uint32_t state = seed * 2654435761u + 1u;
    for (int32_t& value : data) {
        state ^= state << 13;
        state ^= state >> 17;
        state ^= state << 5;
        value = static_cast<int32_t>(state % static_cast<uint32_t>(bound));
    }
    return data;
}

void report_bytes(benchmark::State& state, double bytes_per_iteration) {
    state.SetBytesProcessed(static_cast<int64_t>(bytes_per_iteration * static_cast<double>(state.iterations())));
}

void report_flops(benchmark::State& state, double flops_per_iteration) {
    state.counters["FLOPS"] =
        benchmark::Counter(flops_per_iteration * static_cast<double>(state.iterations()), benchmark::Counter::kIsRate);
}

// The fastest repetition is the one least disturbed by other processes on a shared machine.
double minimum(const std::vector<double>& samples) { return *std::min_element(samples.begin(), samples.end()); }

#define KERNEL_BENCHMARK(function)                                                                           \
    BENCHMARK(function)                                                                                      \
        ->Unit(benchmark::kMicrosecond)                                                                      \
        ->ComputeStatistics("min", minimum)                                                                  \
        ->MeasureProcessCPUTime()                                                                            \
        ->UseRealTime()

// ---- embedding ----

void BM_embedding_forward(benchmark::State& state) {
    std::vector<float> out(tokens * C);
    const std::vector<float> token_table = values(int64_t(V) * C), position_table = values(int64_t(T) * C, 2);
    const std::vector<int32_t> token_ids = indices(tokens, V);
    for (auto _ : state) {
        cpu::embedding_forward(out.data(), token_ids.data(), token_table.data(), position_table.data(), nullptr, B, T,
                               C);
        benchmark::ClobberMemory();
    }
    report_bytes(state, f * 3.0 * tokens * C + index_bytes * tokens);
}
KERNEL_BENCHMARK(BM_embedding_forward);

void BM_embedding_backward(benchmark::State& state) {
    std::vector<float> dtoken_table(int64_t(V) * C), dposition_table(int64_t(T) * C);
    const std::vector<float> dout = values(tokens * C);
    const std::vector<int32_t> token_ids = indices(tokens, V);
    for (auto _ : state) {
        cpu::embedding_backward(dtoken_table.data(), dposition_table.data(), dout.data(), token_ids.data(), nullptr, B,
                                T, C);
        benchmark::ClobberMemory();
    }
    // dout read; one token-table row and one position row updated (+=) per token.
    report_bytes(state, f * 5.0 * tokens * C + index_bytes * tokens);
}
KERNEL_BENCHMARK(BM_embedding_backward);

// ---- gemm: the MLP's up projection, nn.Linear layout (weight stored (4C, C)) ----
// Arg 0: forward      out(N,4C)  = inp(N,C) · W(4C,C)^T
// Arg 1: backward dx  dinp(N,C)  = dout(N,4C) · W(4C,C)
// Arg 2: backward dW  dW(4C,C)  += dout(N,4C)^T · inp(N,C)
// Arg 3: a square 1024³ product, to compare with the CPU's peak
void BM_gemm(benchmark::State& state) {
    int m = 0, n = 0, k = 0;
    bool transpose_a = false, transpose_b = false;
    float beta = 0.0f;
    switch (state.range(0)) {
    case 0: m = tokens, n = 4 * C, k = C, transpose_b = true, state.SetLabel("forward"); break;
    case 1: m = tokens, n = C, k = 4 * C, state.SetLabel("backward_input"); break;
    case 2: m = 4 * C, n = C, k = tokens, transpose_a = true, beta = 1.0f, state.SetLabel("backward_weight"); break;
    default: m = n = k = 1024, state.SetLabel("square_1024"); break;
    }
    const std::vector<float> a = values(int64_t(m) * k, 1), b = values(int64_t(k) * n, 2);
    std::vector<float> c(static_cast<size_t>(int64_t(m) * n));
    for (auto _ : state) {
        cpu::gemm(c.data(), a.data(), b.data(), m, n, k, transpose_a, transpose_b, 1.0f, beta);
        benchmark::ClobberMemory();
    }
    report_flops(state, 2.0 * m * n * k);
}
KERNEL_BENCHMARK(BM_gemm)->DenseRange(0, 3);

// ---- bias (the MLP's 4C-wide layer) ----

void BM_bias_add_forward(benchmark::State& state) {
    std::vector<float> out = values(tokens * 4 * C);
    const std::vector<float> bias = values(4 * C, 2);
    for (auto _ : state) {
        cpu::bias_add_forward(out.data(), bias.data(), tokens, 4 * C);
        benchmark::ClobberMemory();
    }
    report_bytes(state, f * (2.0 * tokens * 4 * C + 4 * C));
}
KERNEL_BENCHMARK(BM_bias_add_forward);

void BM_bias_backward(benchmark::State& state) {
    std::vector<float> dbias(4 * C);
    const std::vector<float> dout = values(tokens * 4 * C);
    for (auto _ : state) {
        cpu::bias_backward(dbias.data(), dout.data(), tokens, 4 * C);
        benchmark::ClobberMemory();
    }
    report_bytes(state, f * (double(tokens) * 4 * C + 2.0 * 4 * C));
}
KERNEL_BENCHMARK(BM_bias_backward);

// ---- layernorm ----

void BM_layernorm_forward(benchmark::State& state) {
    std::vector<float> out(tokens * C), mean(tokens), rstd(tokens);
    const std::vector<float> inp = values(tokens * C), weight = values(C, 2), bias = values(C, 3);
    for (auto _ : state) {
        cpu::layernorm_forward(out.data(), mean.data(), rstd.data(), inp.data(), weight.data(), bias.data(), tokens, C);
        benchmark::ClobberMemory();
    }
    report_bytes(state, f * (2.0 * tokens * C + 2.0 * tokens + 2.0 * C));
}
KERNEL_BENCHMARK(BM_layernorm_forward);

void BM_layernorm_backward(benchmark::State& state) {
    std::vector<float> dinp(tokens * C), dweight(C), dbias(C), mean(tokens), rstd(tokens), out(tokens * C);
    const std::vector<float> dout = values(tokens * C, 4), inp = values(tokens * C), weight = values(C, 2),
                             bias = values(C, 3);
    // Real statistics, so that backward sees what forward saves.
    cpu::layernorm_forward(out.data(), mean.data(), rstd.data(), inp.data(), weight.data(), bias.data(), tokens, C);
    for (auto _ : state) {
        cpu::layernorm_backward(dinp.data(), dweight.data(), dbias.data(), dout.data(), inp.data(), weight.data(),
                                mean.data(), rstd.data(), tokens, C);
        benchmark::ClobberMemory();
    }
    // dinp += (2), dout and inp (2); mean, rstd; weight; dweight and dbias += (4).
    report_bytes(state, f * (4.0 * tokens * C + 2.0 * tokens + 5.0 * C));
}
KERNEL_BENCHMARK(BM_layernorm_backward);

// ---- GELU (the MLP's 4C-wide activation) ----

void BM_gelu_forward(benchmark::State& state) {
    const int64_t count = tokens * 4 * C;
    std::vector<float> out(count);
    const std::vector<float> inp = values(count);
    for (auto _ : state) {
        cpu::gelu_forward(out.data(), inp.data(), count);
        benchmark::ClobberMemory();
    }
    report_bytes(state, f * 2.0 * count);
}
KERNEL_BENCHMARK(BM_gelu_forward);

void BM_gelu_backward(benchmark::State& state) {
    const int64_t count = tokens * 4 * C;
    std::vector<float> dinp(count);
    const std::vector<float> dout = values(count, 2), inp = values(count);
    for (auto _ : state) {
        cpu::gelu_backward(dinp.data(), dout.data(), inp.data(), count, true);
        benchmark::ClobberMemory();
    }
    report_bytes(state, f * 4.0 * count);
}
KERNEL_BENCHMARK(BM_gelu_backward);

// ---- residual ----

void BM_residual_forward(benchmark::State& state) {
    const int64_t count = tokens * C;
    std::vector<float> out(count);
    const std::vector<float> a = values(count, 1), b = values(count, 2);
    for (auto _ : state) {
        cpu::residual_forward(out.data(), a.data(), b.data(), count);
        benchmark::ClobberMemory();
    }
    report_bytes(state, f * 3.0 * count);
}
KERNEL_BENCHMARK(BM_residual_forward);

void BM_residual_backward(benchmark::State& state) {
    const int64_t count = tokens * C;
    std::vector<float> da(count), db(count);
    const std::vector<float> dout = values(count);
    for (auto _ : state) {
        cpu::residual_backward(da.data(), db.data(), dout.data(), count);
        benchmark::ClobberMemory();
    }
    report_bytes(state, f * 5.0 * count);
}
KERNEL_BENCHMARK(BM_residual_backward);

// ---- attention ----

// Shapes: 0 the suite's (B 4, T 64, C 128, NH 4), 1 GPT-2 124M's training step (B 4, T 128, C 768, NH 12).
struct AttentionShape {
    int B, T, C, NH;
    int64_t tokens() const { return int64_t(B) * T; }
    // Causal attention work: QK^T and PV over the lower triangle (T(T+1)/2 pairs), 2 FLOPs per multiply-add.
    double forward_flops() const { return 2.0 * 2.0 * B * NH * (double(T) * (T + 1) / 2) * (C / NH); }
};
AttentionShape attention_shape(const benchmark::State& state) {
    return state.range(0) == 0 ? AttentionShape{B, T, C, NH} : AttentionShape{4, 128, 768, 12};
}

void BM_attention_forward(benchmark::State& state) {
    const AttentionShape s = attention_shape(state);
    std::vector<float> out(s.tokens() * s.C), logsumexp(int64_t(s.B) * s.NH * s.T);
    const std::vector<float> qkv = values(s.tokens() * 3 * s.C);
    for (auto _ : state) {
        cpu::attention_forward(out.data(), logsumexp.data(), qkv.data(), nullptr, s.B, s.T, s.C, s.NH,
                               s.NH); // multi-head
        benchmark::ClobberMemory();
    }
    report_flops(state, s.forward_flops());
}
KERNEL_BENCHMARK(BM_attention_forward)->DenseRange(0, 1);

void BM_attention_backward(benchmark::State& state) {
    const AttentionShape s = attention_shape(state);
    std::vector<float> dqkv(s.tokens() * 3 * s.C), out(s.tokens() * s.C), logsumexp(int64_t(s.B) * s.NH * s.T);
    const std::vector<float> dout = values(s.tokens() * s.C, 2), qkv = values(s.tokens() * 3 * s.C);
    cpu::attention_forward(out.data(), logsumexp.data(), qkv.data(), nullptr, s.B, s.T, s.C, s.NH, s.NH); // multi-head
    for (auto _ : state) {
        cpu::attention_backward(dqkv.data(), dout.data(), qkv.data(), out.data(), logsumexp.data(), nullptr, s.B, s.T,
                                s.C, s.NH, s.NH);
        benchmark::ClobberMemory();
    }
    // Recomputed QK^T, dout·V, then dq, dk and dv: 5 triangle products (the FLOPs the work needs, whatever the
    // kernel spends: the BLAS kernel multiplies whole T x T squares).
    report_flops(state, 2.5 * s.forward_flops());
}
KERNEL_BENCHMARK(BM_attention_backward)->DenseRange(0, 1);

// ---- dropout, p = 0.1 (the residual stream's width) ----

void BM_dropout_forward(benchmark::State& state) {
    const int64_t count = tokens * C;
    std::vector<float> out(count);
    const std::vector<float> inp = values(count);
    for (auto _ : state) {
        cpu::dropout_forward(out.data(), inp.data(), 0.1f, 1234, 0, count);
        benchmark::ClobberMemory();
    }
    report_bytes(state, f * 2.0 * count);
}
KERNEL_BENCHMARK(BM_dropout_forward);

void BM_dropout_backward(benchmark::State& state) {
    const int64_t count = tokens * C;
    std::vector<float> dinp(count);
    const std::vector<float> dout = values(count);
    for (auto _ : state) {
        cpu::dropout_backward(dinp.data(), dout.data(), 0.1f, 1234, 0, count);
        benchmark::ClobberMemory();
    }
    report_bytes(state, f * 3.0 * count);
}
KERNEL_BENCHMARK(BM_dropout_backward);

// ---- cross-entropy over the vocabulary ----

void BM_cross_entropy_forward(benchmark::State& state) {
    std::vector<float> losses(tokens);
    const std::vector<float> logits = values(tokens * V);
    const std::vector<int32_t> targets = indices(tokens, V);
    for (auto _ : state) {
        cpu::cross_entropy_forward(losses.data(), logits.data(), targets.data(), tokens, V, -100);
        benchmark::ClobberMemory();
    }
    report_bytes(state, f * (double(tokens) * V + tokens) + index_bytes * tokens);
}
KERNEL_BENCHMARK(BM_cross_entropy_forward);

void BM_cross_entropy_backward(benchmark::State& state) {
    std::vector<float> dlogits(tokens * V);
    const std::vector<float> dlosses = values(tokens, 2), logits = values(tokens * V);
    const std::vector<int32_t> targets = indices(tokens, V);
    for (auto _ : state) {
        cpu::cross_entropy_backward(dlogits.data(), dlosses.data(), logits.data(), targets.data(), tokens, V, -100);
        benchmark::ClobberMemory();
    }
    report_bytes(state, f * (3.0 * tokens * V + tokens) + index_bytes * tokens);
}
KERNEL_BENCHMARK(BM_cross_entropy_backward);

// The fused classifier: one read and one write of the logits replace the forward's read and the backward's
// two reads and one read-modify-write. Later iterations run over the gradient the first one wrote: the
// same work.
void BM_cross_entropy_fused_forward(benchmark::State& state) {
    std::vector<float> losses(tokens), logits = values(tokens * V);
    const std::vector<int32_t> targets = indices(tokens, V);
    for (auto _ : state) {
        cpu::cross_entropy_fused_forward(losses.data(), logits.data(), targets.data(), 1.0f / tokens, tokens, V, V,
                                         -100);
        benchmark::ClobberMemory();
    }
    report_bytes(state, f * (2.0 * tokens * V + tokens) + index_bytes * tokens);
}
KERNEL_BENCHMARK(BM_cross_entropy_fused_forward);

// ---- reductions over a parameter-sized buffer ----

void BM_sum_forward(benchmark::State& state) {
    float out = 0.0f;
    const std::vector<float> inp = values(parameter_count);
    for (auto _ : state) {
        cpu::sum_forward(&out, inp.data(), parameter_count, 1.0f);
        benchmark::DoNotOptimize(out);
    }
    report_bytes(state, f * parameter_count);
}
KERNEL_BENCHMARK(BM_sum_forward);

void BM_sum_backward(benchmark::State& state) {
    const float dout = 1e-3f;
    std::vector<float> dinp(parameter_count);
    for (auto _ : state) {
        cpu::sum_backward(dinp.data(), &dout, parameter_count, 1.0f);
        benchmark::ClobberMemory();
    }
    report_bytes(state, f * 2.0 * parameter_count);
}
KERNEL_BENCHMARK(BM_sum_backward);

void BM_sum_of_squares(benchmark::State& state) {
    double out = 0.0;
    const std::vector<float> inp = values(parameter_count);
    for (auto _ : state) {
        cpu::sum_of_squares(&out, inp.data(), parameter_count);
        benchmark::DoNotOptimize(out);
    }
    report_bytes(state, f * parameter_count);
}
KERNEL_BENCHMARK(BM_sum_of_squares);

// ---- elementwise helpers (gradient zeroing, clipping, accumulation) ----

void BM_fill(benchmark::State& state) {
    std::vector<float> x(parameter_count);
    for (auto _ : state) {
        cpu::fill(x.data(), 0.0f, parameter_count);
        benchmark::ClobberMemory();
    }
    report_bytes(state, f * parameter_count);
}
KERNEL_BENCHMARK(BM_fill);

void BM_scale(benchmark::State& state) {
    std::vector<float> x = values(parameter_count);
    for (auto _ : state) {
        // -1 keeps magnitudes fixed: repeated scaling by |alpha| < 1 would end in denormals and time those.
        cpu::scale(x.data(), -1.0f, parameter_count);
        benchmark::ClobberMemory();
    }
    report_bytes(state, f * 2.0 * parameter_count);
}
KERNEL_BENCHMARK(BM_scale);

// Arg: element count (parameter-sized, then large enough to stream from DRAM).
void BM_axpy(benchmark::State& state) {
    const int64_t count = state.range(0);
    std::vector<float> y = values(count, 1);
    const std::vector<float> x = values(count, 2);
    for (auto _ : state) {
        cpu::axpy(y.data(), x.data(), 1e-3f, count);
        benchmark::ClobberMemory();
    }
    report_bytes(state, f * 3.0 * count);
}
KERNEL_BENCHMARK(BM_axpy)->Arg(parameter_count)->Arg(large_count);

// ---- optimizer updates ----

void BM_adamw_update(benchmark::State& state) {
    const int64_t count = state.range(0);
    std::vector<float> param = values(count, 1), m(count), v(count);
    const std::vector<float> grad = values(count, 2);
    for (auto _ : state) {
        cpu::adamw_update(param.data(), grad.data(), m.data(), v.data(), count, 3e-4f, 0.9f, 0.95f, 1e-8f, 0.1f, 0.5f,
                          0.5f, 1.0f);
        benchmark::ClobberMemory();
    }
    // param, m and v read and written; grad read.
    report_bytes(state, f * 7.0 * count);
}
KERNEL_BENCHMARK(BM_adamw_update)->Arg(parameter_count)->Arg(large_count);

// The bf16 step's optimizer phase done apart (the update, the masters rounded into the working copies, the
// gradients zeroed: three passes) and as the step's epilogue does it (adamw_update_list: one pass).
void BM_adamw_update_copy_zero_apart(benchmark::State& state) {
    const int64_t count = state.range(0);
    std::vector<float> param = values(count, 1), m(count), v(count), grad = values(count, 2);
    std::vector<bfloat16> copy(count);
    for (auto _ : state) {
        cpu::adamw_update(param.data(), grad.data(), m.data(), v.data(), count, 3e-4f, 0.9f, 0.95f, 1e-8f, 0.1f, 0.5f,
                          0.5f, 1.0f);
        cpu::convert(copy.data(), param.data(), count);
        std::memset(grad.data(), 0, sizeof(float) * size_t(count));
        benchmark::ClobberMemory();
    }
    // The update's 7 floats, then param read and the copy written, then grad written.
    report_bytes(state, (f * 9.0 + 2.0) * count);
}
KERNEL_BENCHMARK(BM_adamw_update_copy_zero_apart)->Arg(parameter_count)->Arg(large_count);

void BM_adamw_update_list(benchmark::State& state) {
    const int64_t count = state.range(0);
    std::vector<float> param = values(count, 1), m(count), v(count), grad = values(count, 2);
    std::vector<bfloat16> copy(count);
    const kernels::AdamWTensor<float> tensor{param.data(), grad.data(), m.data(), v.data(), copy.data(), count, 0.1f};
    for (auto _ : state) {
        cpu::adamw_update_list(&tensor, 1, true, 3e-4f, 0.9f, 0.95f, 1e-8f, 0.5f, 0.5f, 1.0f);
        benchmark::ClobberMemory();
    }
    // param, m and v read and written; grad read and written (zeroed); the copy written.
    report_bytes(state, (f * 8.0 + 2.0) * count);
}
KERNEL_BENCHMARK(BM_adamw_update_list)->Arg(parameter_count)->Arg(large_count);

void BM_sgd_update(benchmark::State& state) {
    std::vector<float> param = values(parameter_count, 1), momentum_buffer(parameter_count);
    const std::vector<float> grad = values(parameter_count, 2);
    for (auto _ : state) {
        cpu::sgd_update(param.data(), grad.data(), momentum_buffer.data(), parameter_count, 1e-3f, 0.9f, 0.0f, 1.0f);
        benchmark::ClobberMemory();
    }
    report_bytes(state, f * 5.0 * parameter_count);
}
KERNEL_BENCHMARK(BM_sgd_update);

} // namespace

BENCHMARK_MAIN();
