// One tensor of a multi-tensor AdamW update, as both twins of adamw_update_list take it (kernels/cpu/adamw.cpp,
// kernels/cuda/adamw.cu): the four streams of its update and what the step's epilogue writes beside them.
#pragma once

#include <cstdint>

#include "base/bfloat16.h"

namespace engine::kernels {

template <typename Scalar>
struct AdamWTensor {
    Scalar* parameter = nullptr;  // (count) updated in place
    Scalar* gradient = nullptr;   // (count) read, then zeroed when the list's update zeroes gradients
    Scalar* exp_avg = nullptr;    // (count) first moment
    Scalar* exp_avg_sq = nullptr; // (count) second moment
    // (count) null, or the parameter's bf16 working copy: each updated value rounded into it (to nearest even, as
    // convert does; a double through float), so that no conversion pass follows the update.
    bfloat16* working_copy = nullptr;
    int64_t count = 0;
    float weight_decay = 0.0f; // decoupled, this tensor's own: 0 for the tensors that do not decay
};

} // namespace engine::kernels
