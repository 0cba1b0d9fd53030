// The library's modules for people's own models (issue 14): PyTorch's default initialisation from an owned,
// seeded generator, Sequential (names, chained forward, float64 gradients), train/eval through the tree,
// Module::to, and every defaulted constructor argument.
#include <cmath>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "expect_error.h"
#include "gradcheck.h"
#include "nn/gpt.h"
#include "nn/io/token_data.h"
#include "nn/sequential.h"

namespace engine::testing {
namespace {

struct Moments {
    double mean = 0.0, variance = 0.0, min = 0.0, max = 0.0;
};
Moments moments_of(const std::vector<float>& values) {
    Moments result{0.0, 0.0, values.at(0), values.at(0)};
    for (float value : values) {
        result.mean += value;
        result.min = std::min<double>(result.min, value);
        result.max = std::max<double>(result.max, value);
    }
    result.mean /= static_cast<double>(values.size());
    for (float value : values) result.variance += (value - result.mean) * (value - result.mean);
    result.variance /= static_cast<double>(values.size());
    return result;
}

// Statistics of a fixed, seeded draw: the tolerances are 6 standard errors of the estimate for n values, so a
// draw from the intended distribution misses them with probability about 2e-9, while a wrong bound (1/sqrt(out)
// instead of 1/sqrt(in), a normal instead of a uniform) misses them by far more.
constexpr double standard_errors = 6.0;

TEST(ModuleInit, LinearWeightAndBiasAreUniformWithinOneOverSqrtIn) {
    constexpr int in = 1024, out = 512;
    nn::Linear layer(in, out, true, {std::make_shared<nn::Generator>(3)});
    const double bound = 1.0 / std::sqrt(static_cast<double>(in)); // 1/32
    const std::vector<float> weight = layer.weight.to_vector<float>();
    ASSERT_EQ(layer.weight.shape(), (Shape{in, out})) << "(in,out), Hugging Face's Conv1D layout";
    for (float value : weight) ASSERT_LE(std::fabs(value), static_cast<float>(bound)) << value;
    // U(-b,b): mean 0, variance b²/3, fourth central moment b⁴/5; the sample variance's standard error is
    // sqrt((μ4 - σ⁴)/n) = b² sqrt(4/(45 n)).
    const double n = static_cast<double>(weight.size());
    const Moments stats = moments_of(weight);
    EXPECT_NEAR(stats.mean, 0.0, standard_errors * std::sqrt(bound * bound / 3.0 / n));
    EXPECT_NEAR(stats.variance, bound * bound / 3.0, standard_errors * bound * bound * std::sqrt(4.0 / (45.0 * n)));
    // The extremes reach the bound: P(max < 0.99 b) = 0.995^n, under 1e-1000.
    EXPECT_GT(stats.max, 0.99 * bound);
    EXPECT_LT(stats.min, -0.99 * bound);
    std::printf("weight mean %.3g (sd %.3g), variance %.6g vs %.6g, range [%.6g, %.6g] vs bound %.6g\n", stats.mean,
                std::sqrt(bound * bound / 3.0 / n), stats.variance, bound * bound / 3.0, stats.min, stats.max, bound);

    // The bias bound is 1/sqrt(in) too (PyTorch's), not 1/sqrt(out): a wide, shallow layer tells them apart.
    nn::Linear wide(16, 2048, true, {std::make_shared<nn::Generator>(4)});
    const Moments bias = moments_of(wide.bias.to_vector<float>());
    EXPECT_LE(std::max(-bias.min, bias.max), 0.25f);
    // P(max < 0.95 b) = 0.975^2048, about 3e-23; 1/sqrt(out) = 0.022 would be far under.
    EXPECT_GT(bias.max, 0.95 * 0.25);
    EXPECT_LT(bias.min, -0.95 * 0.25);
}

TEST(ModuleInit, LayerNormIsOneAndZeroAndEmbeddingIsStandardNormal) {
    nn::LayerNorm norm(7);
    EXPECT_EQ(norm.weight.to_vector<float>(), std::vector<float>(7, 1.0f));
    EXPECT_EQ(norm.bias.to_vector<float>(), std::vector<float>(7, 0.0f));

    nn::Embedding table(1000, 300, {std::make_shared<nn::Generator>(5)});
    ASSERT_EQ(table.weight.shape(), (Shape{1000, 300}));
    const std::vector<float> values = table.weight.to_vector<float>();
    const double n = static_cast<double>(values.size());
    const Moments stats = moments_of(values);
    // N(0,1): the mean's standard error is 1/sqrt(n), the sample variance's sqrt(2/n).
    EXPECT_NEAR(stats.mean, 0.0, standard_errors / std::sqrt(n));
    EXPECT_NEAR(stats.variance, 1.0, standard_errors * std::sqrt(2.0 / n));
    std::printf("embedding mean %.3g, variance %.6g (sd of the estimate %.3g)\n", stats.mean, stats.variance,
                std::sqrt(2.0 / n));
}

// A small model of every layer kind, built from whatever generator the options name.
void build_mixed(nn::Sequential& model, const nn::ParameterOptions& options) {
    model.emplace<nn::Linear>(6, 5, true, options);
    model.emplace<nn::GELU>();
    model.emplace<nn::Linear>(5, 4, false, options);
    model.emplace<nn::LayerNorm>(4, options);
    model.emplace<nn::Linear>(4, 3, true, options);
}

void expect_bitwise_equal_parameters(const nn::Module& a, const nn::Module& b) {
    const auto first = a.named_parameters(), second = b.named_parameters();
    ASSERT_EQ(first.size(), second.size());
    for (size_t index = 0; index < first.size(); ++index) {
        EXPECT_EQ(first[index].first, second[index].first);
        EXPECT_EQ(first[index].second.to_vector<float>(), second[index].second.to_vector<float>()) << first[index].first;
    }
}

TEST(ModuleInit, SameSeedGivesBitwiseTheSameParameters) {
    nn::Sequential first, second;
    nn::manual_seed(11);
    build_mixed(first, {});
    nn::manual_seed(11);
    build_mixed(second, {});
    expect_bitwise_equal_parameters(first, second);

    nn::Sequential third, fourth; // an explicit generator, shared by every layer built from it
    build_mixed(third, {std::make_shared<nn::Generator>(11)});
    build_mixed(fourth, {std::make_shared<nn::Generator>(11)});
    expect_bitwise_equal_parameters(third, fourth);
    expect_bitwise_equal_parameters(first, third); // the default generator after manual_seed(11) is Generator(11)

    nn::Sequential other;
    nn::manual_seed(12);
    build_mixed(other, {});
    EXPECT_NE(first.named_parameters()[0].second.to_vector<float>(), other.named_parameters()[0].second.to_vector<float>());
}

TEST(ModuleInit, EachParameterTakesTheNextStream) {
    const auto generator = std::make_shared<nn::Generator>(21);
    const nn::ParameterOptions options{generator};
    nn::Linear first(8, 8, true, options);
    EXPECT_EQ(generator->next_stream(), 2u) << "weight and bias";
    nn::Linear second(8, 8, true, options);
    nn::Linear no_bias(8, 8, false, options);
    nn::LayerNorm norm(8, options);
    EXPECT_EQ(generator->next_stream(), 7u) << "2 + 2 + 1 + 2: constants take streams too";
    const std::vector<float> weight = first.weight.to_vector<float>(), bias = first.bias.to_vector<float>();
    EXPECT_NE(weight, second.weight.to_vector<float>()) << "two layers, two streams";
    EXPECT_NE(std::vector<float>(weight.begin(), weight.begin() + 8), bias) << "weight and bias, two streams";
    // The documented contract: the weight is stream 0 of the seed, the bias stream 1.
    EXPECT_EQ(weight, nn::uniform_tensor({8, 8}, 1.0 / std::sqrt(8.0), 21, 0, DType::f32).to_vector<float>());
    EXPECT_EQ(bias, nn::uniform_tensor({8}, 1.0 / std::sqrt(8.0), 21, 1, DType::f32).to_vector<float>());
}

TEST(Sequential, ForwardIsTheChainedOpsBitwiseAndNamesFollowPyTorch) {
    std::mt19937_64 random = fresh_generator();
    nn::Sequential model;
    nn::manual_seed(31);
    auto& first = model.emplace<nn::Linear>(6, 5);
    model.emplace<nn::GELU>();
    auto& second = model.emplace<nn::Linear>(5, 4);
    auto& norm = model.emplace<nn::LayerNorm>(4);
    model.emplace<nn::Lambda>([](const Tensor& x) { return add(x, x); }); // one's own op
    EXPECT_EQ(model.size(), 5u);
    EXPECT_EQ(&model[2], &second);

    std::vector<std::string> names;
    for (const auto& [name, parameter] : model.named_parameters()) names.push_back(name);
    EXPECT_EQ(names, (std::vector<std::string>{"0.weight", "0.bias", "2.weight", "2.bias", "3.weight", "3.bias"}));

    const Tensor input = random_tensor(random, {2, 3, 6}, DType::f32);
    const Tensor chained = [&] {
        const Tensor hidden = gelu(linear(input, first.weight, first.bias));
        const Tensor normed = layernorm(linear(hidden, second.weight, second.bias), norm.weight, norm.bias);
        return add(normed, normed);
    }();
    const Tensor output = model(input);
    EXPECT_EQ(output.shape(), (Shape{2, 3, 4}));
    EXPECT_EQ(output.to_vector<float>(), chained.to_vector<float>());
    current_tape().clear();
}

TEST(Sequential, NestedNamesAndAnEmptySequentialIsTheIdentity) {
    nn::Sequential outer;
    auto& inner = outer.emplace<nn::Sequential>();
    inner.emplace<nn::Dropout>(0.1f);
    inner.emplace<nn::Linear>(3, 2);
    outer.emplace<nn::Linear>(2, 2, false);
    std::vector<std::string> names;
    for (const auto& [name, parameter] : outer.named_parameters()) names.push_back(name);
    EXPECT_EQ(names, (std::vector<std::string>{"0.1.weight", "0.1.bias", "1.weight"}));

    const nn::Sequential empty;
    const Tensor input = Tensor::full({2, 2}, 0.5, DType::f32, Device::cpu);
    EXPECT_EQ(empty.forward(input).raw_data(), input.raw_data());
}

// Every layer kind in float64 against central differences, through the container's forward, for the input
// and every parameter (tolerance: the ops' gradchecks', gradcheck.h).
TEST(Sequential, Float64GradientsMatchFiniteDifferences) {
    std::mt19937_64 random = fresh_generator();
    const nn::ParameterOptions options{std::make_shared<nn::Generator>(41), DType::f64};
    nn::Sequential model;
    model.emplace<nn::Linear>(4, 6, true, options);
    model.emplace<nn::GELU>();
    model.emplace<nn::Dropout>(0.0f);
    model.emplace<nn::LayerNorm>(6, options);
    model.emplace<nn::Linear>(6, 3, false, options);
    model.emplace<nn::Lambda>([](const Tensor& x) { return gelu(x); });
    // LayerNorm's gain and bias start at 1 and 0, where a wrong gradient could hide: move them off.
    auto& norm = static_cast<nn::LayerNorm&>(model[3]);
    norm.weight.copy_from(random_tensor(random, {6}, DType::f64, 0.5));
    norm.bias.copy_from(random_tensor(random, {6}, DType::f64, 0.5));

    Tensor input = random_leaf(random, {2, 3, 4});
    const Tensor weights = random_tensor(random, {2 * 3 * 3});
    std::vector<Tensor> checked = model.parameters();
    ASSERT_EQ(checked.size(), 5u);
    checked.push_back(input);
    const GradcheckResult result = gradcheck([&] { return weighted_sum(model(input), weights); }, checked);
    EXPECT_LE(result.max_relative_error, 1e-6) << result.worst;
    std::printf("max relative error %.3g\n", result.max_relative_error);
    current_tape().clear();
}

// The activation layers are their ops: same values bitwise, alone and chained in a Sequential.
TEST(Sequential, ActivationLayersAreTheirOps) {
    std::mt19937_64 random = fresh_generator();
    const Tensor x = random_tensor(random, {3, 5}, DType::f64);
    NoGradGuard no_grad;
    EXPECT_EQ(nn::ReLU()(x).to_vector<double>(), relu(x).to_vector<double>());
    EXPECT_EQ(nn::SiLU()(x).to_vector<double>(), silu(x).to_vector<double>());
    EXPECT_EQ(nn::Tanh()(x).to_vector<double>(), engine::tanh(x).to_vector<double>());
    EXPECT_EQ(nn::Sigmoid()(x).to_vector<double>(), sigmoid(x).to_vector<double>());
    nn::Sequential chain;
    chain.emplace<nn::SiLU>();
    chain.emplace<nn::Tanh>();
    chain.emplace<nn::Sigmoid>();
    EXPECT_EQ(chain(x).to_vector<double>(), sigmoid(engine::tanh(silu(x))).to_vector<double>());
}

TEST(ModuleMode, TrainAndEvalReachANestedDropout) {
    engine::manual_seed(51);
    nn::Sequential outer;
    auto& inner = outer.emplace<nn::Sequential>();
    auto& drop = inner.emplace<nn::Dropout>(); // p = 0.5, PyTorch's default
    EXPECT_EQ(drop.probability, 0.5f);
    EXPECT_TRUE(drop.training());

    const Tensor input = Tensor::full({64}, 1.0, DType::f32, Device::cpu);
    outer.eval();
    EXPECT_FALSE(inner.training());
    EXPECT_FALSE(drop.training());
    EXPECT_EQ(outer(input).to_vector<float>(), input.to_vector<float>()) << "dropout is the identity in eval";

    outer.train();
    EXPECT_TRUE(drop.training());
    int zeros = 0;
    for (float value : outer(input).to_vector<float>()) {
        EXPECT_TRUE(value == 0.0f || value == 2.0f) << value;
        zeros += value == 0.0f;
    }
    // 64 draws at p = 0.5: all kept or all dropped has probability 2^-63.
    EXPECT_GT(zeros, 0);
    EXPECT_LT(zeros, 64);
    current_tape().clear();
}

TEST(ModuleDevice, ToTheSameDeviceKeepsEveryParameter) {
    nn::Sequential model;
    build_mixed(model, {std::make_shared<nn::Generator>(61)});
    const auto before = model.named_parameters();
    std::vector<const void*> data;
    for (const auto& [name, parameter] : before) data.push_back(parameter.raw_data());
    model.to(Device::cpu);
    const auto after = model.named_parameters();
    ASSERT_EQ(before.size(), after.size());
    for (size_t index = 0; index < before.size(); ++index) {
        EXPECT_EQ(after[index].second.id(), before[index].second.id());
        EXPECT_EQ(after[index].second.raw_data(), data[index]) << "nothing to move";
    }
}

TEST(ModuleDevice, ToCudaWithoutCudaThrowsAndChangesNothing) {
    if (ENGINE_HAS_CUDA) GTEST_SKIP() << "this build has CUDA; tests/cuda/test_modules_cuda.cpp moves modules there";
    nn::Sequential model;
    build_mixed(model, {});
    const std::vector<float> weight = model.parameters()[0].to_vector<float>();
    expect_error([&] { model.to(Device::cuda); }, {"Module::to(cuda)", "built without CUDA"});
    EXPECT_EQ(model.parameters()[0].device(), Device::cpu);
    EXPECT_EQ(model.parameters()[0].to_vector<float>(), weight);

    nn::Sequential parameterless; // no allocation to fail: the check comes first
    parameterless.emplace<nn::GELU>();
    expect_error([&] { parameterless.to(Device::cuda); }, {"built without CUDA"});

    nn::GPT gpt(nn::GPTConfig::named("tiny"), 1);
    expect_error([&] { gpt.to(Device::cuda); }, {"built without CUDA"});
    EXPECT_EQ(gpt.device(), Device::cpu);
}

// "No defaulted argument can crash": every constructor of nn/ with a defaulted or default-constructible
// argument, left defaulted, builds something usable; the arguments that cannot be right throw a clear error.
TEST(ModuleDefaults, EveryDefaultedArgumentBuildsAUsableLayer) {
    const Tensor input = Tensor::full({2, 3}, 0.25, DType::f32, Device::cpu);
    nn::Linear with_bias(3, 2);
    EXPECT_TRUE(with_bias.bias.defined());
    EXPECT_EQ(with_bias.weight.dtype(), DType::f32);
    EXPECT_EQ(with_bias.weight.device(), Device::cpu);
    EXPECT_EQ(with_bias(input).shape(), (Shape{2, 2}));

    nn::Linear without_bias(3, 2, false);
    EXPECT_FALSE(without_bias.bias.defined());
    EXPECT_EQ(without_bias.named_parameters().size(), 1u);
    EXPECT_EQ(without_bias(input).to_vector<float>(), linear(input, without_bias.weight).to_vector<float>());
    without_bias.set_compute_dtype(DType::bf16); // working copies with an undefined bias
    EXPECT_FALSE(without_bias.working(without_bias.bias).defined());
    EXPECT_EQ(without_bias.working(without_bias.weight).dtype(), DType::bf16);

    nn::LayerNorm norm(3);
    EXPECT_EQ(norm(input).shape(), (Shape{2, 3}));
    nn::Embedding table(5, 3);
    EXPECT_EQ(table.weight.shape(), (Shape{5, 3}));
    EXPECT_EQ(table.padded_weight.raw_data(), table.weight.raw_data());
    nn::Embedding padded(5, 3, nn::InitOptions{}); // GPT-2's, padded_rows defaulted: unpadded
    EXPECT_EQ(padded.padded_weight.shape(), (Shape{5, 3}));
    // forward looks rows up; its gradient adds each position's upstream row into the token's row
    const Tensor ids = Tensor::from_vector<int32_t>({4, 0, 4}, {1, 3}, Device::cpu);
    const std::vector<float> rows = table.weight.to_vector<float>();
    const Tensor looked_up = table.forward(ids);
    EXPECT_EQ(looked_up.shape(), (Shape{1, 3, 3}));
    const std::vector<float> values = looked_up.to_vector<float>();
    for (int position = 0; position < 3; ++position)
        for (int channel = 0; channel < 3; ++channel)
            EXPECT_EQ(values[position * 3 + channel], rows[(position == 1 ? 0 : 4) * 3 + channel]);
    backward(sum(looked_up));
    const std::vector<float> gradient = table.weight.grad().to_vector<float>();
    for (int row = 0; row < 5; ++row)
        for (int channel = 0; channel < 3; ++channel)
            EXPECT_EQ(gradient[row * 3 + channel], row == 4 ? 2.0f : row == 0 ? 1.0f : 0.0f) << row;
    expect_error([&] { table.forward(Tensor::from_vector<int32_t>({5}, {1, 1}, Device::cpu)); }, {"embedding", "5"});
    nn::Dropout drop;
    EXPECT_EQ(drop(input).shape(), (Shape{2, 3}));
    nn::GELU activation;
    EXPECT_EQ(activation(input).to_vector<float>(), gelu(input).to_vector<float>());
    nn::Sequential empty;
    EXPECT_EQ(empty.parameter_count(), 0u);
    empty.zero_grad();
    empty.train();
    empty.set_compute_dtype(DType::bf16);
    empty.refresh_working_copies();

    // An explicitly null generator is the default one, as a defaulted one.
    nn::manual_seed(71);
    nn::Linear from_null(3, 2, true, {nullptr});
    nn::manual_seed(71);
    nn::Linear from_default(3, 2);
    EXPECT_EQ(from_null.weight.to_vector<float>(), from_default.weight.to_vector<float>());

    // GPT's defaulted device and dtype, and a defaulted GPTConfig.
    nn::GPT gpt(nn::GPTConfig{}, 1);
    EXPECT_EQ(gpt.device(), Device::cpu);
    EXPECT_EQ(gpt.dtype(), DType::f32);
    current_tape().clear();
}

// nn/io's defaulted options and arguments, and GPT's defaulted checkpoint policy, with a forward pass.
TEST(ModuleDefaults, DataLoaderAndGptDefaultsRun) {
    const nn::DataLoaderOptions options; // B 4, T 64, packed, shuffled, seed 0
    nn::DataLoader loader(nn::builtin_corpus(4 * 64 * 3), options);
    const std::optional<nn::Batch> batch = loader.next();
    ASSERT_TRUE(batch.has_value());
    EXPECT_EQ(batch->inputs.shape(), (Shape{4, 64}));
    expect_error([&] { nn::DataLoader(std::vector<int32_t>{}, options); }, {"DataLoader"});
    const nn::Batch padded = nn::make_padded_batch({{1, 2, 3}, {4}}, 4);
    EXPECT_EQ(padded.inputs.to_vector<int32_t>(), (std::vector<int32_t>{1, 2, 3, 0, 4, 0, 0, 0}));

    nn::GPT gpt(nn::GPTConfig{}, 2);
    gpt.set_checkpointing(checkpoint::CheckpointPolicy{});
    EXPECT_FALSE(gpt.checkpointing().enabled);
    const Tensor logits = gpt.forward(batch->inputs);
    EXPECT_EQ(logits.shape(), (Shape{4, 64, nn::GPTConfig{}.vocab_size}));
    current_tape().clear();
}

TEST(ModuleDefaults, ArgumentsThatCannotBeRightThrowBeforeDrawing) {
    const auto generator = std::make_shared<nn::Generator>(81);
    const nn::ParameterOptions options{generator};
    expect_error([&] { nn::Linear(0, 3, true, options); }, {"Linear", "positive", "0"});
    expect_error([&] { nn::Linear(3, -1, true, options); }, {"Linear", "-1"});
    expect_error([&] { nn::LayerNorm(0, options); }, {"LayerNorm", "positive"});
    expect_error([&] { nn::Embedding(4, 0, options); }, {"Embedding", "positive"});
    expect_error([&] { nn::Linear(3, 3, true, {generator, DType::bf16}); }, {"Linear", "bf16", "set_compute_dtype"});
    expect_error([&] { nn::Linear(3, 3, true, {generator, DType::i32}); }, {"Linear", "i32"});
    EXPECT_EQ(generator->next_stream(), 0u) << "nothing was drawn";
    expect_error([] { nn::Dropout(1.0f); }, {"Dropout", "1"});
    expect_error([] { nn::Dropout(-0.1f); }, {"Dropout", "-0.1"});
    expect_error([] { nn::Lambda(nn::Lambda::Function{}); }, {"Lambda", "empty"});
    nn::Sequential model;
    expect_error([&] { model.append(std::unique_ptr<nn::Linear>()); }, {"Sequential", "null"});
    EXPECT_EQ(model.size(), 0u);
    expect_error([&] { (void)model[0]; }, {"Sequential", "index 0", "0 layers"});
}

} // namespace
} // namespace engine::testing
