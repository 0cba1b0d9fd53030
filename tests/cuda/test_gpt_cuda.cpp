// GPT on CUDA against the CPU: the loss and every parameter gradient of an accumulated step under
// checkpointing and offload; and a steady-state trainer step makes no cudaMalloc/cudaHostAlloc call. (A CUDA
// tensor without a device: tests/cuda_no_device.)
#include <optional>
#include <ostream>
#include <string>

#include <gtest/gtest.h>

#include "engine/cuda/runtime.h"
#include "optim/trainer.h"
#include "tests/cuda/compare.h"
#include "tests/cuda/gpt_gradients.h"

namespace engine::test {
namespace {

using checkpoint::CheckpointPolicy;

constexpr int micro_batch_count = 3, batch = 3;

struct PolicyCase {
    const char* name;
    CheckpointPolicy policy;
};
void PrintTo(const PolicyCase& policy_case, std::ostream* out) { *out << policy_case.name; } // ctest names

class GptCudaTest : public ::testing::TestWithParam<PolicyCase> {
protected:
    void SetUp() override {
        if (!engine::cuda::device_available()) GTEST_SKIP() << "no CUDA device";
        engine::cuda::set_tf32_enabled(false); // compared with the fp32 CPU: TF32 would round every GEMM input
    }
};

// Same model seed and engine RNG seed on both devices: identical initial weights (generated on the host)
// and identical dropout masks (the same counter-based RNG), so only rounding differs.
TEST_P(GptCudaTest, LossAndEveryGradientMatchTheCpu) {
    const CheckpointPolicy& policy = GetParam().policy;
    const auto batches = make_micro_batches(small_gpt_config(), micro_batch_count, batch);
    const GptGradients cpu = accumulate_gpt_gradients(Device::cpu, policy, batches, batch);
    const GptGradients cuda = accumulate_gpt_gradients(Device::cuda, policy, batches, batch);
    expect_gradients_close_to_cpu(cuda, cpu, GetParam().name);
}

INSTANTIATE_TEST_SUITE_P(Policies, GptCudaTest,
                         ::testing::Values(PolicyCase{"plain", CheckpointPolicy{}},
                                           PolicyCase{"every_n_1", checkpoint_policy(1, false, false)},
                                           PolicyCase{"every_n_1_offload", checkpoint_policy(1, true, false)},
                                           PolicyCase{"every_n_2_offload", checkpoint_policy(2, true, false)}),
                         [](const ::testing::TestParamInfo<PolicyCase>& info) { return std::string(info.param.name); });

// After warm-up every block a step needs is in the caches: two more steps reach neither cudaMalloc nor
// cudaHostAlloc (checkpointing with offload on, so the pinned pool is exercised too).
TEST(GptCudaAllocator, SteadyStateStepMakesNoSystemAllocation) {
    if (!engine::cuda::device_available()) GTEST_SKIP() << "no CUDA device";
    const nn::GPTConfig config = small_gpt_config();
    nn::GPT model(config, 7, Device::cuda);
    optim::TrainerConfig trainer_config;
    trainer_config.shape.per_device_train_batch_size = batch;
    trainer_config.shape.gradient_accumulation_steps = micro_batch_count;
    trainer_config.shape.checkpointing.enabled = true;
    trainer_config.shape.checkpointing.every_n_layers = 2;
    trainer_config.shape.checkpointing.offload = true;
    optim::Trainer trainer(model, trainer_config);

    const auto micro_batches = make_micro_batches(config, micro_batch_count, batch);
    size_t next = 0;
    const nn::BatchSource source = [&]() -> std::optional<nn::Batch> {
        const MicroBatch& micro = micro_batches[next++ % micro_batches.size()];
        nn::Batch batch_out; // labels unshifted, as the trainer expects: the tokens themselves
        batch_out.inputs = Tensor::from_vector<int32_t>(micro.tokens, {batch, config.max_seq_len}, Device::cpu);
        batch_out.labels = batch_out.inputs;
        return batch_out;
    };
    for (int step = 0; step < 2; ++step) ASSERT_TRUE(trainer.train_step(source).has_value());
    engine::cuda::synchronize();
    const size_t calls = engine::cuda::system_allocation_count();
    const size_t device_allocations = memory_stats(Device::cuda).system_allocations;
    const size_t pinned_allocations = memory_stats(Device::cpu).system_allocations_for(MemoryCategory::pinned_host);
    for (int step = 0; step < 2; ++step) ASSERT_TRUE(trainer.train_step(source).has_value());
    engine::cuda::synchronize();
    EXPECT_EQ(engine::cuda::system_allocation_count(), calls);
    EXPECT_EQ(memory_stats(Device::cuda).system_allocations, device_allocations);
    EXPECT_EQ(memory_stats(Device::cpu).system_allocations_for(MemoryCategory::pinned_host), pinned_allocations);
    EXPECT_GT(calls, 0u); // the warm-up did allocate: the counter is live
}

} // namespace
} // namespace engine::test
