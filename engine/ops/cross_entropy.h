// What cross_entropy, the fused classifier and the streaming LM head share: the target checks, the reduction
// and the checks on the gradient factor a fused forward writes with. For engine/ops sources only.
#pragma once

#include "engine/ops.h"

namespace engine::detail {

struct CheckedTargets {
    Shape leading; // the logits' shape without its last dimension: (N) or (B,T)
    int rows = 0;
    int vocabulary = 0; // the classes: the first columns of the last dimension
    int columns = 0;    // the last dimension, the row stride: vocabulary plus any padding
    int64_t valid_targets = 0; // targets other than ignore_index
};

// targets i32 of shape `leading` on `device`, every label in [0,vocabulary) or ignore_index, read from their
// host copy; vocabulary 0: every one of `columns` is a class.
CheckedTargets check_targets(const char* op, const Shape& leading, int columns, Device device, const Tensor& targets,
                             int ignore_index, int vocabulary);
// d(reduced)/d(losses[i]): 1 for none and sum, 1/valid for mean; a mean over zero targets is defined as 0
// (loss and gradient), never 0/0.
double reduction_scale(Reduction reduction, int64_t valid_targets);
// (N) losses -> (1) scale · their sum in row order (none: the losses themselves).
Tensor reduce_losses(const Tensor& losses, Reduction reduction, double scale);
// A fused forward's promise: a sum or mean, and an expected upstream gradient that is finite, non-zero and
// (for f32 compute) a normal float.
void check_expected_gradient(const char* op, Reduction reduction, double expected_output_gradient, DType dtype);
// scale · expected must be a normal float (or zero) for f32 compute, or the gradient written with it is lost.
void check_gradient_factor(const char* op, double scale, double expected_output_gradient, DType dtype);

} // namespace engine::detail
