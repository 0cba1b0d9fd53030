// Strided-batched row-major GEMM on cuBLAS (CUDA twin of kernels/cpu/batched_gemm.cpp): one
// cublasGemmStridedBatchedEx for a batch of separate outputs, one GEMM per entry in order for a batch summed
// into one c (and for the degenerate k = 0 the per-matrix gemm already handles).
#include "base/cuda/check.h"
#include "kernels/cuda/cuda_kernels.h"
#include "kernels/cuda/gemm_operands.h"

namespace engine::kernels::cuda {
namespace {

template <typename T> constexpr cudaDataType data_type();
template <> constexpr cudaDataType data_type<float>() { return CUDA_R_32F; }
template <> constexpr cudaDataType data_type<bfloat16>() { return CUDA_R_16BF; }

// Row-major C = op(A) op(B) as column-major Cᵀ = op(B)ᵀ op(A)ᵀ (kernels/cuda/gemm_operands.h), batch by batch.
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
    const ColumnMajorGemm layout = column_major_gemm(m, n, k, transpose_a, transpose_b, tf32, data_type<T>());
    CUBLAS_CHECK(cublasGemmStridedBatchedEx(handle, layout.operation_b, layout.operation_a, n, m, k, &alpha, b,
                                            data_type<T>(), layout.leading_b, stride_b, a, data_type<T>(),
                                            layout.leading_a, stride_a, &beta, c, data_type<Out>(), n, stride_c,
                                            static_cast<int>(batch), layout.compute, CUBLAS_GEMM_DEFAULT));
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
