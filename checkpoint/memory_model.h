// Predicts the memory of one GPT training step (forward + loss + backward) per accounting category, under a
// checkpoint policy, from what each op allocates and saves. docs/MEMORY.md derives every term.
#pragma once

#include <cstddef>
#include <string>

#include "checkpoint/checkpoint.h"
#include "nn/gpt.h"

namespace engine::checkpoint {

// Which optimizer's state to count: AdamW keeps two moments per parameter, SGD with momentum one.
enum class OptimizerKind { none, sgd, adamw };

struct MemoryPrediction {
    // Peak bytes of each category over one step. Parameters, gradients and optimizer state are constant;
    // activations, workspace and pinned_host are high-water marks reached at different moments.
    size_t parameters = 0; // master_parameters + working_copies
    size_t master_parameters = 0; // what the optimizer updates (f32 under bf16 mixed precision)
    size_t working_copies = 0;    // bf16 mixed precision: the bf16 copies the forward reads; 0 otherwise
    size_t gradients = 0;
    size_t optimizer_state = 0;
    size_t activations = 0;
    size_t workspace = 0;
    size_t pinned_host = 0;

    std::string activations_peak_moment; // e.g. "recompute of segment 3 (blocks 5-6) in backward"
    int checkpointed_segments = 0;
    int recomputed_blocks = 0; // blocks run twice per step: the extra compute, in block forwards

    size_t of(MemoryCategory category) const;
    // Sum of the device categories' peaks: an upper bound on the device's joint peak (the activation peak
    // and the workspace peak fall at different moments).
    size_t device_total_bound() const { return parameters + gradients + optimizer_state + activations + workspace; }
};

// One training step as the trainer runs it: logits = model.forward_padded(tokens (B,T)) (B,T,Vp) in train mode;
// loss = multiply(cross_entropy_in_place(logits, targets, sum, 1 / items, -100, V), 1 / items) (the fused
// classifier: no separate (B,T,Vp) gradient buffer); logits dropped; backward(loss). Parameters and gradients
// count wte's padded rows (Vp = vocab_size rounded up to 128); the optimizer state only the real ones.
// Bytes already live before the step (tokens, targets) are not included. optimizer_shards > 1 is ZeRO stage 1
// over that many ranks (optim/zero.h): the optimizer state of one rank's part (the parameters padded to equal
// parts), and the flat gradient/parameter buffer and the part in the workspace.
MemoryPrediction predict_memory(const nn::GPTConfig& config, int batch, int seq_len, const CheckpointPolicy& policy,
                                DType dtype = DType::f32, OptimizerKind optimizer = OptimizerKind::adamw,
                                int optimizer_shards = 1);

// A human-readable plan for `train_gpt --plan`: the segment layout, the recompute cost and the predicted
// peak per category, next to the same prediction without checkpointing.
std::string plan_report(const nn::GPTConfig& config, int batch, int seq_len, const CheckpointPolicy& policy,
                        DType dtype = DType::f32, OptimizerKind optimizer = OptimizerKind::adamw,
                        int optimizer_shards = 1);

} // namespace engine::checkpoint
