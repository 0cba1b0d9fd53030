// The emulated cuBLASLt: what it does not emulate (other epilogues, data types, attributes) is refused with
// CUBLAS_STATUS_NOT_SUPPORTED and a message naming it, and through the engine's check that becomes an
// EngineError naming the call; operands are checked like cuBLAS's, and pointers less aligned than the
// heuristic was told are refused.
#include <string>

#include <gtest/gtest.h>

#include "emulator/testing.h"
#include "tests/cuda/cuda_test.h"

namespace engine::test {
namespace {

class CublasLtEmulationTest : public CudaKernelTest {
protected:
    void SetUp() override {
        CudaKernelTest::SetUp();
        if (IsSkipped()) return;
        handle = engine::cuda::cublaslt_handle();
        ASSERT_EQ(cublasLtMatmulDescCreate(&operation, CUBLAS_COMPUTE_32F, CUDA_R_32F), CUBLAS_STATUS_SUCCESS);
    }
    void TearDown() override {
        if (operation != nullptr) (void)cublasLtMatmulDescDestroy(operation);
        engine::emulator::clear_fault();
    }
    cublasLtHandle_t handle = nullptr;
    cublasLtMatmulDesc_t operation = nullptr;
};

bool contains(const std::string& text, const std::string& part) { return text.find(part) != std::string::npos; }

TEST_F(CublasLtEmulationTest, UnemulatedEpilogueIsRefusedByName) {
    const uint32_t gelu = CUBLASLT_EPILOGUE_GELU_BIAS;
    EXPECT_EQ(cublasLtMatmulDescSetAttribute(operation, CUBLASLT_MATMUL_DESC_EPILOGUE, &gelu, sizeof(gelu)),
              CUBLAS_STATUS_NOT_SUPPORTED);
    EXPECT_TRUE(contains(engine::emulator::last_refusal(), "epilogue")) << engine::emulator::last_refusal();
    // Through the engine's check, the refusal is an exception naming the call.
    try {
        CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(operation, CUBLASLT_MATMUL_DESC_EPILOGUE, &gelu, sizeof(gelu)));
        FAIL() << "an unemulated epilogue was accepted";
    } catch (const EngineError& error) {
        EXPECT_TRUE(contains(error.what(), "cublasLtMatmulDescSetAttribute")) << error.what();
        EXPECT_TRUE(contains(error.what(), "not supported")) << error.what();
    }
    const uint32_t bias = CUBLASLT_EPILOGUE_BIAS;
    EXPECT_EQ(cublasLtMatmulDescSetAttribute(operation, CUBLASLT_MATMUL_DESC_EPILOGUE, &bias, sizeof(bias)),
              CUBLAS_STATUS_SUCCESS);
    // The wrong size for an attribute is cuBLASLt's own INVALID_VALUE, not a refusal.
    EXPECT_EQ(cublasLtMatmulDescSetAttribute(operation, CUBLASLT_MATMUL_DESC_EPILOGUE, &bias, 2),
              CUBLAS_STATUS_INVALID_VALUE);
}

TEST_F(CublasLtEmulationTest, UnemulatedTypesAndAttributesAreRefusedByName) {
    cublasLtMatrixLayout_t layout = nullptr;
    EXPECT_EQ(cublasLtMatrixLayoutCreate(&layout, CUDA_R_16F, 4, 4, 4), CUBLAS_STATUS_NOT_SUPPORTED); // bf16 is
    EXPECT_TRUE(contains(engine::emulator::last_refusal(), "data type")) << engine::emulator::last_refusal();
    cublasLtMatmulDesc_t half = nullptr;
    EXPECT_EQ(cublasLtMatmulDescCreate(&half, CUBLAS_COMPUTE_16F, CUDA_R_16F), CUBLAS_STATUS_NOT_SUPPORTED);
    EXPECT_TRUE(contains(engine::emulator::last_refusal(), "compute type")) << engine::emulator::last_refusal();
    const int32_t fill = CUBLAS_FILL_MODE_FULL;
    EXPECT_EQ(cublasLtMatmulDescSetAttribute(operation, CUBLASLT_MATMUL_DESC_FILL_MODE, &fill, sizeof(fill)),
              CUBLAS_STATUS_NOT_SUPPORTED);
    EXPECT_TRUE(contains(engine::emulator::last_refusal(), "attribute")) << engine::emulator::last_refusal();
}

// D (4,5) = A (4,3) · B (3,5) + bias (4); the layouts must agree, and the algorithm's alignments must hold.
TEST_F(CublasLtEmulationTest, ShapesAndAlignmentsAreChecked) {
    const uint32_t epilogue = CUBLASLT_EPILOGUE_BIAS;
    DeviceBuffer<float> a(std::vector<float>(4 * 3, 1.0f)), b(std::vector<float>(3 * 5 + 1, 1.0f)),
        bias(std::vector<float>(4, 0.5f)), d(4 * 5 + 1);
    const float* bias_pointer = bias.get();
    ASSERT_EQ(cublasLtMatmulDescSetAttribute(operation, CUBLASLT_MATMUL_DESC_EPILOGUE, &epilogue, sizeof(epilogue)),
              CUBLAS_STATUS_SUCCESS);
    ASSERT_EQ(cublasLtMatmulDescSetAttribute(operation, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias_pointer,
                                             sizeof(bias_pointer)),
              CUBLAS_STATUS_SUCCESS);
    cublasLtMatrixLayout_t a_layout = nullptr, b_layout = nullptr, d_layout = nullptr, wrong = nullptr;
    ASSERT_EQ(cublasLtMatrixLayoutCreate(&a_layout, CUDA_R_32F, 4, 3, 4), CUBLAS_STATUS_SUCCESS);
    ASSERT_EQ(cublasLtMatrixLayoutCreate(&b_layout, CUDA_R_32F, 3, 5, 3), CUBLAS_STATUS_SUCCESS);
    ASSERT_EQ(cublasLtMatrixLayoutCreate(&d_layout, CUDA_R_32F, 4, 5, 4), CUBLAS_STATUS_SUCCESS);
    ASSERT_EQ(cublasLtMatrixLayoutCreate(&wrong, CUDA_R_32F, 4, 6, 4), CUBLAS_STATUS_SUCCESS);
    cublasLtMatmulPreference_t preference = nullptr;
    ASSERT_EQ(cublasLtMatmulPreferenceCreate(&preference), CUBLAS_STATUS_SUCCESS);
    // Emulated device blocks end against a guard page, so they are 16-byte aligned, not 256 as cudaMalloc's.
    for (const auto attribute : {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES,
                                 CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES}) {
        const uint32_t alignment = 16;
        ASSERT_EQ(cublasLtMatmulPreferenceSetAttribute(preference, attribute, &alignment, sizeof(alignment)),
                  CUBLAS_STATUS_SUCCESS);
    }
    cublasLtMatmulHeuristicResult_t result{};
    int found = 0;
    EXPECT_EQ(cublasLtMatmulAlgoGetHeuristic(handle, operation, a_layout, b_layout, wrong, wrong, preference, 1,
                                             &result, &found),
              CUBLAS_STATUS_INVALID_VALUE);
    ASSERT_EQ(cublasLtMatmulAlgoGetHeuristic(handle, operation, a_layout, b_layout, d_layout, d_layout, preference, 1,
                                             &result, &found),
              CUBLAS_STATUS_SUCCESS);
    ASSERT_EQ(found, 1);
    const float one = 1.0f, zero = 0.0f;
    // The heuristic was promised 16-byte alignment; B one float in is 4-byte aligned.
    EXPECT_EQ(cublasLtMatmul(handle, operation, &one, a.get(), a_layout, b.get() + 1, b_layout, &zero, d.get(), d_layout,
                             d.get(), d_layout, &result.algo, nullptr, 0, stream),
              CUBLAS_STATUS_NOT_SUPPORTED);
    EXPECT_TRUE(contains(engine::emulator::last_refusal(), "MIN_ALIGNMENT_B")) << engine::emulator::last_refusal();
    ASSERT_EQ(cublasLtMatmul(handle, operation, &one, a.get(), a_layout, b.get(), b_layout, &zero, d.get(), d_layout,
                             d.get(), d_layout, &result.algo, nullptr, 0, stream),
              CUBLAS_STATUS_SUCCESS);
    const std::vector<float> product = d.to_host();
    for (int element = 0; element < 4 * 5; ++element) EXPECT_EQ(product[size_t(element)], 3.5f) << element;
    for (auto layout : {a_layout, b_layout, d_layout, wrong}) (void)cublasLtMatrixLayoutDestroy(layout);
    (void)cublasLtMatmulPreferenceDestroy(preference);
}

} // namespace
} // namespace engine::test
