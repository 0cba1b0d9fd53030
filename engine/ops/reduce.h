// Scaled sum and its backward on either device, shared by the reducing ops.
#pragma once

#include "engine/tensor.h"

namespace engine {
void sum_tensors(const Tensor& out, const Tensor& input, double scale);          // out(1) = scale * sum(input)
void sum_backward_tensors(const Tensor& dinput, const Tensor& dout, double scale); // dinput += scale * dout[0]
} // namespace engine
