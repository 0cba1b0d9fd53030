// What the ZeRO tests without a launcher share (tests/test_distributed.cpp, tests/test_zero_stage3.cpp): padded
// documents whose token counts differ between rows, the loader options that cut them into a rank's rows, and the
// collectives' cost of a step as the planner prices it.
#pragma once

#include <cstdint>
#include <vector>

#include "nn/io/token_data.h"
#include "nn/module.h"
#include "optim/trainer_config.h"
#include "planner/cost_model.h"

namespace engine::testing {

inline constexpr int32_t end_of_text = 9;

// Documents of lengths 1..12 (the end-of-text token included), tokens 1..8.
inline std::vector<int32_t> documents(int count) {
    std::vector<int32_t> tokens;
    for (int document = 0; document < count; ++document) {
        const int length = 1 + (document * 7) % 12;
        for (int index = 0; index + 1 < length; ++index) tokens.push_back(1 + (document + index) % 8);
        tokens.push_back(end_of_text);
    }
    return tokens;
}

// 8 positions a row, one document a row (padded with -100 labels), rank's rows of each global batch.
inline nn::DataLoaderOptions padded_options(int batch_size, int rank = 0, int world_size = 1) {
    nn::DataLoaderOptions options;
    options.batch_size = batch_size;
    options.sequence_length = 8;
    options.seed = 5;
    options.layout = nn::DataLayout::padded;
    options.end_of_text = end_of_text;
    options.rank = rank;
    options.world_size = world_size;
    return options;
}

// The trainer the stage-3 tests run (tests/test_zero_stage3.cpp, tests/test_zero_stage3_tables.cpp): 2 rows a micro-batch,
// every layer checkpointed, the clip on (the norm from the shard gradients must be right).
inline optim::TrainerConfig zero_stage_config(int stage, int accumulation, Precision precision) {
    optim::TrainerConfig config;
    config.shape.per_device_train_batch_size = 2;
    config.shape.gradient_accumulation_steps = accumulation;
    config.shape.checkpointing.enabled = true;
    config.shape.precision = precision;
    config.shape.zero_stage = stage;
    config.max_grad_norm = 0.5;
    return config;
}

// Every parameter's values, in model order (released ones must be gathered first: optim::WholeParameters).
inline std::vector<std::vector<float>> parameter_values(const nn::Module& model) {
    std::vector<std::vector<float>> values;
    for (const Tensor& parameter : model.parameters()) values.push_back(parameter.to_vector<float>());
    return values;
}

// planner::add_communication alone: the step's collectives at `stage` over `ranks`, on the CPU's ceilings.
inline planner::StepCost communication_cost(const nn::ModelConfig& config, const checkpoint::CheckpointPolicy& policy,
                                            int stage, int ranks, int accumulation) {
    planner::StepCost cost;
    planner::add_communication(cost, config, accumulation, policy, stage, ranks, planner::cpu_ceilings());
    return cost;
}

} // namespace engine::testing
