// Row-major GEMM on cuBLAS (CUDA twin of kernels/cpu/gemm.cpp).
#include "base/cuda/check.h"
#include "kernels/cuda/cuda_kernels.h"

namespace engine::kernels::cuda {

// cuBLAS is column-major, and a row-major (r, c) matrix is the same memory as a column-major (c, r) one.
// So row-major C = op(A) op(B) is computed as column-major C^T = op(B)^T op(A)^T: swap the operands, keep
// each operand's own transpose flag, and use the row lengths as leading dimensions.
void gemm(float* c, const float* a, const float* b, int m, int n, int k, bool transpose_a, bool transpose_b,
          float alpha, float beta, bool tf32, cublasHandle_t handle, cudaStream_t stream) {
    if (m == 0 || n == 0) return;
    if (k == 0) { // as in the CPU twin: the product is empty, so c = beta * c, and beta == 0 overwrites NaN
        const int64_t count = int64_t(m) * n;
        if (beta == 0.0f) {
            CUDA_CHECK(cudaMemsetAsync(c, 0, count * sizeof(float), stream));
        } else {
            scale(c, beta, count, stream);
        }
        return;
    }
    CUBLAS_CHECK(cublasSetStream(handle, stream));
    const cublasOperation_t operation_a = transpose_a ? CUBLAS_OP_T : CUBLAS_OP_N;
    const cublasOperation_t operation_b = transpose_b ? CUBLAS_OP_T : CUBLAS_OP_N;
    const int leading_a = transpose_a ? m : k; // a stored (k,m) or (m,k)
    const int leading_b = transpose_b ? k : n; // b stored (n,k) or (k,n)
    const cublasComputeType_t compute = tf32 ? CUBLAS_COMPUTE_32F_FAST_TF32 : CUBLAS_COMPUTE_32F;
    CUBLAS_CHECK(cublasGemmEx(handle, operation_b, operation_a, n, m, k, &alpha, b, CUDA_R_32F, leading_b, a,
                              CUDA_R_32F, leading_a, &beta, c, CUDA_R_32F, n, compute, CUBLAS_GEMM_DEFAULT));
}

} // namespace engine::kernels::cuda
