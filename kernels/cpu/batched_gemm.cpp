// Strided-batched row-major GEMM as a loop over kernels::cpu::gemm (BLAS), the reference for
// kernels/cuda/batched_gemm.cu.
#include "kernels/cpu/cpu_kernels.h"

namespace engine::kernels::cpu {

template <typename Scalar, typename Out>
void batched_gemm(Out* c, const Scalar* a, const Scalar* b, int64_t batch, int m, int n, int k, bool transpose_a,
                  bool transpose_b, int64_t stride_a, int64_t stride_b, int64_t stride_c, Compute<Scalar> alpha,
                  Compute<Scalar> beta) {
    for (int64_t entry = 0; entry < batch; ++entry) {
        // A batch summed into one c (stride_c 0) takes beta once, before its first product.
        const Compute<Scalar> entry_beta = stride_c == 0 && entry > 0 ? Compute<Scalar>(1) : beta;
        gemm<Scalar, Out>(c + entry * stride_c, a + entry * stride_a, b + entry * stride_b, m, n, k, transpose_a,
                          transpose_b, alpha, entry_beta);
    }
}

template void batched_gemm<float, float>(float*, const float*, const float*, int64_t, int, int, int, bool, bool,
                                         int64_t, int64_t, int64_t, float, float);
template void batched_gemm<double, double>(double*, const double*, const double*, int64_t, int, int, int, bool, bool,
                                           int64_t, int64_t, int64_t, double, double);
template void batched_gemm<bfloat16, bfloat16>(bfloat16*, const bfloat16*, const bfloat16*, int64_t, int, int, int,
                                               bool, bool, int64_t, int64_t, int64_t, float, float);
template void batched_gemm<bfloat16, float>(float*, const bfloat16*, const bfloat16*, int64_t, int, int, int, bool,
                                            bool, int64_t, int64_t, int64_t, float, float);

} // namespace engine::kernels::cpu
