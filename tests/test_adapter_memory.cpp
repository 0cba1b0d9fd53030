// The LoRA and QLoRA step's memory (planner/adapter_step.h, issue 28 item 6) against the allocator's accounting, to
// the byte: the joint peak of real optim::Trainer steps and every category, for Llama over target sets (PEFT's
// default, the attention, the MLP, all-linear, one layer's), dense and NF4 bases, f32 and bf16, adapter dropout,
// every checkpoint policy with and without offload, the fused classifier and the streaming head, accumulation and
// packed documents' positions; and what the replay refuses.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "adapter_training.h"
#include "expect_error.h"
#include "llama_step.h"
#include "nn/model_config.h"
#include "nn/qlora.h"
#include "planner/memory_model.h"

namespace engine::testing {
namespace {

using checkpoint::CheckpointPolicy;

struct AdapterRun {
    nn::LlamaConfig config;
    std::vector<std::string> targets;
    bool nf4 = false;
    bool bf16 = false;
    CheckpointPolicy policy;
    int micro_batch = 2, accumulation = 1, length = 33;
    int loss_chunk = 0;
    double dropout = 0.0;
    int rank = 4;
};

std::string describe(const AdapterRun& run) {
    std::string text = run.config.to_string() + (run.nf4 ? ", QLoRA r " : ", LoRA r ") + std::to_string(run.rank) + " on";
    for (const std::string& target : run.targets) text += " " + target;
    text += std::string(run.bf16 ? ", bf16" : ", f32") + ", " + run.policy.to_string() + ", B " +
            std::to_string(run.micro_batch) + " x " + std::to_string(run.accumulation) + ", T " +
            std::to_string(run.length) + ", loss chunks " + std::to_string(run.loss_chunk) + ", dropout " +
            std::to_string(run.dropout);
    return text;
}

nn::LoraConfig lora_of(const AdapterRun& run) {
    nn::LoraConfig lora;
    lora.r = run.rank;
    lora.lora_alpha = 8.0;
    lora.lora_dropout = run.dropout;
    lora.target_modules = run.targets;
    return lora;
}

struct Trained {
    std::vector<size_t> peaks; // each step's joint peak above what the process held before the model
    std::vector<MemoryStats> memory;
    size_t before = 0;
};

Trained train(const AdapterRun& run, int steps = 2) {
    current_tape().clear();
    Trained trained;
    trained.before = memory_stats(Device::cpu).current_bytes;
    nn::Llama model(run.config, 11, Device::cpu, DType::f32);
    nn::apply_lora(model, lora_of(run));
    if (run.nf4) nn::quantize_nf4(model);
    optim::TrainerConfig config;
    config.shape.per_device_train_batch_size = run.micro_batch;
    config.shape.gradient_accumulation_steps = run.accumulation;
    config.shape.checkpointing = run.policy;
    config.shape.precision = run.bf16 ? Precision::bf16 : Precision::fp32;
    config.shape.loss_chunk_tokens = run.loss_chunk;
    config.learning_rate = 1e-2;
    config.max_steps = steps;
    optim::Trainer trainer(model, config);
    int cursor = 0;
    const nn::BatchSource source = token_stream_batches(run.config.vocab_size, run.micro_batch, run.length, cursor);
    for (int step = 0; step < steps; ++step) {
        const optim::StepResult result = *trainer.train_step(source);
        EXPECT_TRUE(std::isfinite(result.loss));
        trained.peaks.push_back(result.memory.peak_bytes - trained.before);
        trained.memory.push_back(result.memory);
    }
    return trained;
}

planner::MemoryPrediction predict(const AdapterRun& run) {
    planner::FineTuning tuning;
    tuning.lora = lora_of(run);
    tuning.nf4 = run.nf4;
    return planner::predict_memory(run.config, run.micro_batch, run.length, run.policy,
                                   run.bf16 ? DType::bf16 : DType::f32, planner::OptimizerKind::adamw, 1,
                                   run.accumulation, false, GradientOffload::window, false, run.loss_chunk, 0, false,
                                   tuning);
}

// A small vocabulary and a wide MLP: the peak moves from the LM head into a layer's backward.
nn::LlamaConfig wide_mlp_config() {
    nn::LlamaConfig config = test::small_llama_config(false);
    config.vocab_size = 16;
    config.intermediate_size = 192;
    return config;
}

TEST(AdapterMemory, TrainerStepPeakIsExactToTheByte) {
    const nn::LlamaConfig untied = test::small_llama_config(false), tied = test::small_llama_config(true);
    const nn::LlamaConfig wide = wide_mlp_config();
    const std::vector<std::string> peft_default = {"q_proj", "v_proj"}, all = {"all-linear"};
    const std::vector<std::string> mlp = {"gate_proj", "up_proj", "down_proj"};
    const CheckpointPolicy plain{false, 1, 1, false}, every{true, 1, 1, false}, every_other{true, 2, 1, false},
        pairs_offloaded{true, 1, 2, true}, offloaded{true, 1, 1, true}, third{true, 3, 1, false};
    std::vector<AdapterRun> runs = {
        {untied, peft_default, false, false, plain},
        {tied, peft_default, false, false, every},
        {untied, all, false, false, plain},
        {untied, all, false, false, every_other},
        {wide, mlp, false, false, plain},
        {wide, mlp, false, false, third},
        {wide, {"o_proj"}, false, false, offloaded},
        {untied, {"layers.2.self_attn.k_proj"}, false, false, plain},
        {untied, all, true, false, plain},
        {wide, all, true, false, pairs_offloaded},
        {untied, peft_default, false, true, plain},
        {tied, all, false, true, every},
        {wide, all, true, true, offloaded},
        {untied, peft_default, true, true, every_other},
    };
    // Accumulation, the streaming head, adapter dropout, a larger rank.
    runs.push_back({untied, peft_default, false, false, plain, 2, 2, 33, 16});
    runs.push_back({wide, all, false, true, every, 1, 3, 33, 7});
    runs.push_back({untied, all, false, false, plain, 2, 1, 33, 0, 0.1});
    runs.push_back({wide, mlp, true, false, offloaded, 2, 2, 20, 0, 0.25});
    runs.push_back({tied, all, false, false, every_other, 2, 1, 33, 66, 0.0, 12});
    for (const AdapterRun& run : runs) {
        const planner::MemoryPrediction predicted = predict(run);
        const Trained trained = train(run);
        std::printf("  %-150s peak predicted %8zu B, measured %8zu / %8zu B (%s)\n", describe(run).c_str(),
                    predicted.unified_peak_bytes, trained.peaks[0], trained.peaks[1], predicted.peak_moment.c_str());
        for (size_t step = 0; step < trained.peaks.size(); ++step) {
            EXPECT_EQ(trained.peaks[step], predicted.unified_peak_bytes) << describe(run) << ", step " << step + 1;
            const MemoryStats& memory = trained.memory[step];
            for (MemoryCategory category :
                 {MemoryCategory::parameters, MemoryCategory::gradients, MemoryCategory::optimizer_state})
                EXPECT_EQ(memory.current(category), predicted.of(category))
                    << describe(run) << ": " << memory_category_name(category);
        }
    }
}

// What the replay does not follow yet is refused by name, and a LoRA config apply_lora would refuse is refused as
// predict_model_state refuses it.
TEST(AdapterMemory, RefusesWhatTheReplayDoesNotFollow) {
    planner::FineTuning tuning;
    nn::LoraConfig lora;
    lora.r = 4;
    lora.target_modules = {"q_proj"};
    tuning.lora = lora;
    const nn::ModelConfig llama = nn::ModelConfig::named("llama-tiny");
    const CheckpointPolicy every{true, 1, 1, false};
    const auto predict = [&](const nn::ModelConfig& config, int shards, bool offload_optimizer, int tile) {
        return planner::predict_memory(config, 2, 16, every, DType::f32, planner::OptimizerKind::adamw, shards, 1,
                                       offload_optimizer, GradientOffload::window, false, 0, tile, false, tuning);
    };
    expect_error([&] { predict(llama, 1, false, 8); }, {"the LoRA step", "tiled MLP", "mlp_tile_tokens 8"});
    expect_error([&] { predict(llama, 1, true, 0); }, {"the LoRA step", "optimizer or parameters off the device"});
    expect_error([&] { predict(llama, 2, false, 0); }, {"the LoRA step", "ZeRO-1 (2 shards)"});
    tuning.lora->target_modules = {"c_attn"};
    expect_error([&] { predict(nn::ModelConfig::named("tiny"), 1, false, 0); }, {"the LoRA step", "GPT-2"});
    expect_error([&] { predict(llama, 1, false, 0); }, {"target module 'c_attn'", "matches no adaptable linear layer"});
}

} // namespace
} // namespace engine::testing
