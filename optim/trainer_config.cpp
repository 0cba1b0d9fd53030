// TrainerConfig's parts and rules, and the loss normalisation's factor (optim/trainer_config.h).
#include "optim/trainer_config.h"

#include <cmath>
#include <map>

namespace engine::optim {

LossNormalization LossNormalization::parse(const std::string& name) {
    if (name == "tokens") return tokens;
    if (name == "mean") return mean;
    ENGINE_FAIL("loss_normalization: unknown mode '" << name << "' (known: tokens, mean)");
}

double LossNormalization::factor(int64_t items, int64_t num_items_in_batch, int micro_batches, DType dtype) const {
    if (mode == Mode::tokens) return 1.0 / static_cast<double>(num_items_in_batch);
    const double per_item = items > 0 ? 1.0 / static_cast<double>(items) : 1.0;
    const double per_batch = 1.0 / static_cast<double>(micro_batches);
    if (dtype == DType::f64) return per_item * per_batch;
    return static_cast<double>(static_cast<float>(per_item) * static_cast<float>(per_batch)); // f32, bf16: float
}

AdamWOptions TrainerConfig::adamw_options() const {
    return AdamWOptions{learning_rate, adam_beta1, adam_beta2, adam_epsilon, weight_decay};
}

SGDOptions TrainerConfig::sgd_options() const { return SGDOptions{learning_rate, sgd_momentum, weight_decay}; }

ScheduleConfig TrainerConfig::schedule_config() const {
    ScheduleConfig schedule;
    schedule.type = parse_schedule_type(lr_scheduler_type);
    schedule.learning_rate = learning_rate;
    schedule.warmup_steps = warmup_steps;
    schedule.total_steps = max_steps;
    schedule.min_lr_ratio = min_lr_ratio;
    return schedule;
}

namespace {

// A part's problem under this struct's name for the field (the inverse of the mapping above).
std::optional<ConfigProblem> renamed(std::optional<ConfigProblem> found, const std::map<std::string, std::string>& names) {
    if (found) {
        const auto name = names.find(found->field);
        if (name != names.end()) found->field = name->second;
    }
    return found;
}

} // namespace

std::optional<ConfigProblem> TrainerConfig::problem() const {
    if (std::optional<ConfigProblem> found = shape.problem()) return found;
    // Both optimizers' options, whichever is chosen: a bad value is a mistake either way.
    if (std::optional<ConfigProblem> found = renamed(
            adamw_options().problem(), {{"beta1", "adam_beta1"}, {"beta2", "adam_beta2"}, {"epsilon", "adam_epsilon"}}))
        return found;
    if (std::optional<ConfigProblem> found = renamed(sgd_options().problem(), {{"momentum", "sgd_momentum"}}))
        return found;
    if (std::isnan(max_grad_norm)) return ConfigProblem{"max_grad_norm", "is NaN (<= 0 turns clipping off)"};
    if (lr_scheduler_type != "constant" && lr_scheduler_type != "cosine")
        return ConfigProblem{"lr_scheduler_type", "unknown schedule '" + lr_scheduler_type + "' (known: constant, cosine)"};
    if (std::optional<ConfigProblem> found = renamed(schedule_config().problem(), {{"total_steps", "max_steps"}}))
        return found;
    if (logging_steps <= 0) return ConfigProblem{"logging_steps", "must be positive, got " + std::to_string(logging_steps)};
    if (loss_normalization.mode != LossNormalization::Mode::tokens && loss_normalization.mode != LossNormalization::Mode::mean)
        return ConfigProblem{"loss_normalization", "is neither tokens nor mean"};
    if (batch_invariant_chunk < 0)
        return ConfigProblem{"batch_invariant_chunk", "must be 0 (off) or a number of sequences, got " +
                                                          std::to_string(batch_invariant_chunk)};
    if (batch_invariant_chunk > 0) {
        const std::string chunk = std::to_string(batch_invariant_chunk);
        if (shape.per_device_train_batch_size % batch_invariant_chunk != 0)
            return ConfigProblem{"batch_invariant_chunk", chunk + " does not divide per_device_train_batch_size " +
                                                              std::to_string(shape.per_device_train_batch_size)};
        if (loss_normalization.mode != LossNormalization::Mode::tokens)
            return ConfigProblem{"batch_invariant_chunk", chunk + " needs loss_normalization tokens: a per-micro-batch "
                                                              "mean depends on the split it is meant not to see"};
        if (shape.zero_stage > 1)
            return ConfigProblem{"batch_invariant_chunk", chunk + " runs at zero_stage 0 or 1 for now, got " +
                                                              std::to_string(shape.zero_stage)};
        if (shape.offload_optimizer)
            return ConfigProblem{"batch_invariant_chunk", chunk + " keeps the model state on the device for now: "
                                                              "offload_optimizer is not supported with it"};
    }
    if (optimizer != OptimizerKind::adamw && optimizer != OptimizerKind::sgd)
        return ConfigProblem{"optimizer", std::string("is ") + optimizer_kind_name(optimizer) + ": the trainer needs adamw or sgd"};
    return std::nullopt;
}

void TrainerConfig::validate() const {
    if (const std::optional<ConfigProblem> found = problem()) ENGINE_FAIL(found->field << " " << found->reason);
}

} // namespace engine::optim
