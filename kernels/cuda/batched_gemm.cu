// Strided-batched row-major GEMM on cuBLAS (CUDA twin of kernels/cpu/batched_gemm.cpp): one
// cublasGemmStridedBatchedEx for a batch of separate outputs, one GEMM per entry in order for a batch summed
// into one c (and for the degenerate k = 0 the per-matrix gemm already handles).
#include "base/cuda/check.h"
#include "kernels/cuda/cuda_kernels.h"

namespace engine::kernels::cuda {
namespace {

template <typename T> constexpr cudaDataType data_type();
template <> constexpr cudaDataType data_type<float>() { return CUDA_R_32F; }
template <> constexpr cudaDataType data_type<bfloat16>() { return CUDA_R_16BF; }

// As gemm_ex (kernels/cuda/gemm.cu): row-major C = op(A) op(B) is column-major Cᵀ = op(B)ᵀ op(A)ᵀ, so the
// operands swap, each keeps its transpose flag, and the row lengths are the leading dimensions.
template <typename Out, typename T>
void launch_batched_gemm(Out* c, const T* a, const T* b, int64_t batch, int m, int n, int k, bool transpose_a,
                         bool transpose_b, int64_t stride_a, int64_t stride_b, int64_t stride_c, float alpha,
                         float beta, bool tf32, cublasHandle_t handle, cudaStream_t stream) {
    if (batch == 0 || m == 0 || n == 0) return;
    if (stride_c == 0 || k == 0 || batch == 1 || batch > 2147483647) {
        for (int64_t entry = 0; entry < batch; ++entry) {
            const float entry_beta = stride_c == 0 && entry > 0 ? 1.0f : beta;
            gemm(c + entry * stride_c, a + entry * stride_a, b + entry * stride_b, m, n, k, transpose_a, transpose_b,
                 alpha, entry_beta, tf32, handle, stream);
        }
        return;
    }
    CUBLAS_CHECK(cublasSetStream(handle, stream));
    const cublasOperation_t operation_a = transpose_a ? CUBLAS_OP_T : CUBLAS_OP_N;
    const cublasOperation_t operation_b = transpose_b ? CUBLAS_OP_T : CUBLAS_OP_N;
    const int leading_a = transpose_a ? m : k; // a_i stored (k,m) or (m,k)
    const int leading_b = transpose_b ? k : n; // b_i stored (n,k) or (k,n)
    const bool fast_tf32 = tf32 && data_type<T>() == CUDA_R_32F;
    const cublasComputeType_t compute = fast_tf32 ? CUBLAS_COMPUTE_32F_FAST_TF32 : CUBLAS_COMPUTE_32F;
    CUBLAS_CHECK(cublasGemmStridedBatchedEx(handle, operation_b, operation_a, n, m, k, &alpha, b, data_type<T>(),
                                            leading_b, stride_b, a, data_type<T>(), leading_a, stride_a, &beta, c,
                                            data_type<Out>(), n, stride_c, static_cast<int>(batch), compute,
                                            CUBLAS_GEMM_DEFAULT));
}

} // namespace

void batched_gemm(float* c, const float* a, const float* b, int64_t batch, int m, int n, int k, bool transpose_a,
                  bool transpose_b, int64_t stride_a, int64_t stride_b, int64_t stride_c, float alpha, float beta,
                  bool tf32, cublasHandle_t handle, cudaStream_t stream) {
    launch_batched_gemm(c, a, b, batch, m, n, k, transpose_a, transpose_b, stride_a, stride_b, stride_c, alpha, beta,
                        tf32, handle, stream);
}
void batched_gemm(bfloat16* c, const bfloat16* a, const bfloat16* b, int64_t batch, int m, int n, int k,
                  bool transpose_a, bool transpose_b, int64_t stride_a, int64_t stride_b, int64_t stride_c, float alpha,
                  float beta, bool tf32, cublasHandle_t handle, cudaStream_t stream) {
    launch_batched_gemm(c, a, b, batch, m, n, k, transpose_a, transpose_b, stride_a, stride_b, stride_c, alpha, beta,
                        tf32, handle, stream);
}
void batched_gemm(float* c, const bfloat16* a, const bfloat16* b, int64_t batch, int m, int n, int k,
                  bool transpose_a, bool transpose_b, int64_t stride_a, int64_t stride_b, int64_t stride_c, float alpha,
                  float beta, bool tf32, cublasHandle_t handle, cudaStream_t stream) {
    launch_batched_gemm(c, a, b, batch, m, n, k, transpose_a, transpose_b, stride_a, stride_b, stride_c, alpha, beta,
                        tf32, handle, stream);
}

} // namespace engine::kernels::cuda
