// The batch-invariant mode (docs/TRAINING.md, "The big batch, bitwise"): the fold's sum is exact (an integer oracle) and
// the same in any order; micro-batch b x accumulation 4, 4b x 1 and 2b x 2 train bitwise the same weights and losses
// over 20 steps (AdamW, weight decay, clipping, padded data; f32 and bf16; with checkpointing and offload), where the default
// mode does not; a window whose gradients pass the bound is redone and still matches; bad configurations refused.
#include <gtest/gtest.h>

#include <cmath>
#include <random>

#include "engine/fixed_point.h"
#include "expect_error.h"
#include "gradcheck.h"
#include "nn/gpt.h"
#include "optim/trainer.h"
#include "parameter_snapshot.h"
#include "planner/planner.h"

namespace engine::testing {
namespace {

using nn::Batch;
using optim::Trainer;
using optim::TrainerConfig;

constexpr int vocabulary = 32;
constexpr int time_steps = 12;

// The fold against integers: each term is rint(g · 2^s), summed as an __int128, which no order can change.
TEST(FixedPointFold, SumsExactlyInAnyOrderAndRoundsOnce) {
    std::mt19937_64 generator(7);
    std::normal_distribution<float> normal(0.0f, 1e-2f);
    constexpr int64_t elements = 70000; // more than one CPU chunk
    constexpr int chunks = 5, exponent = 52 - 3 - 8;
    std::vector<std::vector<float>> terms(chunks, std::vector<float>(elements));
    for (auto& chunk : terms)
        for (float& value : chunk) value = normal(generator) * (generator() % 7 == 0 ? 1e2f : 1.0f);
    terms[2][5] = -200.0f; // below the bound of 2^8
    auto fold = [&](const std::vector<int>& order) {
        const Tensor sum = Tensor::zeros({elements}, DType::f64, Device::cpu);
        const Tensor largest = Tensor::zeros({2}, DType::i32, Device::cpu);
        for (int which : order) {
            const Tensor gradient = Tensor::from_vector<float>(terms[which], {elements}, Device::cpu);
            fixed_point_fold(sum, largest, 1, gradient, exponent);
            for (float value : gradient.to_vector<float>()) EXPECT_EQ(value, 0.0f) << "the fold leaves the buffer zeroed";
        }
        EXPECT_EQ(largest.to_vector<int32_t>()[0], 0) << "only the slot asked for";
        EXPECT_EQ(fixed_point_largest_value(largest.to_vector<int32_t>()[1]), 200.0f);
        return sum.to_vector<double>();
    };
    const std::vector<double> forward = fold({0, 1, 2, 3, 4}), backward = fold({4, 2, 0, 3, 1});
    for (int64_t i = 0; i < elements; ++i) {
        __int128 exact = 0;
        for (const auto& chunk : terms) exact += static_cast<__int128>(std::nearbyint(std::ldexp(double(chunk[i]), exponent)));
        ASSERT_EQ(forward[i], std::ldexp(static_cast<double>(exact), -exponent)) << "element " << i;
        ASSERT_EQ(forward[i], backward[i]) << "element " << i;
    }
    const Tensor sum = Tensor::from_vector<double>(forward, {elements}, Device::cpu);
    const Tensor rounded = Tensor::zeros({elements}, DType::f32, Device::cpu);
    fixed_point_round(rounded, sum);
    const std::vector<float> values = rounded.to_vector<float>();
    for (int64_t i = 0; i < elements; ++i) ASSERT_EQ(values[i], static_cast<float>(forward[i]));
}

TEST(FixedPointFold, ANaNOrdersAboveEveryNumberAndReachesTheSum) {
    const Tensor sum = Tensor::zeros({3}, DType::f64, Device::cpu);
    const Tensor largest = Tensor::zeros({1}, DType::i32, Device::cpu);
    fixed_point_fold(sum, largest, 0, Tensor::from_vector<float>({1.0f, -INFINITY, 2.0f}, {3}, Device::cpu), 20);
    EXPECT_TRUE(std::isinf(fixed_point_largest_value(largest.to_vector<int32_t>()[0])));
    fixed_point_fold(sum, largest, 0, Tensor::from_vector<float>({NAN, 0.0f, 3.0f}, {3}, Device::cpu), 20);
    EXPECT_TRUE(std::isnan(fixed_point_largest_value(largest.to_vector<int32_t>()[0])));
    const std::vector<double> values = sum.to_vector<double>();
    EXPECT_TRUE(std::isnan(values[0]));
    EXPECT_TRUE(std::isinf(values[1]));
    EXPECT_EQ(values[2], 5.0);
}

TEST(FixedPointFold, RefusesMismatchedTensorsNamingThem) {
    const Tensor sum = Tensor::zeros({4}, DType::f64, Device::cpu), largest = Tensor::zeros({1}, DType::i32, Device::cpu);
    expect_error([&] { fixed_point_fold(sum, largest, 0, Tensor::zeros({5}, DType::f32, Device::cpu), 10); }, {"differ in size"});
    expect_error([&] { fixed_point_fold(sum, largest, 1, Tensor::zeros({4}, DType::f32, Device::cpu), 10); }, {"slot 1"});
    expect_error([&] { fixed_point_round(Tensor::zeros({4}, DType::f64, Device::cpu), sum); }, {"f32 gradient"});
}

// Sequences of time_steps positions with their own valid lengths (padding: input 0, label -100).
Batch make_batch(std::mt19937_64& generator, const std::vector<int>& lengths) {
    std::uniform_int_distribution<int> token(0, vocabulary - 1);
    const int64_t rows = static_cast<int64_t>(lengths.size());
    std::vector<int32_t> inputs(static_cast<size_t>(rows * time_steps), 0), labels(inputs.size(), -100);
    for (int64_t row = 0; row < rows; ++row)
        for (int t = 0; t < lengths[static_cast<size_t>(row)]; ++t) {
            const size_t at = static_cast<size_t>(row * time_steps + t);
            inputs[at] = token(generator);
            labels[at] = inputs[at];
        }
    return {Tensor::from_vector<int32_t>(inputs, {rows, time_steps}, Device::cpu),
            Tensor::from_vector<int32_t>(labels, {rows, time_steps}, Device::cpu), Tensor()};
}

// Every step's 4 sequences, as batches of `rows` (the same sequences in the same order whatever `rows`).
std::vector<Batch> window_batches(int steps, int rows) {
    std::mt19937_64 generator(99);
    std::uniform_int_distribution<int> length(2, time_steps);
    std::vector<int> lengths;
    for (int index = 0; index < steps * 4; ++index) lengths.push_back(length(generator));
    std::mt19937_64 tokens(5);
    std::vector<Batch> sequences;
    for (int length_value : lengths) sequences.push_back(make_batch(tokens, {length_value}));
    std::vector<Batch> batches;
    for (size_t first = 0; first < sequences.size(); first += static_cast<size_t>(rows)) {
        std::vector<int32_t> inputs, labels;
        for (int row = 0; row < rows; ++row) {
            const auto in = sequences[first + row].inputs.to_vector<int32_t>();
            const auto out = sequences[first + row].labels.to_vector<int32_t>();
            inputs.insert(inputs.end(), in.begin(), in.end());
            labels.insert(labels.end(), out.begin(), out.end());
        }
        batches.push_back({Tensor::from_vector<int32_t>(inputs, {rows, time_steps}, Device::cpu),
                           Tensor::from_vector<int32_t>(labels, {rows, time_steps}, Device::cpu), Tensor()});
    }
    return batches;
}

struct TrainedRun {
    std::vector<uint8_t> weights;
    std::vector<double> losses, norms;
    int redone = 0;
};

// 20 steps of 4 sequences each, as micro-batch `rows` x accumulation 4 / rows.
TrainedRun train(DType dtype, int rows, int chunk, bool checkpointing = false, double loss_multiplier = 1.0) {
    constexpr int steps = 20;
    nn::GPT model({vocabulary, 16, 2, 2, 16, 0.0f}, 1234, Device::cpu, DType::f32);
    TrainerConfig config;
    config.shape.per_device_train_batch_size = rows;
    config.shape.gradient_accumulation_steps = 4 / rows;
    config.shape.precision = dtype == DType::bf16 ? engine::Precision::bf16 : engine::Precision::fp32;
    config.shape.checkpointing.enabled = checkpointing;
    config.shape.checkpointing.offload = checkpointing; // the segments' inputs to the host and back (a copy on the CPU)
    config.learning_rate = 1e-2;
    config.weight_decay = 0.1;
    config.max_grad_norm = 0.5; // active: these gradients' norm is above it
    config.max_steps = steps;
    config.batch_invariant_chunk = chunk;
    Trainer trainer(model, config);
    if (loss_multiplier != 1.0)
        trainer.set_loss_function([&trainer, loss_multiplier](const Tensor& logits, const Batch& batch) {
            return optim::LossSum{multiply(cross_entropy(logits, Trainer::shift_targets(batch), Reduction::sum),
                                           loss_multiplier),
                                  trainer.count_targets(batch)};
        });
    const std::vector<Batch> batches = window_batches(steps, rows);
    TrainedRun run;
    size_t next = 0;
    for (int step = 0; step < steps; ++step) {
        std::vector<Batch> window(batches.begin() + static_cast<std::ptrdiff_t>(next),
                                  batches.begin() + static_cast<std::ptrdiff_t>(next + 4 / rows));
        next += static_cast<size_t>(4 / rows);
        const optim::Accumulation accumulation = trainer.accumulate_gradients(window);
        run.redone += accumulation.redone;
        const optim::StepResult result = trainer.apply_update(accumulation);
        run.losses.push_back(result.loss);
        run.norms.push_back(result.grad_norm);
    }
    run.weights = bytes_of(model.named_parameters());
    return run;
}

class BatchInvariant : public ::testing::TestWithParam<DType> {
protected:
    void SetUp() override { current_tape().clear(); }
};

TEST_P(BatchInvariant, AnySplitOfTheWindowTrainsTheSameBits) {
    const TrainedRun one_by_four = train(GetParam(), 1, 1), four_by_one = train(GetParam(), 4, 1), two_by_two = train(GetParam(), 2, 1);
    EXPECT_GT(one_by_four.norms.front(), 0.5) << "clipping must be active";
    for (const TrainedRun* other : {&four_by_one, &two_by_two}) {
        EXPECT_EQ(other->losses, one_by_four.losses);
        EXPECT_EQ(other->norms, one_by_four.norms);
        EXPECT_TRUE(other->weights == one_by_four.weights) << "weights differ";
    }
    // Chunks of 2 sequences are another grouping of the rows: the same bits for both splits that it divides.
    const TrainedRun pairs_by_two = train(GetParam(), 2, 2), pairs_by_one = train(GetParam(), 4, 2);
    EXPECT_EQ(pairs_by_one.losses, pairs_by_two.losses);
    EXPECT_TRUE(pairs_by_one.weights == pairs_by_two.weights);
    // The control: without the mode the splits part in the last bits (so the comparison above can fail).
    const TrainedRun plain_one = train(GetParam(), 1, 0), plain_four = train(GetParam(), 4, 0);
    EXPECT_FALSE(plain_one.weights == plain_four.weights) << "the default mode was expected to differ";
    // And the mode trains what the default does, within f32 rounding of the summation order.
    double worst = 0.0;
    for (size_t step = 0; step < one_by_four.losses.size(); ++step)
        worst = std::max(worst, std::fabs(one_by_four.losses[step] - plain_four.losses[step]) / plain_four.losses[step]);
    std::printf("%s: largest relative loss difference from the default mode over 20 steps %.3e\n",
                dtype_name(GetParam()), worst);
    EXPECT_LT(worst, 1e-6); // 6.4e-8 measured in f32 and bf16
}

TEST_P(BatchInvariant, CheckpointingAndOffloadKeepTheBits) {
    const TrainedRun plain = train(GetParam(), 1, 1), checkpointed = train(GetParam(), 4, 1, true);
    EXPECT_EQ(plain.losses, checkpointed.losses);
    EXPECT_TRUE(plain.weights == checkpointed.weights);
}

TEST_P(BatchInvariant, AWindowPastTheBoundIsRedoneAndStillMatches) {
    // A loss scaled by 2^12 gives gradient elements above 2^8 in the first windows: each such window runs again with
    // the tensor's bound raised to its largest element.
    const TrainedRun one = train(GetParam(), 1, 1, false, 4096.0), four = train(GetParam(), 4, 1, false, 4096.0);
    EXPECT_GT(one.redone, 0);
    EXPECT_EQ(one.redone, four.redone);
    EXPECT_EQ(one.losses, four.losses);
    EXPECT_TRUE(one.weights == four.weights);
}

INSTANTIATE_TEST_SUITE_P(Precision, BatchInvariant, ::testing::Values(DType::f32, DType::bf16),
                         [](const auto& info) { return std::string(dtype_name(info.param)); });

TEST(BatchInvariantConfig, RefusesWhatItCannotKeepNamingTheField) {
    TrainerConfig config;
    config.shape.per_device_train_batch_size = 4;
    config.batch_invariant_chunk = 3;
    expect_error([&] { config.validate(); }, {"batch_invariant_chunk 3 does not divide per_device_train_batch_size 4"});
    config.batch_invariant_chunk = 2;
    config.loss_normalization = optim::LossNormalization::mean;
    expect_error([&] { config.validate(); }, {"needs loss_normalization tokens"});
    config.loss_normalization = optim::LossNormalization::tokens;
    config.shape.zero_stage = 2;
    config.shape.checkpointing.enabled = true; // what stage 2 needs of itself
    expect_error([&] { config.validate(); }, {"zero_stage 0 or 1"});
    config.shape.zero_stage = 0;
    config.batch_invariant_chunk = -1;
    expect_error([&] { config.validate(); }, {"must be 0 (off)"});
}

TEST(BatchInvariantConfig, AMicroBatchTheChunkDoesNotDivideIsRefusedBeforeAnyGradientMoves) {
    current_tape().clear();
    nn::GPT model({vocabulary, 16, 2, 2, 16, 0.0f}, 1234, Device::cpu, DType::f32);
    TrainerConfig config;
    config.shape.per_device_train_batch_size = 4;
    config.batch_invariant_chunk = 2;
    Trainer trainer(model, config);
    const std::vector<uint8_t> before = bytes_of(model.named_parameters());
    std::mt19937_64 generator(3);
    expect_error([&] { trainer.accumulate_gradients({make_batch(generator, {5, 6, 7})}); },
                 {"micro-batch 0 has 3 sequences, which batch_invariant_chunk 2 does not divide"});
    for (const Tensor& parameter : model.parameters())
        for (float value : parameter.grad().to_vector<float>()) ASSERT_EQ(value, 0.0f);
    EXPECT_TRUE(before == bytes_of(model.named_parameters()));
}

TEST(BatchInvariantPlanner, SearchesOnlyPlansThatKeepTheChunkAndCountsItsSums) {
    const nn::ModelConfig config(nn::GPTConfig{vocabulary, 16, 2, 2, 16, 0.0f});
    planner::PlannerOptions options;
    options.seq_len = time_steps;
    options.ranks = 2;
    options.precisions = {engine::Precision::fp32, engine::Precision::bf16};
    options.batch_invariant_chunk = 2;
    const planner::PlanSearch search = planner::search_plans(config, SIZE_MAX, 16, options);
    ASSERT_FALSE(search.plans.empty());
    for (const planner::Plan& plan : search.plans) {
        EXPECT_EQ(plan.shape.per_device_train_batch_size % 2, 0) << plan.shape.summary();
        EXPECT_LE(plan.shape.zero_stage, 1) << plan.shape.summary();
        EXPECT_FALSE(plan.shape.offload_optimizer);
        // The chunks' step (micro-batch 2, accumulation · b / 2) plus the sums, which persist.
        const planner::MemoryPrediction chunks = planner::predict_memory(
            config, 2, time_steps, plan.shape.checkpointing, precision_dtype(plan.shape.precision), options.optimizer,
            ZeroSharding::of(plan.shape.zero_stage, 2),
            plan.shape.gradient_accumulation_steps * plan.shape.per_device_train_batch_size / 2, false,
            plan.shape.offload_gradients, false, plan.shape.loss_chunk_tokens, plan.shape.mlp_tile_tokens);
        const size_t sums = planner::batch_invariant_sum_bytes(config, precision_dtype(plan.shape.precision));
        EXPECT_EQ(plan.memory.of(MemoryCategory::gradients), chunks.of(MemoryCategory::gradients) + sums);
        EXPECT_EQ(plan.memory.between_steps_bytes, chunks.between_steps_bytes + sums);
    }
    options.batch_invariant_chunk = 3;
    expect_error([&] { planner::search_plans(config, SIZE_MAX, 16, options); },
                 {"batch-invariant chunk of 3 sequences must divide each rank's 8 sequences"});
}

} // namespace
} // namespace engine::testing
