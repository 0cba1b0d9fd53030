// The memory model on the device (planner/memory_model.h): a trainer's measured per-category and joint peaks on
// the CUDA device, and on the host with the model state offloaded, against the prediction.
#include <cstdio>
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
    bool offload_optimizer;
};
void PrintTo(const MemoryCase& memory_case, std::ostream* out) { *out << memory_case.name; }

class DeviceMemory : public ::testing::TestWithParam<MemoryCase> {
protected:
    void SetUp() override {
        if (!engine::cuda::device_available()) GTEST_SKIP() << "no CUDA device";
        engine::cuda::set_tf32_enabled(false);
    }
};

TEST_P(DeviceMemory, MeasuredPeaksArePredicted) {
    const MemoryCase& run = GetParam();
    constexpr int batch = 2, accumulation = 2;
    const nn::ModelConfig config = run.llama ? nn::ModelConfig(small_llama_config(false)) : nn::ModelConfig(small_gpt_config());
    const int length = config.max_seq_len();
    std::unique_ptr<nn::CausalLM> model = config.build(11, Device::cuda, DType::f32);
    optim::TrainerConfig trainer_config;
    trainer_config.shape.per_device_train_batch_size = batch;
    trainer_config.shape.gradient_accumulation_steps = accumulation;
    trainer_config.shape.precision = run.precision;
    trainer_config.shape.checkpointing = run.policy;
    trainer_config.shape.offload_optimizer = run.offload_optimizer;
    optim::Trainer trainer(*model, trainer_config);
    int cursor = 0;
    const nn::BatchSource source = [&]() -> std::optional<nn::Batch> {
        const std::vector<MicroBatch> made = make_token_micro_batches(config.vocab_size(), length, 1, batch, 77u + cursor++);
        nn::Batch out;
        out.inputs = Tensor::from_vector<int32_t>(made[0].tokens, {batch, length}, Device::cuda);
        out.labels = out.inputs;
        return out;
    };
    const planner::MemoryPrediction predicted =
        planner::predict_memory(config, batch, length, run.policy, precision_dtype(run.precision),
                                OptimizerKind::adamw, 1, accumulation, run.offload_optimizer);
    for (int step = 0; step < 2; ++step) {
        const std::optional<optim::StepResult> result = trainer.train_step(source);
        ASSERT_TRUE(result.has_value());
        std::printf("  %s step %d: device peak %zu predicted %zu;", run.name, step + 1, result->memory.peak_bytes,
                    predicted.peak_bytes);
        for (int index = 0; index < memory_category_count; ++index)
            std::printf(" %s %zu/%zu", memory_category_name(static_cast<MemoryCategory>(index)),
                        result->memory.peak_by_category[index], predicted.peaks[index]);
        std::printf("\n    host peak %zu predicted %zu;", result->host_memory.peak_bytes, predicted.host_peak_bytes);
        for (int index = 0; index < memory_category_count; ++index)
            std::printf(" %s %zu/%zu", memory_category_name(static_cast<MemoryCategory>(index)),
                        result->host_memory.peak_by_category[index], predicted.host[index]);
        std::printf("\n");
    }
}

INSTANTIATE_TEST_SUITE_P(
    Runs, DeviceMemory,
    ::testing::Values(MemoryCase{"gpt_fp32", false, Precision::fp32, {}, false},
                      MemoryCase{"gpt_fp32_offload", false, Precision::fp32, {}, true},
                      MemoryCase{"gpt_bf16_ckpt_offload", false, Precision::bf16, {true, 1, 1, true, false}, true},
                      MemoryCase{"llama_bf16", true, Precision::bf16, {}, false},
                      MemoryCase{"llama_bf16_offload", true, Precision::bf16, {}, true}),
    [](const ::testing::TestParamInfo<MemoryCase>& info) { return std::string(info.param.name); });

} // namespace
} // namespace engine::test
