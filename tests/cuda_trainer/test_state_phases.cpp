// The phases outside the step on the CUDA device, measured against the planner: between steps the device holds the
// model state predict_memory predicts; a save and a resume (predict_state_phases) add nothing to it and raise the
// host's account by the one pinned block they stream through (none when the optimizer keeps every saved tensor on
// the host); an evaluation (predict_evaluation_memory) peaks as predicted; a load
// (predict_load_phase) adds nothing to either. The state and the weights come back bitwise. On the emulated device in
// CI; on a real one when lent.
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "engine/cuda/runtime.h"
#include "nn/io/safetensors.h"
#include "optim/trainer.h"
#include "optim/training_state.h"
#include "planner/memory_model.h"
#include "tests/cuda/gpt_gradients.h"
#include "tests/llama_step.h"
#include "tests/parameter_snapshot.h"

namespace engine::test {
namespace {

namespace fs = std::filesystem;

constexpr int micro_batches = 2, batch = 2;

struct PhaseCase {
    const char* name;
    bool llama;
    Precision precision;
    bool checkpointing;           // every layer, its input offloaded
    bool offload_optimizer = false;
    GradientOffload gradients = GradientOffload::window;
    bool parameters = false;      // streamed parameters (offload_parameters)
};
void PrintTo(const PhaseCase& phase_case, std::ostream* out) { *out << phase_case.name; }

nn::ModelConfig model_config(const PhaseCase& run) {
    return run.llama ? nn::ModelConfig(small_llama_config(false)) : nn::ModelConfig(small_gpt_config());
}

optim::TrainerConfig trainer_config(const PhaseCase& run) {
    optim::TrainerConfig config;
    config.shape.per_device_train_batch_size = batch;
    config.shape.gradient_accumulation_steps = micro_batches;
    config.shape.precision = run.precision;
    config.shape.checkpointing.enabled = run.checkpointing;
    config.shape.checkpointing.offload = run.checkpointing;
    config.shape.offload_optimizer = run.offload_optimizer;
    if (run.offload_optimizer) config.shape.offload_gradients = run.gradients;
    config.shape.offload_parameters = run.parameters;
    config.learning_rate = 3e-3;
    config.max_steps = 4;
    return config;
}

size_t device_now() { return memory_stats(Device::cuda).current_bytes; }
size_t host_now() { return memory_stats(Device::cpu).current_bytes; }

class StatePhases : public ::testing::TestWithParam<PhaseCase> {
protected:
    void SetUp() override {
        if (!engine::cuda::device_available()) GTEST_SKIP() << "no CUDA device";
        engine::cuda::set_tf32_enabled(false);
        directory = fs::temp_directory_path() / ("engine_state_phases_" + std::to_string(::getpid()));
        fs::remove_all(directory);
    }
    void TearDown() override { fs::remove_all(directory); }
    fs::path directory;
};

TEST_P(StatePhases, EachPhaseHoldsWhatThePlannerPredicts) {
    const PhaseCase& run = GetParam();
    const nn::ModelConfig config = model_config(run);
    const int length = config.max_seq_len();
    const DType dtype = precision_dtype(run.precision);
    checkpoint::CheckpointPolicy policy;
    policy.enabled = policy.offload = run.checkpointing;
    const planner::MemoryPrediction step =
        planner::predict_memory(config, batch, length, policy, dtype, OptimizerKind::adamw, 1, micro_batches,
                                run.offload_optimizer, run.gradients, run.parameters);
    const planner::StatePhasesPrediction phases = planner::predict_state_phases(step, Device::cuda, run.offload_optimizer);

    const size_t device_before = device_now(), host_before = host_now();
    const size_t workspace_before = memory_stats(Device::cuda).current(MemoryCategory::workspace);
    std::unique_ptr<nn::CausalLM> model = config.build(11, Device::cuda, DType::f32);
    optim::Trainer trainer(*model, trainer_config(run));
    int cursor = 0;
    const nn::BatchSource source = [&]() -> std::optional<nn::Batch> {
        const std::vector<MicroBatch> made =
            make_token_micro_batches(config.vocab_size(), length, 1, batch, 500u + static_cast<uint32_t>(cursor++));
        nn::Batch out;
        out.inputs = Tensor::from_vector<int32_t>(made[0].tokens, {batch, length}, Device::cpu);
        out.labels = out.inputs;
        return out;
    };
    size_t pinned_step_peak = 0;
    for (int index = 0; index < 2; ++index) {
        const std::optional<optim::StepResult> result = trainer.train_step(source);
        ASSERT_TRUE(result.has_value());
        pinned_step_peak = std::max(pinned_step_peak, result->host_memory.peak(MemoryCategory::pinned_host));
    }
    // Pinned host memory during the steps: the parked copies, and the offloaded inputs or one staged ids tensor.
    EXPECT_EQ(pinned_step_peak, step.pinned_peak_bytes);

    // Between steps: the model state as predicted, and cuBLASLt's workspace when this run made it (GPT-2's biased
    // linears; an earlier test of the process may have made it already).
    const size_t made = memory_stats(Device::cuda).current(MemoryCategory::workspace) - workspace_before;
    EXPECT_TRUE(made == 0 || made == step.cuda_runtime_bytes) << made;
    const size_t settled_device = device_now(), settled_host = host_now();
    EXPECT_EQ(settled_device - device_before, step.between_steps_bytes + made);
    EXPECT_EQ(settled_host - host_before, step.host_between_steps_bytes);

    // The save: nothing on the device, the block on the host.
    reset_peak(Device::cuda);
    reset_peak(Device::cpu);
    optim::save_training_state(directory.string(), trainer, nullptr);
    EXPECT_EQ(memory_stats(Device::cuda).peak_bytes, settled_device) << "the save added to the device";
    EXPECT_EQ(memory_stats(Device::cpu).peak_bytes - settled_host, phases.staging);
    EXPECT_EQ(memory_stats(Device::cpu).peak_bytes - host_before, phases.host_save_peak);
    EXPECT_EQ(memory_stats(Device::cpu).peak(MemoryCategory::pinned_host), phases.pinned_peak);
    EXPECT_EQ(device_now(), settled_device);
    EXPECT_EQ(host_now(), settled_host);

    // The evaluation between steps (its batches on the device, ids and labels apart, as the model counts them), unless
    // the parameters stream from the host, which it does not model: the replay's forward beside the state between
    // steps, to the byte (the CUDA kernels' scratch is not live at its peak in these runs).
    if (!run.parameters) {
        constexpr int eval_batches = 2;
        const planner::PhasePrediction evaluation = planner::predict_evaluation_memory(
            config, batch, length, policy, dtype, OptimizerKind::adamw, 1, run.offload_optimizer, run.gradients, false,
            eval_batches,
            0, 0, false);
        std::vector<nn::Batch> batches;
        for (int index = 0; index < eval_batches; ++index) {
            nn::Batch made = *source();
            made.inputs = made.inputs.to(Device::cuda);
            made.labels = made.labels.to(Device::cuda); // a tensor of its own, as the model counts them
            batches.push_back(std::move(made));
        }
        reset_peak(Device::cuda);
        EXPECT_TRUE(std::isfinite(trainer.evaluate(batches).loss));
        const size_t measured = memory_stats(Device::cuda).peak_bytes - device_before - made;
        EXPECT_EQ(measured, evaluation.peak_bytes);
        std::printf("  %s: evaluation peak %zu B, predicted %zu B\n", run.name, measured, evaluation.peak_bytes);
    }

    // Loading weights into a model as built: the device holds the model and nothing more, the host nothing more.
    {
        const std::string weights = (directory / "weights.safetensors").string();
        nn::save_safetensors(*model, weights);
        const size_t load_before = device_now();
        std::unique_ptr<nn::CausalLM> target = config.build(13, Device::cuda, DType::f32);
        const planner::LoadPhasePrediction load = planner::predict_load_phase(config, Device::cuda, false);
        const size_t built = device_now();
        EXPECT_EQ(built - load_before, load.device_peak);
        const size_t load_host = host_now();
        reset_peak(Device::cuda);
        reset_peak(Device::cpu);
        nn::CheckpointNames names;
        names.accepted_prefix = "";
        if (run.llama) names.tied_table = "model.embed_tokens.weight";
        nn::load_safetensors_into(*target, {weights}, names);
        EXPECT_EQ(memory_stats(Device::cuda).peak_bytes, built) << "the load added to the device";
        EXPECT_EQ(memory_stats(Device::cpu).peak_bytes - load_host, load.host_peak) << "the host's account in the load";
        EXPECT_TRUE(testing::bytes_of(target->named_parameters()) == testing::bytes_of(model->named_parameters()));
    }

    // The resume, into a trainer just built: its device holds the state the save found less what a step makes.
    const size_t fresh_device_before = device_now(), fresh_host_before = host_now();
    std::unique_ptr<nn::CausalLM> fresh = config.build(12, Device::cuda, DType::f32);
    optim::Trainer resumed(*fresh, trainer_config(run));
    const size_t built_device = device_now(), built_host = host_now();
    EXPECT_EQ(built_device - fresh_device_before, phases.device_resume_peak);
    EXPECT_EQ(built_host - fresh_host_before, step.host_between_steps_bytes);
    reset_peak(Device::cuda);
    reset_peak(Device::cpu);
    optim::resume_training_state(directory.string(), resumed, nullptr);
    EXPECT_EQ(memory_stats(Device::cuda).peak_bytes, built_device) << "the resume added to the device";
    EXPECT_EQ(memory_stats(Device::cpu).peak_bytes - fresh_host_before, phases.host_resume_peak);
    using testing::bytes_of;
    EXPECT_TRUE(bytes_of(fresh->named_parameters()) == bytes_of(model->named_parameters()));
    EXPECT_TRUE(bytes_of(resumed.optimizer().named_state()) == bytes_of(trainer.optimizer().named_state()));
    EXPECT_EQ(resumed.step(), trainer.step());
    std::printf("  %s: device between steps %zu B (predicted %zu B), save +0 B; host block %zu B; resume into %zu B\n",
                run.name, settled_device - device_before - made, step.between_steps_bytes, phases.staging,
                built_device - fresh_device_before);
}

INSTANTIATE_TEST_SUITE_P(
    Runs, StatePhases,
    ::testing::Values(PhaseCase{"gpt_fp32", false, Precision::fp32, false},
                      PhaseCase{"llama_bf16_checkpointed", true, Precision::bf16, true},
                      PhaseCase{"gpt_bf16_optimizer_on_host", false, Precision::bf16, true, true},
                      PhaseCase{"llama_bf16_streamed_gradients", true, Precision::bf16, true, true, GradientOffload::stream},
                      PhaseCase{"llama_fp32_streamed", true, Precision::fp32, true, true, GradientOffload::stream, true},
                      PhaseCase{"gpt_bf16_streamed", false, Precision::bf16, true, true, GradientOffload::stream, true}),
    [](const ::testing::TestParamInfo<PhaseCase>& info) { return std::string(info.param.name); });

} // namespace
} // namespace engine::test
