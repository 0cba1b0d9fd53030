// The LoRA and QLoRA step's memory (planner/adapter_step.h) on the CUDA device, measured in a trainer's steps: the
// model state's categories (the frozen base dense or in NF4, the adapters' masters, copies, gradients and moments) are
// exact on the device's account, and the step's joint peak is the CPU-exact replay give or take the few hundred bytes
// it does not model on CUDA (the kernels' scratch, the ids), printed, as tests/cuda_trainer/test_device_memory.cpp
// bounds the full fine-tune's.
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "engine/cuda/runtime.h"
#include "nn/lora.h"
#include "nn/qlora.h"
#include "optim/trainer.h"
#include "planner/memory_model.h"
#include "tests/cuda/gpt_gradients.h"
#include "tests/llama_step.h"

namespace engine::test {
namespace {

struct AdapterCase {
    const char* name;
    bool llama;
    std::vector<std::string> targets;
    bool nf4;
    Precision precision;
    checkpoint::CheckpointPolicy policy;
    int loss_chunk = 0;
    int mlp_tile = 0;
};
void PrintTo(const AdapterCase& adapter_case, std::ostream* out) { *out << adapter_case.name; }

class AdapterDeviceMemory : public ::testing::TestWithParam<AdapterCase> {
protected:
    void SetUp() override {
        if (!engine::cuda::device_available()) GTEST_SKIP() << "no CUDA device";
        engine::cuda::set_tf32_enabled(false);
    }
};

constexpr int batch = 2, accumulation = 2;

TEST_P(AdapterDeviceMemory, ModelStateIsExactAndTheStepPeakIsTheReplayPlusCudaScratch) {
    const AdapterCase& run = GetParam();
    const nn::ModelConfig config = run.llama ? nn::ModelConfig(small_llama_config(false)) : nn::ModelConfig(small_gpt_config());
    const int length = config.max_seq_len();
    // cuBLASLt's workspace, when an earlier test of this process made it and this model would not (Llama).
    const size_t inherited = config.is_llama() ? memory_stats(Device::cuda).current(MemoryCategory::workspace) : 0;
    const MemoryStats before = memory_stats(Device::cuda);
    planner::FineTuning tuning;
    nn::LoraConfig lora;
    lora.r = 4;
    lora.lora_alpha = 8.0;
    lora.target_modules = run.targets;
    tuning.lora = lora;
    tuning.nf4 = run.nf4;
    std::optional<optim::StepResult> result;
    {
        std::unique_ptr<nn::CausalLM> model = config.build(11, Device::cuda, DType::f32);
        nn::apply_lora(*model, lora);
        if (run.nf4) nn::quantize_nf4(*model);
        optim::TrainerConfig trainer_config;
        trainer_config.shape.per_device_train_batch_size = batch;
        trainer_config.shape.gradient_accumulation_steps = accumulation;
        trainer_config.shape.precision = run.precision;
        trainer_config.shape.checkpointing = run.policy;
        trainer_config.shape.loss_chunk_tokens = run.loss_chunk;
        trainer_config.shape.mlp_tile_tokens = run.mlp_tile;
        optim::Trainer trainer(*model, trainer_config);
        int cursor = 0;
        const nn::BatchSource source = [&]() -> std::optional<nn::Batch> {
            const std::vector<MicroBatch> made =
                make_token_micro_batches(config.vocab_size(), length, 1, batch, 91u + static_cast<uint32_t>(cursor++));
            nn::Batch out;
            out.inputs = Tensor::from_vector<int32_t>(made[0].tokens, {batch, length}, Device::cuda);
            out.labels = out.inputs;
            return out;
        };
        for (int step = 0; step < 2; ++step) {
            result = trainer.train_step(source);
            ASSERT_TRUE(result.has_value());
        }
    }
    const planner::MemoryPrediction predicted =
        planner::predict_memory(config, batch, length, run.policy, precision_dtype(run.precision), OptimizerKind::adamw,
                                1, accumulation, false, GradientOffload::window, false, run.loss_chunk, run.mlp_tile,
                                false, tuning);
    for (MemoryCategory category :
         {MemoryCategory::parameters, MemoryCategory::gradients, MemoryCategory::optimizer_state})
        EXPECT_EQ(result->memory.peak(category) - before.current(category), predicted.of(category))
            << memory_category_name(category);
    // The whole account, as tests/cuda_trainer/test_device_memory.cpp reads it: this process holds nothing else
    // between tests but cuBLASLt's workspace, which GPT-2's biased linears use (predicted) and Llama's do not
    // (inherited from an earlier test, taken off).
    const long long measured = static_cast<long long>(result->memory.peak_bytes - inherited);
    const long long residue = measured - static_cast<long long>(predicted.peak_on(Device::cuda));
    // What the replay does not model on CUDA: the kernels' scratch (attention's row dots, the reductions' partials)
    // above; below, the ids, which this source makes on the device with its labels sharing its inputs' tensor
    // where the model counts train_gpt's host batches (528 B on these shapes, as for a full fine-tune).
    EXPECT_LT(std::llabs(residue), 4096) << "the replay's unmodelled CUDA bytes";
    std::printf("  %s: device peak %lld B, predicted %zu B (%s); %lld B of CUDA scratch and ids not modelled\n",
                run.name, measured, predicted.peak_on(Device::cuda), predicted.peak_moment.c_str(), residue);
}

INSTANTIATE_TEST_SUITE_P(
    Runs, AdapterDeviceMemory,
    ::testing::Values(AdapterCase{"llama_lora_fp32", true, {"q_proj", "v_proj"}, false, Precision::fp32, {}},
                      AdapterCase{"llama_qlora_bf16_checkpoint", true, {"all-linear"}, true, Precision::bf16,
                                  {true, 1, 1, false, false}},
                      AdapterCase{"llama_lora_bf16_chunks_tiles", true, {"all-linear"}, false, Precision::bf16,
                                  {true, 2, 1, true, false}, 13, 7},
                      AdapterCase{"gpt_lora_fp32_checkpoint_offload", false, {"c_attn"}, false, Precision::fp32,
                                  {true, 1, 1, true, false}},
                      AdapterCase{"gpt_qlora_bf16", false, {"all-linear"}, true, Precision::bf16, {}, 20}),
    [](const ::testing::TestParamInfo<AdapterCase>& info) { return std::string(info.param.name); });

} // namespace
} // namespace engine::test
