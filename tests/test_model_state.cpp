// The model state a run holds (planner::predict_model_state, issue 28 item 6) against the allocator's accounting, to
// the byte: full fine-tunes (where it must equal predict_memory's persistent categories), LoRA on a few target sets
// and QLoRA, for GPT-2 (its tied, padded token table) and Llama, f32 and bf16, AdamW and SGD, measured after real
// optim::Trainer steps; and its refusals.
#include <gtest/gtest.h>

#include <memory>
#include <string>
#include <vector>

#include "adapter_training.h"
#include "expect_error.h"
#include "nn/model_config.h"
#include "planner/memory_model.h"

namespace engine::testing {
namespace {

constexpr int length = 16;

struct TuningRun {
    std::string model;
    std::vector<std::string> targets; // empty: a full fine-tune
    bool nf4 = false;
    Precision precision = Precision::fp32;
    OptimizerKind optimizer = OptimizerKind::adamw;
};

std::string describe(const TuningRun& run) {
    std::string text = run.model + " " + precision_name(run.precision) + " " + optimizer_kind_name(run.optimizer);
    if (run.targets.empty()) return text + ", full";
    text += run.nf4 ? ", QLoRA on" : ", LoRA on";
    for (const std::string& target : run.targets) text += " " + target;
    return text;
}

nn::LoraConfig lora_of(const std::vector<std::string>& targets) {
    nn::LoraConfig lora;
    lora.r = 4;
    lora.lora_alpha = 8.0;
    lora.target_modules = targets;
    return lora;
}

// The categories a trainer holds after two steps, above what the process held before the model was built.
struct Held {
    size_t parameters = 0, gradients = 0, optimizer_state = 0;
};

Held train_and_measure(const TuningRun& run) {
    current_tape().clear();
    const MemoryStats before = memory_stats(Device::cpu);
    Held held;
    {
        const std::unique_ptr<nn::CausalLM> model = nn::ModelConfig::named(run.model).build(3, Device::cpu, DType::f32);
        if (!run.targets.empty()) nn::apply_lora(*model, lora_of(run.targets));
        if (run.nf4) nn::quantize_nf4(*model);
        optim::TrainerConfig config = adapter_trainer_config(run.precision, true, 1e-2, 2);
        config.optimizer = run.optimizer;
        optim::Trainer trainer(*model, config);
        int cursor = 0;
        const nn::BatchSource source = token_stream_batches(model->vocab_size(), 2, length, cursor);
        for (int step = 0; step < 2; ++step) trainer.train_step(source);
        const MemoryStats after = memory_stats(Device::cpu);
        const auto rise = [&](MemoryCategory category) { return after.current(category) - before.current(category); };
        held.parameters = rise(MemoryCategory::parameters);
        held.gradients = rise(MemoryCategory::gradients);
        held.optimizer_state = rise(MemoryCategory::optimizer_state);
    }
    current_tape().clear();
    return held;
}

TEST(ModelState, FullFineTunesAreThePersistentCategoriesOfPredictMemory) {
    for (const std::string name : {"tiny", "llama-tiny", "gpt2-124M", "smollm-135m"}) {
        const nn::ModelConfig config = nn::ModelConfig::named(name);
        for (const DType dtype : {DType::f32, DType::bf16})
            for (const OptimizerKind optimizer : {OptimizerKind::adamw, OptimizerKind::sgd})
                for (const int shards : {1, 3}) {
                    const std::string what = name + " " + dtype_name(dtype) + " " + optimizer_kind_name(optimizer) +
                                             ", " + std::to_string(shards) + " shards";
                    const planner::ModelState state = planner::predict_model_state(config, dtype, optimizer, shards);
                    const planner::MemoryPrediction memory = planner::predict_memory(
                        config, 1, 8, checkpoint::CheckpointPolicy{}, dtype, optimizer, shards);
                    EXPECT_EQ(state.parameters, memory.of(MemoryCategory::parameters)) << what;
                    EXPECT_EQ(state.gradients, memory.of(MemoryCategory::gradients)) << what;
                    EXPECT_EQ(state.optimizer_state, memory.of(MemoryCategory::optimizer_state)) << what;
                    EXPECT_EQ(state.master_parameters, memory.master_parameters) << what;
                    EXPECT_EQ(state.working_copies, memory.working_copies) << what;
                    EXPECT_EQ(state.frozen_parameters, 0u) << what;
                }
    }
}

// Measured after real trainer steps: the frozen base in the step's dtype (2 bytes under bf16) or in NF4, the adapters
// with masters, bf16 copies, gradients and moments.
TEST(ModelState, LoraAndQloraRunsAreExactToTheByte) {
    std::vector<TuningRun> runs;
    for (const Precision precision : {Precision::fp32, Precision::bf16}) {
        runs.push_back({"tiny", {}, false, precision});
        runs.push_back({"llama-tiny", {}, false, precision});
        runs.push_back({"tiny", {"c_attn"}, false, precision});
        runs.push_back({"tiny", {"all-linear"}, true, precision});
        runs.push_back({"tiny", {"attn.c_proj", "c_fc"}, false, precision, OptimizerKind::sgd});
        runs.push_back({"llama-tiny", {"q_proj", "v_proj"}, false, precision});
        runs.push_back({"llama-tiny", {"q_proj", "v_proj"}, true, precision});
        runs.push_back({"llama-tiny", {"all-linear"}, true, precision, OptimizerKind::sgd});
        runs.push_back({"llama-tiny", {"layers.1.mlp.down_proj"}, false, precision});
    }
    for (const TuningRun& run : runs) {
        planner::FineTuning tuning;
        if (!run.targets.empty()) tuning.lora = lora_of(run.targets);
        tuning.nf4 = run.nf4;
        const planner::ModelState state = planner::predict_model_state(
            nn::ModelConfig::named(run.model), precision_dtype(run.precision), run.optimizer, 1, tuning);
        const Held held = train_and_measure(run);
        EXPECT_EQ(held.parameters, state.parameters) << describe(run);
        EXPECT_EQ(held.gradients, state.gradients) << describe(run);
        EXPECT_EQ(held.optimizer_state, state.optimizer_state) << describe(run);
        std::printf("  %-52s parameters %8zu B (frozen %8zu), gradients %7zu B, optimizer %7zu B: as predicted\n",
                    describe(run).c_str(), held.parameters, state.frozen_parameters, held.gradients, held.optimizer_state);
    }
}

TEST(ModelState, RefusesWhatApplyLoraRefuses) {
    const nn::ModelConfig llama = nn::ModelConfig::named("llama-tiny");
    planner::FineTuning tuning;
    tuning.lora = lora_of({"c_attn"});
    expect_error([&] { planner::predict_model_state(llama, DType::f32, OptimizerKind::adamw, 1, tuning); },
                 {"predict_model_state", "target module 'c_attn'", "matches no adaptable linear layer"});
    tuning.lora = lora_of({"q_proj"});
    tuning.lora->r = 4096;
    expect_error([&] { planner::predict_model_state(llama, DType::f32, OptimizerKind::adamw, 1, tuning); },
                 {"predict_model_state", "r 4096 exceeds layer 'model.layers.0.self_attn.q_proj'"});
    tuning.lora->r = 0;
    expect_error([&] { planner::predict_model_state(llama, DType::f32, OptimizerKind::adamw, 1, tuning); },
                 {"predict_model_state", "r 0 must be at least 1"});
    planner::FineTuning bare;
    bare.nf4 = true;
    expect_error([&] { planner::predict_model_state(llama, DType::f32, OptimizerKind::adamw, 1, bare); },
                 {"NF4 without LoRA adapters"});
}

} // namespace
} // namespace engine::testing
