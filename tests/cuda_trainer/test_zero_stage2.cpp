// ZeRO stage 2 on the CUDA device over a one-rank communicator (the emulated device has no NCCL, and MPI moves host
// tensors, so this is where the device path runs in CI): the released layers, their buffers attached for each
// segment's backward and reduced (a copy, on one rank) into the shard gradients, the optimizer reading them at an
// offset, the norm from them. One micro-batch a step trains bitwise as stage 0 without a communicator, GPT-2 and
// Llama, f32 and bf16, with the model state on the device and on the host (the gradients streamed down and reduced
// there); the model state's categories on both accounts are predict_memory(ZeroSharding{1, true})'s to the byte, and
// the step peak moves from stage 0's by what the model predicts. Stage 3 (the Stage3 cases, the model state on the device)
// likewise: its segments' weights released between uses and gathered (a copy, on one rank) from the shard of the
// masters the optimizer updates, bitwise as stage 0, its categories predict_memory(ZeroSharding{1, true, true})'s; with
// the model state on the host the shard and a gathered segment's masters are there, and the device holds that
// segment's working copies only.
#include <cstdio>
#include <memory>
#include <optional>
#include <vector>

#include <gtest/gtest.h>

#include "engine/cuda/runtime.h"
#include "engine/distributed/communicator.h"
#include "optim/trainer.h"
#include "planner/memory_model.h"
#include "tests/cuda/gpt_gradients.h"
#include "tests/llama_step.h"
#include "tests/parameter_snapshot.h"

namespace engine::test {
namespace {

struct ZeroCase {
    const char* name;
    bool llama;
    Precision precision;
    bool offload = false; // the optimizer and the shard on the host, the gradients streamed there
    int stage = 2;
};
void PrintTo(const ZeroCase& zero_case, std::ostream* out) { *out << zero_case.name; }

class ZeroStage2Device : public ::testing::TestWithParam<ZeroCase> {
protected:
    void SetUp() override {
        if (!engine::cuda::device_available()) GTEST_SKIP() << "no CUDA device";
        engine::cuda::set_tf32_enabled(false);
    }
};

constexpr int batch = 2, steps = 3;

struct Trained {
    std::vector<uint8_t> weights;
    std::vector<float> logits; // a forward once the trainer is gone
    std::vector<double> norms;
    MemoryStats memory, host_memory; // the last step's
    planner::MemoryPrediction predicted;
};

Trained train(const ZeroCase& run, bool sharded) {
    const nn::ModelConfig config =
        run.llama ? nn::ModelConfig(small_llama_config(false)) : nn::ModelConfig(small_gpt_config());
    const int length = config.max_seq_len();
    const auto communicator = distributed::make_communicator(distributed::Backend::none);
    std::unique_ptr<nn::CausalLM> model = config.build(11, Device::cuda, DType::f32);
    optim::TrainerConfig trainer_config;
    trainer_config.shape.per_device_train_batch_size = batch;
    trainer_config.shape.gradient_accumulation_steps = 1;
    trainer_config.shape.precision = run.precision;
    trainer_config.shape.checkpointing.enabled = true;
    trainer_config.shape.zero_stage = sharded ? run.stage : 0;
    trainer_config.shape.offload_optimizer = run.offload;
    if (run.offload) trainer_config.shape.offload_gradients = GradientOffload::stream;
    trainer_config.max_grad_norm = 0.5;
    trainer_config.learning_rate = 3e-3;
    Trained out;
    {
        optim::Trainer trainer(*model, trainer_config, sharded ? communicator.get() : nullptr);
        int cursor = 0;
        const nn::BatchSource source = [&]() -> std::optional<nn::Batch> {
            const std::vector<MicroBatch> made =
                make_token_micro_batches(config.vocab_size(), length, 1, batch, 91u + static_cast<uint32_t>(cursor++));
            nn::Batch made_batch;
            made_batch.inputs = Tensor::from_vector<int32_t>(made[0].tokens, {batch, length}, Device::cuda);
            made_batch.labels = made_batch.inputs;
            return made_batch;
        };
        for (int step = 0; step < steps; ++step) {
            const std::optional<optim::StepResult> result = trainer.train_step(source);
            EXPECT_TRUE(result.has_value());
            out.norms.push_back(result->grad_norm);
            out.memory = result->memory;
            out.host_memory = result->host_memory;
            if (sharded) EXPECT_GT(result->communication.reduces, 0);
            if (sharded && run.stage == 3) EXPECT_GT(result->communication.broadcasts, 0);
        }
        // Stage 3: the released layers gathered for good before the trainer goes (with the model state on the host the
        // masters there, and the device copies made by the trainer's destructor), so the model runs after it.
        trainer.gather_released_parameters();
        out.weights = testing::bytes_of(model->named_parameters());
    }
    {
        const NoGradGuard no_grad;
        const std::vector<MicroBatch> made = make_token_micro_batches(config.vocab_size(), length, 1, batch, 7u);
        const Tensor logits = model->forward(Tensor::from_vector<int32_t>(made[0].tokens, {batch, length}, Device::cuda));
        out.logits = cast(logits, DType::f32).to_vector<float>();
    }
    out.predicted = planner::predict_memory(config, batch, length, checkpoint::CheckpointPolicy{true, 1},
                                            precision_dtype(run.precision), OptimizerKind::adamw,
                                            sharded ? ZeroSharding{1, true, run.stage == 3} : ZeroSharding{}, 1, run.offload,
                                            run.offload ? GradientOffload::stream : GradientOffload::window);
    return out;
}

TEST_P(ZeroStage2Device, OneMicroBatchTrainsBitwiseAsStageZeroWithThePredictedState) {
    const ZeroCase& run = GetParam();
    const Trained plain = train(run, false), sharded = train(run, true);
    EXPECT_TRUE(plain.weights == sharded.weights) << "the weights after " << steps << " steps";
    EXPECT_EQ(plain.logits, sharded.logits) << "a forward after the trainer went";
    for (size_t step = 0; step < plain.norms.size(); ++step) // summed over the shard's pieces: the last digits
        EXPECT_NEAR(plain.norms[step], sharded.norms[step], 1e-12 * plain.norms[step]);
    for (const Trained* measured : {&plain, &sharded})
        for (MemoryCategory category :
             {MemoryCategory::parameters, MemoryCategory::gradients, MemoryCategory::optimizer_state})
        {
            EXPECT_EQ(measured->memory.peak(category), measured->predicted.of(category))
                << (measured == &plain ? "stage 0 " : "sharded ") << memory_category_name(category);
            EXPECT_EQ(measured->host_memory.peak(category), measured->predicted.host_of(category))
                << (measured == &plain ? "stage 0, host " : "sharded, host ") << memory_category_name(category);
        }
    // The joint peak: the CUDA-only scratch the model leaves out is the same in both runs, so the difference is exact.
    const long long measured_change =
        static_cast<long long>(sharded.memory.peak_bytes) - static_cast<long long>(plain.memory.peak_bytes);
    const long long predicted_change = static_cast<long long>(sharded.predicted.peak_on(Device::cuda)) -
                                       static_cast<long long>(plain.predicted.peak_on(Device::cuda));
    EXPECT_EQ(measured_change, predicted_change);
    std::printf("  %s: stage %d step peak %zu B against stage 0's %zu B (change %lld B, predicted %lld B)\n", run.name, run.stage,
                sharded.memory.peak_bytes, plain.memory.peak_bytes, measured_change, predicted_change);
    if (run.offload) { // the host's joint peak: the shard and its buffers there, the released masters' buffers not
        const long long host_change = static_cast<long long>(sharded.host_memory.peak_bytes) -
                                      static_cast<long long>(plain.host_memory.peak_bytes);
        const long long predicted_host_change = static_cast<long long>(sharded.predicted.host_peak_bytes) -
                                                static_cast<long long>(plain.predicted.host_peak_bytes);
        EXPECT_EQ(host_change, predicted_host_change);
        std::printf("  %s: the host's step peak %zu B against stage 0's %zu B (change %lld B, predicted %lld B)\n",
                    run.name, sharded.host_memory.peak_bytes, plain.host_memory.peak_bytes, host_change,
                    predicted_host_change);
    }
}

INSTANTIATE_TEST_SUITE_P(Models, ZeroStage2Device,
                         ::testing::Values(ZeroCase{"gpt_f32", false, Precision::fp32},
                                           ZeroCase{"gpt_bf16", false, Precision::bf16},
                                           ZeroCase{"llama_bf16", true, Precision::bf16},
                                           ZeroCase{"gpt_bf16_offload", false, Precision::bf16, true},
                                           ZeroCase{"llama_f32_offload", true, Precision::fp32, true}),
                         [](const ::testing::TestParamInfo<ZeroCase>& info) { return std::string(info.param.name); });
INSTANTIATE_TEST_SUITE_P(Stage3, ZeroStage2Device,
                         ::testing::Values(ZeroCase{"gpt_f32", false, Precision::fp32, false, 3},
                                           ZeroCase{"gpt_bf16", false, Precision::bf16, false, 3},
                                           ZeroCase{"llama_bf16", true, Precision::bf16, false, 3},
                                           ZeroCase{"gpt_bf16_offload", false, Precision::bf16, true, 3},
                                           ZeroCase{"llama_f32_offload", true, Precision::fp32, true, 3},
                                           ZeroCase{"llama_bf16_offload", true, Precision::bf16, true, 3}),
                         [](const ::testing::TestParamInfo<ZeroCase>& info) { return std::string(info.param.name); });

} // namespace
} // namespace engine::test
