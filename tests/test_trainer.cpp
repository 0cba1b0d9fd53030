// The accumulation trainer: token-count normalisation makes N micro-batches equal one big batch (gradients,
// then the AdamW step), mean mode does not on padded data, clipping and the schedule act once per optimizer
// step, partial windows, custom losses, and bad input that changes nothing.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <numbers>

#include "gradcheck.h"
#include "parameter_snapshot.h"
#include "nn/gpt.h"
#include "optim/trainer.h"

namespace engine::testing {
namespace {

using nn::Batch;
using optim::LossNormalization;
using optim::Trainer;
using optim::TrainerConfig;

constexpr int vocabulary = 32;
constexpr int time_steps = 12;
constexpr uint64_t model_seed = 1234;

nn::GPTConfig small_config() { return {vocabulary, 16, 2, 2, 16, 0.0f}; }

// rows sequences of time_steps positions; row r holds lengths[r] real tokens, then padding (input 0,
// label -100). Labels are unshifted, as Hugging Face collators make them.
Batch make_batch(std::mt19937_64& generator, const std::vector<int>& lengths, int time = time_steps) {
    std::uniform_int_distribution<int> token(0, vocabulary - 1);
    const int64_t rows = static_cast<int64_t>(lengths.size());
    std::vector<int32_t> inputs(static_cast<size_t>(rows * time), 0), labels(inputs.size(), -100);
    for (int64_t row = 0; row < rows; ++row)
        for (int t = 0; t < lengths[static_cast<size_t>(row)]; ++t) {
            inputs[static_cast<size_t>(row * time + t)] = token(generator);
            labels[static_cast<size_t>(row * time + t)] = inputs[static_cast<size_t>(row * time + t)];
        }
    return {Tensor::from_vector<int32_t>(inputs, {rows, time}, Device::cpu),
            Tensor::from_vector<int32_t>(labels, {rows, time}, Device::cpu), Tensor()};
}

Batch concatenate(const std::vector<Batch>& batches) {
    std::vector<int32_t> inputs, labels;
    int64_t rows = 0;
    for (const Batch& batch : batches) {
        const std::vector<int32_t> batch_inputs = batch.inputs.to_vector<int32_t>();
        const std::vector<int32_t> batch_labels = batch.labels.to_vector<int32_t>();
        inputs.insert(inputs.end(), batch_inputs.begin(), batch_inputs.end());
        labels.insert(labels.end(), batch_labels.begin(), batch_labels.end());
        rows += batch.inputs.size(0);
    }
    const int64_t time = batches[0].inputs.size(1);
    return {Tensor::from_vector<int32_t>(inputs, {rows, time}, Device::cpu),
            Tensor::from_vector<int32_t>(labels, {rows, time}, Device::cpu), Tensor()};
}

// Three micro-batches of two sequences whose valid lengths all differ: the case the "gradient
// accumulation bug" is about.
std::vector<Batch> padded_micro_batches(std::mt19937_64& generator) {
    return {make_batch(generator, {12, 5}), make_batch(generator, {3, 9}), make_batch(generator, {7, 2})};
}
std::vector<Batch> full_length_micro_batches(std::mt19937_64& generator) {
    return {make_batch(generator, {12, 12}), make_batch(generator, {12, 12}), make_batch(generator, {12, 12})};
}

nn::BatchSource source_of(std::vector<Batch> batches, int* pulled = nullptr) {
    auto remaining = std::make_shared<std::vector<Batch>>(std::move(batches));
    auto next = std::make_shared<size_t>(0);
    return [remaining, next, pulled]() -> std::optional<Batch> {
        if (*next >= remaining->size()) return std::nullopt;
        if (pulled) ++*pulled;
        return (*remaining)[(*next)++];
    };
}

TrainerConfig config_with(int accumulation, LossNormalization mode) {
    TrainerConfig config;
    config.shape.per_device_train_batch_size = 2;
    config.shape.gradient_accumulation_steps = accumulation;
    config.loss_normalization = mode;
    config.max_steps = 10;
    return config;
}

// max over elements of |a − b| / max(|b|, floor), the floor a fraction of the largest |b| in that tensor.
// An element far below its tensor's largest is a sum of terms of about that largest size, so changing the
// summation order (three GEMMs instead of one) moves it by rounding noise of that size: ~1e-16 of the largest
// in float64, ~1e-7 in float32. The floors keep that noise from posing as a relative error: float64 1e-4 of
// the largest (noise then stays ≤ ~1e-12), float32 the largest itself (tensor-wise relative error; at a 1e-6
// floor float32 shows up to 2e-4 from summation order alone). A wrong normalisation is off by O(1).
double floor_fraction(DType dtype) { return dtype == DType::f64 ? 1e-4 : 1.0; } // bf16 as f32: tensor-wise
double max_relative_difference(const Snapshot& actual, const Snapshot& expected, double floor_fraction_of_largest) {
    double worst = 0.0;
    for (size_t which = 0; which < expected.size(); ++which) {
        double largest = 0.0;
        for (double value : expected[which]) largest = std::max(largest, std::fabs(value));
        const double floor = std::max(floor_fraction_of_largest * largest, 1e-300);
        for (size_t i = 0; i < expected[which].size(); ++i)
            worst = std::max(worst, std::fabs(actual[which][i] - expected[which][i]) /
                                        std::max(std::fabs(expected[which][i]), floor));
    }
    return worst;
}

// Gradients after accumulating `batches` with N = batches.size() micro-batches per step.
Snapshot accumulated_gradients(const std::vector<Batch>& batches, LossNormalization mode, DType dtype,
                               optim::Accumulation* window = nullptr, int accumulation = 0) {
    nn::GPT model(small_config(), model_seed, Device::cpu, dtype);
    Trainer trainer(model, config_with(accumulation ? accumulation : static_cast<int>(batches.size()), mode));
    const optim::Accumulation result = trainer.accumulate_gradients(batches);
    if (window) *window = result;
    Snapshot gradients = gradients_of(model);
    model.zero_grad();
    return gradients;
}

class GradientAccumulation : public ::testing::TestWithParam<DType> {
protected:
    void SetUp() override { current_tape().clear(); }
    std::mt19937_64 generator = fresh_generator();
    // bf16 (mixed precision) is held to f32's bound. Every activation is computed row by row (the GEMMs'
    // dot products run along K, whatever the number of rows), so a micro-batch's bf16 activations and
    // activation gradients are bitwise those of the same rows inside the big batch. What differs is only how
    // the parameter gradients are summed: three GEMMs adding into the f32 buffers, or one; f32 rounding noise,
    // as in f32 (measured 1.2e-7). Had the window been summed in bf16, each micro-batch's contribution would
    // be rounded to 8 bits on the way in, a difference of order u = 2^-8 = 4e-3, 400x this bound (and terms
    // below u of the running sum would vanish, test_bf16.cpp). A wrong normalisation is off by O(1).
    double tolerance() const { return GetParam() == DType::f64 ? 1e-10 : 1e-5; }
    double difference(const Snapshot& actual, const Snapshot& expected) const {
        return max_relative_difference(actual, expected, floor_fraction(GetParam()));
    }
};

TEST_P(GradientAccumulation, TokenModeMicroBatchesEqualOneBigBatch) {
    const std::vector<Batch> micro = padded_micro_batches(generator);
    optim::Accumulation accumulated, big_window;
    const Snapshot accumulated_grads = accumulated_gradients(micro, LossNormalization::tokens, GetParam(), &accumulated);
    const Snapshot big = accumulated_gradients({concatenate(micro)}, LossNormalization::tokens, GetParam(), &big_window);
    // Targets: labels[:,1:] != -100, i.e. valid length − 1 per sequence: 11+4+2+8+6+1.
    EXPECT_EQ(accumulated.num_items_in_batch, 32);
    EXPECT_EQ(big_window.num_items_in_batch, 32);
    EXPECT_NEAR(accumulated.loss_sum(), big_window.loss_sum(), tolerance() * big_window.loss_sum());
    const double gradient_difference = difference(accumulated_grads, big);
    std::printf("token mode, %s: max relative gradient difference %.3e\n", dtype_name(GetParam()), gradient_difference);
    EXPECT_LE(gradient_difference, tolerance());
}

TEST_P(GradientAccumulation, MeanModeDiffersOnPaddedDataAndAgreesOnEqualLengths) {
    const std::vector<Batch> padded = padded_micro_batches(generator);
    const Snapshot big = accumulated_gradients({concatenate(padded)}, LossNormalization::tokens, GetParam());
    const Snapshot mean = accumulated_gradients(padded, LossNormalization::mean, GetParam());
    const double padded_difference = difference(mean, big);
    std::printf("mean mode on padded data: max relative gradient difference %.3e\n", padded_difference);
    EXPECT_GT(padded_difference, 1e-2) << "mean mode weights tokens unequally on variable lengths";

    const std::vector<Batch> equal = full_length_micro_batches(generator);
    const Snapshot tokens = accumulated_gradients(equal, LossNormalization::tokens, GetParam());
    const Snapshot equal_mean = accumulated_gradients(equal, LossNormalization::mean, GetParam());
    const Snapshot equal_big = accumulated_gradients({concatenate(equal)}, LossNormalization::tokens, GetParam());
    EXPECT_LE(difference(equal_mean, tokens), tolerance());
    EXPECT_LE(difference(equal_mean, equal_big), tolerance());
}

TEST_P(GradientAccumulation, LastPartialWindowNormalisesByWhatItHas) {
    // Five micro-batches with N = 3: the second step sees two, and must equal one batch of those two.
    std::vector<Batch> micro = padded_micro_batches(generator);
    micro.push_back(make_batch(generator, {4, 10}));
    micro.push_back(make_batch(generator, {12, 6}));
    const std::vector<Batch> tail(micro.begin() + 3, micro.end());
    optim::Accumulation partial;
    const Snapshot partial_grads = accumulated_gradients(tail, LossNormalization::tokens, GetParam(), &partial, 3);
    EXPECT_EQ(partial.micro_batches, 2);
    EXPECT_EQ(partial.num_items_in_batch, 3 + 9 + 11 + 5);
    EXPECT_LE(difference(partial_grads, accumulated_gradients({concatenate(tail)}, LossNormalization::tokens, GetParam())),
              tolerance());

    nn::GPT model(small_config(), model_seed, Device::cpu, GetParam());
    Trainer trainer(model, config_with(3, LossNormalization::tokens));
    const nn::BatchSource source = source_of(micro);
    const std::optional<optim::StepResult> first = trainer.train_step(source);
    const std::optional<optim::StepResult> second = trainer.train_step(source);
    ASSERT_TRUE(first && second);
    EXPECT_EQ(first->micro_batches, 3);
    EXPECT_EQ(second->micro_batches, 2);
    EXPECT_EQ(second->num_items_in_batch, 28);
    EXPECT_EQ(second->tokens, 2 * 2 * time_steps);
    EXPECT_FALSE(trainer.train_step(source).has_value());
    EXPECT_EQ(trainer.step(), 2);
}

TEST_P(GradientAccumulation, LastPartialWindowInMeanModeDividesByTheBatchesItHas) {
    // Mean mode (and an unscaled custom loss) divide each micro-batch's mean by the number of micro-batches in
    // the window: a short last window of k = 2 with N = 3 must equal a full window of 2, not be scaled by 2/3.
    std::vector<Batch> tail = {make_batch(generator, {4, 10}), make_batch(generator, {12, 6})};
    const Snapshot short_window = accumulated_gradients(tail, LossNormalization::mean, GetParam(), nullptr, 3);
    const Snapshot full_window = accumulated_gradients(tail, LossNormalization::mean, GetParam(), nullptr, 2);
    EXPECT_LE(difference(short_window, full_window), tolerance());

    // Equal lengths: mean mode over the short window equals one big batch of those two.
    std::vector<Batch> equal = {make_batch(generator, {12, 12}), make_batch(generator, {12, 12})};
    const Snapshot short_equal = accumulated_gradients(equal, LossNormalization::mean, GetParam(), nullptr, 3);
    const Snapshot big = accumulated_gradients({concatenate(equal)}, LossNormalization::tokens, GetParam());
    EXPECT_LE(difference(short_equal, big), tolerance());

    // A custom loss in mean mode (a per-batch mean) in a short window is divided by 2 as well.
    auto custom_gradients = [&](int accumulation) {
        nn::GPT model(small_config(), model_seed, Device::cpu, GetParam());
        Trainer trainer(model, config_with(accumulation, LossNormalization::mean));
        trainer.set_loss_function([&trainer](const Tensor& logits, const Batch& batch) {
            return optim::LossSum{cross_entropy(logits, Trainer::shift_targets(batch), Reduction::sum),
                                  trainer.count_targets(batch)};
        });
        trainer.accumulate_gradients(equal);
        return gradients_of(model);
    };
    EXPECT_LE(difference(custom_gradients(3), big), tolerance());
}

INSTANTIATE_TEST_SUITE_P(Precision, GradientAccumulation, ::testing::Values(DType::f64, DType::f32, DType::bf16),
                         [](const auto& info) { return std::string(dtype_name(info.param)); });

class TrainerTest : public TapeTest {};

TEST_F(TrainerTest, AdamWStepAfterAccumulationEqualsStepOnBigBatch) {
    const std::vector<Batch> micro = padded_micro_batches(generator);
    TrainerConfig config = config_with(3, LossNormalization::tokens);
    config.weight_decay = 0.1;
    config.learning_rate = 1e-2;
    config.max_grad_norm = 0.5; // active: the norm of these gradients is far above it
    nn::GPT accumulated(small_config(), model_seed, Device::cpu, DType::f64);
    Trainer accumulated_trainer(accumulated, config);
    const optim::StepResult small_steps = *accumulated_trainer.train_step(source_of(micro));

    config.shape.gradient_accumulation_steps = 1;
    config.shape.per_device_train_batch_size = 6;
    nn::GPT big(small_config(), model_seed, Device::cpu, DType::f64);
    Trainer big_trainer(big, config);
    const optim::StepResult big_step = *big_trainer.train_step(source_of({concatenate(micro)}));

    EXPECT_GT(big_step.grad_norm, config.max_grad_norm);
    EXPECT_NEAR(small_steps.grad_norm, big_step.grad_norm, 1e-10 * big_step.grad_norm);
    EXPECT_NEAR(small_steps.loss, big_step.loss, 1e-10 * big_step.loss);
    // |a − b| ≤ atol + rtol·|b| per element. An AdamW update is at most about lr in size whatever the gradient
    // (it divides by sqrt(v)), so gradients that are mathematically zero, like the key bias's (softmax ignores
    // a per-row shift), turn rounding noise into updates; atol = 1e-10·lr bounds that noise.
    const Snapshot expected = values_of(big), actual = values_of(accumulated);
    for (size_t which = 0; which < expected.size(); ++which)
        for (size_t i = 0; i < expected[which].size(); ++i)
            ASSERT_LE(std::fabs(actual[which][i] - expected[which][i]),
                      1e-10 * config.learning_rate + 1e-10 * std::fabs(expected[which][i]))
                << "parameter " << which << " element " << i;
    EXPECT_NE(values_of(big), values_of(nn::GPT(small_config(), model_seed, Device::cpu, DType::f64)));
    // Gradients are zeroed after the step; optimizer state holds two moments per parameter, and none for the
    // padded rows of wte (stored with the parameters: vocabulary 32 is padded to 128 rows).
    for (const auto& gradient : gradients_of(accumulated))
        for (double value : gradient) ASSERT_EQ(value, 0.0);
    const size_t padding = size_t(small_config().padded_vocab_size() - vocabulary) * 16 * sizeof(double);
    EXPECT_EQ(small_steps.memory.current(MemoryCategory::optimizer_state),
              2 * (small_steps.memory.current(MemoryCategory::parameters) - padding));
    EXPECT_GT(small_steps.memory.peak(MemoryCategory::activations), 0u);
}

// The step's epilogue (the update writes the bf16 working copies and zeroes the gradients in its own pass): after
// each bf16 step every working copy is its master rounded, so that a refresh changes no bit, and every gradient
// is zero. The weights moved, so the copies were written, not left.
TEST_F(TrainerTest, Bf16StepLeavesEveryCopyItsMasterRoundedAndEveryGradientZero) {
    nn::GPT model(small_config(), model_seed, Device::cpu, DType::f32);
    TrainerConfig config = config_with(2, LossNormalization::tokens);
    config.shape.precision = Precision::bf16;
    config.learning_rate = 1e-2;
    Trainer trainer(model, config);
    EXPECT_TRUE(trainer.optimizer().has_step_epilogue());
    const auto copies = [&] {
        std::vector<std::vector<uint16_t>> bits;
        for (const Tensor& copy : model.working_parameters()) {
            EXPECT_EQ(copy.dtype(), DType::bf16);
            bits.emplace_back();
            for (const bfloat16 value : copy.to_vector<bfloat16>()) bits.back().push_back(value.bits);
        }
        return bits;
    };
    const auto before = copies();
    for (int step = 0; step < 2; ++step) {
        ASSERT_TRUE(trainer.train_step(source_of(padded_micro_batches(generator))).has_value());
        const auto written = copies();
        model.refresh_working_copies();
        EXPECT_EQ(written, copies()) << "step " << step << ": a refresh moved a working copy";
        for (const auto& gradient : gradients_of(model))
            for (double value : gradient) ASSERT_EQ(value, 0.0) << "step " << step;
    }
    EXPECT_NE(copies(), before);
}

TEST_F(TrainerTest, ClipsOnceOnTheAccumulatedGradients) {
    const std::vector<Batch> micro = padded_micro_batches(generator);
    const Snapshot accumulated = accumulated_gradients(micro, LossNormalization::tokens, DType::f64);
    const double norm = global_norm(accumulated);

    // Plain SGD at lr 1 makes the update exactly −coefficient · accumulated gradient, so clipping twice (or
    // per micro-batch) would show.
    TrainerConfig config = config_with(3, LossNormalization::tokens);
    config.optimizer = optim::OptimizerKind::sgd;
    config.sgd_momentum = 0.0;
    config.learning_rate = 1.0;
    config.max_grad_norm = 1e-3;
    nn::GPT model(small_config(), model_seed, Device::cpu, DType::f64);
    const Snapshot before = values_of(model);
    Trainer trainer(model, config);
    const optim::StepResult result = *trainer.train_step(source_of(micro));
    EXPECT_NEAR(result.grad_norm, norm, 1e-12 * norm);
    const double coefficient = config.max_grad_norm / (norm + 1e-6);
    const Snapshot after = values_of(model);
    // The update kernels take their factors as float, so the applied coefficient carries float rounding
    // (≤ 6e-8 relative); a second clip would change the update by a factor of ~1e-3.
    for (size_t which = 0; which < after.size(); ++which)
        for (size_t i = 0; i < after[which].size(); ++i) {
            const double update = after[which][i] - before[which][i];
            const double expected = -coefficient * accumulated[which][i];
            // The update is read back as after − before, each rounded to float64: 4 ulp of the parameter.
            ASSERT_LE(std::fabs(update - expected), 1e-7 * std::fabs(expected) + 4.5e-16 * std::fabs(before[which][i]))
                << "parameter " << which << " element " << i << ": update " << update << ", expected " << expected;
        }
}

TEST_F(TrainerTest, ScheduleAdvancesOncePerOptimizerStep) {
    std::vector<Batch> micro;
    for (int index = 0; index < 15; ++index) micro.push_back(make_batch(generator, {12, 8}));
    TrainerConfig config = config_with(3, LossNormalization::tokens);
    config.lr_scheduler_type = "cosine";
    config.learning_rate = 0.01;
    config.warmup_steps = 2;
    config.max_steps = 6;
    nn::GPT model(small_config(), model_seed, Device::cpu, DType::f32);
    Trainer trainer(model, config);
    int pulled = 0;
    const nn::BatchSource source = source_of(micro, &pulled);
    for (int64_t step = 1; step <= 5; ++step) {
        const optim::StepResult result = *trainer.train_step(source);
        const int64_t index = step - 1; // the 0-based optimizer step this update was
        const double expected = index < 2 ? 0.01 * static_cast<double>(index) / 2.0
                                          : 0.01 * 0.5 * (1.0 + std::cos(std::numbers::pi * (index - 2) / 4.0));
        EXPECT_NEAR(result.learning_rate, expected, 1e-15) << "step " << step;
        EXPECT_NEAR(trainer.optimizer().learning_rate(), expected, 1e-15);
        EXPECT_EQ(result.step, step);
        EXPECT_EQ(result.micro_batches, 3);
    }
    EXPECT_EQ(pulled, 15);
    EXPECT_EQ(trainer.optimizer().step_count(), 5);
    EXPECT_NEAR(trainer.current_learning_rate(), 0.01 * 0.5 * (1.0 + std::cos(std::numbers::pi * 3.0 / 4.0)), 1e-15);
}

TEST_F(TrainerTest, ReportedLossIsTheTrueTokenMeanInBothModes) {
    const std::vector<Batch> micro = padded_micro_batches(generator);
    const Batch big = concatenate(micro);
    double expected = 0.0;
    {
        nn::GPT reference(small_config(), model_seed, Device::cpu, DType::f64);
        NoGradGuard no_grad;
        expected = cross_entropy(reference.forward(big.inputs), Trainer::shift_targets(big), Reduction::mean).item();
    }
    for (LossNormalization mode : {LossNormalization::tokens, LossNormalization::mean}) {
        nn::GPT model(small_config(), model_seed, Device::cpu, DType::f64);
        Trainer trainer(model, config_with(3, mode));
        const optim::StepResult result = *trainer.train_step(source_of(micro));
        EXPECT_NEAR(result.loss, expected, 1e-12 * expected) << mode.name();
        EXPECT_EQ(result.num_items_in_batch, 32);
        EXPECT_EQ(result.tokens, 3 * 2 * time_steps);
        EXPECT_GT(result.tokens_per_second, 0.0);
    }
}

TEST_F(TrainerTest, ShiftLabelsAreUsedAndCountedWhenSupplied) {
    Batch batch = make_batch(generator, {12, 4});
    nn::GPT model(small_config(), model_seed, Device::cpu, DType::f64);
    Trainer trainer(model, config_with(1, LossNormalization::tokens));
    const std::vector<int32_t> shifted = Trainer::shift_targets(batch).to_vector<int32_t>();
    const std::vector<int32_t> labels = batch.labels.to_vector<int32_t>();
    EXPECT_EQ(shifted[0], labels[1]);
    EXPECT_EQ(shifted[time_steps - 1], -100);
    EXPECT_EQ(trainer.count_targets(batch), 11 + 3);

    // A collator's own shift_labels (here: every position predicts token 1) replaces the labels.
    batch.shift_labels = Tensor::full({2, time_steps}, 1.0, DType::i32, Device::cpu);
    EXPECT_EQ(trainer.count_targets(batch), 2 * time_steps);
    EXPECT_EQ(Trainer::shift_targets(batch).to_vector<int32_t>(), std::vector<int32_t>(2 * time_steps, 1));
}

TEST_F(TrainerTest, CustomLossScaledOrDividedByMicroBatchCount) {
    const std::vector<Batch> micro = padded_micro_batches(generator);
    const Snapshot token_mode = accumulated_gradients(micro, LossNormalization::tokens, DType::f64);
    const Snapshot mean_mode = accumulated_gradients(micro, LossNormalization::mean, DType::f64);

    // A custom loss returns its sum and item count; the trainer normalises it like the built-in loss.
    auto gradients_with = [&](LossNormalization mode) {
        nn::GPT model(small_config(), model_seed, Device::cpu, DType::f64);
        Trainer trainer(model, config_with(3, mode));
        trainer.set_loss_function([&trainer](const Tensor& logits, const Batch& batch) {
            return optim::LossSum{cross_entropy(logits, Trainer::shift_targets(batch), Reduction::sum),
                                  trainer.count_targets(batch)};
        });
        trainer.accumulate_gradients(micro);
        return gradients_of(model);
    };
    // Token mode: divided by num_items_in_batch.
    const Snapshot scaled = gradients_with(LossNormalization::tokens);
    EXPECT_LE(max_relative_difference(scaled, token_mode, 1e-4), 1e-12);
    // Mean mode: each micro-batch's mean divided by N.
    const Snapshot unscaled = gradients_with(LossNormalization::mean);
    EXPECT_LE(max_relative_difference(unscaled, mean_mode, 1e-4), 1e-12);
}

TEST_F(TrainerTest, BadTokenThrowsBeforeAnyWeightOrGradientChanges) {
    std::vector<Batch> micro = padded_micro_batches(generator);
    std::vector<int32_t> inputs = micro[1].inputs.to_vector<int32_t>();
    inputs[5] = vocabulary; // one past the end
    micro[1].inputs = Tensor::from_vector<int32_t>(inputs, micro[1].inputs.shape(), Device::cpu);

    nn::GPT model(small_config(), model_seed, Device::cpu, DType::f32);
    const Snapshot before = values_of(model);
    Trainer trainer(model, config_with(3, LossNormalization::tokens));
    try {
        trainer.train_step(source_of(micro));
        FAIL() << "a token outside the vocabulary must throw";
    } catch (const EngineError& error) {
        const std::string message = error.what();
        EXPECT_NE(message.find("micro-batch 1"), std::string::npos) << message;
        EXPECT_NE(message.find("token 32"), std::string::npos) << message;
        EXPECT_NE(message.find("vocabulary"), std::string::npos) << message;
    }
    EXPECT_EQ(values_of(model), before);
    for (const auto& gradient : gradients_of(model))
        for (double value : gradient) ASSERT_EQ(value, 0.0);
    EXPECT_EQ(trainer.step(), 0);
    EXPECT_TRUE(current_tape().empty());
}

TEST_F(TrainerTest, FailureAfterAFirstBackwardLeavesWeightsAndGradientsClean) {
    const std::vector<Batch> micro = padded_micro_batches(generator);
    nn::GPT model(small_config(), model_seed, Device::cpu, DType::f32);
    const Snapshot before = values_of(model);
    Trainer trainer(model, config_with(3, LossNormalization::tokens));
    int calls = 0;
    trainer.set_loss_function([&calls, &trainer](const Tensor& logits, const Batch& batch) {
        ENGINE_CHECK(++calls < 2, "custom loss: failing on purpose on the second micro-batch");
        return optim::LossSum{cross_entropy(logits, Trainer::shift_targets(batch), Reduction::sum),
                              trainer.count_targets(batch)};
    });
    EXPECT_THROW(trainer.train_step(source_of(micro)), EngineError);
    EXPECT_EQ(calls, 2);
    EXPECT_EQ(values_of(model), before);
    for (const auto& gradient : gradients_of(model))
        for (double value : gradient) ASSERT_EQ(value, 0.0);
    EXPECT_TRUE(current_tape().empty());
}

TEST_F(TrainerTest, RejectsBadConfigAndAllIgnoredWindow) {
    nn::GPT model(small_config(), model_seed, Device::cpu, DType::f32);
    TrainerConfig config = config_with(0, LossNormalization::tokens);
    EXPECT_THROW(Trainer(model, config), EngineError);
    config = config_with(1, LossNormalization::tokens);
    config.lr_scheduler_type = "exponential";
    EXPECT_THROW(Trainer(model, config), EngineError);
    config = config_with(1, LossNormalization::tokens);
    config.adam_beta2 = 1.0;
    EXPECT_THROW(Trainer(model, config), EngineError);

    Trainer trainer(model, config_with(1, LossNormalization::tokens));
    EXPECT_THROW(trainer.train_step(source_of({make_batch(generator, {1, 0})})), EngineError); // no target at all
    Batch too_long = make_batch(generator, {17}, 17);
    EXPECT_THROW(trainer.train_step(source_of({too_long})), EngineError);
    EXPECT_EQ(trainer.step(), 0);
}

TEST_F(TrainerTest, RefusesToStartOnATapeLeftByAnEvaluationForward) {
    const std::vector<Batch> micro = padded_micro_batches(generator);
    nn::GPT model(small_config(), model_seed, Device::cpu, DType::f32);
    Trainer trainer(model, config_with(3, LossNormalization::tokens));
    Tensor forgotten = model.forward(micro[0].inputs); // an evaluation without NoGradGuard
    const Snapshot before = values_of(model);
    try {
        trainer.train_step(source_of(micro));
        FAIL() << "a dirty tape must be refused";
    } catch (const EngineError& error) {
        EXPECT_NE(std::string(error.what()).find("NoGradGuard"), std::string::npos) << error.what();
    }
    EXPECT_EQ(values_of(model), before);
    current_tape().clear();
}

} // namespace
} // namespace engine::testing
