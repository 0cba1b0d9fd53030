// A micro-batch as the trainer consumes it, and the source it comes from.
#pragma once

#include <functional>
#include <optional>

#include "engine/tensor.h"

namespace engine::nn {

struct Batch {
    Tensor inputs; // (B,T) i32 token ids; padding positions hold any valid id (e.g. 0)
    // (B,T) i32, unshifted as in Hugging Face: labels[b,t] is token t itself, -100 where there is no token
    // (padding). Causal LM shifts them: position t predicts labels[b,t+1].
    Tensor labels;
    // Optional (B,T) i32, already shifted (position t's target), for collators that supply it; when present
    // it is used and counted instead of labels.
    Tensor shift_labels;
    // Optional (B,T) i32: packed documents (DataLayout::packed_documents), each row several documents back to back,
    // positions[b,t] the token's position in its document (0 at its first token). The model restarts positions
    // there and attends within each document only (CausalLM::forward_hidden); labels hold -100 at each document's
    // first token, so no position predicts across a boundary. Undefined: one sequence per row.
    Tensor positions;
};

// Returns the next micro-batch, or nullopt when the data is exhausted.
using BatchSource = std::function<std::optional<Batch>()>;

} // namespace engine::nn
