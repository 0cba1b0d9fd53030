// The census of a training step on the device: every operation the step queues on a stream (kernels, cuBLAS and
// cuBLASLt calls, memsets and copies, events), counted by the emulator. On a GPU each but the event calls costs a
// launch gap, which bench/roofline.py charges per launch: its count must be the step's real one (issue 32, item 5).
// The step is GPT-2 124M's (12 layers, 12 heads, the 50257-token vocabulary padded to 50304) at a small width and
// batch, in bf16 as the headline runs it: the count depends on the layers and the flags, not on the sizes. The
// census is linear in the layers but for the multi-tensor launches (the gradient norm's and the AdamW update's, one
// per group of tensors), so a per-layer count, a fixed part and the lists' describe it; it is printed for
// roofline.py.
#include <cstdio>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "emulator/testing.h"
#include "engine/cuda/runtime.h"
#include "optim/trainer.h"
#include "tests/cuda/gpt_gradients.h"

namespace engine::test {
namespace {

struct Census {
    std::map<std::string, uint64_t> operations;
    uint64_t launches = 0; // what costs a launch gap: every operation but the event calls
    uint64_t gemms = 0, memsets = 0, copies = 0, kernels = 0;
    uint64_t lists = 0;    // the multi-tensor launches: one per group of tensors, not per layer
    uint64_t updates = 0;  // of which the AdamW update's
};

bool list_kernel(const std::string& kind) {
    return kind == "chunk_sums_of_squares_kernel" || kind == "ordered_total_kernel" ||
           kind == "adamw_update_list_kernel";
}

// One step's census after a first step (which makes the lazily created buffers and handles).
Census step_census(int layers, bool checkpointing) {
    nn::GPTConfig config{50257, 64, layers, 12, 96, 0.0f};
    nn::GPT model(config, 7, Device::cuda, DType::f32);
    optim::TrainerConfig trainer_config;
    trainer_config.shape.per_device_train_batch_size = 2;
    trainer_config.shape.gradient_accumulation_steps = 1;
    trainer_config.shape.precision = Precision::bf16;
    trainer_config.shape.checkpointing.enabled = checkpointing;
    optim::Trainer trainer(model, trainer_config);
    int cursor = 0;
    const nn::BatchSource source = [&]() -> std::optional<nn::Batch> {
        const std::vector<MicroBatch> made = make_token_micro_batches(config.vocab_size, 16, 1, 2, 5u + cursor++);
        nn::Batch batch;
        batch.inputs = Tensor::from_vector<int32_t>(made[0].tokens, {2, 16}, Device::cuda);
        batch.labels = batch.inputs;
        return batch;
    };
    EXPECT_TRUE(trainer.train_step(source).has_value());
    emulator::reset_stream_operations();
    EXPECT_TRUE(trainer.train_step(source).has_value());
    Census census;
    census.operations = emulator::stream_operations();
    for (const auto& [kind, count] : census.operations) {
        if (kind == "cudaEventRecord" || kind == "cudaStreamWaitEvent") continue;
        census.launches += count;
        if (list_kernel(kind)) census.lists += count;
        if (kind == "adamw_update_list_kernel") census.updates += count;
        if (kind.rfind("cublas", 0) == 0) census.gemms += count;
        else if (kind == "cudaMemsetAsync") census.memsets += count;
        else if (kind.rfind("cudaMemcpy", 0) == 0) census.copies += count;
        else census.kernels += count;
    }
    return census;
}

TEST(StepCensus, Gpt2StepLaunchesAreLinearInTheLayersAndCounted) {
    if (!engine::cuda::device_available()) GTEST_SKIP() << "no CUDA device";
    for (const bool checkpointing : {false, true}) {
        const Census three = step_census(3, checkpointing), six = step_census(6, checkpointing),
                     twelve = step_census(12, checkpointing);
        // Every kind but the lists' grows by the same count a layer.
        const auto layered = [](const Census& census) { return census.launches - census.lists; };
        const uint64_t per_layer = (layered(six) - layered(three)) / 3;
        EXPECT_EQ(layered(six) - layered(three), 3 * per_layer);
        EXPECT_EQ(layered(twelve) - layered(six), 6 * per_layer) << "a layer's launches do not depend on its place";
        const uint64_t fixed = layered(twelve) - 12 * per_layer;
        std::printf("GPT-2 124M's step in bf16, %s: %llu launches (%llu kernels, %llu GEMMs, %llu memsets, %llu "
                    "copies) = %llu fixed + 12 x %llu per layer + %llu multi-tensor (%llu of them AdamW's)\n",
                    checkpointing ? "every layer checkpointed" : "no checkpointing",
                    static_cast<unsigned long long>(twelve.launches), static_cast<unsigned long long>(twelve.kernels),
                    static_cast<unsigned long long>(twelve.gemms), static_cast<unsigned long long>(twelve.memsets),
                    static_cast<unsigned long long>(twelve.copies), static_cast<unsigned long long>(fixed),
                    static_cast<unsigned long long>(per_layer), static_cast<unsigned long long>(twelve.lists),
                    static_cast<unsigned long long>(twelve.updates));
        for (const auto& [kind, count] : twelve.operations)
            std::printf("  %6llu  %s\n", static_cast<unsigned long long>(count), kind.c_str());
        // The update is one launch per 64 tensors: 4 + 12 x 12 = 148 at 12 layers, 40 at 3.
        EXPECT_EQ(twelve.updates, 3u);
        EXPECT_EQ(three.updates, 1u);
        // Neither an update nor a conversion nor a memset per parameter tensor: the update's epilogue writes the
        // copies and zeroes the gradients.
        for (const auto& [kind, count] : twelve.operations)
            for (const char* replaced : {"convert_kernel", "adamw_update_kernel<"})
                EXPECT_EQ(kind.find(replaced), std::string::npos) << count << " launches of " << kind;
        // bench/roofline.py charges the step's launch gaps on these counts (CENSUS_FIXED, CENSUS_PER_LAYER,
        // CENSUS_LISTS): a change to what the step launches must change them there too, with its prediction.
        EXPECT_EQ(fixed, 25u) << "update bench/roofline.py's CENSUS_FIXED";
        EXPECT_EQ(per_layer, checkpointing ? 49u : 39u) << "update bench/roofline.py's CENSUS_PER_LAYER";
        // Input gradients are written first where an op can (β = 0 GEMMs, GELU's write form, the residual's copies
        // of dout): one zero fill a layer is left, attention's dqkv, and three outside the layers.
        EXPECT_EQ(twelve.memsets, 15u);
        EXPECT_EQ(twelve.lists, 7u) << "update bench/roofline.py's CENSUS_LISTS";
    }
}

} // namespace
} // namespace engine::test
