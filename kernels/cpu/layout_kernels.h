// CPU reference kernels of the layout ops (conventions: kernels/cpu/cpu_kernels.h). Included by cpu_kernels.h.
// Why: permute, slice and concat compute nothing, so their kernels are plain copies, one walk in output order
// (forwards are exact in every storage type; backwards add); batched_gemm is a loop over gemm, and a batch summed
// into one c adds its products in batch order, a fixed order.
// Where one op lives, permute for instance: engine/ops/permute.cpp (declared in engine/ops/layout.h),
// kernels/cpu/permute.cpp, kernels/cuda/permute.cu; tests/test_layout_gradcheck.cpp (f64 finite differences),
// tests/cuda/test_layout_kernels.cpp (CUDA against this).
#pragma once

#include <cstdint>

#include "base/bfloat16.h"

namespace engine::kernels::cpu {

// The most dimensions a permute takes (the CUDA twin keeps the shape in a kernel argument of this size).
inline constexpr int max_permute_rank = 8;

// ---- permute: out's axis i is inp's axis dims[i] ----
// `shape` (rank) is inp's shape; out's is shape[dims[0]], ..., shape[dims[rank-1]]. Pure copies: exact in
// every storage type.
template <typename Scalar>
void permute_forward(Scalar* out,       // permuted shape
                     const Scalar* inp, // shape
                     const int64_t* shape, const int64_t* dims, int rank);
// dinp += dout permuted back by the inverse of dims.
template <typename Scalar>
void permute_backward(Scalar* dinp,       // shape +=
                      const Scalar* dout, // permuted shape
                      const int64_t* shape, const int64_t* dims, int rank);

// ---- slice and concat: blocks along one dimension of a tensor seen as (outer, size, inner) ----
// out (outer, length, inner) = inp (outer, size, inner)[:, start:start+length, :]
template <typename Scalar>
void slice_forward(Scalar* out, const Scalar* inp, int64_t outer, int64_t size, int64_t inner, int64_t start,
                   int64_t length);
// dinp (outer, size, inner)[:, start:start+length, :] += dout (outer, length, inner)
template <typename Scalar>
void slice_backward(Scalar* dinp, const Scalar* dout, int64_t outer, int64_t size, int64_t inner, int64_t start,
                    int64_t length);
// One input of a concat: out (outer, size, inner)[:, start:start+length, :] = inp (outer, length, inner)
template <typename Scalar>
void concat_forward(Scalar* out, const Scalar* inp, int64_t outer, int64_t size, int64_t inner, int64_t start,
                    int64_t length);
// dinp (outer, length, inner) += dout (outer, size, inner)[:, start:start+length, :]
template <typename Scalar>
void concat_backward(Scalar* dinp, const Scalar* dout, int64_t outer, int64_t size, int64_t inner, int64_t start,
                     int64_t length);

// ---- batched gemm, row-major: c_i = alpha * op(a_i) * op(b_i) + beta * c_i for i in [0, batch) ----
// a_i = a + i * stride_a (each (m,k), or (k,m) transposed), b_i = b + i * stride_b ((k,n) or (n,k)), c_i likewise.
// stride_b = 0 broadcasts one b over the batch. stride_c = 0 sums the batch into one c: c = alpha * Σ_i
// op(a_i) op(b_i) + beta * c, each product added in batch order (a fixed order: deterministic). Out as gemm:
// Scalar, or Compute<Scalar> for parameter gradients accumulating in f32.
template <typename Scalar, typename Out>
void batched_gemm(Out* c, const Scalar* a, const Scalar* b, int64_t batch, int m, int n, int k, bool transpose_a,
                  bool transpose_b, int64_t stride_a, int64_t stride_b, int64_t stride_c, Compute<Scalar> alpha,
                  Compute<Scalar> beta);

} // namespace engine::kernels::cpu
