// Row-major GEMM on cuBLAS (CUDA twin of kernels/cpu/gemm.cpp).
#include <algorithm>

#include "engine/cuda/runtime.h"
#include "kernels/cuda/cublas_handle.h"
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/cuda_kernels.h"

namespace engine::kernels::cuda {

// cuBLAS is column-major, and a row-major (r, c) matrix is the same memory as a column-major (c, r) one.
// So row-major C = op(A) op(B) is computed as column-major C^T = op(B)^T op(A)^T: swap the operands, keep
// each operand's own transpose flag, and use the row lengths as leading dimensions.
void gemm(float* c, const float* a, const float* b, int m, int n, int k, bool transpose_a, bool transpose_b,
          float alpha, float beta, cudaStream_t stream) {
    if (m == 0 || n == 0) return;
    cublasHandle_t handle = engine::cuda::cublas_handle();
    CUBLAS_CHECK(cublasSetStream(handle, stream));
    const cublasOperation_t operation_a = transpose_a ? CUBLAS_OP_T : CUBLAS_OP_N;
    const cublasOperation_t operation_b = transpose_b ? CUBLAS_OP_T : CUBLAS_OP_N;
    // cuBLAS rejects a leading dimension below 1 even when k == 0 makes the operand empty.
    const int leading_a = std::max(1, transpose_a ? m : k); // a stored (k,m) or (m,k)
    const int leading_b = std::max(1, transpose_b ? k : n); // b stored (n,k) or (k,n)
    const cublasComputeType_t compute =
        engine::cuda::tf32_enabled() ? CUBLAS_COMPUTE_32F_FAST_TF32 : CUBLAS_COMPUTE_32F;
    CUBLAS_CHECK(cublasGemmEx(handle, operation_b, operation_a, n, m, k, &alpha, b, CUDA_R_32F, leading_b, a,
                              CUDA_R_32F, leading_a, &beta, c, CUDA_R_32F, n, compute, CUBLAS_GEMM_DEFAULT));
}

} // namespace engine::kernels::cuda
