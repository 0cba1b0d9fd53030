// What the ZeRO tests without a launcher share (tests/test_distributed.cpp, tests/test_zero_stage3.cpp,
// tests/test_zero_stage3_tables.cpp): padded documents whose token counts differ between rows, the loader options that
// cut them into a rank's rows, the stage-3 trainer and its out-of-memory sweep, and the collectives' cost of a step as
// the planner prices it.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <vector>

#include "engine/distributed/communicator.h"
#include "engine/memory.h"
#include "nn/causal_lm.h"
#include "nn/io/token_data.h"
#include "nn/module.h"
#include "optim/trainer.h"
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

// The out-of-memory sweep of a stage-3 trainer (tests/test_zero_stage3.cpp, tests/test_zero_stage3_tables.cpp): one step
// first, then the next step run under a memory limit that each failure raises to just past the allocation it failed
// at, so that every attempt fails at the step's next new high, until one gets through. After each failure `released`
// checks the model; then the trainer and a twin that never failed (its batches skipped alike) train on, and must end
// bitwise the same. Returns the number of failures.
inline int out_of_memory_sweep(const std::function<std::unique_ptr<nn::CausalLM>()>& make_model,
                               const optim::TrainerConfig& config,
                               const std::function<void(nn::CausalLM&, int failures)>& released) {
    const std::vector<int32_t> tokens = documents(80);
    // The batches made before any limit (so no failure falls inside the data loader), one list per trainer.
    const auto batches_of = [&] {
        nn::DataLoader loader(tokens, padded_options(2));
        const nn::BatchSource source = loader.source();
        std::vector<nn::Batch> batches;
        while (batches.size() < 1000) batches.push_back(*source()); // the loader goes round its epochs for ever
        return batches;
    };
    const auto communicator = distributed::make_communicator(distributed::Backend::none);
    const std::unique_ptr<nn::CausalLM> failing_model = make_model(), reference_model = make_model();
    optim::Trainer failing(*failing_model, config, communicator.get());
    optim::Trainer reference(*reference_model, config, communicator.get());
    const std::vector<nn::Batch> failing_batches = batches_of(), reference_batches = batches_of();
    size_t failing_next = 0, reference_next = 0;
    const nn::BatchSource failing_source = [&]() -> std::optional<nn::Batch> {
        if (failing_next == failing_batches.size()) return std::nullopt;
        return failing_batches[failing_next++];
    };
    const nn::BatchSource reference_source = [&]() -> std::optional<nn::Batch> {
        if (reference_next == reference_batches.size()) return std::nullopt;
        return reference_batches[reference_next++];
    };
    EXPECT_TRUE(failing.train_step(failing_source).has_value()); // the buffers a step keeps exist from here on
    EXPECT_TRUE(reference.train_step(reference_source).has_value());
    size_t limit = memory_stats(Device::cpu).current_bytes + 1;
    int failures = 0;
    size_t succeeded_from = 0; // the first batch of the step that got through
    for (;;) {
        if (failures >= 5000 || failing_next + 2 >= failing_batches.size()) {
            ADD_FAILURE() << "no limit let the step through, or the batches ran out first";
            return failures;
        }
        set_memory_limit(Device::cpu, limit);
        succeeded_from = failing_next;
        clear_out_of_memory();
        bool failed = false;
        try {
            failing.train_step(failing_source);
        } catch (const OutOfMemoryError&) {
            failed = true;
        }
        set_memory_limit(Device::cpu, SIZE_MAX);
        if (!failed) break;
        ++failures;
        const OutOfMemoryRecord* record = last_out_of_memory();
        if (record == nullptr) {
            ADD_FAILURE() << "an out-of-memory error with no record";
            return failures;
        }
        const size_t next = record->usage.current_bytes + record->requested;
        EXPECT_GT(next, limit) << "the step failed below its limit";
        limit = std::max(next, limit + 1);
        released(*failing_model, failures);
    }
    reference_next = succeeded_from; // the failed steps' batches skipped alike
    EXPECT_TRUE(reference.train_step(reference_source).has_value());
    for (int step = 0; step < 2; ++step) {
        EXPECT_TRUE(failing.train_step(failing_source).has_value());
        EXPECT_TRUE(reference.train_step(reference_source).has_value());
    }
    const optim::WholeParameters whole_failing(failing), whole_reference(reference);
    EXPECT_EQ(parameter_values(*failing_model), parameter_values(*reference_model));
    return failures;
}

// planner::add_communication alone: the step's collectives at `stage` over `ranks`, on the CPU's ceilings.
inline planner::StepCost communication_cost(const nn::ModelConfig& config, const checkpoint::CheckpointPolicy& policy,
                                            int stage, int ranks, int accumulation) {
    planner::StepCost cost;
    planner::add_communication(cost, config, accumulation, policy, stage, ranks, planner::cpu_ceilings());
    return cost;
}

} // namespace engine::testing
