// Constant and warmup + cosine learning-rate schedules.
#include "optim/schedule.h"

#include <algorithm>
#include <cmath>
#include <numbers>

#include "base/error.h"

namespace engine::optim {

ScheduleType parse_schedule_type(const std::string& name) {
    if (name == "constant") return ScheduleType::constant;
    if (name == "cosine") return ScheduleType::cosine;
    ENGINE_FAIL("lr_scheduler_type: unknown schedule '" << name << "' (known: constant, cosine)");
}

const char* schedule_type_name(ScheduleType type) { return type == ScheduleType::cosine ? "cosine" : "constant"; }

std::optional<std::string> learning_rate_problem(double learning_rate) {
    if (std::isfinite(learning_rate) && learning_rate >= 0.0) return std::nullopt;
    return "must be finite and >= 0, got " + value_text(learning_rate);
}

std::optional<ConfigProblem> ScheduleConfig::problem() const {
    if (type != ScheduleType::constant && type != ScheduleType::cosine)
        return ConfigProblem{"type", "is neither constant nor cosine"};
    if (const std::optional<std::string> reason = learning_rate_problem(learning_rate))
        return ConfigProblem{"learning_rate", *reason};
    if (warmup_steps < 0) return ConfigProblem{"warmup_steps", "must be >= 0, got " + std::to_string(warmup_steps)};
    if (total_steps < 0) return ConfigProblem{"total_steps", "must be >= 0, got " + std::to_string(total_steps)};
    if (!(min_lr_ratio >= 0.0 && min_lr_ratio <= 1.0))
        return ConfigProblem{"min_lr_ratio", "must be in [0,1], got " + value_text(min_lr_ratio)};
    return std::nullopt;
}

LearningRateSchedule::LearningRateSchedule(const ScheduleConfig& config) : config_(config) {
    if (const std::optional<ConfigProblem> found = config.problem())
        ENGINE_FAIL("schedule: " << found->field << " " << found->reason);
}

double LearningRateSchedule::at(int64_t optimizer_step) const {
    ENGINE_CHECK(optimizer_step >= 0, "schedule: step must be >= 0, got " << optimizer_step);
    const double peak = config_.learning_rate;
    if (optimizer_step < config_.warmup_steps)
        return peak * static_cast<double>(optimizer_step) / static_cast<double>(config_.warmup_steps);
    if (config_.type == ScheduleType::constant) return peak;
    const double decay_steps = static_cast<double>(std::max<int64_t>(1, config_.total_steps - config_.warmup_steps));
    const double progress =
        std::clamp(static_cast<double>(optimizer_step - config_.warmup_steps) / decay_steps, 0.0, 1.0);
    const double cosine = 0.5 * (1.0 + std::cos(std::numbers::pi * progress));
    return peak * (config_.min_lr_ratio + (1.0 - config_.min_lr_ratio) * cosine);
}

} // namespace engine::optim
