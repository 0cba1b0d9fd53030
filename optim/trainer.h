// The causal-LM trainer: the generic accumulation trainer (optim/module_trainer.h) with an nn::CausalLM (GPT-2,
// Llama) as its model and nn::Batch (causal-LM token batches) as its batch. It validates and counts each window's batches before the
// first forward and computes the loss through the fused classifier (cross_entropy_in_place), or through a
// custom loss on the logits. docs/TRAINING.md gives the loss formulas.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <vector>

#include "nn/causal_lm.h"
#include "nn/model_config.h" // GPT-2 and Llama, the causal LMs this trainer is mostly used with
#include "nn/io/batch.h"
#include "optim/module_trainer.h"

namespace engine::optim {

// A custom loss: the (B,T,V) logits and the batch in, the SUM of its per-target losses and their count
// out (the count must be count_targets(batch)); the trainer normalises it as config.loss_normalization says.
using LossFunction = std::function<LossSum(const Tensor& logits, const nn::Batch& batch)>;
// What a batch's items are: causal LM shifted targets (labels[:,1:] or shift_labels) or every label.
enum class TargetCounting { causal_shifted, all_labels };

class Trainer : public ModuleTrainer {
public:
    // ModuleTrainer's constructor, for a causal LM (which applies the checkpoint policy to its decoder layers).
    Trainer(nn::CausalLM& model, const TrainerConfig& config, distributed::Communicator* communicator = nullptr);

    // One optimizer step over up to N micro-batches from `source` (ModuleTrainer::train_step). Every batch of
    // the window is validated before the first forward: a bad one changes nothing.
    std::optional<StepResult> train_step(const nn::BatchSource& source);
    // validates and counts every batch first, then forward -> loss -> backward each one.
    Accumulation accumulate_gradients(const std::vector<nn::Batch>& batches);

    // ModuleTrainer::evaluate over validated batches: the token mean of the loss, under NoGradGuard.
    Evaluation evaluate(const std::vector<nn::Batch>& batches);

    // Replaces the fused classifier by `loss_function` on the real (B,T,V) logits; its items are counted as
    // `counting` says. An empty function restores the built-in loss.
    void set_loss_function(LossFunction loss_function, TargetCounting counting = TargetCounting::causal_shifted);

    // The shifted causal-LM targets of a batch (B,T) i32 on the host: shift_labels if supplied, else
    // target[b,t] = labels[b,t+1] for t < T-1 and -100 at t = T-1.
    static Tensor shift_targets(const nn::Batch& batch);
    // The batch's items (its targets that are not -100), read from the host without a forward.
    int64_t count_targets(const nn::Batch& batch) const;

    nn::CausalLM& model() { return model_; }

private:
    void validate_batch(const nn::Batch& batch, size_t index) const;
    LossSum micro_batch_loss(const nn::Batch& batch, const LossScale& scale);
    // Validated and counted; `chunked`: in the batch-invariant mode each batch as its chunks of batch_invariant_chunk
    // rows (kept in chunk_batches_ while the micro-batches live).
    std::vector<MicroBatch> micro_batches_of(const std::vector<nn::Batch>& batches, bool chunked = false);

    nn::CausalLM& model_;
    LossFunction loss_function_;
    TargetCounting counting_ = TargetCounting::causal_shifted;
    // The current micro-batch's device inputs and targets, held until its backward has run and released
    // before the next one uploads: the lifetime planner/memory_model.h's joint peak accounts for.
    Tensor device_inputs_, device_targets_, device_positions_; // positions: packed documents only
    std::vector<nn::Batch> chunk_batches_; // the batch-invariant mode's chunks of the window being accumulated
};

} // namespace engine::optim
