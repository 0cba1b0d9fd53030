// The activations and workspace of one LoRA or QLoRA micro-batch (issue 28 item 6): the step replayed over
// tensors that have a size and no data, each op allocating and saving what its engine twin does, so that the
// high-water marks come out as the allocator records them. docs/MEMORY.md ("The LoRA step") says why a replay.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "checkpoint/checkpoint.h"
#include "engine/dtype.h"
#include "nn/lora.h"
#include "nn/model_config.h"
#include "planner/memory_model.h"

namespace engine::planner {

// What one micro-batch's forward and backward hold above what was live before it (the model state, the batches).
struct AdapterStepWalk {
    size_t activations = 0; // the activations category's high-water mark
    std::string activations_moment;
    size_t workspace = 0;   // the workspace category's
    size_t pinned_host = 0; // the offloaded segment inputs' (pinned host)
    size_t joint = 0;       // activations + workspace at one moment: a device with memory of its own
    std::string joint_moment;
    size_t unified_joint = 0; // activations + workspace + pinned host at one moment: the CPU backend's one account
};

// One allocation (+bytes) or free (-bytes) of the replay, on the account engine/memory.h's MemoryCategory names:
// what tests compare, event for event, with the allocator's memory timeline of the same micro-batch.
struct AdapterStepEvent {
    int account = 0; // 0 activations, 1 workspace, 2 pinned host
    int64_t bytes = 0;
};

// One micro-batch of `batch` x `seq_len` tokens as optim::Trainer runs it on a model that nn::apply_lora (and with
// nf4, nn::quantize_nf4) adapted: forward under `policy`, the fused classifier (loss_chunk_tokens 0) or the
// streaming head, the loss scaled, backward; mlp_tile_tokens > 0: each layer's MLP tiled. GPT-2 and Llama, f32 and
// bf16 (mixed precision).
AdapterStepWalk walk_adapter_step(const nn::ModelConfig& config, int batch, int seq_len,
                                  const checkpoint::CheckpointPolicy& policy, DType dtype, const nn::LoraConfig& lora,
                                  bool nf4, int loss_chunk_tokens, int mlp_tile_tokens = 0,
                                  std::vector<AdapterStepEvent>* events = nullptr);

// One evaluation micro-batch (Trainer::evaluate: eval mode, no-grad, the same loss as training's, its sum read): a
// full fine-tune's (no tuning.lora: under no-grad what trains changes nothing but the adapters' ops) or a LoRA or
// QLoRA run's. What it holds above what was live before it, as walk_adapter_step's (nothing pinned: under no-grad
// a checkpointed segment keeps nothing). gathered_layer_bytes: at ZeRO-3 what one checkpointed layer's gathered weights
// take on the device (MemoryPrediction::gathered_layer_bytes), held in the joint peak while its segment runs;
// gathered_table_bytes: a Llama's token table or head gathered (MemoryPrediction::gathered_table_bytes), held for the
// lookup and for the head's GEMM (the streaming head's loss).
AdapterStepWalk walk_evaluation(const nn::ModelConfig& config, int batch, int seq_len,
                                const checkpoint::CheckpointPolicy& policy, DType dtype, const FineTuning& tuning,
                                int loss_chunk_tokens, int mlp_tile_tokens = 0,
                                std::vector<AdapterStepEvent>* events = nullptr, size_t gathered_layer_bytes = 0,
                                size_t gathered_table_bytes = 0);

// predict_memory for a LoRA or QLoRA run (tuning.lora set): the model state of predict_model_state, the step's
// activations and workspace from walk_adapter_step, and the joint peak as Trainer::train_step holds it. Refused,
// naming it, for what the replay does not follow yet: the optimizer off the device, streamed parameters and ZeRO-1.
MemoryPrediction predict_adapter_memory(const nn::ModelConfig& config, int batch, int seq_len,
                                        const checkpoint::CheckpointPolicy& policy, DType dtype, OptimizerKind optimizer,
                                        int optimizer_shards, int accumulation_steps, bool offload_optimizer,
                                        bool offload_parameters, int loss_chunk_tokens, int mlp_tile_tokens,
                                        bool packed_documents, const FineTuning& tuning);

} // namespace engine::planner
