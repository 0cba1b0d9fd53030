// Row-major matrix multiply through CBLAS (OpenBLAS), the reference for kernels/cuda/gemm.cu.
#include "kernels/cpu/cpu_kernels.h"

#include <cblas.h>

namespace engine::kernels::cpu {

namespace {

// BLAS rejects k == 0 on some implementations and leading dimensions of 0 on others, so the degenerate
// product (op(a) op(b) is all zeros) is handled here: c = beta * c.
template <typename T>
void scale_output_only(T* c, int m, int n, T beta) {
    const int64_t count = static_cast<int64_t>(m) * n;
    // beta == 0 must overwrite, not multiply, so that NaN or garbage in c does not survive (BLAS semantics).
    if (beta == T(0)) {
        for (int64_t i = 0; i < count; ++i) c[i] = T(0);
    } else {
        for (int64_t i = 0; i < count; ++i) c[i] *= beta;
    }
}

void blas_gemm(float* c, const float* a, const float* b, int m, int n, int k, CBLAS_TRANSPOSE op_a,
               CBLAS_TRANSPOSE op_b, int lda, int ldb, float alpha, float beta) {
    cblas_sgemm(CblasRowMajor, op_a, op_b, m, n, k, alpha, a, lda, b, ldb, beta, c, n);
}

void blas_gemm(double* c, const double* a, const double* b, int m, int n, int k, CBLAS_TRANSPOSE op_a,
               CBLAS_TRANSPOSE op_b, int lda, int ldb, double alpha, double beta) {
    cblas_dgemm(CblasRowMajor, op_a, op_b, m, n, k, alpha, a, lda, b, ldb, beta, c, n);
}

} // namespace

template <typename T>
void gemm(T* c, const T* a, const T* b, int m, int n, int k, bool transpose_a, bool transpose_b, T alpha, T beta) {
    if (m == 0 || n == 0) return;
    if (k == 0) {
        scale_output_only(c, m, n, beta);
        return;
    }
    // Row-major leading dimension is the stored row length: a is (m,k) or (k,m); b is (k,n) or (n,k).
    const int lda = transpose_a ? m : k;
    const int ldb = transpose_b ? k : n;
    blas_gemm(c, a, b, m, n, k, transpose_a ? CblasTrans : CblasNoTrans, transpose_b ? CblasTrans : CblasNoTrans,
              lda, ldb, alpha, beta);
}

template void gemm<float>(float*, const float*, const float*, int, int, int, bool, bool, float, float);
template void gemm<double>(double*, const double*, const double*, int, int, int, bool, bool, double, double);

} // namespace engine::kernels::cpu
