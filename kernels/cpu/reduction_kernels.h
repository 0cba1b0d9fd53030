// CPU reference kernels of the reduction ops (conventions: kernels/cpu/cpu_kernels.h). Included by cpu_kernels.h.
// "Over a dimension" kernels see a contiguous tensor as (outer, size, inner) (engine/ops/dimensions.h):
// element (o, i, n) sits at (o * size + i) * inner + n, and the reduction runs over i.
// Why: row sums and losses run in double (softmax's after subtracting the maximum, so that no exp overflows),
// which keeps the reference's error below the CUDA twins' float sums. rms_norm rounds the normalised value to the
// storage type before the weight multiplies it, as LlamaRMSNorm does, so its bf16 output is Hugging Face's.
// Where one op lives, rms_norm for instance: engine/ops/reductions_rms_norm.cpp (declared in
// engine/ops/reductions.h), kernels/cpu/rms_norm.cpp, kernels/cuda/rms_norm.cu; tests/test_reductions_gradcheck.cpp
// (f64 finite differences), tests/cuda/test_reduction_ops_kernels.cpp (CUDA against this).
#pragma once

#include <cstdint>

#include "base/bfloat16.h"

namespace engine::kernels::cpu {

// ---- softmax and log_softmax over one dimension (max subtracted; row sums in double) ----
template <typename Scalar>
void softmax_forward(Scalar* out,       // (outer,size,inner)
                     const Scalar* inp, // (outer,size,inner)
                     int64_t outer, int64_t size, int64_t inner);
// dinp += out * (dout - sum_i(dout * out)), from the saved output.
template <typename Scalar>
void softmax_backward(Scalar* dinp, const Scalar* dout, const Scalar* out, int64_t outer, int64_t size,
                      int64_t inner);
template <typename Scalar>
void log_softmax_forward(Scalar* out, const Scalar* inp, int64_t outer, int64_t size, int64_t inner);
// dinp += dout - exp(out) * sum_i(dout), from the saved output.
template <typename Scalar>
void log_softmax_backward(Scalar* dinp, const Scalar* dout, const Scalar* out, int64_t outer, int64_t size,
                          int64_t inner);

// ---- sum, mean and max over one dimension: out (outer,inner) in the input's storage type ----
// out = scale * sum_i(inp), accumulated in double and rounded once (scale 1: sum, 1/size: mean).
template <typename Scalar>
void sum_over_dimension_forward(Scalar* out, const Scalar* inp, int64_t outer, int64_t size, int64_t inner,
                                Compute<Scalar> scale);
// dinp[o,i,n] += scale * dout[o,n]
template <typename Scalar>
void sum_over_dimension_backward(Scalar* dinp, const Scalar* dout, int64_t outer, int64_t size, int64_t inner,
                                 Compute<Scalar> scale);
// out = max_i(inp); indices = the FIRST i attaining it (a NaN counts as the maximum, as in PyTorch).
template <typename Scalar>
void max_over_dimension_forward(Scalar* out, int32_t* indices, const Scalar* inp, int64_t outer, int64_t size,
                                int64_t inner);
// dinp[o, indices[o,n], n] += dout[o,n]
template <typename Scalar>
void max_over_dimension_backward(Scalar* dinp, const Scalar* dout, const int32_t* indices, int64_t outer,
                                 int64_t size, int64_t inner);

// ---- mse_loss: (inp - target)^2 ----
// none: out[i] = (inp[i] - target[i])^2 in the storage type.
template <typename Scalar>
void squared_error_forward(Scalar* out, const Scalar* inp, const Scalar* target, int64_t N);
// sum / mean: out (1) = scale * sum((inp - target)^2), in double, stored as Compute<Scalar> (a loss keeps its bits).
template <typename Scalar>
void mse_loss_forward(Compute<Scalar>* out, const Scalar* inp, const Scalar* target, int64_t N,
                      Compute<Scalar> scale);
// none: g = 2 (inp - target) dout[i]; dinp += g, dtarget -= g. Either gradient may be null.
template <typename Scalar>
void squared_error_backward(Scalar* dinp, Scalar* dtarget, const Scalar* dout, const Scalar* inp,
                            const Scalar* target, int64_t N);
// sum / mean: g = 2 scale dout[0] (inp - target); dinp += g, dtarget -= g. Either gradient may be null.
template <typename Scalar>
void mse_loss_backward(Scalar* dinp, Scalar* dtarget, const Compute<Scalar>* dout, const Scalar* inp,
                       const Scalar* target, int64_t N, Compute<Scalar> scale);

// ---- rms_norm over the last dimension (Llama): out = weight * round(x * rstd), rstd = 1/sqrt(mean(x^2) + eps) ----
// Statistics in double, rstd stored as Compute<Scalar>. As Hugging Face's LlamaRMSNorm, the normalised row is
// rounded to the storage type before the weight multiplies it (a second rounding for bf16, none for f32/f64).
template <typename Scalar>
void rms_norm_forward(Scalar* out,            // (N,C)
                      Compute<Scalar>* rstd,  // (N)
                      const Scalar* inp,      // (N,C)
                      const Scalar* weight,   // (C)
                      int N, int C, double eps);
// dinp += rstd * (dnorm - norm * mean(dnorm * norm)), dnorm = weight * dout; dweight += dout * round(norm).
template <typename Scalar>
void rms_norm_backward(Scalar* dinp,             // (N,C) +=
                       Compute<Scalar>* dweight, // (C) +=
                       const Scalar* dout, const Scalar* inp, const Scalar* weight, const Compute<Scalar>* rstd,
                       int N, int C);

// ---- the batch-invariant mode's fold (docs/TRAINING.md, "The big batch, bitwise") ----
// sum += rint(gradient · 2^exponent) · 2^-exponent, element by element, then gradient = 0; *largest = max(*largest,
// bits of every |gradient|). Exact while |sum| stays below 2^(53 - exponent), which the caller's exponent keeps.
void fixed_point_fold(double* sum,        // (N) +=
                      uint32_t* largest,  // (1) max=
                      float* gradient,    // (N) read, then zeroed
                      int exponent, int64_t N);
// gradient = sum rounded to f32.
void fixed_point_round(float* gradient, const double* sum, int64_t N);

} // namespace engine::kernels::cpu
