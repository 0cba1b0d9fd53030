// How a row-major GEMM maps onto column-major cuBLAS, shared by kernels/cuda/gemm.cu and batched_gemm.cu.
#pragma once

#include "base/cuda/headers.h"

namespace engine::kernels::cuda {

// cuBLAS is column-major, and a row-major (r, c) matrix is the same memory as a column-major (c, r) one. So
// row-major C = op(A) op(B) is computed as column-major Cᵀ = op(B)ᵀ op(A)ᵀ: the caller swaps the operands,
// each keeps its own transpose flag, and the row lengths are the leading dimensions. TF32 applies to f32
// operands only.
struct ColumnMajorGemm {
    cublasOperation_t operation_a, operation_b;
    int leading_a, leading_b; // a stored (m,k) or, transposed, (k,m); b stored (k,n) or (n,k)
    cublasComputeType_t compute;
};
inline ColumnMajorGemm column_major_gemm(int m, int n, int k, bool transpose_a, bool transpose_b, bool tf32,
                                         cudaDataType operand_type) {
    const bool fast_tf32 = tf32 && operand_type == CUDA_R_32F;
    return {transpose_a ? CUBLAS_OP_T : CUBLAS_OP_N, transpose_b ? CUBLAS_OP_T : CUBLAS_OP_N, transpose_a ? m : k,
            transpose_b ? k : n, fast_tf32 ? CUBLAS_COMPUTE_32F_FAST_TF32 : CUBLAS_COMPUTE_32F};
}

} // namespace engine::kernels::cuda
