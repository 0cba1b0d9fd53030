// Row-major matrix multiply through CBLAS (OpenBLAS), the reference for kernels/cuda/gemm.cu; the bf16 forms
// widen the operands to f32 (exact), multiply in f32 and round once on store, as cuBLAS's bf16 GEMMs do.
#include "kernels/cpu/cpu_kernels.h"

#include <cblas.h>

#include <type_traits>
#include <vector>

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

std::vector<float> widened(const bfloat16* values, int64_t count) {
    std::vector<float> out(static_cast<size_t>(count));
    for (int64_t i = 0; i < count; ++i) out[static_cast<size_t>(i)] = to_float(values[i]);
    return out;
}

// c(m,n) = alpha·op(a)·op(b) + beta·c in the compute type: a and b widened when bf16 (bf16 → f32 is exact).
template <typename Scalar>
void compute_gemm(Compute<Scalar>* c, const Scalar* a, const Scalar* b, int m, int n, int k, bool transpose_a,
                  bool transpose_b, Compute<Scalar> alpha, Compute<Scalar> beta) {
    if (k == 0) {
        scale_output_only(c, m, n, beta);
        return;
    }
    // Row-major leading dimension is the stored row length: a is (m,k) or (k,m); b is (k,n) or (n,k).
    const int lda = transpose_a ? m : k;
    const int ldb = transpose_b ? k : n;
    const CBLAS_TRANSPOSE op_a = transpose_a ? CblasTrans : CblasNoTrans, op_b = transpose_b ? CblasTrans : CblasNoTrans;
    if constexpr (std::is_same_v<Scalar, bfloat16>) {
        const std::vector<float> wide_a = widened(a, int64_t(m) * k), wide_b = widened(b, int64_t(k) * n);
        blas_gemm(c, wide_a.data(), wide_b.data(), m, n, k, op_a, op_b, lda, ldb, alpha, beta);
    } else {
        blas_gemm(c, a, b, m, n, k, op_a, op_b, lda, ldb, alpha, beta);
    }
}

} // namespace

template <typename Scalar, typename Out>
void gemm(Out* c, const Scalar* a, const Scalar* b, int m, int n, int k, bool transpose_a, bool transpose_b,
          Compute<Scalar> alpha, Compute<Scalar> beta) {
    static_assert(std::is_same_v<Out, Scalar> || std::is_same_v<Out, Compute<Scalar>>);
    if (m == 0 || n == 0) return;
    if constexpr (std::is_same_v<Out, Compute<Scalar>>) {
        compute_gemm<Scalar>(c, a, b, m, n, k, transpose_a, transpose_b, alpha, beta);
    } else {
        // bf16 c: the f32 result alpha·AB + beta·c is rounded once (beta == 0 ignores c, NaN included).
        const int64_t count = int64_t(m) * n;
        std::vector<float> result(static_cast<size_t>(count), 0.0f); // (m,n)
        if (beta != 0.0f) result = widened(c, count);
        compute_gemm<Scalar>(result.data(), a, b, m, n, k, transpose_a, transpose_b, alpha, beta);
        for (int64_t i = 0; i < count; ++i) c[i] = to_bfloat16(result[static_cast<size_t>(i)]);
    }
}

template <typename Scalar>
void gemm_bias(Scalar* c, const Scalar* a, const Scalar* b, const Scalar* bias, int m, int n, int k, bool transpose_a,
               bool transpose_b) {
    if (m == 0 || n == 0) return;
    if constexpr (std::is_same_v<Scalar, bfloat16>) {
        // One rounding of the f32 sum, as cuBLASLt's bias epilogue: gemm then bias_add_forward would round twice.
        std::vector<float> result(static_cast<size_t>(int64_t(m) * n)); // (m,n)
        compute_gemm<Scalar>(result.data(), a, b, m, n, k, transpose_a, transpose_b, 1.0f, 0.0f);
        for (int row = 0; row < m; ++row) {
            for (int column = 0; column < n; ++column) {
                const int64_t index = int64_t(row) * n + column;
                c[index] = to_bfloat16(result[static_cast<size_t>(index)] + to_float(bias[column]));
            }
        }
    } else {
        gemm<Scalar>(c, a, b, m, n, k, transpose_a, transpose_b, Scalar(1), Scalar(0));
        bias_add_forward<Scalar>(c, bias, m, n);
    }
}

template void gemm<float, float>(float*, const float*, const float*, int, int, int, bool, bool, float, float);
template void gemm<double, double>(double*, const double*, const double*, int, int, int, bool, bool, double, double);
template void gemm<bfloat16, bfloat16>(bfloat16*, const bfloat16*, const bfloat16*, int, int, int, bool, bool, float,
                                       float);
template void gemm<bfloat16, float>(float*, const bfloat16*, const bfloat16*, int, int, int, bool, bool, float, float);
template void gemm_bias<float>(float*, const float*, const float*, const float*, int, int, int, bool, bool);
template void gemm_bias<double>(double*, const double*, const double*, const double*, int, int, int, bool, bool);
template void gemm_bias<bfloat16>(bfloat16*, const bfloat16*, const bfloat16*, const bfloat16*, int, int, int, bool,
                                  bool);

} // namespace engine::kernels::cpu
