// CUDA vs CPU for the GEMM with the bias in cuBLASLt's epilogue: gemm_bias against the CPU gemm followed by
// bias_add_forward (every transpose, shapes off every tile size, fp32 and TF32), and linear() with a bias on
// CUDA against linear() on the CPU. Outputs start as NaN: the fused GEMM must write every element.
#include <cmath>
#include <string>

#include "engine/cuda/runtime.h"
#include "engine/memory.h"
#include "engine/ops.h"
#include "kernels/cpu/cpu_kernels.h"
#include "kernels/cuda/cuda_kernels.h"
#include "tests/cuda/compare.h"
#include "tests/cuda/cuda_test.h"

namespace engine::test {
namespace {

namespace cpu = engine::kernels::cpu;
namespace gpu = engine::kernels::cuda;

using GemmEpilogueTest = CudaKernelTest;

struct GemmShape {
    int m, n, k;
};
// Not multiples of 16 (or of 4), one row alone, and a longer inner dimension.
constexpr GemmShape shapes[] = {{17, 33, 5}, {1, 33, 5}, {37, 53, 29}};

void check_gemm_bias(GemmEpilogueTest& test, GemmShape shape, bool transpose_a, bool transpose_b, bool tf32,
                     Tolerance tolerance) {
    const auto [m, n, k] = shape;
    const auto a = test.random_floats(size_t(m) * k), b = test.random_floats(size_t(k) * n);
    const auto bias = test.random_floats(size_t(n));
    auto c = nan_filled(size_t(m) * n);
    DeviceBuffer<float> a_device(a), b_device(b), bias_device(bias), c_device(c);
    cpu::gemm(c.data(), a.data(), b.data(), m, n, k, transpose_a, transpose_b, 1.0f, 0.0f);
    cpu::bias_add_forward(c.data(), bias.data(), m, n);
    gpu::gemm_bias(c_device.get(), a_device.get(), b_device.get(), bias_device.get(), m, n, k, transpose_a,
                   transpose_b, tf32, engine::cuda::cublaslt_handle(), engine::cuda::cublaslt_workspace(),
                   engine::cuda::cublaslt_workspace_bytes, test.stream);
    EXPECT_TRUE(all_close(c_device.to_host(), c, tolerance,
                          "gemm_bias m=" + std::to_string(m) + " n=" + std::to_string(n) + " k=" + std::to_string(k) +
                              " transpose_a=" + std::to_string(transpose_a) +
                              " transpose_b=" + std::to_string(transpose_b) + " tf32=" + std::to_string(tf32)));
}

TEST_F(GemmEpilogueTest, Fp32EveryTransposeAndShape) {
    for (const GemmShape shape : shapes) {
        for (const bool transpose_a : {false, true}) {
            for (const bool transpose_b : {false, true})
                check_gemm_bias(*this, shape, transpose_a, transpose_b, false, Tolerance{1e-5, 1e-4});
        }
    }
}

// TF32 rounds each operand to 10 mantissa bits: a relative error of at most 2^-11 each, so one product
// a·b is off by at most (1 + 2^-11)^2 - 1 ~ 2^-10 of |a·b| <= 1 (inputs in [-1,1]). Summed over k terms the
// error is at most k·2^-10 (the bias is added in fp32, and fp32 accumulation adds ~1e-6): a bound, not an
// rms, so no seed can break it; an indexing, transpose or bias error moves outputs by O(1) > k·2^-10 for
// these k. (Truncation instead of rounding would double the worst case, yet random signs keep the actual
// errors near sqrt(k)·2^-10/3, far inside.)
TEST_F(GemmEpilogueTest, Tf32EveryTransposeAndShape) {
    for (const GemmShape shape : shapes) {
        const double bound = shape.k * std::ldexp(1.0, -10) + 1e-5;
        for (const bool transpose_a : {false, true}) {
            for (const bool transpose_b : {false, true})
                check_gemm_bias(*this, shape, transpose_a, transpose_b, true, Tolerance{bound, 0.0});
        }
    }
}

// k = 0: the product is empty, so every row is the bias, exactly.
TEST_F(GemmEpilogueTest, EmptyInnerDimensionGivesTheBias) {
    check_gemm_bias(*this, GemmShape{3, 7, 0}, false, false, false, Tolerance{0.0, 0.0});
}

// The op: linear() with a bias on CUDA (one gemm_bias) equals linear() on the CPU (gemm, then the bias), for a
// 3-D input whose rows (3·5) and widths are off every tile size. cuBLASLt's workspace is accounted.
TEST_F(GemmEpilogueTest, LinearWithBiasMatchesTheCpu) {
    constexpr int batch = 3, time = 5, in_features = 19, out_features = 23;
    const Tensor input = Tensor::from_vector<float>(random_floats(size_t(batch) * time * in_features),
                                                    {batch, time, in_features}, Device::cpu);
    const Tensor weight = Tensor::from_vector<float>(random_floats(size_t(in_features) * out_features),
                                                     {in_features, out_features}, Device::cpu);
    const Tensor bias = Tensor::from_vector<float>(random_floats(out_features), {out_features}, Device::cpu);
    const Tensor expected = linear(input, weight, bias);
    const Tensor actual = linear(input.to(Device::cuda), weight.to(Device::cuda), bias.to(Device::cuda));
    ASSERT_EQ(actual.shape(), expected.shape());
    EXPECT_TRUE(all_close(actual.to(Device::cpu).to_vector<float>(), expected.to_vector<float>(),
                          Tolerance{1e-5, 1e-4}, "linear with bias"));
    EXPECT_GE(memory_stats(Device::cuda).current(MemoryCategory::workspace), engine::cuda::cublaslt_workspace_bytes);
}

} // namespace
} // namespace engine::test
