// The generic trainer (optim/module_trainer.h) on a model that is not a GPT: a two-layer MLP classifier of
// our own with a user loss returning (sum, items). Uneven micro-batches in token mode equal one big batch,
// token and mean mode differ exactly as SPEC.md §1 says, the clip acts once, the non-finite guard holds, the
// loss falls, and the seams refuse what they cannot do.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>

#include "expect_error.h"
#include "gradcheck.h"
#include "parameter_snapshot.h"
#include "nn/gpt.h"
#include "nn/layers.h"
#include "optim/trainer.h"
#include "optim/training_state.h"

namespace engine::testing {
namespace {

using optim::LossNormalization;
using optim::ModuleTrainer;
using optim::TrainerConfig;

constexpr int features = 6;
constexpr int hidden = 10;
constexpr int classes = 4;
constexpr uint64_t model_seed = 77;

// linear -> gelu -> linear. No checkpointable layers: it keeps Module's default set_checkpointing.
class TinyMlp : public nn::Module {
public:
    explicit TinyMlp(DType dtype) : first(features, hidden, init(dtype), 0.5), second(hidden, classes, init(dtype), 0.5) {
        register_module("first", first);
        register_module("second", second);
    }
    Tensor forward(const Tensor& input) const { return second.forward(gelu(first.forward(input))); } // (R,K)
    nn::Linear first, second;

private:
    static nn::InitOptions init(DType dtype) {
        return nn::InitOptions(nn::ParameterOptions{std::make_shared<nn::Generator>(model_seed), dtype, Device::cpu},
                               0.02);
    }
};

// rows of features; a target -100 marks a padding row that is no item.
struct MlpBatch {
    Tensor inputs;  // (R,F)
    Tensor targets; // (R) i32
};

Tensor tensor_of(const std::vector<double>& values, const Shape& shape, DType dtype) {
    if (dtype == DType::f64) return Tensor::from_vector<double>(values, shape, Device::cpu);
    return Tensor::from_vector<float>(std::vector<float>(values.begin(), values.end()), shape, Device::cpu);
}

MlpBatch make_batch(std::mt19937_64& generator, int rows, int padding_rows, DType dtype) {
    std::normal_distribution<double> value(0.0, 1.0);
    std::uniform_int_distribution<int> label(0, classes - 1);
    std::vector<double> inputs(static_cast<size_t>(rows * features));
    for (double& x : inputs) x = value(generator);
    std::vector<int32_t> targets(static_cast<size_t>(rows));
    for (int row = 0; row < rows; ++row) targets[static_cast<size_t>(row)] = row < rows - padding_rows ? label(generator) : -100;
    return {tensor_of(inputs, {rows, features}, dtype),
            Tensor::from_vector<int32_t>(targets, {rows}, Device::cpu)};
}

MlpBatch concatenate(const std::vector<MlpBatch>& batches, DType dtype) {
    std::vector<double> inputs;
    std::vector<int32_t> targets;
    for (const MlpBatch& batch : batches) {
        const std::vector<double> x = as_doubles(batch.inputs);
        const std::vector<int32_t> t = batch.targets.to_vector<int32_t>();
        inputs.insert(inputs.end(), x.begin(), x.end());
        targets.insert(targets.end(), t.begin(), t.end());
    }
    const int64_t rows = static_cast<int64_t>(targets.size());
    return {tensor_of(inputs, {rows, features}, dtype),
            Tensor::from_vector<int32_t>(targets, {rows}, Device::cpu)};
}

// The user's side of the API: the items are counted on the host before any forward; the loss is a sum.
optim::TrainingTask<MlpBatch> task_for(const TinyMlp& model) {
    optim::TrainingTask<MlpBatch> task;
    task.count_items = [](const MlpBatch& batch) {
        const std::vector<int32_t> targets = batch.targets.to_vector<int32_t>();
        return static_cast<int64_t>(std::count_if(targets.begin(), targets.end(), [](int32_t t) { return t != -100; }));
    };
    task.loss = [&model, count = task.count_items](const MlpBatch& batch, const optim::LossScale&) {
        return optim::LossSum{cross_entropy(model.forward(batch.inputs), batch.targets, Reduction::sum), count(batch)};
    };
    task.count_tokens = [](const MlpBatch& batch) { return batch.inputs.size(0); };
    return task;
}

std::vector<optim::MicroBatch> micro_batches_of(const std::vector<MlpBatch>& batches, const optim::TrainingTask<MlpBatch>& task) {
    std::vector<optim::MicroBatch> micro;
    for (const MlpBatch& batch : batches) micro.push_back(task.micro_batch(batch));
    return micro;
}

TrainerConfig config_with(int accumulation, LossNormalization mode) {
    TrainerConfig config;
    config.shape.gradient_accumulation_steps = accumulation;
    config.loss_normalization = mode;
    return config;
}

// Tensor-wise relative difference: max |a − b| over a tensor / max |b| of that tensor, the worst tensor.
double tensorwise_difference(const Snapshot& actual, const Snapshot& expected) {
    double worst = 0.0;
    for (size_t which = 0; which < expected.size(); ++which) {
        double largest = 1e-300, error = 0.0;
        for (size_t i = 0; i < expected[which].size(); ++i) {
            largest = std::max(largest, std::fabs(expected[which][i]));
            error = std::max(error, std::fabs(actual[which][i] - expected[which][i]));
        }
        worst = std::max(worst, error / largest);
    }
    return worst;
}

// Gradients after one window over `batches` (N = their count unless given), without an update.
Snapshot window_gradients(const std::vector<MlpBatch>& batches, LossNormalization mode, DType dtype,
                          optim::Accumulation* window = nullptr) {
    TinyMlp model(dtype);
    ModuleTrainer trainer(model, config_with(static_cast<int>(batches.size()), mode));
    const optim::Accumulation result = trainer.accumulate(micro_batches_of(batches, task_for(model)));
    if (window) *window = result;
    return gradients_of(model);
}

// Three micro-batches whose item counts differ: 4 of 5 rows, 1 of 3, 3 of 3 (8 items).
std::vector<MlpBatch> uneven_batches(std::mt19937_64& generator, DType dtype) {
    return {make_batch(generator, 5, 1, dtype), make_batch(generator, 3, 2, dtype), make_batch(generator, 3, 0, dtype)};
}

class GenericTrainer : public ::testing::TestWithParam<DType> {
protected:
    void SetUp() override { current_tape().clear(); }
    std::mt19937_64 generator = fresh_generator();
};

TEST_P(GenericTrainer, TokenModeUnevenMicroBatchesEqualOneBigBatch) {
    const DType dtype = GetParam();
    const std::vector<MlpBatch> micro = uneven_batches(generator, dtype);
    optim::Accumulation accumulated, big_window;
    const Snapshot accumulated_gradients = window_gradients(micro, LossNormalization::tokens, dtype, &accumulated);
    const Snapshot big = window_gradients({concatenate(micro, dtype)}, LossNormalization::tokens, dtype, &big_window);
    EXPECT_EQ(accumulated.num_items_in_batch, 8);
    EXPECT_EQ(big_window.num_items_in_batch, 8);
    EXPECT_EQ(accumulated.tokens, 11);
    // Both compute the same per-row products; they differ only in how the 11 rows' contributions are summed
    // (three GEMMs over 5, 3, 3 rows plus two additions into the buffer, or one over 11) and the loss's sum.
    // Each way is within γ_13 = 13u of the exact sum of |terms| (Higham, summation), so the difference is
    // within 26u·κ of the tensor's largest element, κ = Σ|terms| / max|gradient| (≤ ~10 here: 11 rows of O(1)
    // terms, at most partly cancelling): 26·2^-53·10 = 2.9e-14 in f64, 26·2^-24·10 = 1.5e-5 in f32. A wrong
    // normalisation (mean mode, say) is off by O(1).
    const double bound = dtype == DType::f64 ? 3e-14 : 1.5e-5;
    const double difference = tensorwise_difference(accumulated_gradients, big);
    std::printf("generic trainer, %s: tensor-wise gradient difference window vs big batch %.3e (bound %.1e)\n",
                dtype_name(dtype), difference, bound);
    EXPECT_LE(difference, bound);
    EXPECT_NEAR(accumulated.loss_sum(), big_window.loss_sum(), bound * big_window.loss_sum());
}

INSTANTIATE_TEST_SUITE_P(Precision, GenericTrainer, ::testing::Values(DType::f64, DType::f32),
                         [](const auto& info) { return std::string(dtype_name(info.param)); });

class GenericTrainerTest : public TapeTest {};

TEST_F(GenericTrainerTest, TokenAndMeanModeDifferExactlyAsTheSpecSays) {
    // The oracle: each micro-batch alone (N = 1, where both modes are sum_k / items_k) gives M_k, the gradient
    // of its own item mean. SPEC.md: token mode's window gradient is Σ_k items_k·M_k / Σ items, mean mode's
    // is Σ_k M_k / N. f64 throughout: the identities hold to rounding (bound as above, 3e-14).
    const std::vector<MlpBatch> micro = uneven_batches(generator, DType::f64);
    const std::vector<double> items = {4, 1, 3};
    std::vector<Snapshot> alone;
    for (const MlpBatch& batch : micro) alone.push_back(window_gradients({batch}, LossNormalization::tokens, DType::f64));
    Snapshot expected_tokens = alone[0], expected_mean = alone[0];
    for (size_t which = 0; which < alone[0].size(); ++which)
        for (size_t i = 0; i < alone[0][which].size(); ++i) {
            double tokens = 0.0, mean = 0.0;
            for (size_t k = 0; k < micro.size(); ++k) {
                tokens += items[k] * alone[k][which][i] / 8.0;
                mean += alone[k][which][i] / 3.0;
            }
            expected_tokens[which][i] = tokens;
            expected_mean[which][i] = mean;
        }
    const Snapshot token_mode = window_gradients(micro, LossNormalization::tokens, DType::f64);
    const Snapshot mean_mode = window_gradients(micro, LossNormalization::mean, DType::f64);
    const double token_error = tensorwise_difference(token_mode, expected_tokens);
    const double mean_error = tensorwise_difference(mean_mode, expected_mean);
    const double modes_apart = tensorwise_difference(mean_mode, token_mode);
    std::printf("token mode vs Σ items_k M_k / total %.3e; mean mode vs Σ M_k / N %.3e; modes apart %.3e\n",
                token_error, mean_error, modes_apart);
    EXPECT_LE(token_error, 3e-14);
    EXPECT_LE(mean_error, 3e-14);
    EXPECT_GT(modes_apart, 1e-2) << "uneven item counts weigh the micro-batches differently in mean mode";

    // Equal item counts: the two modes agree (to rounding).
    const std::vector<MlpBatch> equal = {make_batch(generator, 3, 0, DType::f64), make_batch(generator, 3, 0, DType::f64)};
    EXPECT_LE(tensorwise_difference(window_gradients(equal, LossNormalization::mean, DType::f64),
                                    window_gradients(equal, LossNormalization::tokens, DType::f64)),
              3e-14);
}

TEST_F(GenericTrainerTest, ClipsOnceOnTheAccumulatedGradients) {
    const std::vector<MlpBatch> micro = uneven_batches(generator, DType::f64);
    const Snapshot accumulated = window_gradients(micro, LossNormalization::tokens, DType::f64);
    const double norm = global_norm(accumulated);

    // SGD at lr 1 without momentum: the update is exactly −coefficient · accumulated gradient.
    TrainerConfig config = config_with(3, LossNormalization::tokens);
    config.optimizer = optim::OptimizerKind::sgd;
    config.sgd_momentum = 0.0;
    config.learning_rate = 1.0;
    config.max_grad_norm = 1e-3;
    TinyMlp model(DType::f64);
    const Snapshot before = values_of(model);
    ModuleTrainer trainer(model, config);
    const optim::TrainingTask<MlpBatch> task = task_for(model);
    size_t next = 0;
    const std::function<std::optional<MlpBatch>()> source = [&]() -> std::optional<MlpBatch> {
        if (next >= micro.size()) return std::nullopt;
        return micro[next++];
    };
    const optim::StepResult result = *trainer.train_step(source, task);
    EXPECT_EQ(result.micro_batches, 3);
    EXPECT_EQ(result.num_items_in_batch, 8);
    EXPECT_GT(norm, 10 * config.max_grad_norm);
    EXPECT_NEAR(result.grad_norm, norm, 1e-12 * norm);
    const double coefficient = config.max_grad_norm / (norm + 1e-6);
    const Snapshot after = values_of(model);
    double worst = 0.0;
    for (size_t which = 0; which < after.size(); ++which)
        for (size_t i = 0; i < after[which].size(); ++i) {
            const double update = after[which][i] - before[which][i];
            const double expected = -coefficient * accumulated[which][i];
            // The update kernels take their factors as float (≤ 6e-8 relative); the read-back after − before
            // is 4 ulp of the parameter. A second clip would scale the update by ~1e-3.
            worst = std::max(worst, std::fabs(update - expected) / std::max(std::fabs(expected), 1e-300));
            ASSERT_LE(std::fabs(update - expected), 1e-7 * std::fabs(expected) + 4.5e-16 * std::fabs(before[which][i]))
                << "parameter " << which << " element " << i;
        }
    std::printf("clip: grad norm %.6f, coefficient %.3e, worst relative update error %.3e\n", norm, coefficient, worst);
    EXPECT_FALSE(trainer.train_step(source, task).has_value());
}

TEST_F(GenericTrainerTest, NonFiniteLossThrowsOrSkipsWithoutTouchingTheWeights) {
    std::vector<MlpBatch> micro = uneven_batches(generator, DType::f32);
    std::vector<float> poisoned = micro[1].inputs.to_vector<float>();
    poisoned[2] = std::numeric_limits<float>::quiet_NaN();
    micro[1].inputs = Tensor::from_vector<float>(poisoned, micro[1].inputs.shape(), Device::cpu);
    for (bool skip : {false, true}) {
        TinyMlp model(DType::f32);
        const Snapshot before = values_of(model);
        TrainerConfig config = config_with(3, LossNormalization::tokens);
        config.skip_nonfinite = skip;
        ModuleTrainer trainer(model, config);
        const optim::Accumulation window = trainer.accumulate(micro_batches_of(micro, task_for(model)));
        if (!skip) {
            try {
                trainer.apply_update(window);
                FAIL() << "a NaN loss must throw";
            } catch (const EngineError& error) {
                const std::string message = error.what();
                EXPECT_NE(message.find("non-finite"), std::string::npos) << message;
                EXPECT_NE(message.find("first.weight"), std::string::npos) << message; // the first such parameter
            }
        } else {
            const optim::StepResult result = trainer.apply_update(window);
            EXPECT_TRUE(result.skipped);
            EXPECT_EQ(trainer.skipped_steps(), 1);
        }
        EXPECT_EQ(trainer.step(), 0);
        EXPECT_EQ(values_of(model), before);
        for (const auto& gradient : gradients_of(model))
            for (double value : gradient) ASSERT_EQ(value, 0.0);
    }
}

TEST_F(GenericTrainerTest, LossFallsOverSteps) {
    // A fixed dataset of 4 micro-batches of uneven items, trained 40 steps of 2 micro-batches with AdamW.
    std::vector<MlpBatch> data;
    for (int index = 0; index < 4; ++index) data.push_back(make_batch(generator, 6, index % 3, DType::f32));
    TinyMlp model(DType::f32);
    TrainerConfig config = config_with(2, LossNormalization::tokens);
    config.learning_rate = 3e-2;
    config.max_steps = 40;
    ModuleTrainer trainer(model, config);
    const optim::TrainingTask<MlpBatch> task = task_for(model);
    (void)model.forward(data[0].inputs); // a forward in grad mode, dropped: the next window must still run
    size_t next = 0;
    const std::function<std::optional<MlpBatch>()> cycle = [&]() -> std::optional<MlpBatch> {
        return data[next++ % data.size()];
    };
    double first = 0.0, last = 0.0;
    for (int step = 0; step < 40; ++step) {
        const optim::StepResult result = *trainer.train_step(cycle, task);
        ASSERT_TRUE(std::isfinite(result.loss));
        if (step < 2) first += result.loss / 2; // the two windows cover the data once
        if (step >= 38) last += result.loss / 2;
    }
    std::printf("generic trainer: mean loss over the data %.4f at the start, %.4f after 40 steps (ln 4 = %.4f)\n", first,
                last, std::log(4.0));
    EXPECT_EQ(trainer.step(), 40);
    EXPECT_LT(last, 0.5 * first);
}

TEST_F(GenericTrainerTest, EvaluationRecordsNothingAndMatchesTheStepLoss) {
    const std::vector<MlpBatch> micro = uneven_batches(generator, DType::f64);
    TinyMlp model(DType::f64);
    ModuleTrainer trainer(model, config_with(3, LossNormalization::tokens));
    const optim::TrainingTask<MlpBatch> task = task_for(model);
    const Snapshot before = values_of(model);
    const ModuleTrainer::Evaluation evaluation = trainer.evaluate(micro_batches_of(micro, task));
    EXPECT_TRUE(current_tape().empty());
    EXPECT_TRUE(model.training()); // restored
    EXPECT_EQ(values_of(model), before);
    for (const auto& gradient : gradients_of(model))
        for (double value : gradient) ASSERT_EQ(value, 0.0);
    EXPECT_EQ(evaluation.num_items_in_batch, 8);
    // The step's reported loss is computed from the same weights, before its update, by the same forwards.
    const optim::StepResult step = trainer.apply_update(trainer.accumulate(micro_batches_of(micro, task)));
    std::printf("evaluation loss %.17g, the step's reported loss %.17g\n", evaluation.loss, step.loss);
    EXPECT_EQ(evaluation.loss, step.loss);
}

TEST_F(GenericTrainerTest, GptEvaluationRunsUnderNoGradAndMatchesTheStepLoss) {
    // The GPT trainer's evaluate: the fused classifier under NoGradGuard leaves the logits intact and records
    // nothing; the loss equals the one the step then reports from the same weights.
    nn::GPT model({32, 16, 2, 2, 16, 0.0f}, model_seed, Device::cpu, DType::f64);
    optim::Trainer trainer(model, config_with(2, LossNormalization::tokens));
    std::uniform_int_distribution<int> token(0, 31);
    std::vector<nn::Batch> batches;
    for (int index = 0; index < 2; ++index) {
        std::vector<int32_t> ids(2 * 8);
        for (int32_t& id : ids) id = token(generator);
        const Tensor tokens = Tensor::from_vector<int32_t>(ids, {2, 8}, Device::cpu);
        batches.push_back({tokens, tokens, Tensor()});
    }
    const ModuleTrainer::Evaluation evaluation = trainer.evaluate(batches);
    EXPECT_TRUE(current_tape().empty());
    EXPECT_EQ(evaluation.num_items_in_batch, 2 * 2 * 7);
    for (const auto& gradient : gradients_of(model))
        for (double value : gradient) ASSERT_EQ(value, 0.0);
    const optim::StepResult step = trainer.apply_update(trainer.accumulate_gradients(batches));
    std::printf("GPT evaluation loss %.17g, the step's reported loss %.17g\n", evaluation.loss, step.loss);
    EXPECT_NEAR(evaluation.loss, step.loss, 1e-14 * step.loss); // the same sums, from another kernel path
}

TEST_F(GenericTrainerTest, SavedStateResumesBitwise) {
    // Training state (weights, AdamW moments and step, RNG) of a non-GPT module: 2 steps, capture, restore into
    // a fresh model and trainer, 2 more steps; against 4 steps straight. Same arithmetic: bitwise.
    std::vector<MlpBatch> data;
    for (int index = 0; index < 8; ++index) data.push_back(make_batch(generator, 4, index % 2, DType::f32));
    auto run = [&](ModuleTrainer& trainer, const TinyMlp& model, size_t first, size_t count) {
        const optim::TrainingTask<MlpBatch> task = task_for(model);
        size_t next = first;
        const std::function<std::optional<MlpBatch>()> source = [&]() -> std::optional<MlpBatch> {
            if (next >= first + count) return std::nullopt;
            return data[next++];
        };
        while (trainer.train_step(source, task)) {}
    };
    TrainerConfig config = config_with(2, LossNormalization::tokens);
    config.learning_rate = 1e-2;
    TinyMlp straight_model(DType::f32);
    ModuleTrainer straight(straight_model, config);
    run(straight, straight_model, 0, 8);

    TinyMlp first_model(DType::f32);
    ModuleTrainer first(first_model, config);
    run(first, first_model, 0, 4);
    const io::TrainingState state = optim::capture_training_state(first, nullptr);
    TinyMlp resumed_model(DType::f32);
    ModuleTrainer resumed(resumed_model, config);
    optim::restore_training_state(state, resumed, nullptr);
    EXPECT_EQ(resumed.step(), 2);
    run(resumed, resumed_model, 4, 4);
    EXPECT_EQ(resumed.step(), 4);
    EXPECT_EQ(values_of(resumed_model), values_of(straight_model));
    EXPECT_NE(values_of(resumed_model), values_of(TinyMlp(DType::f32)));
}

TEST_F(GenericTrainerTest, SeamsRefuseWhatTheyCannotDo) {
    TinyMlp model(DType::f32);
    // A checkpoint policy for a module without checkpointable layers is refused, not ignored.
    TrainerConfig checkpointed = config_with(1, LossNormalization::tokens);
    checkpointed.shape.checkpointing.enabled = true;
    try {
        ModuleTrainer refused(model, checkpointed);
        FAIL() << "gradient_checkpointing on a module without checkpointable layers must throw";
    } catch (const EngineError& error) {
        EXPECT_NE(std::string(error.what()).find("no checkpointable layers"), std::string::npos) << error.what();
    }
    // A loss that sums over other items than were counted before its forward is refused, and nothing moves.
    ModuleTrainer trainer(model, config_with(2, LossNormalization::tokens));
    const Snapshot before = values_of(model);
    std::vector<optim::MicroBatch> micro = micro_batches_of(uneven_batches(generator, DType::f32), task_for(model));
    micro.resize(2);
    micro[1].items += 1;
    try {
        trainer.accumulate(micro);
        FAIL() << "a count that does not match the loss must throw";
    } catch (const EngineError& error) {
        EXPECT_NE(std::string(error.what()).find("counted as 2"), std::string::npos) << error.what();
    }
    EXPECT_EQ(values_of(model), before);
    for (const auto& gradient : gradients_of(model))
        for (double value : gradient) ASSERT_EQ(value, 0.0);
    EXPECT_TRUE(current_tape().empty());
    // validate() names the field.
    TrainerConfig bad = config_with(1, LossNormalization::tokens);
    bad.shape.checkpointing.prefetch = true;
    ASSERT_TRUE(bad.problem().has_value());
    EXPECT_EQ(bad.problem()->field, "prefetch");
    EXPECT_THROW(bad.validate(), EngineError);
}

// The batch-invariant mode through the generic API: each MicroBatch is one chunk, train_step pulls as many as make a
// window (accumulation x per-device batch / chunk), any grouping of the same chunks trains the same bits, and a second
// window before apply_update is refused.
TEST(GenericTrainer, BatchInvariantChunksMakeTheWindowWhateverTheirGrouping) {
    std::mt19937_64 generator(5);
    std::vector<MlpBatch> chunks;
    for (int index = 0; index < 8; ++index) chunks.push_back(make_batch(generator, 1, index % 3 == 2 ? 1 : 0, DType::f32));
    auto train = [&](int per_device, int accumulation, std::vector<int>* pulled_per_step) {
        TinyMlp model(DType::f32);
        TrainerConfig config = config_with(accumulation, LossNormalization::tokens);
        config.shape.per_device_train_batch_size = per_device;
        config.batch_invariant_chunk = 1;
        config.max_grad_norm = 0.5;
        optim::ModuleTrainer trainer(model, config);
        const optim::TrainingTask<MlpBatch> task = task_for(model);
        size_t next = 0;
        const std::function<std::optional<MlpBatch>()> source = [&]() -> std::optional<MlpBatch> {
            if (next == chunks.size()) return std::nullopt;
            return chunks[next++];
        };
        while (const std::optional<optim::StepResult> result = trainer.train_step(source, task))
            if (pulled_per_step != nullptr) pulled_per_step->push_back(result->micro_batches);
        return bytes_of(model.named_parameters());
    };
    std::vector<int> pulled;
    const std::vector<uint8_t> four_by_one = train(4, 1, &pulled);
    EXPECT_EQ(pulled, (std::vector<int>{4, 4})) << "a window of 4 chunks of 1";
    EXPECT_TRUE(train(2, 2, nullptr) == four_by_one);
    EXPECT_TRUE(train(1, 4, nullptr) == four_by_one);

    TinyMlp model(DType::f32);
    TrainerConfig config = config_with(1, LossNormalization::tokens);
    config.shape.per_device_train_batch_size = 2;
    config.batch_invariant_chunk = 1;
    optim::ModuleTrainer trainer(model, config);
    const optim::TrainingTask<MlpBatch> task = task_for(model);
    const std::vector<optim::MicroBatch> window = micro_batches_of({chunks[0], chunks[1]}, task);
    const optim::Accumulation first = trainer.accumulate(window);
    expect_error([&] { trainer.accumulate(window); }, {"the last window's gradient has not been applied"});
    trainer.apply_update(first);
    trainer.accumulate(window); // taken: the next window runs
}

} // namespace
} // namespace engine::testing
