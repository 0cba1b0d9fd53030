// The step shape's rules, names and flags (planner/step_shape.h).
#include "planner/step_shape.h"

#include <sstream>

namespace engine {

Precision parse_precision(const std::string& name) {
    if (name == "fp32") return Precision::fp32;
    if (name == "bf16") return Precision::bf16;
    ENGINE_FAIL("precision: unknown precision '" << name << "' (known: fp32, bf16)");
}

const char* precision_name(Precision precision) { return precision == Precision::bf16 ? "bf16" : "fp32"; }

DType precision_dtype(Precision precision) { return precision == Precision::bf16 ? DType::bf16 : DType::f32; }

OptimizerKind parse_optimizer_kind(const std::string& name) {
    if (name == "adamw") return OptimizerKind::adamw;
    if (name == "sgd") return OptimizerKind::sgd;
    ENGINE_FAIL("optimizer: unknown optimizer '" << name << "' (known: adamw, sgd)");
}

const char* optimizer_kind_name(OptimizerKind kind) {
    return kind == OptimizerKind::adamw ? "adamw" : kind == OptimizerKind::sgd ? "sgd" : "none";
}

int optimizer_state_tensors(OptimizerKind kind) {
    return kind == OptimizerKind::adamw ? 2 : kind == OptimizerKind::sgd ? 1 : 0;
}

GradientOffload parse_gradient_offload(const std::string& name) {
    if (name == "window") return GradientOffload::window;
    if (name == "stream") return GradientOffload::stream;
    ENGINE_FAIL("offload_gradients: unknown way '" << name << "' (known: window, stream)");
}

const char* gradient_offload_name(GradientOffload where) { return where == GradientOffload::stream ? "stream" : "window"; }

std::optional<ConfigProblem> StepShape::problem() const {
    if (per_device_train_batch_size <= 0)
        return ConfigProblem{"per_device_train_batch_size",
                             "must be positive, got " + std::to_string(per_device_train_batch_size)};
    if (gradient_accumulation_steps <= 0)
        return ConfigProblem{"gradient_accumulation_steps",
                             "must be positive, got " + std::to_string(gradient_accumulation_steps)};
    if (std::optional<ConfigProblem> found = checkpointing.problem()) return found;
    // The checkpoint layer ignores these combinations; a run that asks for them has made a mistake.
    if (checkpointing.offload && !checkpointing.enabled)
        return ConfigProblem{"offload", "moves checkpointed segment inputs to host memory, so it needs gradient_checkpointing"};
    if (checkpointing.prefetch && !checkpointing.offload)
        return ConfigProblem{"prefetch", "prefetches offloaded inputs, so it needs offload"};
    if (zero_stage < 0 || zero_stage > 3)
        return ConfigProblem{"zero_stage", "must be 0, 1, 2 or 3, got " + std::to_string(zero_stage)};
    if (zero_stage >= 2 && !checkpointing.enabled)
        return ConfigProblem{"zero_stage", std::to_string(zero_stage) +
                                               " reduces each checkpointed segment's gradients onto their owners as its "
                                               "backward ends, so it needs gradient_checkpointing"};
    if (zero_stage >= 2 && offload_optimizer && offload_gradients != GradientOffload::stream)
        return ConfigProblem{"zero_stage", std::to_string(zero_stage) +
                                               " with offload_optimizer sums each checkpointed segment's gradients in "
                                               "the ranks' host shards as its backward ends, so it needs "
                                               "offload_gradients stream"};
    if (zero_stage == 3 && offload_parameters)
        return ConfigProblem{"offload_parameters", "with zero_stage 3 the checkpointed segments' weights are on the "
                                                   "device only while their segment runs already (gathered from the "
                                                   "ranks' shards, on the host with offload_optimizer): leave "
                                                   "offload_parameters off"};
    if (offload_gradients == GradientOffload::stream && !offload_optimizer)
        return ConfigProblem{"offload_gradients", "stream sums the gradients on the host, so it needs offload_optimizer"};
    if (offload_gradients == GradientOffload::stream && !checkpointing.enabled)
        return ConfigProblem{"offload_gradients", "stream gives device buffers to the checkpointed segments' backward only, "
                                                  "so it needs gradient_checkpointing"};
    if (offload_parameters && !offload_optimizer)
        return ConfigProblem{"offload_parameters", "streams the working weights from the host copy the update keeps "
                                                   "current, so it needs offload_optimizer"};
    if (offload_parameters && !checkpointing.enabled)
        return ConfigProblem{"offload_parameters", "streams the weights of the checkpointed segments' layers (a "
                                                   "segment's weights come back for its recompute), so it needs "
                                                   "gradient_checkpointing"};
    if (loss_chunk_tokens < 0)
        return ConfigProblem{"loss_chunk_tokens", "must be >= 0 (0: the whole logits), got " + std::to_string(loss_chunk_tokens)};
    if (mlp_tile_tokens < 0)
        return ConfigProblem{"mlp_tile_tokens", "must be >= 0 (0: the whole MLP), got " + std::to_string(mlp_tile_tokens)};
    return std::nullopt;
}

std::string StepShape::flags() const {
    std::ostringstream text;
    text << "--per-device-train-batch-size " << per_device_train_batch_size << " --gradient-accumulation-steps "
         << gradient_accumulation_steps;
    if (checkpointing.enabled) {
        text << " --gradient-checkpointing --every-n-layers " << checkpointing.every_n_layers << " --segment-size "
             << checkpointing.segment_size;
        if (checkpointing.offload) text << " --offload";
        if (checkpointing.prefetch) text << " --prefetch";
    }
    text << " --precision " << precision_name(precision);
    if (zero_stage > 0) text << " --zero-stage " << zero_stage;
    if (offload_optimizer) text << " --offload-optimizer cpu";
    if (offload_optimizer && offload_gradients == GradientOffload::stream) text << " --offload-gradients stream";
    if (offload_parameters) text << " --offload-parameters cpu";
    if (loss_chunk_tokens > 0) text << " --loss-chunk-tokens " << loss_chunk_tokens;
    else text << " --loss-chunk-tokens off";
    if (mlp_tile_tokens > 0) text << " --mlp-tile-tokens " << mlp_tile_tokens;
    else text << " --mlp-tile-tokens off";
    return text.str();
}

std::string StepShape::summary(int ranks) const {
    std::ostringstream text;
    text << "b " << per_device_train_batch_size << " x " << gradient_accumulation_steps;
    if (ranks > 1) text << " x " << ranks << " ranks";
    text << ", ";
    if (!checkpointing.enabled) text << "no checkpointing";
    else if (checkpointing.segment_size != 1) text << "segments of " << checkpointing.segment_size;
    else text << "checkpoint every " << checkpointing.every_n_layers;
    if (checkpointing.offload) text << " + offload";
    text << ", " << precision_name(precision);
    if (zero_stage > 0) text << ", ZeRO-" << zero_stage;
    if (offload_optimizer)
        text << (offload_gradients == GradientOffload::stream ? ", optimizer and gradients on the host"
                                                               : ", optimizer on the host");
    if (offload_parameters) text << ", parameters streamed";
    if (loss_chunk_tokens > 0) text << ", loss chunks of " << loss_chunk_tokens;
    if (mlp_tile_tokens > 0) text << ", MLP tiles of " << mlp_tile_tokens;
    return text.str();
}

} // namespace engine
