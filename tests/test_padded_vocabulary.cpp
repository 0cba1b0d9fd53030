// The vocabulary padded to a multiple of 128 inside GPT: users see (…,V) logits and a (V,C) wte, the loss
// sees only the first V of Vp columns, the padding rows stay exactly zero through AdamW steps with weight
// decay, and the column copy that hands out (…,V) is differentiable.
#include "expect_error.h"
#include "gradcheck.h"
#include "nn/io/safetensors.h"
#include "optim/trainer.h"

namespace engine::testing {
namespace {

nn::GPTConfig config_with_vocabulary(int vocabulary) { return {vocabulary, 8, 2, 2, 16, 0.0f}; }

Tensor random_tokens(std::mt19937_64& generator, int vocabulary, int batch, int time) {
    std::uniform_int_distribution<int32_t> token(0, vocabulary - 1);
    std::vector<int32_t> ids(static_cast<size_t>(batch * time));
    for (int32_t& id : ids) id = token(generator);
    return Tensor::from_vector<int32_t>(ids, {batch, time}, Device::cpu);
}

// The padding rows of wte's storage and of its gradient buffer: every one of them must be 0.
std::vector<double> values_of(const Tensor& tensor) {
    if (tensor.dtype() == DType::f64) return tensor.to_vector<double>();
    const std::vector<float> values = tensor.to_vector<float>();
    return {values.begin(), values.end()};
}

std::vector<double> padding_of(const Tensor& padded, int vocabulary) {
    const std::vector<double> values = values_of(padded);
    const size_t width = static_cast<size_t>(padded.size(1));
    return {values.begin() + static_cast<std::ptrdiff_t>(vocabulary * width), values.end()};
}

TEST(PaddedVocabulary, ShapesCountsAndStorage) {
    const nn::GPTConfig config = config_with_vocabulary(50);
    EXPECT_EQ(config.padded_vocab_size(), 128);
    EXPECT_EQ(nn::GPTConfig::named("gpt2-124M").padded_vocab_size(), 50304);
    EXPECT_EQ(config_with_vocabulary(256).padded_vocab_size(), 256);
    const size_t before = memory_stats(Device::cpu).current(MemoryCategory::parameters);
    nn::GPT model(config, 3, Device::cpu, DType::f64);
    const size_t stored = memory_stats(Device::cpu).current(MemoryCategory::parameters) - before;
    EXPECT_EQ(model.wte.weight.shape(), (Shape{50, 16}));
    EXPECT_EQ(model.wte.padded_weight.shape(), (Shape{128, 16}));
    EXPECT_EQ(model.wte.weight.raw_data(), model.wte.padded_weight.raw_data());
    EXPECT_EQ(model.wte.weight.grad().raw_data(), model.wte.padded_weight.grad().raw_data());
    // Reported parameters are the real ones; the allocation holds the padding rows as well.
    EXPECT_EQ(stored, (model.parameter_count() + (128 - 50) * 16) * sizeof(double));
    for (double value : padding_of(model.wte.padded_weight, 50)) ASSERT_EQ(value, 0.0);
    // The first V rows are the unpadded initialisation: the same draw as a model whose V needs no padding
    // would make for those rows, so a seed gives the same weights as before the padding.
    nn::GPT unpadded(config_with_vocabulary(128), 3, Device::cpu, DType::f64);
    const std::vector<double> real = model.wte.weight.to_vector<double>();
    const std::vector<double> reference = unpadded.wte.weight.to_vector<double>();
    EXPECT_EQ(real, std::vector<double>(reference.begin(), reference.begin() + 50 * 16));
}

TEST(PaddedVocabulary, ForwardReturnsTheRealColumnsOfThePaddedLogits) {
    std::mt19937_64 generator = fresh_generator();
    nn::GPT model(config_with_vocabulary(50), 5, Device::cpu, DType::f64);
    const Tensor tokens = random_tokens(generator, 50, 2, 8);
    NoGradGuard no_grad;
    const Tensor logits = model.forward(tokens), padded = model.forward_padded(tokens);
    ASSERT_EQ(logits.shape(), (Shape{2, 8, 50}));
    ASSERT_EQ(padded.shape(), (Shape{2, 8, 128}));
    const std::vector<double> real = logits.to_vector<double>(), all = padded.to_vector<double>();
    for (int row = 0; row < 16; ++row)
        for (int column = 0; column < 128; ++column) {
            const double value = all[static_cast<size_t>(row * 128 + column)];
            if (column < 50) ASSERT_EQ(value, real[static_cast<size_t>(row * 50 + column)]);
            else ASSERT_EQ(value, 0.0) << "padded column " << column; // x · (zero row)
        }
}

// The fused loss over (…,Vp) with vocabulary V against plain cross_entropy over the (…,V) forward: same
// loss, same gradients for every parameter, and no gradient in the padding rows.
TEST(PaddedVocabulary, PaddedLossMatchesTheLossOverTheRealColumns) {
    std::mt19937_64 generator = fresh_generator();
    nn::GPT model(config_with_vocabulary(50), 5, Device::cpu, DType::f64);
    const Tensor tokens = random_tokens(generator, 50, 2, 8);
    std::vector<int32_t> labels = random_tokens(generator, 50, 2, 8).to_vector<int32_t>();
    labels[3] = default_ignore_index;
    const Tensor targets = Tensor::from_vector<int32_t>(labels, {2, 8}, Device::cpu);
    auto run = [&](bool padded) {
        model.zero_grad();
        Tensor loss;
        {
            const Tensor logits = padded ? model.forward_padded(tokens) : model.forward(tokens);
            loss = padded ? cross_entropy_in_place(logits, targets, Reduction::mean, 1.0, default_ignore_index, 50)
                          : cross_entropy(logits, targets, Reduction::mean);
        }
        const double value = loss.item();
        backward(loss);
        std::vector<std::vector<double>> gradients;
        for (const auto& [name, parameter] : model.named_parameters()) gradients.push_back(parameter.grad().to_vector<double>());
        return std::make_pair(value, gradients);
    };
    const auto [plain_loss, plain] = run(false);
    const auto [padded_loss, padded] = run(true);
    EXPECT_NEAR(padded_loss, plain_loss, 1e-13 * plain_loss);
    for (size_t which = 0; which < plain.size(); ++which)
        for (size_t i = 0; i < plain[which].size(); ++i)
            ASSERT_NEAR(padded[which][i], plain[which][i], 1e-12 * (1.0 + std::fabs(plain[which][i])))
                << "parameter " << which << " element " << i;
    for (double value : padding_of(model.wte.padded_weight.grad(), 50)) ASSERT_EQ(value, 0.0);
    expect_error(
        [&] {
            const Tensor logits = model.forward_padded(tokens);
            cross_entropy_in_place(logits, Tensor::from_vector<int32_t>(std::vector<int32_t>(16, 50), {2, 8}, Device::cpu),
                                   Reduction::sum, 1.0, default_ignore_index, 50);
        },
        {"cross_entropy_in_place", "label 50", "[0,50)"});
    current_tape().clear();
}

// Training with AdamW and weight decay: the optimizer never sees the padding rows, so they stay exactly zero
// (and so do their gradients), while the real rows move.
TEST(PaddedVocabulary, PaddingRowsStayZeroThroughAdamWSteps) {
    std::mt19937_64 generator = fresh_generator();
    nn::GPT model(config_with_vocabulary(50), 9, Device::cpu, DType::f32);
    optim::TrainerConfig config;
    config.shape.per_device_train_batch_size = 2;
    config.shape.gradient_accumulation_steps = 2;
    config.weight_decay = 0.1;
    config.learning_rate = 1e-2;
    config.max_steps = 3;
    optim::Trainer trainer(model, config);
    const std::vector<double> initial = values_of(model.wte.weight);
    int pulled = 0;
    const nn::BatchSource source = [&]() -> std::optional<nn::Batch> {
        if (pulled++ >= 6) return std::nullopt;
        return nn::Batch{random_tokens(generator, 50, 2, 8), random_tokens(generator, 50, 2, 8), Tensor()};
    };
    for (int step = 0; step < 3; ++step) ASSERT_TRUE(trainer.train_step(source).has_value());
    EXPECT_NE(values_of(model.wte.weight), initial);
    for (double value : padding_of(model.wte.padded_weight, 50)) ASSERT_EQ(value, 0.0);
    for (double value : padding_of(model.wte.padded_weight.grad(), 50)) ASSERT_EQ(value, 0.0);
}

// Files keep Hugging Face's (V,C): save writes the real rows, load fills them and leaves the padding zero.
TEST(PaddedVocabulary, SafetensorsKeepTheRealShape) {
    nn::GPT source(config_with_vocabulary(50), 11, Device::cpu, DType::f32);
    nn::GPT target(config_with_vocabulary(50), 12, Device::cpu, DType::f32);
    const std::string path = ::testing::TempDir() + "padded_vocabulary.safetensors";
    nn::save_safetensors(source, path);
    nn::load_safetensors_into(target, path);
    EXPECT_EQ(target.wte.weight.to_vector<float>(), source.wte.weight.to_vector<float>());
    for (double value : padding_of(target.wte.padded_weight, 50)) ASSERT_EQ(value, 0.0);
    EXPECT_EQ(nn::read_safetensors_header(path).find("wte.weight")->shape, (Shape{50, 16}));
}

TEST(PaddedVocabulary, FirstColumnsGradcheckAndBadInput) {
    std::mt19937_64 generator = fresh_generator();
    Tensor input = random_leaf(generator, {3, 2, 7});
    Tensor weights = random_tensor(generator, {3 * 2 * 4});
    const auto result = gradcheck([&] { return weighted_sum(first_columns(input, 4), weights); }, {input});
    EXPECT_LE(result.max_relative_error, 1e-6) << result.worst;
    expect_error([&] { first_columns(input, 8); }, {"first_columns", "8 columns", "7"});
}

} // namespace
} // namespace engine::testing
