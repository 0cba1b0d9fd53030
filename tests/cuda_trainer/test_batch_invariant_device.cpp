// The batch-invariant mode on the CUDA device (docs/TRAINING.md, "The big batch, bitwise"): GPT-2, f32 and bf16, AdamW
// with clipping, padded data and dropout 0.1: micro-batch 1 x accumulation 4, 4 x 1, and 2 x 2 with checkpointing and
// the segments' inputs offloaded train bitwise the same weights, losses and norms (the chunks run in the same order on
// one rank, so even the dropout masks agree); the default mode does not.
#include <random>
#include <vector>

#include <gtest/gtest.h>

#include "engine/cuda/runtime.h"
#include "optim/trainer.h"
#include "planner/memory_model.h"
#include "tests/cuda/gpt_gradients.h"
#include "tests/parameter_snapshot.h"

namespace engine::test {
namespace {

constexpr int steps = 2; // the CPU tests run 20; each emulated run takes seconds, and minutes under ASan

struct Trained {
    std::vector<uint8_t> weights;
    std::vector<double> losses, norms;
    size_t peak = 0; // the last step's device peak
};

// Every step's 4 sequences of random lengths, as batches of `rows` on the device.
std::vector<nn::Batch> sequences_as(int rows, int vocabulary, int length) {
    std::mt19937 generator(17);
    std::uniform_int_distribution<int32_t> token(0, vocabulary - 1), valid(2, length);
    std::vector<int32_t> inputs, labels;
    for (int sequence = 0; sequence < steps * 4; ++sequence) {
        const int count = valid(generator);
        for (int t = 0; t < length; ++t) {
            inputs.push_back(t < count ? token(generator) : 0);
            labels.push_back(t < count ? inputs.back() : -100);
        }
    }
    std::vector<nn::Batch> batches;
    const size_t per_batch = static_cast<size_t>(rows) * length;
    for (size_t first = 0; first < inputs.size(); first += per_batch) {
        const std::vector<int32_t> batch_inputs(inputs.begin() + first, inputs.begin() + first + per_batch);
        const std::vector<int32_t> batch_labels(labels.begin() + first, labels.begin() + first + per_batch);
        nn::Batch batch;
        batch.inputs = Tensor::from_vector<int32_t>(batch_inputs, {rows, length}, Device::cuda);
        batch.labels = Tensor::from_vector<int32_t>(batch_labels, {rows, length}, Device::cuda);
        batches.push_back(batch);
    }
    return batches;
}

Trained train(Precision precision, int rows, bool invariant, bool checkpoint_and_offload, int accumulation = 0) {
    if (accumulation == 0) accumulation = 4 / rows;
    const nn::GPTConfig config = small_gpt_config(); // dropout 0.1
    nn::GPT model(config, 11, Device::cuda, DType::f32);
    optim::TrainerConfig trainer_config;
    trainer_config.shape.per_device_train_batch_size = rows;
    trainer_config.shape.gradient_accumulation_steps = accumulation;
    trainer_config.shape.precision = precision;
    trainer_config.shape.checkpointing.enabled = checkpoint_and_offload;
    trainer_config.shape.checkpointing.offload = checkpoint_and_offload;
    trainer_config.max_grad_norm = 0.5;
    trainer_config.learning_rate = 3e-3;
    trainer_config.weight_decay = 0.1;
    trainer_config.batch_invariant_chunk = invariant ? 1 : 0;
    optim::Trainer trainer(model, trainer_config);
    const std::vector<nn::Batch> batches = sequences_as(rows, config.vocab_size, config.max_seq_len);
    Trained out;
    for (int step = 0; step < steps; ++step) {
        const auto first = batches.begin() + static_cast<std::ptrdiff_t>(step * (4 / rows));
        const optim::StepResult result =
            trainer.apply_update(trainer.accumulate_gradients({first, first + 4 / rows}));
        out.losses.push_back(result.loss);
        out.norms.push_back(result.grad_norm);
        out.peak = result.memory.peak_bytes;
    }
    out.weights = testing::bytes_of(model.named_parameters());
    return out;
}

class BatchInvariantDevice : public ::testing::TestWithParam<Precision> {
protected:
    void SetUp() override {
        if (!engine::cuda::device_available()) GTEST_SKIP() << "no CUDA device";
        engine::cuda::set_tf32_enabled(false);
        current_tape().clear();
    }
};

TEST_P(BatchInvariantDevice, AnySplitOfTheWindowTrainsTheSameBits) {
    const Trained one_by_four = train(GetParam(), 1, true, false), four_by_one = train(GetParam(), 4, true, false),
                  offloaded = train(GetParam(), 2, true, true);
    EXPECT_GT(one_by_four.norms.front(), 0.5) << "clipping must be active";
    for (const Trained* other : {&four_by_one, &offloaded}) {
        EXPECT_EQ(other->losses, one_by_four.losses);
        EXPECT_EQ(other->norms, one_by_four.norms);
        EXPECT_TRUE(other->weights == one_by_four.weights) << "weights differ";
    }
    // The default mode at 1 x 4 (checkpointed and offloaded, which changes no bit) and at 4 x 1 differ: the comparison
    // above can fail.
    const Trained chunked_plain = train(GetParam(), 1, false, true, 4), plain_four = train(GetParam(), 4, false, false);
    EXPECT_FALSE(chunked_plain.weights == plain_four.weights) << "the default mode was expected to differ";
    // The device peak: the mode's 2 x 2 run holds what the default 1 x 4 run does (the same chunks' activations, the
    // same held rows) plus what planner::predict_memory adds for the mode, to the byte: the sums and the chunk copies.
    const nn::GPTConfig config = small_gpt_config();
    const size_t copies = size_t{4} * static_cast<size_t>(config.max_seq_len) * sizeof(int32_t) * 2;
    EXPECT_EQ(offloaded.peak - chunked_plain.peak,
              planner::batch_invariant_sum_bytes(nn::ModelConfig(config), precision_dtype(GetParam())) + copies);
}

INSTANTIATE_TEST_SUITE_P(Precision, BatchInvariantDevice, ::testing::Values(Precision::fp32, Precision::bf16),
                         [](const auto& info) { return std::string(info.param == Precision::bf16 ? "bf16" : "f32"); });

} // namespace
} // namespace engine::test
