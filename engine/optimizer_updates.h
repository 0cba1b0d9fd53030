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
// device, one floating dtype (f32 on CUDA). The optimizers step through the list form below; this per-range form,
// over the single-tensor kernels, is what the list is held to bit for bit (tests/adamw_list.h).
void adamw_update(const Tensor& parameter, const Tensor& gradient, int64_t gradient_first, const Tensor& exp_avg,
                  const Tensor& exp_avg_sq, int64_t first, int64_t count, const AdamWUpdate& update);

// One range of a multi-tensor AdamW update: what adamw_update takes, and what the step's epilogue writes beside it.
struct AdamWRange {
    Tensor parameter; // elements [first, first + count) are updated
    int64_t first = 0;
    Tensor gradient; // elements [gradient_first, gradient_first + count) are read (and zeroed with zero_gradients)
    int64_t gradient_first = 0;
    Tensor exp_avg, exp_avg_sq; // count elements each
    int64_t count = 0;
    bool decays = false; // whether the update's weight_decay applies to this range
    // Undefined, or a bf16 tensor on the parameter's device (its working copy) whose elements [first, first +
    // count) take the updated values rounded to nearest even, as convert_into would write them.
    Tensor working_copy;
};

// AdamW over many ranges at once, with the step's epilogue in the same pass: each working copy written and, with
// zero_gradients, each range's gradient elements zeroed. Bitwise adamw_update, convert_into and a zero fill range
// by range, in one memory pass instead of three: on CUDA one launch for up to 64 ranges
// (kernels::cuda::adamw_list_capacity), where the per-range calls launch three kernels a range. The ranges share
// one device and dtype (f32 on CUDA); every one of this call's is checked before anything is written.
void adamw_update(const std::vector<AdamWRange>& ranges, const AdamWUpdate& update, bool zero_gradients);

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
