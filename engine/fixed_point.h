// The batch-invariant mode's two passes on tensors (docs/TRAINING.md, "The big batch, bitwise"): a chunk's f32
// gradient folded into an exact double sum, and the window's gradient rounded from it; checks and the CPU/CUDA
// dispatch, so that optim/ reaches the kernels only through the engine.
#pragma once

#include <cstdint>

#include "engine/tensor.h"

namespace engine {

// sum (f64) += gradient (f32) on the grid 2^-exponent, element by element, and gradient = 0; largest (i32, one
// element per tensor folded) at `slot` keeps the bits of the largest |gradient| seen, a NaN above every number. All
// three on one device; sum and gradient of one element count.
void fixed_point_fold(const Tensor& sum, const Tensor& largest, int64_t slot, const Tensor& gradient, int exponent);
// gradient (f32) = sum (f64) rounded to nearest.
void fixed_point_round(const Tensor& gradient, const Tensor& sum);
// What a largest slot's bits mean: the value |g| they are the bits of (NaN for a NaN).
float fixed_point_largest_value(int32_t bits);

} // namespace engine
