// CUDA twins of kernels/cpu/reduction_kernels.h (conventions: kernels/cuda/cuda_kernels.h). Included by cuda_kernels.h.
// Every "over a dimension" kernel takes (outer, size, inner): a warp per row when inner == 1 (the dimension
// is contiguous; warp-shuffle sums), else a thread per (outer, inner) column looping the dimension, adjacent
// threads on adjacent inner positions so every step reads coalesced. Sums run in float in a fixed order.
// Why: a contiguous row is read coalesced by one warp and reduced by shuffles with no block barrier; across
// inner, neighbouring threads read neighbouring addresses instead. rms_norm's dweight, a sum over every row, is
// layernorm's two passes (norm_passes.cuh) rather than atomics, and the reduced mse_loss reuses sum_forward's
// two-stage double reduction. Map: kernels/cpu/reduction_kernels.h.
#pragma once

#include <cstdint>

#include "base/cuda/headers.h"
#include "base/bfloat16.h"

namespace engine::kernels::cuda {

// ---- softmax and log_softmax over one dimension ----
void softmax_forward(float* out, const float* inp, int64_t outer, int64_t size, int64_t inner, cudaStream_t stream);
void softmax_forward(bfloat16* out, const bfloat16* inp, int64_t outer, int64_t size, int64_t inner,
                     cudaStream_t stream);
void softmax_backward(float* dinp, const float* dout, const float* out, int64_t outer, int64_t size, int64_t inner,
                      cudaStream_t stream);
void softmax_backward(bfloat16* dinp, const bfloat16* dout, const bfloat16* out, int64_t outer, int64_t size,
                      int64_t inner, cudaStream_t stream);
void log_softmax_forward(float* out, const float* inp, int64_t outer, int64_t size, int64_t inner,
                         cudaStream_t stream);
void log_softmax_forward(bfloat16* out, const bfloat16* inp, int64_t outer, int64_t size, int64_t inner,
                         cudaStream_t stream);
void log_softmax_backward(float* dinp, const float* dout, const float* out, int64_t outer, int64_t size,
                          int64_t inner, cudaStream_t stream);
void log_softmax_backward(bfloat16* dinp, const bfloat16* dout, const bfloat16* out, int64_t outer, int64_t size,
                          int64_t inner, cudaStream_t stream);

// ---- sum / mean (scale) and max over one dimension ----
void sum_over_dimension_forward(float* out, const float* inp, int64_t outer, int64_t size, int64_t inner, float scale,
                                cudaStream_t stream);
void sum_over_dimension_forward(bfloat16* out, const bfloat16* inp, int64_t outer, int64_t size, int64_t inner,
                                float scale, cudaStream_t stream);
void sum_over_dimension_backward(float* dinp, const float* dout, int64_t outer, int64_t size, int64_t inner,
                                 float scale, cudaStream_t stream);
void sum_over_dimension_backward(bfloat16* dinp, const bfloat16* dout, int64_t outer, int64_t size, int64_t inner,
                                 float scale, cudaStream_t stream);
void max_over_dimension_forward(float* out, int32_t* indices, const float* inp, int64_t outer, int64_t size,
                                int64_t inner, cudaStream_t stream);
void max_over_dimension_forward(bfloat16* out, int32_t* indices, const bfloat16* inp, int64_t outer, int64_t size,
                                int64_t inner, cudaStream_t stream);
void max_over_dimension_backward(float* dinp, const float* dout, const int32_t* indices, int64_t outer, int64_t size,
                                 int64_t inner, cudaStream_t stream);
void max_over_dimension_backward(bfloat16* dinp, const bfloat16* dout, const int32_t* indices, int64_t outer,
                                 int64_t size, int64_t inner, cudaStream_t stream);

// ---- mse_loss ----
void squared_error_forward(float* out, const float* inp, const float* target, int64_t N, cudaStream_t stream);
void squared_error_forward(bfloat16* out, const bfloat16* inp, const bfloat16* target, int64_t N,
                           cudaStream_t stream);
// The reduced loss reuses sum_forward's deterministic two-stage reduction over the f32 squared errors:
// squares_workspace holds N floats, partials_workspace reduction_workspace_count(N) doubles.
void mse_loss_forward(float* out, float* squares_workspace, double* partials_workspace, const float* inp,
                      const float* target, int64_t N, float scale, cudaStream_t stream);
void mse_loss_forward(float* out, float* squares_workspace, double* partials_workspace, const bfloat16* inp,
                      const bfloat16* target, int64_t N, float scale, cudaStream_t stream);
void squared_error_backward(float* dinp, float* dtarget, const float* dout, const float* inp, const float* target,
                            int64_t N, cudaStream_t stream);
void squared_error_backward(bfloat16* dinp, bfloat16* dtarget, const bfloat16* dout, const bfloat16* inp,
                            const bfloat16* target, int64_t N, cudaStream_t stream);
void mse_loss_backward(float* dinp, float* dtarget, const float* dout, const float* inp, const float* target,
                       int64_t N, float scale, cudaStream_t stream);
void mse_loss_backward(bfloat16* dinp, bfloat16* dtarget, const float* dout, const bfloat16* inp,
                       const bfloat16* target, int64_t N, float scale, cudaStream_t stream);

// ---- rms_norm over the last dimension: rstd and dweight are float ----
void rms_norm_forward(float* out, float* rstd, const float* inp, const float* weight, int N, int C, float eps,
                      cudaStream_t stream);
void rms_norm_forward(bfloat16* out, float* rstd, const bfloat16* inp, const bfloat16* weight, int N, int C,
                      float eps, cudaStream_t stream);
// partials_workspace: rms_norm_backward_workspace_count(N, C) floats of device memory, overwritten.
int rms_norm_backward_workspace_count(int N, int C);
void rms_norm_backward(float* dinp, float* dweight, float* partials_workspace, const float* dout, const float* inp,
                       const float* weight, const float* rstd, int N, int C, cudaStream_t stream);
void rms_norm_backward(bfloat16* dinp, float* dweight, float* partials_workspace, const bfloat16* dout,
                       const bfloat16* inp, const bfloat16* weight, const float* rstd, int N, int C,
                       cudaStream_t stream);

// ---- the batch-invariant mode's fold: twins of kernels/cpu/fixed_point.cpp ----
void fixed_point_fold(double* sum, uint32_t* largest, float* gradient, int exponent, int64_t N, cudaStream_t stream);
void fixed_point_round(float* gradient, const double* sum, int64_t N, cudaStream_t stream);

} // namespace engine::kernels::cuda
