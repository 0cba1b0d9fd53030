// The emulated cuBLAS and cuBLASLt with bf16 operands: cublasGemmEx with CUDA_R_16BF A and B and an f32 or bf16
// C in CUBLAS_COMPUTE_32F, and cuBLASLt's bf16 layouts with the bias epilogue, computed in f32 and rounded once
// into a bf16 C; combinations that are not emulated (mixed operand types, TF32 or 16F compute with bf16) are
// refused by name.
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "emulator/testing.h"
#include "base/bfloat16.h"
#include "tests/bf16_vectors.h"
#include "tests/cuda/cuda_test.h"

namespace engine::test {
namespace {

using Bf16EmulationTest = CudaKernelTest;

bool contains(const std::string& text, const std::string& part) { return text.find(part) != std::string::npos; }

// Column-major C (m,n) = alpha·A(m,k)·B(k,n) + beta·C + bias(m), in f32 from the same values, k ascending.
std::vector<float> reference(const std::vector<float>& a, const std::vector<float>& b, std::vector<float> c,
                             const std::vector<float>& bias, int m, int n, int k, float alpha, float beta) {
    for (int column = 0; column < n; ++column) {
        for (int row = 0; row < m; ++row) {
            float sum = 0.0f;
            for (int inner = 0; inner < k; ++inner) sum += a[size_t(inner) * m + row] * b[size_t(column) * k + inner];
            float& value = c[size_t(column) * m + row];
            value = alpha * sum + beta * value + (bias.empty() ? 0.0f : bias[row]);
        }
    }
    return c;
}

// The f32 sums of exactly-widened operands differ from the reference only in summation order: within
// k·2^-24·sum|a||b| <= 2^-17 here (k = 9, |a|,|b| <= 1), far below half a bf16 ulp of the O(1) results, so the
// bf16 C equals round(reference) except where the reference lies within that slack of a rounding boundary; the
// check allows 1 ulp there and none elsewhere (f32 C: the slack itself).
TEST_F(Bf16EmulationTest, GemmExBf16OperandsWithF32AndBf16C) {
    const int m = 5, n = 6, k = 9;
    const auto a = rounded(random_floats(size_t(m) * k)), b = rounded(random_floats(size_t(k) * n));
    const auto c0 = random_floats(size_t(m) * n);
    DeviceBuffer<bfloat16> a_device(a), b_device(b), c_bf16(rounded(c0));
    DeviceBuffer<float> c_f32(c0);
    const float alpha = 0.5f, beta = 1.0f;
    cublasHandle_t handle = engine::cuda::cublas_handle();
    ASSERT_EQ(cublasSetStream(handle, stream), CUBLAS_STATUS_SUCCESS);
    ASSERT_EQ(cublasGemmEx(handle, CUBLAS_OP_N, CUBLAS_OP_N, m, n, k, &alpha, a_device.get(), CUDA_R_16BF, m,
                           b_device.get(), CUDA_R_16BF, k, &beta, c_f32.get(), CUDA_R_32F, m, CUBLAS_COMPUTE_32F,
                           CUBLAS_GEMM_DEFAULT),
              CUBLAS_STATUS_SUCCESS);
    ASSERT_EQ(cublasGemmEx(handle, CUBLAS_OP_N, CUBLAS_OP_N, m, n, k, &alpha, a_device.get(), CUDA_R_16BF, m,
                           b_device.get(), CUDA_R_16BF, k, &beta, c_bf16.get(), CUDA_R_16BF, m, CUBLAS_COMPUTE_32F,
                           CUBLAS_GEMM_DEFAULT),
              CUBLAS_STATUS_SUCCESS);
    const auto f32_expected = reference(widened(a), widened(b), c0, {}, m, n, k, alpha, beta);
    const auto bf16_expected = reference(widened(a), widened(b), widened(rounded(c0)), {}, m, n, k, alpha, beta);
    const auto f32_result = c_f32.to_host();
    const auto bf16_result = c_bf16.to_host();
    const double slack = std::ldexp(1.0, -17);
    for (size_t i = 0; i < f32_result.size(); ++i) {
        EXPECT_NEAR(f32_result[i], f32_expected[i], slack) << i;
        const double error = std::fabs(double(to_float(bf16_result[i])) - bf16_expected[i]);
        const bool near_boundary = std::fabs(std::fabs(bf16_expected[i] - to_float(to_bfloat16(bf16_expected[i]))) -
                                             0.5 * bfloat16_ulp(bf16_expected[i])) <= slack;
        EXPECT_LE(error, (near_boundary ? 1.0 : 0.5) * bfloat16_ulp(bf16_expected[i])) << i;
    }
}

TEST_F(Bf16EmulationTest, MixedOrTf32Bf16GemmsAreRefusedByName) {
    const int m = 2, n = 2, k = 2;
    DeviceBuffer<bfloat16> a(size_t(m) * k), c(size_t(m) * n);
    DeviceBuffer<float> b(size_t(k) * n);
    const float one = 1.0f, zero = 0.0f;
    cublasHandle_t handle = engine::cuda::cublas_handle();
    EXPECT_EQ(cublasGemmEx(handle, CUBLAS_OP_N, CUBLAS_OP_N, m, n, k, &one, a.get(), CUDA_R_16BF, m, b.get(), CUDA_R_32F,
                           k, &zero, c.get(), CUDA_R_16BF, m, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
              CUBLAS_STATUS_NOT_SUPPORTED);
    EXPECT_TRUE(contains(engine::emulator::last_refusal(), "data types")) << engine::emulator::last_refusal();
    EXPECT_EQ(cublasGemmEx(handle, CUBLAS_OP_N, CUBLAS_OP_N, m, n, k, &one, a.get(), CUDA_R_16BF, m, a.get(),
                           CUDA_R_16BF, k, &zero, c.get(), CUDA_R_16BF, m, CUBLAS_COMPUTE_32F_FAST_TF32,
                           CUBLAS_GEMM_DEFAULT),
              CUBLAS_STATUS_NOT_SUPPORTED);
    EXPECT_TRUE(contains(engine::emulator::last_refusal(), "compute type")) << engine::emulator::last_refusal();
}

// cuBLASLt: D (bf16) = A·B + bias (bf16), every layout CUDA_R_16BF: the f32 result plus the bias rounded once;
// same slack argument as above. Mixed A/B types are refused by name.
TEST_F(Bf16EmulationTest, LtMatmulBf16WithBiasRoundsOnce) {
    const int m = 4, n = 5, k = 9;
    const auto a = rounded(random_floats(size_t(m) * k)), b = rounded(random_floats(size_t(k) * n));
    const auto bias = rounded(random_floats(size_t(m)));
    DeviceBuffer<bfloat16> a_device(a), b_device(b), bias_device(bias), d(size_t(m) * n);
    cublasLtHandle_t handle = engine::cuda::cublaslt_handle();
    cublasLtMatmulDesc_t operation = nullptr;
    ASSERT_EQ(cublasLtMatmulDescCreate(&operation, CUBLAS_COMPUTE_32F, CUDA_R_32F), CUBLAS_STATUS_SUCCESS);
    const uint32_t epilogue = CUBLASLT_EPILOGUE_BIAS;
    const void* bias_pointer = bias_device.get();
    ASSERT_EQ(cublasLtMatmulDescSetAttribute(operation, CUBLASLT_MATMUL_DESC_EPILOGUE, &epilogue, sizeof(epilogue)),
              CUBLAS_STATUS_SUCCESS);
    ASSERT_EQ(cublasLtMatmulDescSetAttribute(operation, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias_pointer,
                                             sizeof(bias_pointer)),
              CUBLAS_STATUS_SUCCESS);
    cublasLtMatrixLayout_t a_layout = nullptr, b_layout = nullptr, d_layout = nullptr, f32_layout = nullptr;
    ASSERT_EQ(cublasLtMatrixLayoutCreate(&a_layout, CUDA_R_16BF, m, k, m), CUBLAS_STATUS_SUCCESS);
    ASSERT_EQ(cublasLtMatrixLayoutCreate(&b_layout, CUDA_R_16BF, k, n, k), CUBLAS_STATUS_SUCCESS);
    ASSERT_EQ(cublasLtMatrixLayoutCreate(&d_layout, CUDA_R_16BF, m, n, m), CUBLAS_STATUS_SUCCESS);
    ASSERT_EQ(cublasLtMatrixLayoutCreate(&f32_layout, CUDA_R_32F, k, n, k), CUBLAS_STATUS_SUCCESS);
    const float one = 1.0f, zero = 0.0f;
    ASSERT_EQ(cublasLtMatmul(handle, operation, &one, a_device.get(), a_layout, b_device.get(), b_layout, &zero, d.get(),
                             d_layout, d.get(), d_layout, nullptr, nullptr, 0, stream),
              CUBLAS_STATUS_SUCCESS);
    const auto expected = reference(widened(a), widened(b), std::vector<float>(size_t(m) * n), widened(bias), m, n, k,
                                    1.0f, 0.0f);
    const auto result = d.to_host();
    const double slack = std::ldexp(1.0, -17);
    for (size_t i = 0; i < result.size(); ++i) {
        const bool near_boundary = std::fabs(std::fabs(expected[i] - to_float(to_bfloat16(expected[i]))) -
                                             0.5 * bfloat16_ulp(expected[i])) <= slack;
        EXPECT_LE(std::fabs(double(to_float(result[i])) - expected[i]),
                  (near_boundary ? 1.0 : 0.5) * bfloat16_ulp(expected[i]))
            << i;
    }
    EXPECT_EQ(cublasLtMatmul(handle, operation, &one, a_device.get(), a_layout, b_device.get(), f32_layout, &zero,
                             d.get(), d_layout, d.get(), d_layout, nullptr, nullptr, 0, stream),
              CUBLAS_STATUS_NOT_SUPPORTED);
    EXPECT_TRUE(contains(engine::emulator::last_refusal(), "matrix types")) << engine::emulator::last_refusal();
    for (auto* layout : {a_layout, b_layout, d_layout, f32_layout}) (void)cublasLtMatrixLayoutDestroy(layout);
    (void)cublasLtMatmulDescDestroy(operation);
}

} // namespace
} // namespace engine::test
