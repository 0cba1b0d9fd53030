// Scaled sum and its backward on either device, shared by the reducing ops.
#pragma once

#include "engine/tensor.h"

namespace engine {
// out and dout are in compute_dtype(input's dtype): f32 for a bf16 input.
void sum_tensors(const Tensor& out, const Tensor& input, double scale);          // out(1) = scale * sum(input)
void sum_backward_tensors(const Tensor& dinput, const Tensor& dout, double scale); // dinput += scale * dout[0]
} // namespace engine
