// CUDA twins of kernels/cpu/pointwise_kernels.h (conventions: kernels/cuda/cuda_kernels.h): float and bfloat16
// storage, float arithmetic, the formulas of kernels/common/pointwise_functions.h.
// Why: the forwards are bound by memory bandwidth, so unary and same-shape binary kernels take 128-bit packs and
// a broadcast forward is one thread per output element over the merged layout. A gradient has no atomics: one
// thread owns an operand element when the innermost dimension is kept (neighbouring threads read neighbouring
// dout), one warp with a fixed shuffle tree when it is summed; its float sums stay within a bound of the CPU's
// double ones that tests/cuda/test_pointwise_ops_kernels.cpp derives. Map: kernels/cpu/pointwise_kernels.h.
#pragma once

#include <cstdint>

#include "base/cuda/headers.h"
#include "base/bfloat16.h"
#include "kernels/common/pointwise_functions.h"

namespace engine::kernels::cuda {

void unary_forward(float* out, const float* inp, int64_t N, UnaryFunction function, cudaStream_t stream);
void unary_forward(bfloat16* out, const bfloat16* inp, int64_t N, UnaryFunction function, cudaStream_t stream);
void unary_backward(float* dinp, const float* dout, const float* saved, int64_t N, UnaryFunction function,
                    cudaStream_t stream);
void unary_backward(bfloat16* dinp, const bfloat16* dout, const bfloat16* saved, int64_t N, UnaryFunction function,
                    cudaStream_t stream);

void binary_forward(float* out, const float* a, const float* b, const BroadcastLayout& layout,
                    BinaryFunction function, cudaStream_t stream);
void binary_forward(bfloat16* out, const bfloat16* a, const bfloat16* b, const BroadcastLayout& layout,
                    BinaryFunction function, cudaStream_t stream);
// Deterministic, no atomics: each operand element's sum is owned by one thread (kept innermost dimension:
// neighbouring threads read neighbouring dout) or one warp (a row sum: the lanes stride the row and a fixed
// shuffle tree adds them), in float.
void binary_backward(float* doperand, const float* dout, const float* a, const float* b,
                     const GradientLayout& gradient, BinaryFunction function, cudaStream_t stream);
void binary_backward(bfloat16* doperand, const bfloat16* dout, const bfloat16* a, const bfloat16* b,
                     const GradientLayout& gradient, BinaryFunction function, cudaStream_t stream);

} // namespace engine::kernels::cuda
