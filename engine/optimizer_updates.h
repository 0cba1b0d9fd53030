// The optimizers' update kernels on tensors: the checks and the CPU/CUDA dispatch, so that optim/ reaches the
// kernels only through the engine, as every op does. Each updates one contiguous range of a parameter (the
// whole tensor, or a ZeRO shard) from as many gradient elements and the range's own state tensors. The gradient
// elements are the same range of the parameter's gradient buffer, or (ZeRO-2) a run of a rank's shard gradient.
#pragma once

#include <cstdint>

#include "engine/tensor.h"

namespace engine {

// Hyperparameters of one AdamW update, as the kernels take them (float; the bias corrections computed in
// double by the caller and rounded once).
struct AdamWUpdate {
    float learning_rate = 0.0f;
    float beta1 = 0.0f;
    float beta2 = 0.0f;
    float epsilon = 0.0f;
    float weight_decay = 0.0f; // decoupled: p -= lr * weight_decay * p
    float bias_correction1 = 1.0f;
    float bias_correction2 = 1.0f;
    float grad_scale = 1.0f; // the clip coefficient (and the ranks' average), fused into the update
};

// p: elements [first, first + count) of parameter; grad: [gradient_first, gradient_first + count) of gradient (1-D,
// or the parameter's shape); exp_avg, exp_avg_sq: count elements (docs/TRAINING.md has the formula). All on one
// device, one floating dtype (f32 on CUDA).
void adamw_update(const Tensor& parameter, const Tensor& gradient, int64_t gradient_first, const Tensor& exp_avg,
                  const Tensor& exp_avg_sq, int64_t first, int64_t count, const AdamWUpdate& update);

// SGD with momentum, PyTorch's semantics (coupled weight decay, no dampening, no Nesterov).
struct SGDUpdate {
    float learning_rate = 0.0f;
    float momentum = 0.0f;
    float weight_decay = 0.0f;
    float grad_scale = 1.0f;
};

// p: elements [first, first + count) of parameter; grad: [gradient_first, gradient_first + count) of gradient;
// momentum_buffer: count elements.
void sgd_update(const Tensor& parameter, const Tensor& gradient, int64_t gradient_first, const Tensor& momentum_buffer,
                int64_t first, int64_t count, const SGDUpdate& update);

} // namespace engine
