// The shape of one optimizer step: what the planner chooses (planner/planner.h) and the trainer carries out
// (TrainerConfig::shape, optim/trainer_config.h), one value for both, so that a plan becomes a run by one
// assignment; with the two kinds it names, the precision and the optimizer. These are the vocabulary the
// planner, the trainer and train_gpt share, so they live in namespace engine, in the lower of the two rooms
// that use them (the planner sits below optim: docs/ARCHITECTURE.md).
#pragma once

#include <optional>
#include <string>

#include "base/error.h"
#include "checkpoint/checkpoint.h"
#include "engine/dtype.h"

namespace engine {

// How a step computes. fp32: in the parameters' own dtype (f32 for every model train_gpt builds; the
// gradient checks' f64 models stay f64). bf16: mixed precision as Hugging Face's `bf16`: bf16 working copies,
// activations, saved and offloaded tensors; f32 masters, gradient buffers and optimizer state.
enum class Precision { fp32, bf16 };
Precision parse_precision(const std::string& name); // "fp32" | "bf16"; throws EngineError otherwise
const char* precision_name(Precision precision);     // "fp32" | "bf16"
// The dtype a step's activations are stored in, for a model of f32 parameters.
DType precision_dtype(Precision precision);

// Which optimizer ends the step. none is the bare step of the memory model (no state); a trainer needs one
// of the others.
enum class OptimizerKind { none, sgd, adamw };
OptimizerKind parse_optimizer_kind(const std::string& name); // "adamw" | "sgd"; throws EngineError otherwise
const char* optimizer_kind_name(OptimizerKind kind);         // "adamw" | "sgd" | "none"
// State tensors the optimizer keeps per parameter: AdamW's two moments, SGD's momentum buffer, none's none.
int optimizer_state_tensors(OptimizerKind kind);

// With the optimizer on the host, where a window's gradients are summed (docs/MEMORY.md, "Model state off the
// device"). window: on the device, in f32 buffers for the whole model, copied to the host once per step.
// stream: on the host: each checkpointed segment's gradients get device buffers only for its backward, then go
// down and are added into the masters' f32 buffers, micro-batch after micro-batch in order; the device holds
// one segment's at a time (the layers outside checkpointed segments, the embeddings and the head keep window
// buffers).
enum class GradientOffload { window, stream };
GradientOffload parse_gradient_offload(const std::string& name); // "window" | "stream"
const char* gradient_offload_name(GradientOffload where);

// How a data-parallel run shards its model state over `ranks` ranks, as the memory model takes it: more than 1 rank
// is ZeRO stage 1 (the optimizer state), and with `gradients` stage 2 (the summed gradients too; the checkpointed
// segments' layers hold whole buffers only from their recompute to the end of their backward), which a trainer given
// a one-rank communicator also builds (its shards and buffers are then real, over one part). An int converts to stage
// 1 over that many ranks, what the memory model's `optimizer_shards` always meant.
// With `parameters` (stage 3, which has `gradients` too) the checkpointed segments' layers also hold their parameters
// (masters and working copies) only while a segment is gathered for its forward or its recompute and backward, each
// rank keeping the masters of its part.
struct ZeroSharding {
    int ranks = 1;
    bool gradients = false;
    bool parameters = false;
    // Stage 0 over several ranks: the optimizer state is whole, and the window's gradients are summed over the ranks in
    // place, the tensors shorter than a bucket through one staging buffer (Communicator::all_reduce_gradients).
    bool all_reduced = false;
    constexpr ZeroSharding() = default;
    constexpr ZeroSharding(int ranks) : ranks(ranks) {} // NOLINT: a rank count is stage 1 over them
    constexpr ZeroSharding(int ranks, bool gradients, bool parameters = false)
        : ranks(ranks), gradients(gradients || parameters), parameters(parameters) {}
    // What a step shape asks of `ranks` ranks: no shards at stage 0 (its gradients all-reduced where ranks > 1) or on
    // one rank (train_gpt gives one process no communicator).
    static ZeroSharding of(int zero_stage, int ranks) {
        if (ranks > 1 && zero_stage == 0) {
            ZeroSharding all_reduce;
            all_reduce.all_reduced = true;
            return all_reduce;
        }
        return zero_stage == 0 || ranks <= 1 ? ZeroSharding{} : ZeroSharding{ranks, zero_stage >= 2, zero_stage == 3};
    }
};

// The fields keep Hugging Face's TrainingArguments names, which are also train_gpt's flags.
struct StepShape {
    int per_device_train_batch_size = 8;        // sequences per micro-batch (per rank)
    int gradient_accumulation_steps = 1;        // N micro-batches per optimizer step
    checkpoint::CheckpointPolicy checkpointing; // gradient_checkpointing, every_n_layers, segment_size, offload, prefetch
    Precision precision = Precision::fp32;
    // 1: ZeRO stage 1, each of the N data-parallel ranks keeping the optimizer state of 1/N of the parameters
    // (optim/zero.h); 2: ZeRO stage 2, the summed gradients of 1/N too (the checkpointed segments' layers hold
    // theirs only during their backward; with offload_optimizer, offload_gradients stream and the shard on the
    // host); 3: ZeRO stage 3, the masters of 1/N too (the checkpointed segments' layers hold their weights only while
    // a segment runs, gathered from the ranks); 0: every rank keeps all of it.
    int zero_stage = 0;
    // Model state off the device (DeepSpeed's offload_optimizer; docs/MEMORY.md, "Model state off the
    // device"): the f32 masters, their gradient buffers and the optimizer state live in host memory and the
    // update runs there; the device keeps the working weights and the window's f32 gradients, which go to the
    // host once per step. Needs a model on a device other than the host.
    bool offload_optimizer = false;
    GradientOffload offload_gradients = GradientOffload::window; // with offload_optimizer only
    // Parameters streamed (DeepSpeed's offload_param), with offload_optimizer and checkpointing: the working
    // weights of the checkpointed segments' layers live on the host too, and come to the device for the
    // segment's forward and again for its recompute and backward, one segment at a time (docs/MEMORY.md,
    // "Parameters streamed"). The embeddings, the head and the layers outside checkpointed segments stay.
    bool offload_parameters = false;
    // The streaming LM head (docs/MEMORY.md, "The streaming LM head"): the loss and its gradients over chunks of
    // this many tokens of the micro-batch's B·T, so that the (B,T,Vp) logits never exist, one (chunk,Vp) block at
    // a time instead. 0: the whole logits (the fused classifier over forward_padded).
    int loss_chunk_tokens = 0;
    // The sequence-tiled MLP (docs/MEMORY.md, "The tiled MLP"): every decoder layer's MLP over tiles of this many
    // of the micro-batch's B·T tokens (checkpoint::tiled_rows), so that its intermediates exist one tile at a
    // time; each backward re-runs the MLP forward once more. 0: the whole MLP.
    int mlp_tile_tokens = 0;

    // Every rule on these fields, the checkpoint policy's included: the first broken one, or nullopt.
    std::optional<ConfigProblem> problem() const;
    // train_gpt's flags for this shape, e.g. "--per-device-train-batch-size 4 --gradient-accumulation-steps 2
    // --gradient-checkpointing --every-n-layers 1 --segment-size 1 --precision fp32".
    std::string flags() const;
    // "b 4 x 2, checkpoint every 1 (segments of 1), fp32"; with ranks > 1 "b 4 x 2 x 8 ranks, ...".
    std::string summary(int ranks = 1) const;
    bool operator==(const StepShape&) const = default;
};

} // namespace engine
