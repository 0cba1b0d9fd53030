// The gradient-accumulation trainer: the one place that knows where an optimizer step begins and ends.
// One step pulls up to N micro-batches, counts their targets, runs forward -> loss -> backward for each
// (gradients add up in the buffers), then clips once, updates, zeroes the gradients and advances the
// learning-rate schedule. docs/TRAINING.md gives the loss formulas.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "engine/distributed/communicator.h"
#include "nn/gpt.h"
#include "nn/io/batch.h"
#include "optim/optimizer.h"
#include "optim/schedule.h"
#include "optim/zero.h"

namespace engine::optim {

enum class LossNormalization { tokens, mean };
enum class OptimizerKind { adamw, sgd };
LossNormalization parse_loss_normalization(const std::string& name); // "tokens" | "mean"
OptimizerKind parse_optimizer_kind(const std::string& name);         // "adamw" | "sgd"
const char* loss_normalization_name(LossNormalization mode);
const char* optimizer_kind_name(OptimizerKind kind);

// Field names follow Hugging Face TrainingArguments where one exists.
struct TrainerConfig {
    int per_device_train_batch_size = 8; // sequences per micro-batch; the data source makes them
    int gradient_accumulation_steps = 1; // N micro-batches per optimizer step
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
    // Checkpoint policy for the model's blocks (checkpoint/checkpoint.h).
    bool gradient_checkpointing = false;
    int every_n_layers = 1;
    int segment_size = 1; // 0 = ceil(sqrt(layers))
    bool offload = false;
    bool skip_nonfinite = false; // a NaN/Inf loss or gradient norm skips the update instead of throwing
    bool prefetch = false; // with offload: copy the next segment's input host→device ahead, on a copy stream
    // 1: ZeRO stage 1 over the constructor's communicator, each rank keeping the optimizer state of 1/N of
    // the parameters (optim/zero.h); 0: every rank keeps all of it.
    int zero_stage = 0;
    // Mixed precision, Hugging Face's `bf16`: the trainer gives the model bf16 working copies of its f32
    // parameters (Module::set_compute_dtype), so activations, saved tensors and offloaded inputs are bf16
    // while the optimizer updates the f32 masters from f32 gradient buffers (docs/TRAINING.md, "bf16").
    // false leaves the model's own dtype (a GPT built with DType::bf16 is mixed precision already).
    bool bf16 = false;

    checkpoint::CheckpointPolicy checkpoint_policy() const;

    void validate() const; // throws EngineError naming the field
};

// What one optimizer step did.
struct StepResult {
    int64_t step = 0;                // optimizer steps completed, this one included (1-based)
    double loss = 0.0;               // sum of all token losses / num_items_in_batch (custom loss: see below)
    double learning_rate = 0.0;      // the rate this step used
    double grad_norm = 0.0;          // global norm of the accumulated gradients, before clipping
    int64_t tokens = 0;              // input positions processed (sum of B·T over the micro-batches)
    int64_t num_items_in_batch = 0;  // valid targets over the whole window, every rank's
    int64_t rank_num_items_in_batch = 0; // this rank's part of them
    int micro_batches = 0;           // N, or k < N for a last partial window
    double seconds = 0.0;
    double tokens_per_second = 0.0;
    MemoryStats memory;              // the model device's statistics; peaks cover this step only
    bool skipped = false;            // non-finite loss or gradients with skip_nonfinite: no update was made
    // What the communicator did during this step (zero without one): one count, one gradient and one loss
    // all-reduce per step with data parallelism, whatever the number of micro-batches.
    distributed::CommunicatorCounters communication;
};

// A custom loss. It returns a scalar whose backward is the micro-batch's contribution. With
// loss_is_scaled_for_ga it already divided by num_items_in_batch; otherwise it is a per-batch mean and the
// trainer divides it by the number of micro-batches in the window.
using LossFunction = std::function<Tensor(const Tensor& logits, const nn::Batch& batch, int64_t num_items_in_batch)>;
// What num_items_in_batch counts: causal LM shifted targets (labels[:,1:] or shift_labels) or every label.
enum class TargetCounting { causal_shifted, all_labels };

// The state of one accumulation window, between accumulate_gradients and apply_update.
struct Accumulation {
    int64_t num_items_in_batch = 0;       // over every rank's micro-batches of the window
    int64_t rank_num_items_in_batch = 0;  // this rank's part of it (all of it in one process)
    int micro_batches = 0;
    int64_t tokens = 0;
    // Each micro-batch's reported loss as (one-value tensor, factor): value·factor is its token-loss sum. They
    // stay on the device until loss_sum() reads them, which apply_update does once the gradient norm has
    // waited for the device anyway, so no micro-batch's forward makes the host wait.
    std::vector<std::pair<Tensor, double>> reported_losses;
    double loss_sum() const; // the sum the reported loss is made of
};

class Trainer {
public:
    // Applies the checkpoint policy to the model, seeds the engine RNG, and creates the optimizer (its
    // state is allocated now) and the schedule. The model must outlive the trainer. With a communicator the
    // trainer is data-parallel from the start (see set_communicator), and zero_stage 1 shards the optimizer
    // state over its ranks.
    Trainer(nn::GPT& model, const TrainerConfig& config, distributed::Communicator* communicator = nullptr);

    // One optimizer step over up to N micro-batches from `source`. Returns nullopt, changing nothing, when
    // the source has no batch left. If any micro-batch is bad or throws, no weight changes and the gradient
    // buffers are zeroed again before the error propagates (the batches pulled are consumed).
    std::optional<StepResult> train_step(const nn::BatchSource& source);

    // The two halves of a step, public for tests and tools that inspect the accumulated gradients.
    // accumulate_gradients: validates every batch first, then forward -> loss -> backward each one.
    Accumulation accumulate_gradients(const std::vector<nn::Batch>& batches);
    // clip once -> optimizer step at the schedule's rate -> zero_grad -> the schedule advances.
    StepResult apply_update(const Accumulation& accumulation);

    void set_loss_function(LossFunction loss_function, bool loss_is_scaled_for_ga,
                           TargetCounting counting = TargetCounting::causal_shifted);

    // Data parallelism (docs/DISTRIBUTED.md): each window's token count is summed over the ranks before its
    // first backward, the gradient buffers once after its last, and the loss sum once for the report, so
    // every rank takes the same step. Not owned; nullptr (the default) is one process. Every rank must make
    // the same calls: a rank that throws leaves the others waiting, so launch with mpirun, which ends them.
    // With zero_stage 1 the communicator must be the constructor's, which sharded the optimizer state.
    void set_communicator(distributed::Communicator* communicator);
    distributed::Communicator* communicator() const { return communicator_; }

    // The shifted causal-LM targets of a batch (B,T) i32 on the host: shift_labels if supplied, else
    // target[b,t] = labels[b,t+1] for t < T-1 and -100 at t = T-1.
    static Tensor shift_targets(const nn::Batch& batch);
    int64_t count_targets(const nn::Batch& batch) const;

    int64_t step() const { return optimizer_->step_count(); } // optimizer steps done
    int64_t skipped_steps() const { return skipped_steps_; }  // windows skipped for non-finite values
    double current_learning_rate() const { return schedule_.at(step()); }
    Optimizer& optimizer() { return *optimizer_; }
    // The optimizer state as whole tensors named as named_state() unsharded: the live tensors, or under ZeRO-1
    // gathered from every rank (a collective every rank calls).
    NamedTensors whole_optimizer_state() { return zero_ ? zero_->gather_state(*optimizer_) : optimizer_->named_state(); }
    const LearningRateSchedule& schedule() const { return schedule_; }
    const TrainerConfig& config() const { return config_; }
    nn::GPT& model() { return model_; }

private:
    void validate_batch(const nn::Batch& batch, size_t index) const;
    Tensor micro_batch_loss(const Tensor& logits, const nn::Batch& batch, const Tensor& targets,
                            Accumulation& window);

    nn::GPT& model_;
    TrainerConfig config_;
    std::vector<Tensor> parameters_;
    std::unique_ptr<Optimizer> optimizer_;
    LearningRateSchedule schedule_;
    LossFunction loss_function_;
    bool loss_is_scaled_for_ga_ = false;
    TargetCounting counting_ = TargetCounting::causal_shifted;
    // The factor that turns the ranks' summed gradients into this step's: 1 when each rank's loss is divided
    // by the global token count, 1/world_size for per-rank means (DDP's average).
    double rank_gradient_scale() const;

    distributed::Communicator* communicator_ = nullptr;
    std::unique_ptr<ZeroShards> zero_; // zero_stage 1 with a communicator
    distributed::CommunicatorCounters window_counters_; // the communicator's counters when the window began
    std::chrono::steady_clock::time_point window_start_;
    int64_t skipped_steps_ = 0;
};

} // namespace engine::optim
