// Global gradient-norm clipping with torch.nn.utils.clip_grad_norm_'s arithmetic, applied once per
// optimizer step to the accumulated gradients.
#pragma once

#include <vector>

#include "engine/tensor.h"

namespace engine::optim {

inline constexpr double clip_epsilon = 1e-6; // PyTorch's: coefficient = max_norm / (norm + 1e-6)

// sqrt of the sum of squares of every parameter's gradient buffer, accumulated in double.
double global_grad_norm(const std::vector<Tensor>& parameters);
// The factor to multiply the gradients by: max_norm / (norm + 1e-6) when norm > max_norm, else 1.
// max_norm <= 0 means no clipping (factor 1), as Hugging Face's max_grad_norm = 0.
double clip_coefficient(double norm, double max_norm);
// Scales the gradient buffers in place when needed; returns the norm before clipping.
double clip_grad_norm(const std::vector<Tensor>& parameters, double max_norm);

} // namespace engine::optim
