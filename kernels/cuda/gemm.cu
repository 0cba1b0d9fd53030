// Row-major GEMM on cuBLAS (CUDA twin of kernels/cpu/gemm.cpp), and the GEMM with the bias added in
// cuBLASLt's epilogue (the twin of kernels/cpu gemm followed by bias_add_forward).
#include <cstdint>
#include <map>
#include <mutex>
#include <tuple>
#include <utility>

#include "base/cuda/check.h"
#include "kernels/cuda/cuda_kernels.h"
#include "kernels/cuda/gemm_operands.h"

namespace engine::kernels::cuda {

namespace {

// Row-major C = op(A) op(B) as column-major Cᵀ = op(B)ᵀ op(A)ᵀ (kernels/cuda/gemm_operands.h). The operands are
// `operand_type` (f32, or bf16 on the bf16 tensor cores), c is `c_type`; the compute type is f32 (or TF32
// when `tf32` and the operands are f32), so a bf16 c is the f32 result alpha·AB + beta·C rounded once.
void gemm_ex(void* c, cudaDataType c_type, const void* a, const void* b, cudaDataType operand_type, int m, int n,
             int k, bool transpose_a, bool transpose_b, float alpha, float beta, bool tf32, cublasHandle_t handle,
             cudaStream_t stream) {
    if (m == 0 || n == 0) return;
    if (k == 0) { // as in the CPU twin: the product is empty, so c = beta * c, and beta == 0 overwrites NaN
        const int64_t count = int64_t(m) * n;
        const size_t element_bytes = c_type == CUDA_R_16BF ? sizeof(bfloat16) : sizeof(float);
        if (beta == 0.0f) {
            CUDA_CHECK(cudaMemsetAsync(c, 0, count * element_bytes, stream));
        } else if (c_type == CUDA_R_32F) {
            scale(static_cast<float*>(c), beta, count, stream);
        } else {
            ENGINE_CHECK(beta == 1.0f, "gemm: a bf16 c (" << m << "x" << n << ") with k = 0 and beta " << beta
                                                          << " is not implemented (beta 0 or 1 are)");
        }
        return;
    }
    CUBLAS_CHECK(cublasSetStream(handle, stream));
    const ColumnMajorGemm layout = column_major_gemm(m, n, k, transpose_a, transpose_b, tf32, operand_type);
    CUBLAS_CHECK(cublasGemmEx(handle, layout.operation_b, layout.operation_a, n, m, k, &alpha, b, operand_type,
                              layout.leading_b, a, operand_type, layout.leading_a, &beta, c, c_type, n, layout.compute,
                              CUBLAS_GEMM_DEFAULT));
}

} // namespace

void gemm(float* c, const float* a, const float* b, int m, int n, int k, bool transpose_a, bool transpose_b,
          float alpha, float beta, bool tf32, cublasHandle_t handle, cudaStream_t stream) {
    gemm_ex(c, CUDA_R_32F, a, b, CUDA_R_32F, m, n, k, transpose_a, transpose_b, alpha, beta, tf32, handle, stream);
}

// bfloat16 is layout-compatible with __nv_bfloat16, which is what cuBLAS reads for CUDA_R_16BF.
void gemm(bfloat16* c, const bfloat16* a, const bfloat16* b, int m, int n, int k, bool transpose_a, bool transpose_b,
          float alpha, float beta, bool tf32, cublasHandle_t handle, cudaStream_t stream) {
    gemm_ex(c, CUDA_R_16BF, a, b, CUDA_R_16BF, m, n, k, transpose_a, transpose_b, alpha, beta, tf32, handle, stream);
}

void gemm(float* c, const bfloat16* a, const bfloat16* b, int m, int n, int k, bool transpose_a, bool transpose_b,
          float alpha, float beta, bool tf32, cublasHandle_t handle, cudaStream_t stream) {
    gemm_ex(c, CUDA_R_32F, a, b, CUDA_R_16BF, m, n, k, transpose_a, transpose_b, alpha, beta, tf32, handle, stream);
}

namespace {

// The descriptors of one cublasLtMatmul call, destroyed on every path (a failed call throws).
struct MatmulDescriptors {
    cublasLtMatmulDesc_t operation = nullptr;
    cublasLtMatrixLayout_t a = nullptr, b = nullptr, c = nullptr;
    cublasLtMatmulPreference_t preference = nullptr;
    MatmulDescriptors() = default;
    MatmulDescriptors(const MatmulDescriptors&) = delete;
    MatmulDescriptors& operator=(const MatmulDescriptors&) = delete;
    ~MatmulDescriptors() {
        if (preference != nullptr) (void)cublasLtMatmulPreferenceDestroy(preference);
        if (c != nullptr) (void)cublasLtMatrixLayoutDestroy(c);
        if (b != nullptr) (void)cublasLtMatrixLayoutDestroy(b);
        if (a != nullptr) (void)cublasLtMatrixLayoutDestroy(a);
        if (operation != nullptr) (void)cublasLtMatmulDescDestroy(operation);
    }
};

// The largest power of two up to 256 that divides the address: cuBLASLt's heuristic assumes 256-byte aligned
// operands unless told otherwise, and a kernel chosen for that may fail on a tensor view at an offset.
uint32_t alignment_of(const void* pointer) {
    const auto address = reinterpret_cast<uintptr_t>(pointer);
    uint32_t alignment = 256;
    while (alignment > 1 && address % alignment != 0) alignment /= 2;
    return alignment;
}

// The heuristic's pick depends on the shape, the flags, the workspace and the alignments; asking it is a
// host-side search worth skipping in a training loop, where the same few shapes repeat every step.
// The third flag is the math: 0 fp32, 1 TF32, 2 bf16 operands.
using AlgorithmKey = std::tuple<cublasLtHandle_t, int, int, int, bool, bool, int, size_t, uint32_t, uint32_t, uint32_t,
                                uint32_t>;
std::mutex algorithm_mutex;
std::map<AlgorithmKey, cublasLtMatmulAlgo_t> algorithms;

// Row-major C = op(A) op(B) + bias is column-major C^T = op(B)^T op(A)^T + bias, the bias now running along
// C^T's rows, which is what CUBLASLT_EPILOGUE_BIAS adds (a vector as long as D's rows, on every column).
// `type`: of a, b, bias and c alike (f32, or bf16 with the f32 result plus bias rounded once into c).
void gemm_bias_ex(void* c, const void* a, const void* b, const void* bias, cudaDataType type, int m, int n, int k,
                  bool transpose_a, bool transpose_b, bool tf32, cublasLtHandle_t handle, void* workspace,
                  size_t workspace_bytes, cudaStream_t stream) {
    MatmulDescriptors descriptors;
    if (type != CUDA_R_32F) tf32 = false; // TF32 is a math of f32 operands only
    const cublasComputeType_t compute = tf32 ? CUBLAS_COMPUTE_32F_FAST_TF32 : CUBLAS_COMPUTE_32F;
    CUBLAS_CHECK(cublasLtMatmulDescCreate(&descriptors.operation, compute, CUDA_R_32F));
    const int32_t operation_b = transpose_b ? CUBLAS_OP_T : CUBLAS_OP_N; // cuBLASLt's A is our b
    const int32_t operation_a = transpose_a ? CUBLAS_OP_T : CUBLAS_OP_N; // and its B our a
    const uint32_t epilogue = CUBLASLT_EPILOGUE_BIAS;
    CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(descriptors.operation, CUBLASLT_MATMUL_DESC_TRANSA, &operation_b,
                                                sizeof(operation_b)));
    CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(descriptors.operation, CUBLASLT_MATMUL_DESC_TRANSB, &operation_a,
                                                sizeof(operation_a)));
    CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(descriptors.operation, CUBLASLT_MATMUL_DESC_EPILOGUE, &epilogue,
                                                sizeof(epilogue)));
    CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(descriptors.operation, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias,
                                                sizeof(bias)));
    // Column-major layouts of the row-major operands: b stored (k,n) or (n,k), a stored (m,k) or (k,m).
    CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&descriptors.a, type, transpose_b ? k : n, transpose_b ? n : k,
                                            transpose_b ? k : n));
    CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&descriptors.b, type, transpose_a ? m : k, transpose_a ? k : m,
                                            transpose_a ? m : k));
    CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&descriptors.c, type, n, m, n));

    const uint32_t alignment_a = alignment_of(b), alignment_b = alignment_of(a), alignment_c = alignment_of(c);
    const uint32_t alignment_bias = alignment_of(bias);
    const int math = type == CUDA_R_16BF ? 2 : tf32 ? 1 : 0;
    const AlgorithmKey key{handle, m, n, k, transpose_a, transpose_b, math, workspace_bytes, alignment_a, alignment_b,
                           alignment_c, alignment_bias};
    cublasLtMatmulAlgo_t algorithm;
    {
        std::lock_guard<std::mutex> lock(algorithm_mutex);
        auto cached = algorithms.find(key);
        if (cached == algorithms.end()) {
            const uint64_t most_workspace = workspace_bytes;
            CUBLAS_CHECK(cublasLtMatmulPreferenceCreate(&descriptors.preference));
            CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(descriptors.preference,
                                                              CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &most_workspace,
                                                              sizeof(most_workspace)));
            const std::pair<cublasLtMatmulPreferenceAttributes_t, uint32_t> alignments[] = {
                {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, alignment_a},
                {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, alignment_b},
                {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, alignment_c},
                {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, alignment_c}};
            for (const auto& [attribute, alignment] : alignments) {
                CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(descriptors.preference, attribute, &alignment,
                                                                  sizeof(alignment)));
            }
            cublasLtMatmulHeuristicResult_t result{};
            int found = 0;
            CUBLAS_CHECK(cublasLtMatmulAlgoGetHeuristic(handle, descriptors.operation, descriptors.a, descriptors.b,
                                                        descriptors.c, descriptors.c, descriptors.preference, 1, &result,
                                                        &found));
            if (found == 0) {
                base::cuda::throw_cublas_error(CUBLAS_STATUS_NOT_SUPPORTED,
                                               "cublasLtMatmulAlgoGetHeuristic (no algorithm for this GEMM with bias)",
                                               __FILE__, __LINE__);
            }
            cached = algorithms.emplace(key, result.algo).first;
        }
        algorithm = cached->second;
    }
    const float alpha = 1.0f, beta = 0.0f;
    CUBLAS_CHECK(cublasLtMatmul(handle, descriptors.operation, &alpha, b, descriptors.a, a, descriptors.b, &beta, c,
                                descriptors.c, c, descriptors.c, &algorithm, workspace, workspace_bytes, stream));
}

} // namespace

void gemm_bias(float* c, const float* a, const float* b, const float* bias, int m, int n, int k, bool transpose_a,
               bool transpose_b, bool tf32, cublasLtHandle_t handle, void* workspace, size_t workspace_bytes,
               cudaStream_t stream) {
    if (m == 0 || n == 0) return;
    if (k == 0) { // the product is empty: c = bias on every row, as the CPU twins give
        CUDA_CHECK(cudaMemsetAsync(c, 0, int64_t(m) * n * sizeof(float), stream));
        bias_add_forward(c, bias, m, n, stream);
        return;
    }
    gemm_bias_ex(c, a, b, bias, CUDA_R_32F, m, n, k, transpose_a, transpose_b, tf32, handle, workspace,
                 workspace_bytes, stream);
}

void gemm_bias(bfloat16* c, const bfloat16* a, const bfloat16* b, const bfloat16* bias, int m, int n, int k,
               bool transpose_a, bool transpose_b, bool tf32, cublasLtHandle_t handle, void* workspace,
               size_t workspace_bytes, cudaStream_t stream) {
    if (m == 0 || n == 0) return;
    if (k == 0) { // the product is empty: c = bias (exactly, bf16 to bf16) on every row; a degenerate case
        for (int row = 0; row < m; ++row) {
            CUDA_CHECK(cudaMemcpyAsync(c + int64_t(row) * n, bias, n * sizeof(bfloat16), cudaMemcpyDeviceToDevice,
                                       stream));
        }
        return;
    }
    gemm_bias_ex(c, a, b, bias, CUDA_R_16BF, m, n, k, transpose_a, transpose_b, tf32, handle, workspace,
                 workspace_bytes, stream);
}

} // namespace engine::kernels::cuda
