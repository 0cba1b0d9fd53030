// The reductions ops (declared here, defined in engine/ops/reductions*.cpp). Included by engine/ops.h.
// A dimension may be negative (counted from the end). Every op takes f32, f64 (CPU) and bf16 tensors.
#pragma once

#include <cstdint>

#include "engine/ops.h" // Reduction (ops.h includes this header at its end, after defining it)
#include "engine/tensor.h"

namespace engine {

// exp(x - max) / sum(exp(x - max)) over `dim`; saves its output.
Tensor softmax(const Tensor& input, int64_t dim);
// x - max - log(sum(exp(x - max))) over `dim`; saves its output.
Tensor log_softmax(const Tensor& input, int64_t dim);

// Over `dim`, in the input's dtype (accumulated in double on the CPU, float on CUDA, rounded once); keepdim
// leaves `dim` as a 1. (The full sum to shape (1) is sum(input) in engine/ops.h.)
Tensor sum(const Tensor& input, int64_t dim, bool keepdim = false);
Tensor mean(const Tensor& input, int64_t dim, bool keepdim = false);
// The values only; the gradient goes to the FIRST index attaining the max (saved as i32 indices).
Tensor max(const Tensor& input, int64_t dim, bool keepdim = false);

// (input - target)^2, shapes equal. none: elementwise, in the input's dtype; sum / mean: shape (1) in
// compute_dtype (f32 for bf16, as sum and cross_entropy). Gradients to input and, if it requires grad, target.
Tensor mse_loss(const Tensor& input, const Tensor& target, Reduction reduction = Reduction::mean);

// Llama's RMSNorm over the last dimension: weight * round(x / sqrt(mean(x^2) + eps)), weight (C); saves rstd
// (compute_dtype). The weight's gradient is a parameter gradient (f32 for bf16).
Tensor rms_norm(const Tensor& input, const Tensor& weight, double eps = 1e-6);

} // namespace engine
