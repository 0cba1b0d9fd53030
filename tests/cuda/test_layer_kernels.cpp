// CUDA vs CPU for the layer kernels: GEMM (every transpose, fp32 and TF32) and cross-entropy (attention:
// test_attention_kernels.cpp; layernorm: test_reduction_kernels.cpp). Outputs are poisoned with NaN. +=
// outputs start from identical small random contents, U(-0.01, 0.01): non-zero, so a kernel that overwrites
// fails, yet small beside the gradients, so the rtol term (relative to |start + gradient|) does not hide
// errors in the gradient itself.
#include "engine/cuda/runtime.h"
#include "kernels/cpu/cpu_kernels.h"
#include "kernels/cuda/cuda_kernels.h"
#include "tests/cuda/compare.h"
#include "tests/cuda/cuda_test.h"

namespace engine::test {
namespace {

namespace cpu = engine::kernels::cpu;
namespace gpu = engine::kernels::cuda;

using LayerKernelTest = CudaKernelTest;

constexpr float accumulator_start = 0.01f;
std::vector<float> accumulator(LayerKernelTest& test, size_t count) {
    return test.random_floats(count, -accumulator_start, accumulator_start);
}

constexpr int gemm_k = 29;

// beta 0.3 accumulates into c; beta 0 must overwrite c, so there c starts as NaN (the BLAS rule that c is
// not read is what a fused bias or a fresh output buffer relies on).
void check_gemm(LayerKernelTest& test, bool transpose_a, bool transpose_b, float beta, bool tf32,
                Tolerance tolerance, int k = gemm_k) {
    constexpr int m = 37, n = 53;
    const auto a = test.random_floats(size_t(m) * k), b = test.random_floats(size_t(k) * n);
    auto c = beta == 0.0f ? nan_filled(size_t(m) * n) : test.random_floats(size_t(m) * n);
    DeviceBuffer<float> a_device(a), b_device(b), c_device(c);
    cpu::gemm(c.data(), a.data(), b.data(), m, n, k, transpose_a, transpose_b, 0.7f, beta);
    gpu::gemm(c_device.get(), a_device.get(), b_device.get(), m, n, k, transpose_a, transpose_b, 0.7f, beta, tf32,
              engine::cuda::cublas_handle(), test.stream);
    EXPECT_TRUE(all_close(c_device.to_host(), c, tolerance,
                          "gemm transpose_a=" + std::to_string(transpose_a) +
                              " transpose_b=" + std::to_string(transpose_b) + " beta=" + std::to_string(beta) +
                              " tf32=" + std::to_string(tf32) + " k=" + std::to_string(k)));
}

TEST_F(LayerKernelTest, GemmFp32EveryTransposeAndBeta) {
    for (const float beta : {0.3f, 0.0f}) {
        for (const bool transpose_a : {false, true}) {
            for (const bool transpose_b : {false, true})
                check_gemm(*this, transpose_a, transpose_b, beta, false, Tolerance{1e-5, 1e-4});
        }
    }
}

// k = 0: the product is empty, so c = beta * c exactly (and beta = 0 writes zeros over the NaN).
TEST_F(LayerKernelTest, GemmWithEmptyInnerDimensionScalesC) {
    for (const float beta : {0.3f, 0.0f}) check_gemm(*this, false, false, beta, false, Tolerance{0.0, 0.0}, 0);
}

// TF32 keeps 10 of float's 23 mantissa bits, so each input carries a relative error up to 2^-11 if cuBLAS
// rounds it, 2^-10 if it truncates. With inputs U(-1,1) (|a*b| rms 1/3) the error of one product has rms
// about 1.3e-4 (rounding) or 3.5e-4 (truncation); over k = 29 random-sign terms, times alpha 0.7, that is
// an rms of 5e-4 or 1.3e-3 per output, and the largest of ~2,000 outputs is under 4 rms: 2e-3 or 5e-3.
// atol 1e-2 covers truncation with 2x to spare (5e-3 would suffice only if rounding were certain); any
// indexing or transpose error moves outputs by O(1).
TEST_F(LayerKernelTest, GemmTf32EveryTranspose) {
    static_assert(gemm_k == 29, "the TF32 tolerance below is derived for k = 29");
    for (const bool transpose_a : {false, true}) {
        for (const bool transpose_b : {false, true})
            check_gemm(*this, transpose_a, transpose_b, 0.3f, true, Tolerance{1e-2, 5e-3});
    }
}

TEST_F(LayerKernelTest, CrossEntropyForwardAndBackward) {
    constexpr int N = 3 * 37, V = 301, ignore_index = -100;
    const auto logits = random_floats(size_t(N) * V, -8.0f, 8.0f), dlosses = random_floats(N);
    auto targets = random_ints(N, 0, V - 1);
    targets[0] = targets[N - 1] = ignore_index;
    std::vector<float> losses(N);
    auto dlogits = accumulator(*this, size_t(N) * V);
    DeviceBuffer<float> logits_device(logits), dlosses_device(dlosses), losses_device(nan_filled(N));
    DeviceBuffer<float> dlogits_device(dlogits);
    DeviceBuffer<int32_t> targets_device(targets);
    cpu::cross_entropy_forward(losses.data(), logits.data(), targets.data(), N, V, ignore_index);
    cpu::cross_entropy_backward(dlogits.data(), dlosses.data(), logits.data(), targets.data(), N, V, ignore_index);
    gpu::cross_entropy_forward(losses_device.get(), logits_device.get(), targets_device.get(), N, V, ignore_index,
                               stream);
    gpu::cross_entropy_backward(dlogits_device.get(), dlosses_device.get(), logits_device.get(), targets_device.get(),
                                N, V, ignore_index, stream);
    EXPECT_TRUE(all_close(losses_device.to_host(), losses, Tolerance{1e-5, 1e-5}, "cross_entropy losses"));
    EXPECT_TRUE(all_close(dlogits_device.to_host(), dlogits, Tolerance{2e-6, 1e-5}, "cross_entropy dlogits"));
}

} // namespace
} // namespace engine::test
