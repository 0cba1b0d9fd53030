// CUDA bf16 against CPU bf16 on the same inputs: the GEMM (cuBLAS GemmEx with CUDA_R_16BF, f32 or bf16 C), the
// GEMM with the bias in cuBLASLt's epilogue, the tensor-core attention (bf16 wmma) forward and backward, and the
// fused cross-entropy; then the ops on the device against the ops on the CPU. Bounds derived next to each test.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <iostream>
#include <string>

#include "engine/autograd.h"
#include "engine/cuda/runtime.h"
#include "engine/ops.h"
#include "kernels/cpu/cpu_kernels.h"
#include "kernels/cuda/cuda_kernels.h"
#include "tests/attention_bf16_bounds.h"
#include "tests/bf16_vectors.h"
#include "tests/cuda/cuda_test.h"

namespace engine::test {
namespace {

namespace cpu = engine::kernels::cpu;
namespace gpu = engine::kernels::cuda;

using Bf16KernelTest = CudaKernelTest;
const double u = std::ldexp(1.0, -8); // bf16 unit roundoff

// Errors in bf16 ulps of the CPU value: the largest, printed for the record.
struct UlpRecord {
    double worst = 0.0;
    void add(double error, double reference) { worst = std::max(worst, error / bfloat16_ulp(reference)); }
};

// GEMM: both sides multiply the same exactly-widened operands in f32 and round once; only the f32 summation
// order may differ (CPU: OpenBLAS row-major; emulated cuBLAS: column-major on swapped operands; a GPU: its own),
// by at most 2k·2^-24·sum|a||b| <= 2k²·2^-24 for |a|,|b| <= 1. A bf16 C may therefore differ where the f32 results
// straddle a rounding boundary: at most 1 ulp plus that slack. An f32 C (parameter gradients): the slack alone.
TEST_F(Bf16KernelTest, GemmMatchesTheCpuWithinOneUlp) {
    const int m = 19, n = 23, k = 33;
    const double slack = 2.0 * k * k * std::ldexp(1.0, -24);
    for (const bool transpose_a : {false, true}) {
        for (const bool transpose_b : {false, true}) {
            for (const float beta : {0.0f, 1.0f}) {
                const auto a = rounded(random_floats(size_t(m) * k)), b = rounded(random_floats(size_t(k) * n));
                const auto c0 = random_floats(size_t(m) * n);
                std::vector<bfloat16> c_cpu = rounded(c0);
                std::vector<float> f_cpu = c0;
                DeviceBuffer<bfloat16> a_device(a), b_device(b), c_device(c_cpu);
                DeviceBuffer<float> f_device(c0);
                cpu::gemm(c_cpu.data(), a.data(), b.data(), m, n, k, transpose_a, transpose_b, 1.0f, beta);
                cpu::gemm(f_cpu.data(), a.data(), b.data(), m, n, k, transpose_a, transpose_b, 1.0f, beta);
                gpu::gemm(c_device.get(), a_device.get(), b_device.get(), m, n, k, transpose_a, transpose_b, 1.0f, beta,
                          false, engine::cuda::cublas_handle(), stream);
                gpu::gemm(f_device.get(), a_device.get(), b_device.get(), m, n, k, transpose_a, transpose_b, 1.0f, beta,
                          false, engine::cuda::cublas_handle(), stream);
                const auto c_cuda = c_device.to_host();
                const auto f_cuda = f_device.to_host();
                UlpRecord record;
                for (size_t i = 0; i < c_cuda.size(); ++i) {
                    const double reference = to_float(c_cpu[i]);
                    const double error = std::fabs(to_float(c_cuda[i]) - reference);
                    EXPECT_LE(error, bfloat16_ulp(reference) + slack) << "bf16 c element " << i;
                    EXPECT_LE(std::fabs(f_cuda[i] - f_cpu[i]), slack) << "f32 c element " << i;
                    record.add(error, reference);
                }
                std::cout << "[ measured ] gemm ta=" << transpose_a << " tb=" << transpose_b << " beta=" << beta
                          << ": largest bf16 difference " << record.worst << " ulp\n";
            }
        }
    }
}

// gemm_bias: cuBLASLt's epilogue adds the bf16 bias to the f32 product before the one rounding, as the CPU
// gemm_bias<bfloat16> does: the same 1 ulp + slack as the GEMM.
TEST_F(Bf16KernelTest, GemmBiasMatchesTheCpuWithinOneUlp) {
    const int m = 17, n = 33, k = 29;
    const double slack = 2.0 * k * k * std::ldexp(1.0, -24) + std::ldexp(1.0, -24);
    const auto a = rounded(random_floats(size_t(m) * k)), b = rounded(random_floats(size_t(k) * n));
    const auto bias = rounded(random_floats(size_t(n)));
    std::vector<bfloat16> c_cpu(size_t(m) * n);
    cpu::gemm_bias(c_cpu.data(), a.data(), b.data(), bias.data(), m, n, k, false, false);
    DeviceBuffer<bfloat16> a_device(a), b_device(b), bias_device(bias), c_device(size_t(m) * n);
    gpu::gemm_bias(c_device.get(), a_device.get(), b_device.get(), bias_device.get(), m, n, k, false, false, false,
                   engine::cuda::cublaslt_handle(), engine::cuda::cublaslt_workspace(),
                   engine::cuda::cublaslt_workspace_bytes, stream);
    const auto c_cuda = c_device.to_host();
    for (size_t i = 0; i < c_cuda.size(); ++i) {
        const double reference = to_float(c_cpu[i]);
        EXPECT_LE(std::fabs(to_float(c_cuda[i]) - reference), bfloat16_ulp(reference) + slack) << i;
    }
}

// Attention. The CUDA bf16 kernels have the CPU bf16 reference's rounding points (P rounded after the same
// running maximum, per key tile of attention_bf16_key_tile; P and dS rounded before the backward's products;
// one rounding per store), so they differ only through f32 arithmetic: summation orders (the softmax's sum and
// D are reduced across lanes; a GPU's mma sums in its own order) and, on a GPU, expf's last bit. Those move an
// f32 value by a few 2^-24 relative; the result then differs by (a) its own rounding, at most 1 ulp, (b) a P or
// dS that lands on the other side of a bf16 rounding boundary, at most 2u relative each, so at most 2u times the
// weighted sums of attention_bf16_bounds.h, and (c) the f32 differences themselves, (hs + T + 8)·2^-24 of the
// same sums. Measured: the largest difference in ulps is printed (under emulation the orders mostly agree).
struct Bf16AttentionResults {
    std::vector<bfloat16> out, dqkv;
    std::vector<float> logsumexp;
};

// Packed documents: the lengths of each batch row's documents, in order, summing to T; none: plain causal.
using Documents = std::vector<std::vector<int>>;

// (b, first token, length) of every document; without documents, each batch row is one.
struct DocumentSpan {
    int batch, first, length;
};
std::vector<DocumentSpan> document_spans(const Documents& documents, AttentionShape shape) {
    std::vector<DocumentSpan> spans;
    for (int b = 0; b < shape.B; ++b) {
        if (documents.empty()) {
            spans.push_back({b, 0, shape.T});
            continue;
        }
        int first = 0;
        for (const int length : documents[size_t(b)]) {
            spans.push_back({b, first, length});
            first += length;
        }
        EXPECT_EQ(first, shape.T) << "the documents of row " << b << " must sum to T";
    }
    return spans;
}

// The (B,T) positions of `documents` (0, 1, ... inside each document), or empty for none.
std::vector<int32_t> document_positions(const Documents& documents, AttentionShape shape) {
    if (documents.empty()) return {};
    std::vector<int32_t> positions(size_t(shape.B) * shape.T);
    for (const DocumentSpan& span : document_spans(documents, shape)) {
        for (int position = 0; position < span.length; ++position)
            positions[size_t(span.batch) * shape.T + span.first + position] = position;
    }
    return positions;
}

// attention_bounds per document: a document is a causal sequence of its own (no query outside it sees its keys,
// none inside sees others'), so its bounds are those of its tokens cut out as a batch of one.
AttentionBounds document_bounds(const std::vector<float>& qkv, const std::vector<float>& dout,
                                const std::vector<float>& out, const std::vector<float>& logsumexp,
                                AttentionShape shape, const Documents& documents) {
    if (documents.empty()) return attention_bounds(qkv, dout, out, logsumexp, shape);
    const size_t width = size_t(shape.qkv_width()), C = size_t(shape.C), T = size_t(shape.T);
    const size_t NH = size_t(shape.NH);
    AttentionBounds bounds{std::vector<double>(size_t(shape.B) * T * C),
                           std::vector<double>(size_t(shape.B) * T * width)};
    for (const DocumentSpan& span : document_spans(documents, shape)) {
        const size_t first_token = size_t(span.batch) * T + span.first, length = size_t(span.length);
        const auto rows = [&](const std::vector<float>& values, size_t row_width) {
            return std::vector<float>(values.begin() + first_token * row_width,
                                      values.begin() + (first_token + length) * row_width);
        };
        std::vector<float> document_logsumexp;
        for (size_t h = 0; h < NH; ++h) {
            const auto head = logsumexp.begin() + (size_t(span.batch) * NH + h) * T + span.first;
            document_logsumexp.insert(document_logsumexp.end(), head, head + length);
        }
        const AttentionBounds part = attention_bounds(rows(qkv, width), rows(dout, C), rows(out, C), document_logsumexp,
                                                      AttentionShape{1, span.length, shape.C, shape.NH, shape.KVH});
        std::copy(part.forward.begin(), part.forward.end(), bounds.forward.begin() + first_token * C);
        std::copy(part.backward.begin(), part.backward.end(), bounds.backward.begin() + first_token * width);
    }
    return bounds;
}

void check_attention(Bf16KernelTest& test, AttentionShape shape, const Documents& documents = {}) {
    const int B = shape.B, T = shape.T, C = shape.C, NH = shape.NH, KVH = shape.kv_heads(), hs = C / NH;
    const size_t tokens = size_t(B) * T;
    const auto qkv = rounded(test.random_floats(tokens * shape.qkv_width(), -2.0f, 2.0f));
    const auto dout = rounded(test.random_floats(tokens * C));
    const auto dqkv_start = rounded(test.random_floats(tokens * shape.qkv_width(), -0.01f, 0.01f));
    const std::vector<int32_t> positions = document_positions(documents, shape);
    const int32_t* host_positions = positions.empty() ? nullptr : positions.data();
    Bf16AttentionResults cpu_results{std::vector<bfloat16>(tokens * C), dqkv_start,
                                     std::vector<float>(size_t(B) * NH * T)};
    cpu::attention_forward(cpu_results.out.data(), cpu_results.logsumexp.data(), qkv.data(), host_positions, B, T, C,
                           NH, KVH);
    cpu::attention_backward(cpu_results.dqkv.data(), dout.data(), qkv.data(), cpu_results.out.data(),
                            cpu_results.logsumexp.data(), host_positions, B, T, C, NH, KVH);

    DeviceBuffer<bfloat16> qkv_device(qkv), dout_device(dout), dqkv_device(dqkv_start), out_device(tokens * C);
    DeviceBuffer<float> logsumexp_device(nan_filled(size_t(B) * NH * T)), row_dot(size_t(B) * NH * T);
    DeviceBuffer<int32_t> positions_device(positions.empty() ? std::vector<int32_t>(1) : positions);
    const int32_t* device_positions = positions.empty() ? nullptr : positions_device.get();
    gpu::attention_forward(out_device.get(), logsumexp_device.get(), qkv_device.get(), device_positions, B, T, C, NH,
                           KVH, false, test.stream);
    // The backward reads the CPU's out and logsumexp, so that it is compared on the same inputs as the CPU's.
    DeviceBuffer<bfloat16> cpu_out(cpu_results.out);
    DeviceBuffer<float> cpu_logsumexp(cpu_results.logsumexp);
    gpu::attention_backward(dqkv_device.get(), row_dot.get(), dout_device.get(), qkv_device.get(), cpu_out.get(),
                            cpu_logsumexp.get(), device_positions, B, T, C, NH, KVH, false, test.stream);
    const auto out = out_device.to_host();
    const auto logsumexp = logsumexp_device.to_host();
    const auto dqkv = dqkv_device.to_host();

    const AttentionBounds bounds =
        document_bounds(widened(qkv), widened(dout), widened(cpu_results.out), cpu_results.logsumexp, shape, documents);
    const double f32_slack = (hs + T + 8) * std::ldexp(1.0, -24);
    const std::string where = " B=" + std::to_string(B) + " T=" + std::to_string(T) + " hs=" + std::to_string(hs) +
                              " NH=" + std::to_string(NH) + " KVH=" + std::to_string(KVH) +
                              (documents.empty() ? "" : " documents");
    UlpRecord out_record, dqkv_record;
    for (size_t i = 0; i < out.size(); ++i) {
        const double reference = to_float(cpu_results.out[i]), error = std::fabs(to_float(out[i]) - reference);
        EXPECT_LE(error, bfloat16_ulp(reference) + (2 * u + f32_slack) * bounds.forward[i]) << "out " << i << where;
        // Emulated, the scores, maxima and so the rounded P are computed in the CPU's order (wmma sums k ascending,
        // expf is the host's): only the softmax sum's order differs, so out is within its own 1 ulp.
        if (ENGINE_CUDA_EMULATED) EXPECT_LE(error, bfloat16_ulp(reference)) << "out (emulated) " << i << where;
        out_record.add(error, reference);
    }
    for (size_t i = 0; i < logsumexp.size(); ++i)
        EXPECT_LE(std::fabs(logsumexp[i] - cpu_results.logsumexp[i]),
                  f32_slack * (1.0 + std::fabs(cpu_results.logsumexp[i])))
            << "logsumexp " << i << where;
    for (size_t i = 0; i < dqkv.size(); ++i) {
        const double reference = to_float(cpu_results.dqkv[i]), error = std::fabs(to_float(dqkv[i]) - reference);
        EXPECT_LE(error, bfloat16_ulp(reference) + (2 * u + f32_slack) * bounds.backward[i] + std::ldexp(1.0, -20))
            << "dqkv " << i << where;
        dqkv_record.add(error, reference);
    }
    std::cout << "[ measured ]" << where << ": out within " << out_record.worst << " ulp, dqkv within "
              << dqkv_record.worst << " ulp of the CPU bf16\n";
}

// T = 1, 17, 20 and 70/80: a lone row, partial tiles, and rows past one 64-key tile (the rescaling) and past one
// 64-row block; head sizes 16 (one fragment), 24 (run-time width below 64, scalar loads), 64 (vectorized), 160
// and 256 (compiled width 256: the key pass's two column passes, 8 + 2 and 8 + 8 fragments).
TEST_F(Bf16KernelTest, AttentionMatchesTheCpuBf16) {
    for (const AttentionShape shape : {AttentionShape{1, 1, 32, 2}, AttentionShape{2, 17, 48, 2},
                                       AttentionShape{1, 80, 64, 1}, AttentionShape{1, 70, 32, 2},
                                       AttentionShape{1, 20, 160, 1}, AttentionShape{1, 20, 256, 1}}) {
        check_attention(*this, shape);
    }
}

// Grouped-query attention (KVH < NH): the key/value pass sums dK and dV of a kv head over its query heads in f32
// before the one rounding, as the CPU bf16 reference; the bounds sum over the same heads. T = 17 and 70 (partial
// tiles, past one 64-key tile), head sizes 64, 128 and 256, groups of 2, 3 and 6.
TEST_F(Bf16KernelTest, GroupedQueryAttentionMatchesTheCpuBf16) {
    for (const AttentionShape shape : {AttentionShape{2, 17, 256, 4, 2}, AttentionShape{1, 70, 384, 6, 1},
                                       AttentionShape{1, 20, 256, 2, 1}, AttentionShape{1, 70, 384, 3, 1},
                                       AttentionShape{1, 20, 512, 2, 1}, AttentionShape{1, 17, 144, 6, 2}}) {
        check_attention(*this, shape);
    }
}

// Packed documents (positions): the forward's key tiles stay the CPU's (64 keys from key 0), a row skips those
// without its keys and masks the rest to its document, so under emulation out stays within 1 ulp as above; the
// bounds are each document's own. Documents end on tile edges (64, 128) and inside tiles, one token long
// (first row, and after a tile edge), and span query blocks; T = 150 and 90 are no multiple of 32 or 64. In the
// second shape the block of rows 64.. starts at key tile 0 (row 64's document starts at 31) while rows 70.. see
// none of it: their running maximum is still -inf there. Head sizes 64, 16, 24 (scalar loads), 160 and 256 (two
// dK/dV column passes).
TEST_F(Bf16KernelTest, AttentionWithDocumentsMatchesTheCpuBf16) {
    check_attention(*this, AttentionShape{2, 150, 64, 1}, Documents{{1, 63, 2, 84}, {64, 64, 22}});
    check_attention(*this, AttentionShape{1, 100, 32, 2}, Documents{{30, 1, 39, 30}});
    check_attention(*this, AttentionShape{2, 90, 48, 2}, Documents{{90}, {45, 1, 44}});
    check_attention(*this, AttentionShape{1, 80, 160, 1}, Documents{{20, 60}});
    check_attention(*this, AttentionShape{1, 70, 256, 1}, Documents{{5, 65}});
}

// Grouped-query attention with documents: dK and dV of a kv head summed over its group's queries of the key's
// document only. Head sizes 64 (G = 2 and 3) and 256 (G = 2).
TEST_F(Bf16KernelTest, GroupedQueryAttentionWithDocumentsMatchesTheCpuBf16) {
    check_attention(*this, AttentionShape{2, 100, 256, 4, 2}, Documents{{1, 99}, {50, 50}});
    check_attention(*this, AttentionShape{1, 90, 384, 6, 2}, Documents{{70, 20}});
    check_attention(*this, AttentionShape{1, 40, 512, 2, 1}, Documents{{17, 23}});
}

// One document per row given as positions 0..T-1 is plain causal attention: the bf16 kernels give null
// positions' bits.
TEST_F(Bf16KernelTest, OneDocumentPerRowIsCausalBitwise) {
    const AttentionShape shape{2, 100, 128, 2, 1};
    const int B = shape.B, T = shape.T, C = shape.C, NH = shape.NH, KVH = shape.kv_heads();
    const size_t tokens = size_t(B) * T;
    const auto qkv = rounded(random_floats(tokens * shape.qkv_width(), -2.0f, 2.0f));
    const auto dout = rounded(random_floats(tokens * C));
    const auto dqkv_start = rounded(random_floats(tokens * shape.qkv_width(), -0.01f, 0.01f));
    DeviceBuffer<bfloat16> qkv_device(qkv), dout_device(dout);
    DeviceBuffer<int32_t> positions(document_positions(Documents(size_t(B), std::vector<int>{T}), shape));
    const auto run = [&](const int32_t* device_positions) {
        DeviceBuffer<bfloat16> out(tokens * C), dqkv(dqkv_start);
        DeviceBuffer<float> logsumexp(nan_filled(size_t(B) * NH * T)), row_dot(size_t(B) * NH * T);
        gpu::attention_forward(out.get(), logsumexp.get(), qkv_device.get(), device_positions, B, T, C, NH, KVH, false,
                               stream);
        gpu::attention_backward(dqkv.get(), row_dot.get(), dout_device.get(), qkv_device.get(), out.get(),
                                logsumexp.get(), device_positions, B, T, C, NH, KVH, false, stream);
        return Bf16AttentionResults{out.to_host(), dqkv.to_host(), logsumexp.to_host()};
    };
    const Bf16AttentionResults causal = run(nullptr), documents = run(positions.get());
    const auto same_bits = [](const auto& a, const auto& b) {
        return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(a[0])) == 0;
    };
    EXPECT_TRUE(same_bits(causal.out, documents.out));
    EXPECT_TRUE(same_bits(causal.logsumexp, documents.logsumexp));
    EXPECT_TRUE(same_bits(causal.dqkv, documents.dqkv));
}

// Fused cross-entropy: the CPU computes the row statistics in double, the GPU in f32 (online max and sum): the
// losses differ by f32 rounding, (V + 8)·2^-24·(1 + |loss|); the gradient (p - onehot)·dloss is rounded once on
// both, so it differs by at most 1 ulp plus the f32 difference of p, (V + 8)·2^-24·|dloss|.
// padded_V 40: packs of 4 (64-bit bf16 accesses); 38: the scalar path.
TEST_F(Bf16KernelTest, FusedCrossEntropyMatchesTheCpuBf16) {
    for (const int padded_V : {40, 38}) {
        const int N = 5, V = 37, ignore_index = -100;
        const auto logits = rounded(random_floats(size_t(N) * padded_V, -4.0f, 4.0f));
        const std::vector<int32_t> targets = {0, 36, ignore_index, 5, 20};
        const float dloss = 0.2f;
        std::vector<bfloat16> cpu_gradient = logits;
        std::vector<float> cpu_losses(N);
        cpu::cross_entropy_fused_forward(cpu_losses.data(), cpu_gradient.data(), targets.data(), dloss, N, V, padded_V,
                                         ignore_index);
        DeviceBuffer<bfloat16> gradient(logits);
        DeviceBuffer<int32_t> targets_device(targets);
        DeviceBuffer<float> losses(nan_filled(N));
        gpu::cross_entropy_fused_forward(losses.get(), gradient.get(), targets_device.get(), dloss, N, V, padded_V,
                                         ignore_index, stream);
        const auto cuda_losses = losses.to_host();
        const auto cuda_gradient = gradient.to_host();
        const double slack = (V + 8) * std::ldexp(1.0, -24);
        for (int n = 0; n < N; ++n)
            EXPECT_LE(std::fabs(cuda_losses[n] - cpu_losses[n]), slack * (1 + std::fabs(cpu_losses[n]))) << padded_V;
        for (size_t i = 0; i < cuda_gradient.size(); ++i) {
            const double reference = to_float(cpu_gradient[i]);
            EXPECT_LE(std::fabs(to_float(cuda_gradient[i]) - reference), bfloat16_ulp(reference) + slack * dloss)
                << "padded_V " << padded_V << " element " << i;
        }
    }
}

// linear with a bias in bf16, forward only (the bf16 bias gradient comes with the bias kernels' branch): the
// device's cuBLASLt epilogue against the CPU's gemm_bias, both rounding the f32 sum once: the GEMM's 1 ulp +
// slack (k = 19: 2k²·2^-24).
TEST_F(Bf16KernelTest, LinearWithBiasForwardMatchesTheCpu) {
    const int rows = 15, in = 19, out = 23;
    const auto x = rounded(random_floats(size_t(rows) * in)), w = rounded(random_floats(size_t(in) * out));
    const auto b = rounded(random_floats(size_t(out)));
    NoGradGuard no_grad;
    auto run = [&](Device device) {
        const Tensor y = linear(Tensor::from_vector<bfloat16>(x, {rows, in}, Device::cpu).to(device),
                                Tensor::from_vector<bfloat16>(w, {in, out}, Device::cpu).to(device),
                                Tensor::from_vector<bfloat16>(b, {out}, Device::cpu).to(device));
        EXPECT_EQ(y.dtype(), DType::bf16);
        return y.to(Device::cpu).to_vector<bfloat16>();
    };
    const auto on_cpu = run(Device::cpu), on_cuda = run(Device::cuda);
    const double slack = 2.0 * in * in * std::ldexp(1.0, -24);
    for (size_t i = 0; i < on_cpu.size(); ++i) {
        const double reference = to_float(on_cpu[i]);
        EXPECT_LE(std::fabs(to_float(on_cuda[i]) - reference), bfloat16_ulp(reference) + slack) << i;
    }
}

// The ops on the device against the ops on the CPU, bf16 end to end (linear without bias, attention, the tied
// head through matmul, cross-entropy): the dtypes (bf16 activations, f32 loss, f32 parameter gradients) and the
// loss within a loose bound (it passes through all of the above: 2^-5 relative).
TEST_F(Bf16KernelTest, OpsOnTheDeviceMatchTheCpu) {
    const int B = 2, T = 9, C = 32, V = 13, NH = 2;
    const auto x = rounded(random_floats(size_t(B) * T * C)), w = rounded(random_floats(size_t(C) * 3 * C));
    const auto table = rounded(random_floats(size_t(V) * C));
    std::vector<int32_t> labels(size_t(B) * T);
    for (size_t i = 0; i < labels.size(); ++i) labels[i] = int32_t((i * 7) % V);
    struct Run {
        float loss;
        std::vector<float> weight_grad;
    };
    auto run = [&](Device device) {
        Tensor input = Tensor::from_vector<bfloat16>(x, {B, T, C}, Device::cpu).to(device);
        Tensor weight = Tensor::from_vector<bfloat16>(w, {C, 3 * C}, Device::cpu).to(device);
        Tensor tokens = Tensor::from_vector<bfloat16>(table, {V, C}, Device::cpu).to(device);
        weight.set_requires_grad(true);
        tokens.set_requires_grad(true);
        const Tensor logits = matmul(attention(linear(input, weight), NH), tokens, true);
        const Tensor loss = cross_entropy(logits, Tensor::from_vector<int32_t>(labels, {B, T}, Device::cpu).to(device));
        EXPECT_EQ(logits.dtype(), DType::bf16);
        EXPECT_EQ(loss.dtype(), DType::f32);
        backward(loss);
        EXPECT_EQ(weight.grad().dtype(), DType::f32);
        EXPECT_EQ(tokens.grad().dtype(), DType::f32);
        return Run{loss.to(Device::cpu).to_vector<float>()[0], weight.grad().to(Device::cpu).to_vector<float>()};
    };
    const Run on_cpu = run(Device::cpu), on_cuda = run(Device::cuda);
    EXPECT_NEAR(on_cuda.loss, on_cpu.loss, std::ldexp(1.0, -5) * std::fabs(on_cpu.loss));
    double largest = 0.0;
    for (const float value : on_cpu.weight_grad) largest = std::max(largest, double(std::fabs(value)));
    for (size_t i = 0; i < on_cpu.weight_grad.size(); ++i)
        EXPECT_NEAR(on_cuda.weight_grad[i], on_cpu.weight_grad[i], std::ldexp(1.0, -5) * largest) << i;
}

} // namespace
} // namespace engine::test
