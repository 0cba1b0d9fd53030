// What a training run is told: TrainerConfig (Hugging Face's TrainingArguments names), the step's shape in it
// (planner/step_shape.h, shared with the planner), and LossNormalization, the one place that knows how the
// micro-batches' loss sums become the window's loss. Every rule on the fields is asked through problem(), which
// composes the rules of the parts (the step shape and its checkpoint policy, the optimizers' options, the
// schedule), each written once beside the struct it constrains.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include "base/error.h"
#include "engine/dtype.h"
#include "optim/optimizer.h"
#include "optim/schedule.h"
#include "planner/step_shape.h"

namespace engine::optim {

// The step's shape, precision and optimizer kind are the planner's vocabulary too (planner/step_shape.h).
using engine::OptimizerKind;
using engine::Precision;
using engine::StepShape;

// How the micro-batches' loss sums become the window's loss (SPEC.md §1, "Loss scaling"): the one place that
// knows it. Micro-batch k of a window of N returns (sum_k, items_k); its loss, whose backward is its share of
// the step's gradient, is sum_k · factor(...):
//   tokens: sum_k / num_items_in_batch, num_items_in_batch = Σ items over the window (and every rank): the
//           window's gradient is that of the item mean over the whole effective batch, whatever the padding;
//   mean:   (sum_k / items_k) / N, the per-micro-batch mean divided by the micro-batches present (k < N in a
//           last partial window): equal to tokens mode only when every micro-batch has as many items (the
//           "gradient accumulation bug" otherwise).
struct LossNormalization {
    enum class Mode { tokens, mean };
    Mode mode = Mode::tokens;

    constexpr LossNormalization() = default;
    constexpr LossNormalization(Mode mode) : mode(mode) {} // NOLINT: a mode is a normalisation
    static const LossNormalization tokens;
    static const LossNormalization mean;
    bool operator==(const LossNormalization&) const = default;

    // The factor micro-batch k's loss sum is multiplied by. Mean mode forms it as C(1/items)·C(1/N) in the
    // compute type C of `dtype` (float for f32 and bf16, double for f64), a value exact in double: so a
    // fused loss that writes its gradient with it (the GPT classifier) gets bitwise the gradient of a mean
    // scaled by 1/N. A micro-batch without items adds nothing in mean mode (its sum is 0): factor C(1/N).
    double factor(int64_t items, int64_t num_items_in_batch, int micro_batches, DType dtype) const;
    // tokens divides every rank's loss by the global count, so the ranks' gradients add; mean mode is a
    // per-rank mean, so they are averaged (DDP).
    bool divides_by_global_count() const { return mode == Mode::tokens; }
    const char* name() const { return mode == Mode::mean ? "mean" : "tokens"; }
    static LossNormalization parse(const std::string& name); // "tokens" | "mean"
};
inline constexpr LossNormalization LossNormalization::tokens{LossNormalization::Mode::tokens};
inline constexpr LossNormalization LossNormalization::mean{LossNormalization::Mode::mean};

// A bad TrainerConfig field: its name (the struct's, which is also the Hugging Face argument's) and why.
using engine::ConfigProblem;

// Field names follow Hugging Face TrainingArguments where one exists.
struct TrainerConfig {
    // Micro-batch, accumulation steps, checkpoint policy, precision and ZeRO stage: what the planner chooses,
    // so a plan is applied as `config.shape = plan.shape`. The defaults: 8 sequences, 1 micro-batch, no
    // checkpointing, the model's own precision, no ZeRO. Checkpointing is applied through
    // Module::set_checkpointing; precision bf16 gives the model bf16 working copies of its f32 parameters
    // (Module::set_compute_dtype), while the optimizer updates the f32 masters from f32 gradient buffers
    // (docs/TRAINING.md, "bf16"); fp32 leaves the model's own dtype (a GPT built with DType::bf16 is mixed
    // precision already). zero_stage 1 shards the optimizer state over the constructor's communicator, 2 the summed
    // gradients too, 3 the checkpointed layers' masters too (StepShape::zero_stage).
    StepShape shape;
    double learning_rate = 1e-3;
    double weight_decay = 0.0; // applied to 2-D weights only (optim/optimizer.h)
    double adam_beta1 = 0.9;
    double adam_beta2 = 0.999;
    double adam_epsilon = 1e-8;
    double max_grad_norm = 1.0; // <= 0 turns clipping off
    std::string lr_scheduler_type = "constant"; // "constant" | "cosine"
    int64_t warmup_steps = 0;
    double min_lr_ratio = 0.0; // cosine floor as a fraction of learning_rate
    int64_t max_steps = 100;   // optimizer steps; the cosine schedule ends here
    uint64_t seed = 42;        // the engine RNG stream (dropout); model init takes its own seed
    int64_t logging_steps = 1;
    LossNormalization loss_normalization = LossNormalization::tokens;
    OptimizerKind optimizer = OptimizerKind::adamw;
    double sgd_momentum = 0.9;
    bool skip_nonfinite = false; // a NaN/Inf loss or gradient norm skips the update instead of throwing
    // The batch-invariant mode (docs/TRAINING.md, "The big batch, bitwise"): 0 is off; c > 0 runs every micro-batch as
    // chunks of c sequences, each its own forward and backward, whose gradients are summed exactly (optim/
    // batch_invariant.h), so any split of the same window into micro-batches, accumulation steps and ranks trains the
    // same bits. c must divide per_device_train_batch_size; tokens normalisation, zero_stage 0 or 1 and the model state
    // on the device only, for now.
    int batch_invariant_chunk = 0;

    // The parts the trainer builds, from these fields (the one mapping of the field names onto theirs).
    AdamWOptions adamw_options() const;
    SGDOptions sgd_options() const;
    ScheduleConfig schedule_config() const; // needs a known lr_scheduler_type

    // Every rule on the fields: the first bad field, named as this struct spells it, or nullopt. Programs map the
    // field back to their own flag (train_gpt: --per-device-train-batch-size for per_device_train_batch_size).
    std::optional<ConfigProblem> problem() const;
    void validate() const; // throws EngineError "<field> <reason>" for problem()
};

} // namespace engine::optim
