// The pointwise ops: unary functions, and the binary arithmetic with NumPy broadcasting. Included by engine/ops.h.
#pragma once

#include "engine/tensor.h"

namespace engine {

// Elementwise, same shape and dtype as the input. Each saves the one tensor its backward reads: relu, silu and
// log their input; tanh, sigmoid and exp their output. log of a non-positive value gives -inf or NaN, as in
// every framework: values are not inspected (that would read the device); the trainer's non-finite guard
// catches them in a loss.
Tensor relu(const Tensor& input);
Tensor silu(const Tensor& input); // x · sigmoid(x), Llama's and SwiGLU's activation
Tensor tanh(const Tensor& input);
Tensor sigmoid(const Tensor& input);
Tensor exp(const Tensor& input);
Tensor log(const Tensor& input);

// a ∘ b with NumPy broadcasting: shapes are right-aligned and each pair of extents is equal or one of them is
// 1; the result has the larger extent everywhere. The gradient of a broadcast operand is summed over the
// dimensions it was broadcast along. Same dtype and device for both. `add` of two equal shapes is the
// residual add (one backward pass for both inputs); sub, mul and div save what their backward reads (mul:
// the other operand; div: b, and a for b's gradient).
Tensor add(const Tensor& a, const Tensor& b);
Tensor sub(const Tensor& a, const Tensor& b);
Tensor mul(const Tensor& a, const Tensor& b);
Tensor div(const Tensor& a, const Tensor& b);

} // namespace engine
