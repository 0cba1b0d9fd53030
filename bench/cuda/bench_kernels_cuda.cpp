// Throughput of the shipped CUDA kernels at GPT-2 small shapes (B=8, T=1024, C=768, NH=12, V=50257).
// Memory-bound kernels report bytes/s (minimum traffic: each input read once, each output written once;
// += outputs count twice); GEMM and attention report FLOP/s. Times come from CUDA events on the compute
// stream, so launch overhead is included but host-side queueing is not.
#include <cstdint>
#include <functional>
#include <type_traits>
#include <vector>

#include <benchmark/benchmark.h>

#include "base/cuda/check.h"
#include "base/cuda/handles.h"
#include "base/cuda/headers.h"
#include "engine/cuda/runtime.h"
#include "kernels/cuda/cuda_kernels.h"

namespace {

namespace gpu = engine::kernels::cuda;

constexpr int B = 8, T = 1024, C = 768, NH = 12, V = 50257;
constexpr int64_t tokens = int64_t(B) * T;
constexpr int64_t parameter_count = 124'000'000;

// Device memory filled with a small constant so that no kernel meets NaN or overflow.
template <typename Element>
class DeviceArray {
public:
    explicit DeviceArray(int64_t count, float value = 0.01f) : count_(count) {
        CUDA_CHECK(cudaMalloc(reinterpret_cast<void**>(&data_), count * sizeof(Element)));
        if constexpr (std::is_same_v<Element, float>) {
            gpu::fill(data_, value, count, engine::cuda::compute_stream());
        } else {
            CUDA_CHECK(cudaMemsetAsync(data_, 0, count * sizeof(Element), engine::cuda::compute_stream()));
        }
    }
    ~DeviceArray() { (void)cudaFree(data_); }
    DeviceArray(const DeviceArray&) = delete;
    DeviceArray& operator=(const DeviceArray&) = delete;
    Element* get() const { return data_; }

private:
    Element* data_ = nullptr;
    int64_t count_;
};

bool prepare(benchmark::State& state) {
    if (!engine::cuda::device_available()) {
        state.SkipWithError("no CUDA device");
        return false;
    }
    engine::cuda::ensure_initialized();
    return true;
}

// Runs `launch` once per iteration between two events and reports the per-iteration traffic or work.
void run_timed(benchmark::State& state, double bytes, double flops, const std::function<void(cudaStream_t)>& launch) {
    cudaStream_t stream = engine::cuda::compute_stream();
    launch(stream); // warm-up: first-touch, cuBLAS heuristics
    engine::cuda::synchronize();
    engine::base::cuda::Event start(cudaEventDefault), stop(cudaEventDefault);
    for (auto _ : state) {
        start.record(stream);
        launch(stream);
        stop.record(stream);
        stop.synchronize();
        float milliseconds = 0.0f;
        CUDA_CHECK(cudaEventElapsedTime(&milliseconds, start.get(), stop.get()));
        state.SetIterationTime(milliseconds / 1000.0);
    }
    if (bytes > 0) state.SetBytesProcessed(static_cast<int64_t>(bytes * state.iterations()));
    if (flops > 0) state.counters["FLOPS"] = benchmark::Counter(flops * state.iterations(), benchmark::Counter::kIsRate);
}

constexpr double f = sizeof(float);

void BM_gemm(benchmark::State& state) {
    if (!prepare(state)) return;
    const bool tf32 = state.range(0) != 0;
    // The MLP's up projection: (B*T, C) x (C, 4C) with the weight stored (4C, C) as nn.Linear does.
    const int m = tokens, n = 4 * C, k = C;
    DeviceArray<float> a(int64_t(m) * k), b(int64_t(n) * k), c(int64_t(m) * n);
    run_timed(state, 0, 2.0 * m * n * k, [&](cudaStream_t stream) {
        gpu::gemm(c.get(), a.get(), b.get(), m, n, k, false, true, 1.0f, 0.0f, tf32, engine::cuda::cublas_handle(),
                  stream);
    });
    state.SetLabel(tf32 ? "tf32" : "fp32");
}
BENCHMARK(BM_gemm)->Arg(0)->Arg(1)->UseManualTime()->Unit(benchmark::kMicrosecond);

// The same GEMM with the bias in cuBLASLt's epilogue, as linear runs it: against BM_gemm, what the fused bias
// costs (predicted: nothing measurable); the unfused bias pass it replaces would move 2·m·n floats.
void BM_gemm_bias(benchmark::State& state) {
    if (!prepare(state)) return;
    const bool tf32 = state.range(0) != 0;
    const int m = tokens, n = 4 * C, k = C;
    DeviceArray<float> a(int64_t(m) * k), b(int64_t(n) * k), bias(n), c(int64_t(m) * n);
    run_timed(state, 0, 2.0 * m * n * k, [&](cudaStream_t stream) {
        gpu::gemm_bias(c.get(), a.get(), b.get(), bias.get(), m, n, k, false, true, tf32,
                       engine::cuda::cublaslt_handle(), engine::cuda::cublaslt_workspace(),
                       engine::cuda::cublaslt_workspace_bytes, stream);
    });
    state.SetLabel(tf32 ? "tf32" : "fp32");
}
BENCHMARK(BM_gemm_bias)->Arg(0)->Arg(1)->UseManualTime()->Unit(benchmark::kMicrosecond);

void BM_layernorm_forward(benchmark::State& state) {
    if (!prepare(state)) return;
    DeviceArray<float> out(tokens * C), inp(tokens * C), mean(tokens), rstd(tokens), weight(C), bias(C);
    run_timed(state, f * (2.0 * tokens * C + 2.0 * tokens), 0, [&](cudaStream_t stream) {
        gpu::layernorm_forward(out.get(), mean.get(), rstd.get(), inp.get(), weight.get(), bias.get(), tokens, C,
                               stream);
    });
}
BENCHMARK(BM_layernorm_forward)->UseManualTime()->Unit(benchmark::kMicrosecond);

void BM_layernorm_backward(benchmark::State& state) {
    if (!prepare(state)) return;
    DeviceArray<float> dinp(tokens * C), dout(tokens * C), inp(tokens * C), mean(tokens), rstd(tokens);
    DeviceArray<float> weight(C), dweight(C), dbias(C);
    DeviceArray<float> partials(gpu::layernorm_backward_workspace_count(tokens, C));
    run_timed(state, f * (4.0 * tokens * C), 0, [&](cudaStream_t stream) {
        gpu::layernorm_backward(dinp.get(), dweight.get(), dbias.get(), partials.get(), dout.get(), inp.get(),
                                weight.get(), mean.get(), rstd.get(), tokens, C, stream);
    });
}
BENCHMARK(BM_layernorm_backward)->UseManualTime()->Unit(benchmark::kMicrosecond);

void BM_gelu_forward(benchmark::State& state) {
    if (!prepare(state)) return;
    const int64_t count = tokens * 4 * C;
    DeviceArray<float> out(count), inp(count);
    run_timed(state, f * 2.0 * count, 0,
              [&](cudaStream_t stream) { gpu::gelu_forward(out.get(), inp.get(), count, stream); });
}
BENCHMARK(BM_gelu_forward)->UseManualTime()->Unit(benchmark::kMicrosecond);

void BM_gelu_backward(benchmark::State& state) {
    if (!prepare(state)) return;
    const int64_t count = tokens * 4 * C;
    DeviceArray<float> dinp(count), dout(count), inp(count);
    run_timed(state, f * 4.0 * count, 0,
              [&](cudaStream_t stream) { gpu::gelu_backward(dinp.get(), dout.get(), inp.get(), count, true, stream); });
}
BENCHMARK(BM_gelu_backward)->UseManualTime()->Unit(benchmark::kMicrosecond);

void BM_residual_forward(benchmark::State& state) {
    if (!prepare(state)) return;
    const int64_t count = tokens * C;
    DeviceArray<float> out(count), a(count), b(count);
    run_timed(state, f * 3.0 * count, 0,
              [&](cudaStream_t stream) { gpu::residual_forward(out.get(), a.get(), b.get(), count, stream); });
}
BENCHMARK(BM_residual_forward)->UseManualTime()->Unit(benchmark::kMicrosecond);

void BM_bias_backward(benchmark::State& state) {
    if (!prepare(state)) return;
    DeviceArray<float> dbias(4 * C), dout(tokens * 4 * C), partials(gpu::bias_backward_workspace_count(tokens, 4 * C));
    run_timed(state, f * tokens * 4.0 * C, 0, [&](cudaStream_t stream) {
        gpu::bias_backward(dbias.get(), partials.get(), dout.get(), tokens, 4 * C, stream);
    });
}
BENCHMARK(BM_bias_backward)->UseManualTime()->Unit(benchmark::kMicrosecond);

void BM_dropout_forward(benchmark::State& state) {
    if (!prepare(state)) return;
    const int64_t count = tokens * C;
    DeviceArray<float> out(count), inp(count);
    run_timed(state, f * 2.0 * count, 0, [&](cudaStream_t stream) {
        gpu::dropout_forward(out.get(), inp.get(), 0.1f, 1234, 0, count, stream);
    });
}
BENCHMARK(BM_dropout_forward)->UseManualTime()->Unit(benchmark::kMicrosecond);

void BM_embedding_forward(benchmark::State& state) {
    if (!prepare(state)) return;
    DeviceArray<float> out(tokens * C), token_table(int64_t(V) * C), position_table(int64_t(T) * C);
    DeviceArray<int32_t> token_ids(tokens);
    run_timed(state, f * 3.0 * tokens * C, 0, [&](cudaStream_t stream) {
        gpu::embedding_forward(out.get(), token_ids.get(), token_table.get(), position_table.get(), nullptr, B, T, C,
                               stream);
    });
}
BENCHMARK(BM_embedding_forward)->UseManualTime()->Unit(benchmark::kMicrosecond);

void BM_embedding_backward(benchmark::State& state) {
    if (!prepare(state)) return;
    DeviceArray<float> dout(tokens * C), dtoken_table(int64_t(V) * C), dposition_table(int64_t(T) * C);
    // Spread-out token ids (a stride coprime to V), grouped once on the host as the op does each backward.
    std::vector<int32_t> token_ids(tokens);
    for (int64_t i = 0; i < tokens; ++i) token_ids[i] = static_cast<int32_t>((i * 7919) % V);
    const gpu::TokenGroups groups = gpu::group_positions_by_token(token_ids.data(), static_cast<int>(tokens));
    DeviceArray<int32_t> device_groups(static_cast<int64_t>(groups.packed.size()));
    CUDA_CHECK(cudaStreamSynchronize(engine::cuda::compute_stream())); // its zeroing runs on the compute stream
    CUDA_CHECK(cudaMemcpy(device_groups.get(), groups.packed.data(), groups.packed.size() * sizeof(int32_t),
                          cudaMemcpyHostToDevice));
    run_timed(state, f * 3.0 * tokens * C, 0, [&](cudaStream_t stream) {
        gpu::embedding_backward(dtoken_table.get(), dposition_table.get(), dout.get(), device_groups.get(),
                                groups.distinct, nullptr, 0, B, T, C, stream);
    });
}
BENCHMARK(BM_embedding_backward)->UseManualTime()->Unit(benchmark::kMicrosecond);

// Causal attention work: QK^T and PV over the lower triangle, 2 FLOPs per multiply-add. Backward counts the
// customary 2.5x forward (dV, dP, dK, dQ and one QK^T), not the kernels' extra recomputation: the rate is
// then comparable with other FlashAttention figures. Arg 0: fp32-accurate 3xTF32, arg 1: TF32.
constexpr double attention_forward_flops = 2.0 * 2.0 * B * NH * (double(T) * (T + 1) / 2) * (C / NH);
constexpr double attention_backward_flops = 2.5 * attention_forward_flops;

// positions: null (one causal document per row), or packed documents of `document_length` tokens.
struct AttentionBuffers {
    DeviceArray<float> out{tokens * C}, qkv{tokens * 3 * C}, dqkv{tokens * 3 * C}, dout{tokens * C};
    DeviceArray<float> logsumexp{int64_t(B) * NH * T}, row_dot_workspace{int64_t(B) * NH * T}; // (B,NH,T)
    DeviceArray<int32_t> document_positions{tokens};                                           // (B,T)
    const int32_t* positions = nullptr;

    AttentionBuffers() = default;
    explicit AttentionBuffers(int document_length) {
        std::vector<int32_t> host(static_cast<size_t>(tokens));
        for (int64_t token = 0; token < tokens; ++token) host[token] = int32_t(token % T % document_length);
        CUDA_CHECK(cudaStreamSynchronize(engine::cuda::compute_stream())); // its zeroing runs on the compute stream
        CUDA_CHECK(
            cudaMemcpy(document_positions.get(), host.data(), host.size() * sizeof(int32_t), cudaMemcpyHostToDevice));
        positions = document_positions.get();
    }

    void forward(bool tf32, cudaStream_t stream) {
        // multi-head
        gpu::attention_forward(out.get(), logsumexp.get(), qkv.get(), positions, B, T, C, NH, NH, tf32, stream);
    }
    void backward(bool tf32, cudaStream_t stream) {
        gpu::attention_backward(dqkv.get(), row_dot_workspace.get(), dout.get(), qkv.get(), out.get(), logsumexp.get(),
                                positions, B, T, C, NH, NH, tf32, stream);
    }
};

void BM_attention_forward(benchmark::State& state) {
    if (!prepare(state)) return;
    const bool tf32 = state.range(0) != 0;
    AttentionBuffers buffers;
    run_timed(state, 0, attention_forward_flops, [&](cudaStream_t stream) { buffers.forward(tf32, stream); });
    state.SetLabel(tf32 ? "tf32" : "fp32");
}
BENCHMARK(BM_attention_forward)->Arg(0)->Arg(1)->UseManualTime()->Unit(benchmark::kMillisecond);

void BM_attention_backward(benchmark::State& state) {
    if (!prepare(state)) return;
    const bool tf32 = state.range(0) != 0;
    AttentionBuffers buffers;
    buffers.forward(tf32, engine::cuda::compute_stream());
    run_timed(state, 0, attention_backward_flops, [&](cudaStream_t stream) { buffers.backward(tf32, stream); });
    state.SetLabel(tf32 ? "tf32" : "fp32");
}
BENCHMARK(BM_attention_backward)->Arg(0)->Arg(1)->UseManualTime()->Unit(benchmark::kMillisecond);

// A training step's attention: forward then backward.
void BM_attention_forward_backward(benchmark::State& state) {
    if (!prepare(state)) return;
    const bool tf32 = state.range(0) != 0;
    AttentionBuffers buffers;
    run_timed(state, 0, attention_forward_flops + attention_backward_flops, [&](cudaStream_t stream) {
        buffers.forward(tf32, stream);
        buffers.backward(tf32, stream);
    });
    state.SetLabel(tf32 ? "tf32" : "fp32");
}
BENCHMARK(BM_attention_forward_backward)->Arg(0)->Arg(1)->UseManualTime()->Unit(benchmark::kMillisecond);

// The same step over packed documents of T/4 tokens (positions restart every 256): a quarter of the causal
// work, counted as such, so the rate shows what the skipped tiles save (ideally the same FLOP/s as above).
void BM_attention_documents_forward_backward(benchmark::State& state) {
    if (!prepare(state)) return;
    const bool tf32 = state.range(0) != 0;
    constexpr int document_length = T / 4;
    constexpr double document_share = double(document_length + 1) / (T + 1); // of the causal pairs
    AttentionBuffers buffers(document_length);
    run_timed(state, 0, (attention_forward_flops + attention_backward_flops) * document_share,
              [&](cudaStream_t stream) {
                  buffers.forward(tf32, stream);
                  buffers.backward(tf32, stream);
              });
    state.SetLabel(tf32 ? "tf32, documents of 256" : "fp32, documents of 256");
}
BENCHMARK(BM_attention_documents_forward_backward)->Arg(0)->Arg(1)->UseManualTime()->Unit(benchmark::kMillisecond);

void BM_cross_entropy_forward(benchmark::State& state) {
    if (!prepare(state)) return;
    DeviceArray<float> losses(tokens), logits(tokens * V);
    DeviceArray<int32_t> targets(tokens);
    run_timed(state, f * double(tokens) * V, 0, [&](cudaStream_t stream) {
        gpu::cross_entropy_forward(losses.get(), logits.get(), targets.get(), tokens, V, -100, stream);
    });
}
BENCHMARK(BM_cross_entropy_forward)->UseManualTime()->Unit(benchmark::kMicrosecond);

void BM_cross_entropy_backward(benchmark::State& state) {
    if (!prepare(state)) return;
    DeviceArray<float> dlogits(tokens * V), dlosses(tokens), logits(tokens * V);
    DeviceArray<int32_t> targets(tokens);
    run_timed(state, f * 3.0 * tokens * V, 0, [&](cudaStream_t stream) {
        gpu::cross_entropy_backward(dlogits.get(), dlosses.get(), logits.get(), targets.get(), tokens, V, -100,
                                    stream);
    });
}
BENCHMARK(BM_cross_entropy_backward)->UseManualTime()->Unit(benchmark::kMicrosecond);

// The fused classifier: one read and one write of the logits. padded_V = V takes the scalar path (V = 50257
// is odd); a row stride rounded up to 128 takes the 128-bit one.
void run_cross_entropy_fused(benchmark::State& state, int padded_V) {
    if (!prepare(state)) return;
    DeviceArray<float> losses(tokens), logits(int64_t(tokens) * padded_V);
    DeviceArray<int32_t> targets(tokens);
    run_timed(state, f * 2.0 * tokens * padded_V, 0, [&](cudaStream_t stream) {
        gpu::cross_entropy_fused_forward(losses.get(), logits.get(), targets.get(), 1.0f / tokens, tokens, V, padded_V,
                                         -100, stream);
    });
}
void BM_cross_entropy_fused_forward(benchmark::State& state) { run_cross_entropy_fused(state, V); }
BENCHMARK(BM_cross_entropy_fused_forward)->UseManualTime()->Unit(benchmark::kMicrosecond);
void BM_cross_entropy_fused_forward_padded(benchmark::State& state) {
    run_cross_entropy_fused(state, (V + 127) / 128 * 128);
}
BENCHMARK(BM_cross_entropy_fused_forward_padded)->UseManualTime()->Unit(benchmark::kMicrosecond);

void BM_sum_of_squares(benchmark::State& state) {
    if (!prepare(state)) return;
    DeviceArray<float> inp(parameter_count);
    const int64_t count = parameter_count;
    DeviceArray<double> out(1), partials(gpu::sum_of_squares_workspace_count(&count, 1));
    run_timed(state, f * parameter_count, 0, [&](cudaStream_t stream) {
        gpu::sum_of_squares(out.get(), partials.get(), inp.get(), parameter_count, stream);
    });
}
BENCHMARK(BM_sum_of_squares)->UseManualTime()->Unit(benchmark::kMicrosecond);

void BM_adamw_update(benchmark::State& state) {
    if (!prepare(state)) return;
    DeviceArray<float> param(parameter_count), grad(parameter_count), m(parameter_count), v(parameter_count);
    run_timed(state, f * 7.0 * parameter_count, 0, [&](cudaStream_t stream) {
        gpu::adamw_update(param.get(), grad.get(), m.get(), v.get(), parameter_count, 3e-4f, 0.9f, 0.95f, 1e-8f, 0.1f,
                          0.5f, 0.5f, 1.0f, stream);
    });
}
BENCHMARK(BM_adamw_update)->UseManualTime()->Unit(benchmark::kMicrosecond);

// The update with the bf16 step's epilogue (the working copy written, the gradient zeroed) in one pass.
void BM_adamw_update_list(benchmark::State& state) {
    if (!prepare(state)) return;
    DeviceArray<float> param(parameter_count), grad(parameter_count), m(parameter_count), v(parameter_count);
    DeviceArray<engine::bfloat16> copy(parameter_count);
    const engine::kernels::AdamWTensor<float> tensor{param.get(), grad.get(), m.get(), v.get(), copy.get(), parameter_count, 0.1f};
    run_timed(state, (f * 8.0 + 2.0) * parameter_count, 0, [&](cudaStream_t stream) {
        gpu::adamw_update_list(&tensor, 1, true, 3e-4f, 0.9f, 0.95f, 1e-8f, 0.5f, 0.5f, 1.0f, stream);
    });
}
BENCHMARK(BM_adamw_update_list)->UseManualTime()->Unit(benchmark::kMicrosecond);

} // namespace

BENCHMARK_MAIN();
