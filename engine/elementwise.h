// Non-differentiable in-place tensor helpers used by autograd, optimizers and the trainer.
#pragma once

#include "engine/tensor.h"

namespace engine {

void accumulate_into(const Tensor& destination, const Tensor& source, double alpha = 1.0); // dst += alpha*src
void scale_in_place(const Tensor& tensor, double factor);
double sum_of_squares(const Tensor& tensor); // in double, whatever the dtype
// The sum of squares of all the tensors (same device and dtype) with one read of the device: one result
// for the global gradient norm instead of a synchronising read per tensor.
double sum_of_squares(const std::vector<Tensor>& tensors);
// Whether every element is finite (no NaN or Inf).
bool all_finite(const Tensor& tensor);

} // namespace engine
