// Learning-rate schedules, indexed by the optimizer step (0-based: the step about to be taken), never by
// micro-batch. Formulas follow Hugging Face's get_*_schedule_with_warmup.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include "base/error.h"

namespace engine::optim {

enum class ScheduleType { constant, cosine };
ScheduleType parse_schedule_type(const std::string& name); // "constant" | "cosine"; throws otherwise
const char* schedule_type_name(ScheduleType type);

struct ScheduleConfig {
    ScheduleType type = ScheduleType::constant;
    double learning_rate = 1e-3; // the peak
    int64_t warmup_steps = 0;    // linear ramp: lr · step / warmup_steps for step < warmup_steps
    int64_t total_steps = 0;     // cosine only: where it reaches the floor
    double min_lr_ratio = 0.0;   // cosine only: the floor as a fraction of the peak
    // The rules on these fields (named as here): the first broken one, or nullopt. The constructor throws it.
    std::optional<ConfigProblem> problem() const;
};

// The one rule on a learning rate, shared by the schedule, the optimizers' options and set_learning_rate:
// finite and >= 0. The reason, or nullopt.
std::optional<std::string> learning_rate_problem(double learning_rate);

// constant: warmup ramp, then the peak.
// cosine: warmup ramp, then peak · (r + (1 − r) · ½(1 + cos(π · p))), p = (step − warmup) / (total − warmup)
// clamped to [0,1], r = min_lr_ratio.
class LearningRateSchedule {
public:
    explicit LearningRateSchedule(const ScheduleConfig& config); // throws config.problem()
    double at(int64_t optimizer_step) const;
    const ScheduleConfig& config() const { return config_; }

private:
    ScheduleConfig config_;
};

} // namespace engine::optim
