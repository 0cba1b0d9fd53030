// Learning-rate schedules, indexed by the optimizer step (0-based: the step about to be taken), never by
// micro-batch. Formulas follow Hugging Face's get_*_schedule_with_warmup.
#pragma once

#include <cstdint>
#include <string>

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
};

// constant: warmup ramp, then the peak.
// cosine: warmup ramp, then peak · (r + (1 − r) · ½(1 + cos(π · p))), p = (step − warmup) / (total − warmup)
// clamped to [0,1], r = min_lr_ratio.
class LearningRateSchedule {
public:
    explicit LearningRateSchedule(const ScheduleConfig& config); // throws on negative counts or a bad ratio
    double at(int64_t optimizer_step) const;
    const ScheduleConfig& config() const { return config_; }

private:
    ScheduleConfig config_;
};

} // namespace engine::optim
