// GPT-2 model: shapes, seeded initialisation (including the residual-projection scaling), the tied LM
// head, and a float64 finite-difference check of the loss gradient with respect to its parameters.
#include <gtest/gtest.h>

#include <cmath>

#include "gradcheck.h"
#include "nn/gpt.h"

namespace engine::testing {
namespace {

class GPTModel : public TapeTest {};

Tensor random_tokens(std::mt19937_64& generator, int rows, int time, int vocabulary) {
    std::uniform_int_distribution<int> token(0, vocabulary - 1);
    std::vector<int32_t> values(static_cast<size_t>(rows * time));
    for (int32_t& value : values) value = token(generator);
    return Tensor::from_vector<int32_t>(values, {rows, time}, Device::cpu);
}

Tensor parameter_named(const nn::GPT& model, const std::string& name) {
    for (const auto& [parameter_name, parameter] : model.named_parameters())
        if (parameter_name == name) return parameter;
    ADD_FAILURE() << "no parameter " << name;
    return Tensor();
}

TEST_F(GPTModel, ForwardShapesAndHuggingFaceNames) {
    const nn::GPTConfig config{48, 16, 3, 2, 16, 0.0f};
    nn::GPT model(config, 7);
    const Tensor logits = model.forward(random_tokens(generator, 3, 10, 48));
    EXPECT_EQ(logits.shape(), (Shape{3, 10, 48}));
    EXPECT_TRUE(logits.requires_grad());

    const auto named = model.named_parameters();
    EXPECT_EQ(named.front().first, "wte.weight");
    EXPECT_EQ(named.size(), 2u + 3u * 12u + 2u); // wte, wpe; 12 per block; ln_f
    for (const auto& [name, parameter] : named) EXPECT_EQ(name.find("lm_head"), std::string::npos) << name;
    EXPECT_EQ(parameter_named(model, "h.2.attn.c_attn.weight").shape(), (Shape{16, 48})); // Conv1D (in,out)
    EXPECT_EQ(parameter_named(model, "h.0.mlp.c_fc.weight").shape(), (Shape{16, 64}));
    EXPECT_THROW(model.forward(random_tokens(generator, 1, 17, 48)), EngineError); // beyond max_seq_len
}

TEST_F(GPTModel, SeededInitialisationIsDeterministic) {
    const nn::GPTConfig config{40, 8, 2, 2, 16, 0.0f};
    nn::GPT first(config, 11), same(config, 11), other(config, 12);
    const auto a = first.named_parameters(), b = same.named_parameters(), c = other.named_parameters();
    size_t differing = 0;
    for (size_t index = 0; index < a.size(); ++index) {
        const std::vector<float> values = a[index].second.to_vector<float>();
        EXPECT_EQ(values, b[index].second.to_vector<float>()) << a[index].first; // bitwise
        if (values != c[index].second.to_vector<float>()) ++differing;
        if (a[index].first.find("ln") != std::string::npos) {
            const bool is_weight = a[index].first.ends_with("weight");
            for (float value : values) ASSERT_EQ(value, is_weight ? 1.0f : 0.0f) << a[index].first;
        }
    }
    // Every normally initialised tensor (wte, wpe, and 4 Linear weights per block) depends on the seed.
    EXPECT_EQ(differing, 2u + 2u * 4u);
}

double standard_deviation(const Tensor& tensor) {
    const std::vector<float> values = tensor.to_vector<float>();
    double sum = 0.0, squares = 0.0;
    for (float value : values) {
        sum += value;
        squares += static_cast<double>(value) * value;
    }
    const double count = static_cast<double>(values.size());
    return std::sqrt(squares / count - (sum / count) * (sum / count));
}

TEST_F(GPTModel, ResidualProjectionsAreScaledByInverseSqrtOfTwiceTheLayers) {
    // 4 layers of width 256: mlp.c_proj has 262,144 draws, so the sample std is within ~0.2% (1σ) of the
    // truth; ±2% is loose for sampling noise yet far from 0.02 (a factor √8 ≈ 2.8 away).
    const nn::GPTConfig config{64, 8, 4, 4, 256, 0.0f};
    nn::GPT model(config, 5);
    const double residual = 0.02 / std::sqrt(2.0 * 4);
    for (const char* name : {"h.0.mlp.c_proj.weight", "h.3.mlp.c_proj.weight", "h.1.attn.c_proj.weight"})
        EXPECT_NEAR(standard_deviation(parameter_named(model, name)), residual, 0.02 * residual) << name;
    for (const char* name : {"h.0.attn.c_attn.weight", "h.2.mlp.c_fc.weight"})
        EXPECT_NEAR(standard_deviation(parameter_named(model, name)), 0.02, 0.02 * 0.02) << name;
    for (const char* name : {"h.0.attn.c_attn.bias", "h.0.mlp.c_proj.bias"})
        for (float value : parameter_named(model, name).to_vector<float>()) ASSERT_EQ(value, 0.0f) << name;
}

TEST_F(GPTModel, TiedHeadGivesTheEmbeddingGradientFromBothUses) {
    // Tokens 0..5 appear in the input; the rest of the vocabulary only reaches the loss through the head.
    const nn::GPTConfig config{24, 8, 1, 2, 8, 0.0f};
    nn::GPT model(config, 3, Device::cpu, DType::f64);
    const Tensor tokens = Tensor::from_vector<int32_t>({0, 1, 2, 3, 4, 5}, {1, 6}, Device::cpu);
    const Tensor targets = Tensor::from_vector<int32_t>({1, 2, 3, 4, 5, 0}, {1, 6}, Device::cpu);
    backward(cross_entropy(model.forward(tokens), targets));
    const std::vector<double> gradient = model.wte.weight.grad().to_vector<double>();
    double unused_row = 0.0;
    for (int c = 0; c < 8; ++c) unused_row += std::fabs(gradient[static_cast<size_t>(20 * 8 + c)]);
    EXPECT_GT(unused_row, 0.0) << "a token that is never input still gets a gradient: the head is wte";

    // The embedding use alone: freeze the head's copy by feeding a detached clone into the same math.
    model.zero_grad();
    const Tensor head_weight = model.wte.weight.detach().clone();
    Tensor x = embedding(tokens, model.wte.weight, model.wpe.weight);
    x = model.ln_f.forward(model.run_blocks(x, 0, model.block_count()));
    backward(cross_entropy(matmul(x, head_weight, true), targets));
    const std::vector<double> embedding_only = model.wte.weight.grad().to_vector<double>();
    double input_row_difference = 0.0, embedding_row = 0.0;
    for (int c = 0; c < 8; ++c) {
        input_row_difference += std::fabs(gradient[static_cast<size_t>(2 * 8 + c)] - embedding_only[static_cast<size_t>(2 * 8 + c)]);
        embedding_row += std::fabs(embedding_only[static_cast<size_t>(2 * 8 + c)]);
    }
    EXPECT_GT(embedding_row, 0.0);
    EXPECT_GT(input_row_difference, 1e-6 * embedding_row) << "an input token's row also gets the head's share";
    model.zero_grad();
}

TEST_F(GPTModel, Float64GradientMatchesFiniteDifferences) {
    const nn::GPTConfig config{16, 8, 2, 2, 8, 0.0f};
    nn::GPT model(config, 9, Device::cpu, DType::f64);
    const Tensor tokens = random_tokens(generator, 2, 5, 16);
    std::vector<int32_t> target_values = random_tokens(generator, 2, 5, 16).to_vector<int32_t>();
    target_values[4] = -100; // padding takes no part
    const Tensor targets = Tensor::from_vector<int32_t>(target_values, {2, 5}, Device::cpu);
    const auto loss = [&] { return cross_entropy(model.forward(tokens), targets); };
    std::vector<Tensor> checked;
    for (const char* name : {"wte.weight", "wpe.weight", "h.0.ln_1.weight", "h.0.attn.c_attn.weight",
                             "h.0.attn.c_proj.bias", "h.1.mlp.c_fc.weight", "h.1.mlp.c_proj.weight", "ln_f.bias"})
        checked.push_back(parameter_named(model, name));
    // Step 1e-6, not the ops tests' 1e-5: LayerNorm over std-0.02 embeddings gives this loss a much larger
    // third derivative than the ops tests see, so the truncation term h^2 f'''/6 dominates at 1e-5; at
    // 1e-6 rounding (eps |loss| / h, about 3e-10) and truncation both sit well under the tolerance.
    const GradcheckResult result = gradcheck(loss, checked, 1e-6);
    EXPECT_LT(result.max_relative_error, 1e-6) << result.worst;
    model.zero_grad();
}

} // namespace
} // namespace engine::testing

namespace engine::testing {
namespace {
// A defaulted InitOptions (no stream counter given) used to dereference a null pointer in Linear's
// constructor (issue 14). It must build: each parameter takes the next stream of the options' own counter.
TEST(LayerInit, DefaultedInitOptionsBuildALinearWithDistinctStreams) {
    const nn::InitOptions init;
    nn::Linear first(8, 4, init, 0.02);
    nn::Linear second(8, 4, init, 0.02);
    EXPECT_EQ(first.weight.shape(), (Shape{8, 4}));
    EXPECT_NE(first.weight.to_vector<float>(), second.weight.to_vector<float>()) << "two layers, two streams";
    for (float value : first.bias.to_vector<float>()) EXPECT_EQ(value, 0.0f);
}
} // namespace
} // namespace engine::testing
