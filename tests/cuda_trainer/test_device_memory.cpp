// The memory model on the CUDA device (planner/memory_model.h) with and without optimizer offload, measured
// in a trainer's steps: the model state's categories are exact on both accounts, and what the tier changes
// (the device's joint peak, the host's) is exact to the byte. The base prediction is the CPU's walk of the step
// plus cuBLASLt's workspace; the few hundred bytes of CUDA-only reductions and ids it does not model yet are
// printed and, being the same with and without the tier, cancel in the deltas.
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "engine/cuda/runtime.h"
#include "nn/gpt.h"
#include "nn/llama.h"
#include "optim/trainer.h"
#include "planner/memory_model.h"
#include "tests/cuda/gpt_gradients.h"
#include "tests/llama_step.h"

namespace engine::test {
namespace {

struct MemoryCase {
    const char* name;
    bool llama;
    Precision precision;
    checkpoint::CheckpointPolicy policy;
    GradientOffload gradients = GradientOffload::window; // with the optimizer on the host
    bool parameters = false;                             // and streamed parameters
    int loss_chunk = 0;                                  // the streaming LM head's chunk (0: the whole logits)
    int mlp_tile = 0;                                    // the MLP's tile (0: the whole MLP)
};
void PrintTo(const MemoryCase& memory_case, std::ostream* out) { *out << memory_case.name; }

class DeviceMemory : public ::testing::TestWithParam<MemoryCase> {
protected:
    void SetUp() override {
        if (!engine::cuda::device_available()) GTEST_SKIP() << "no CUDA device";
        engine::cuda::set_tf32_enabled(false);
    }
};

constexpr int batch = 2, accumulation = 2;

nn::ModelConfig config_of(const MemoryCase& run) {
    return run.llama ? nn::ModelConfig(small_llama_config(false)) : nn::ModelConfig(small_gpt_config());
}
int config_length(const MemoryCase& run) { return config_of(run).max_seq_len(); }

struct Measured {
    MemoryStats device, host; // a step's (the second: caches warm)
    planner::MemoryPrediction predicted;
    // cuBLASLt's workspace when an earlier test of this process allocated it and this model would not have
    // (Llama): in the measured peak, not in this model's prediction.
    size_t inherited = 0;
};

Measured measure(const MemoryCase& run, bool offload_optimizer) {
    const nn::ModelConfig config = config_of(run);
    const int length = config.max_seq_len();
    std::unique_ptr<nn::CausalLM> model = config.build(11, Device::cuda, DType::f32);
    optim::TrainerConfig trainer_config;
    trainer_config.shape.per_device_train_batch_size = batch;
    trainer_config.shape.gradient_accumulation_steps = accumulation;
    trainer_config.shape.precision = run.precision;
    trainer_config.shape.checkpointing = run.policy;
    trainer_config.shape.offload_optimizer = offload_optimizer;
    if (offload_optimizer) trainer_config.shape.offload_gradients = run.gradients;
    trainer_config.shape.offload_parameters = offload_optimizer && run.parameters;
    trainer_config.shape.loss_chunk_tokens = run.loss_chunk;
    trainer_config.shape.mlp_tile_tokens = run.mlp_tile;
    optim::Trainer trainer(*model, trainer_config);
    int cursor = 0;
    const nn::BatchSource source = [&]() -> std::optional<nn::Batch> {
        const std::vector<MicroBatch> made =
            make_token_micro_batches(config.vocab_size(), length, 1, batch, 77u + static_cast<uint32_t>(cursor++));
        nn::Batch out;
        out.inputs = Tensor::from_vector<int32_t>(made[0].tokens, {batch, length}, Device::cuda);
        out.labels = out.inputs;
        return out;
    };
    Measured measured;
    if (config.is_llama()) measured.inherited = memory_stats(Device::cuda).current(MemoryCategory::workspace);
    measured.predicted = planner::predict_memory(config, batch, length, run.policy, precision_dtype(run.precision),
                                                 OptimizerKind::adamw, 1, accumulation, offload_optimizer,
                                                 offload_optimizer ? run.gradients : GradientOffload::window,
                                                 offload_optimizer && run.parameters, run.loss_chunk, run.mlp_tile);
    for (int step = 0; step < 2; ++step) {
        const std::optional<optim::StepResult> result = trainer.train_step(source);
        EXPECT_TRUE(result.has_value());
        measured.device = result->memory;
        measured.host = result->host_memory;
    }
    return measured;
}

TEST_P(DeviceMemory, TheTiersCostIsPredictedToTheByte) {
    const MemoryCase& run = GetParam();
    const Measured plain = measure(run, false), offloaded = measure(run, true);
    for (const Measured* measured : {&plain, &offloaded}) {
        const char* tier = measured == &plain ? "on the device" : "optimizer offload";
        for (MemoryCategory category :
             {MemoryCategory::parameters, MemoryCategory::gradients, MemoryCategory::optimizer_state}) {
            EXPECT_EQ(measured->device.peak(category), measured->predicted.of(category))
                << tier << ", device " << memory_category_name(category);
            EXPECT_EQ(measured->host.peak(category), measured->predicted.host_of(category))
                << tier << ", host " << memory_category_name(category);
        }
        // Pinned: the parked copies (streamed parameters), and the offloaded inputs or the ids' upload staging.
        EXPECT_EQ(measured->host.peak(MemoryCategory::pinned_host), measured->predicted.pinned_peak_bytes) << tier;
    }
    const auto residue = [](size_t measured, size_t predicted) {
        return static_cast<long long>(measured) - static_cast<long long>(predicted);
    };
    const long long device_residue =
        residue(plain.device.peak_bytes - plain.inherited, plain.predicted.peak_on(Device::cuda));
    const long long host_residue = residue(plain.host.peak_bytes, plain.predicted.host_peak_bytes);
    EXPECT_EQ(residue(offloaded.device.peak_bytes - offloaded.inherited, offloaded.predicted.peak_on(Device::cuda)),
              device_residue)
        << "the device peak the tier saves";
    // The host's peak falls either in forward, where the current micro-batch's ids are staged on the host (its
    // targets, (B,T) i32, and the pinned copy of its upload: not modelled), or in the update, where the bf16
    // rounding of the largest master is (modelled): the staging is at most what the prediction misses.
    const long long staging = 2LL * 2 * config_length(run) * static_cast<long long>(sizeof(int32_t)) + 8;
    for (long long missed : {host_residue, residue(offloaded.host.peak_bytes, offloaded.predicted.host_peak_bytes)}) {
        EXPECT_GE(missed, 0) << "the host peak over-predicted";
        EXPECT_LE(missed, staging) << "the host peak under-predicted by more than the ids' staging";
    }
    EXPECT_LT(std::llabs(device_residue), 4096) << "the base device prediction's unmodelled CUDA bytes";
    std::printf("  %s: device peak %zu -> %zu B (predicted %zu -> %zu; %lld B of CUDA reductions and ids not "
                "modelled), host peak %zu -> %zu B (predicted %zu -> %zu; %lld B of staging not modelled)\n",
                run.name, plain.device.peak_bytes, offloaded.device.peak_bytes, plain.predicted.peak_on(Device::cuda),
                offloaded.predicted.peak_on(Device::cuda), device_residue, plain.host.peak_bytes,
                offloaded.host.peak_bytes, plain.predicted.host_peak_bytes, offloaded.predicted.host_peak_bytes,
                host_residue);
}

INSTANTIATE_TEST_SUITE_P(
    Runs, DeviceMemory,
    ::testing::Values(MemoryCase{"gpt_fp32", false, Precision::fp32, {}},
                      MemoryCase{"gpt_bf16_checkpoint_offload", false, Precision::bf16, {true, 1, 1, true, false}},
                      MemoryCase{"llama_fp32_checkpoint", true, Precision::fp32, {true, 2, 1, false, false}},
                      MemoryCase{"llama_bf16", true, Precision::bf16, {}},
                      MemoryCase{"gpt_bf16_streamed", false, Precision::bf16, {true, 1, 1, true, false},
                                 GradientOffload::stream},
                      MemoryCase{"llama_fp32_streamed", true, Precision::fp32, {true, 2, 1, false, false},
                                 GradientOffload::stream},
                      // Streamed parameters: a layer outside the checkpointed ones keeps its copy on the device;
                      // segments of two layers fetch two at once.
                      MemoryCase{"gpt_bf16_parameters", false, Precision::bf16, {true, 2, 1, true, false},
                                 GradientOffload::window, true},
                      MemoryCase{"llama_fp32_streamed_parameters", true, Precision::fp32, {true, 1, 2, false, false},
                                 GradientOffload::stream, true},
                      // The streaming LM head: chunks with a shorter last one, with and without the tiers.
                      MemoryCase{"gpt_bf16_loss_chunks", false, Precision::bf16, {true, 1, 1, true, false},
                                 GradientOffload::stream, false, 20},
                      MemoryCase{"llama_fp32_loss_chunks", true, Precision::fp32, {}, GradientOffload::window, false,
                                 13},
                      // The tiled MLP: a shorter last tile, with the head's chunks and the tiers, and plain.
                      MemoryCase{"gpt_bf16_mlp_tiles", false, Precision::bf16, {true, 1, 1, true, false},
                                 GradientOffload::stream, false, 20, 12},
                      MemoryCase{"llama_fp32_mlp_tiles", true, Precision::fp32, {}, GradientOffload::window, false, 0,
                                 7}),
    [](const ::testing::TestParamInfo<MemoryCase>& info) { return std::string(info.param.name); });

} // namespace
} // namespace engine::test
